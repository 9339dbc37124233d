"""The embedded default's problems: seeded arithmetic in five levels, train and test disjoint by construction."""

from __future__ import annotations

import hashlib
import random
import re

NAMES = [
    "Ava",
    "Ben",
    "Cara",
    "Dev",
    "Eli",
    "Fay",
    "Gus",
    "Hana",
    "Ivan",
    "Jo",
    "Kai",
    "Lena",
    "Milo",
    "Nia",
    "Omar",
    "Pia",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "shells", "coins", "cards", "balloons"]


def _answer_line(value: int) -> str:
    return f"So the answer is \\boxed{{{value}}}."


def _arith_level(level: int, rng: random.Random) -> tuple[str, int, str]:
    """One problem of a difficulty level, its integer answer and a worked solution (steps one per line, the last
    stating the answer).

    1: single-digit addition/subtraction; 2: single-digit multiplication or a one-step word problem;
    3: two-digit addition/subtraction; 4: two steps; 5: three steps (word problems and expressions).
    The solution is written from the drawn values after the draws: problems are the same with or without it.
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    d = lambda lo=1, hi=9: rng.randint(lo, hi)  # noqa: E731
    if level == 1:
        a, b = d(), d()
        if rng.random() < 0.5:
            text = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "Find the sum of {a} and {b}."])
            steps = [f"We need the sum of {a} and {b}.", f"Start from {a} and count up {b}: {a} + {b} = {a + b}."]
            return text.format(a=a, b=b), a + b, _steps(steps, a + b)
        a, b = max(a, b), min(a, b)
        text = rng.choice(["What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}."])
        steps = [f"We take {b} away from {a}.", f"Start from {a} and count down {b}: {a} - {b} = {a - b}."]
        return text.format(a=a, b=b), a - b, _steps(steps, a - b)
    if level == 2:
        a, b = d(2), d(2)
        kind = rng.randrange(3)
        if kind == 0:
            text = rng.choice(["What is {a} \u00d7 {b}?", "Compute {a} times {b}.", "What is {a} * {b}?"])
            steps = [f"{a} times {b} is {b} groups of {a}.", f"{a} \u00d7 {b} = {a * b}."]
            return text.format(a=a, b=b), a * b, _steps(steps, a * b)
        if kind == 1:
            steps = [f"{name} starts with {a} {item} and gets {b} more, so we add.", f"{a} + {b} = {a + b}."]
            return (
                f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?",
                a + b,
                _steps(steps, a + b),
            )
        a, b = max(a, b) + d(), min(a, b)
        steps = [f"{name} starts with {a} {item} and gives away {b}, so we subtract.", f"{a} - {b} = {a - b}."]
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b, _steps(steps, a - b)
    if level == 3:
        a, b = d(10, 99), d(10, 99)
        if rng.random() < 0.5:
            text = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}."])
            tens, ones = a // 10 * 10 + b // 10 * 10, a % 10 + b % 10
            steps = [
                f"Add the tens: {a // 10 * 10} + {b // 10 * 10} = {tens}.",
                f"Add the ones: {a % 10} + {b % 10} = {ones}.",
                f"Put them together: {tens} + {ones} = {a + b}.",
            ]
            return text.format(a=a, b=b), a + b, _steps(steps, a + b)
        a, b = max(a, b), min(a, b)
        text = rng.choice(["What is {a} - {b}?", "Compute {a} - {b}."])
        first = a - b // 10 * 10
        steps = [
            f"Take away the tens of {b} first: {a} - {b // 10 * 10} = {first}.",
            f"Then take away the ones: {first} - {b % 10} = {a - b}.",
        ]
        return text.format(a=a, b=b), a - b, _steps(steps, a - b)
    if level == 4:
        a, b, c = d(), d(), d()
        kind = rng.randrange(3)
        if kind == 0:
            steps = [f"First add {a} and {b}: {a} + {b} = {a + b}.", f"Then add {c}: {a + b} + {c} = {a + b + c}."]
            return f"What is {a} + {b} + {c}?", a + b + c, _steps(steps, a + b + c)
        if kind == 1:
            a = a + b  # keep the result non-negative
            steps = [f"Work from left to right: {a} - {b} = {a - b}.", f"Then add {c}: {a - b} + {c} = {a - b + c}."]
            return f"What is {a} - {b} + {c}?", a - b + c, _steps(steps, a - b + c)
        steps = [
            f"{name} starts with {a} {item} and buys {b} more: {a} + {b} = {a + b}.",
            f"Finding {c} more gives {a + b} + {c} = {a + b + c}.",
        ]
        return (
            f"{name} has {a} {item}. {name} buys {b} more and then finds {c} more. How many {item} does {name} have?",
            a + b + c,
            _steps(steps, a + b + c),
        )
    if level == 5:
        a, b, c = d(2), d(2), d()
        kind = rng.randrange(3)
        if kind == 0:
            steps = [
                f"The parentheses first: {a} + {b} = {a + b}.",
                f"Then multiply: {a + b} \u00d7 {c} = {(a + b) * c}.",
            ]
            return f"What is ({a} + {b}) \u00d7 {c}?", (a + b) * c, _steps(steps, (a + b) * c)
        if kind == 1:
            steps = [f"Multiply first: {a} \u00d7 {b} = {a * b}.", f"Then add: {a * b} + {c} = {a * b + c}."]
            return f"What is {a} \u00d7 {b} + {c}?", a * b + c, _steps(steps, a * b + c)
        steps = [
            f"The bags hold {a} \u00d7 {b} = {a * b} {item} in all.",
            f"Giving away {c} leaves {a * b} - {c} = {a * b - c}.",
        ]
        return (
            (
                f"{name} buys {a} bags with {b} {item} in each bag, then gives away {c} {item}. "
                f"How many {item} does {name} have left?"
            ),
            a * b - c,
            _steps(steps, a * b - c),
        )
    raise ValueError(f"builtin:arith has levels 1 to 5, not {level}.")


def _steps(steps: list[str], answer: int) -> str:
    return "\n".join([*steps, _answer_line(answer)])


# What counts as the same problem (retrieval never shows one as "another" problem)

_OPERATION_WORDS = {
    "+": "+",
    "plus": "+",
    "sum": "+",
    "add": "+",
    "more": "+",
    "total": "+",
    "-": "-",
    "minus": "-",
    "subtract": "-",
    "difference": "-",
    "left": "-",
    "away": "-",
    "*": "*",
    "\u00d7": "*",
    "times": "*",
    "product": "*",
    "\\times": "*",
    "\\cdot": "*",
    "/": "/",
    "divided": "/",
    "\u00f7": "/",
    "\\div": "/",
}
_FACT_TOKEN = re.compile(r"\d+(?:\.\d+)?|[+\-*/\u00d7\u00f7]|\\[a-z]+|[a-z]+")
MAX_FACT_CHARS = 160  # a fact is read only from a short problem; a long one is a different problem if its text is


def problem_key(problem: str) -> tuple[str, tuple | None]:
    """``(text, fact)`` of a problem: its text with case and spacing normalized, and for a short arithmetic
    problem its fact, the operands (order-free) with the operations: "What is 3 + 4?", "Compute 4 + 3." and
    "Find the sum of 3 and 4." share one fact. ``fact`` is None where there is none to read (fewer than two
    numbers, no operation, or a long problem)."""
    text = " ".join(problem.lower().split())
    if len(text) > MAX_FACT_CHARS:
        return text, None
    tokens = _FACT_TOKEN.findall(text)
    numbers = sorted(t for t in tokens if t[0].isdigit())
    operations = sorted({_OPERATION_WORDS[t] for t in tokens if t in _OPERATION_WORDS})
    return text, (tuple(numbers), tuple(operations)) if len(numbers) >= 2 and operations else None


def same_problem(a: str, b: str) -> bool:
    """Whether two problem texts are one problem: the same text, or the same arithmetic fact."""
    (text_a, fact_a), (text_b, fact_b) = problem_key(a), problem_key(b)
    return text_a == text_b or (fact_a is not None and fact_a == fact_b)


def _in_test_split(text: str) -> bool:
    """Train and test are split by fact, not by text: "What is 3 + 4?" and "Find the sum of 3 and 4." state one
    fact and always land on the same side, so no held-out problem is a training fact restated."""
    text, fact = problem_key(text)
    return int(hashlib.sha1(repr(fact if fact is not None else text).encode()).hexdigest(), 16) % 5 == 0


def arith_problems(levels: list[int], n: int, seed: int, split: str) -> list[tuple[str, str, str, int, str]]:
    """Up to ``n`` distinct ``(id, text, answer, level, solution)`` problems of ``split``, levels mixed in equal
    shares."""
    rng = random.Random(f"lanpo-arith-{seed}-{split}")
    want_test = split == "test"
    problems: dict[str, tuple[str, str, str, int, str]] = {}
    attempts = 0
    while len(problems) < n and attempts < 200 * n:
        attempts += 1
        level = levels[len(problems) % len(levels)]
        text, answer, solution = _arith_level(level, rng)
        if _in_test_split(text) != want_test:
            continue
        pid = f"arith-L{level}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
        problems.setdefault(pid, (pid, text, str(answer), level, solution))
    return list(problems.values())
