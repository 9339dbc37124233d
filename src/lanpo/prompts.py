"""Every prompt lanpo sends to a model, and the parsers for what models write back.

Training, evaluation and the SFT data builder all use these functions, so the skills taught in SFT are
exactly the ones the RL loop asks for. The templates for feedback contexts (reflection, abstraction)
deliberately contain no words that could read as a verdict on an attempt (see ``feedback.leakage_problems``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

Messages = list[dict[str, str]]

SOLVE_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# Code problems (lanpo.data.code_tasks) are stated with CODE_HEADER first; every prompt about one asks for code,
# reviews code and keeps code out of lessons. The problem's own text says which domain it is in, so every prompt
# builder, in training, evaluation and SFT alike, picks the right words from the problem alone.
CODE_HEADER = "Write the Python function below."
CODE_INSTRUCTION = "Write the complete function, with its signature, in one ```python code block."


@dataclass(frozen=True)
class Domain:
    instruction: str  # how to present the solution
    review: str  # what a reflection checks
    summary_rule: str  # what a summary must leave out


MATH = Domain(
    SOLVE_INSTRUCTION,
    "check every calculation and every piece of reasoning",
    "Do not repeat the final answer or the specific numbers.",
)
CODE = Domain(
    CODE_INSTRUCTION,
    "check every line of code, and the inputs it must handle (empty, zero, negative)",
    "Do not write any code or name the function; describe ideas in words.",
)


def is_code_problem(problem: str) -> bool:
    return isinstance(problem, str) and problem.lstrip().startswith(CODE_HEADER)


def domain_of(problem: str) -> Domain:
    return CODE if is_code_problem(problem) else MATH


# Characters of an attempt shown in a reflection prompt or a summary prompt (a few hundred tokens).
MAX_ATTEMPT_CHARS = 2000


def user(content: str) -> Messages:
    return [{"role": "user", "content": content}]


def solve_messages(problem: str) -> Messages:
    """The plain (zero-shot / scratch) prompt."""
    return user(f"{problem.strip()}\n{domain_of(problem).instruction}")


def clip(text: str, limit: int = MAX_ATTEMPT_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit].rstrip() + " [...]"


# ---------------------------------------------------------------------------------------------------------------
# Reward-agnostic reflection (same problem)

REFLECTION_TEMPLATE = """Problem:
{problem}

Below {attempt_phrase} at this problem, shown without any grading. {quality}

{attempts}

First, review {review_object} step by step: {review}, and point out any step that looks doubtful. Then solve the problem again from the start, writing a complete solution. \
{instruction}"""


def reflection_text(problem: str, attempts: list[str]) -> str:
    # No digits in template text: a number here could coincide with the gold answer (see feedback.py).
    if not attempts:
        raise ValueError("A reflection prompt needs at least one earlier attempt.")
    many = len(attempts) > 1
    blocks = [f"### Earlier attempt\n{clip(a)}" for a in attempts]
    return REFLECTION_TEMPLATE.format(
        problem=problem.strip(),
        attempt_phrase="are several earlier attempts" if many else "is an earlier attempt",
        quality="Their quality is unknown." if many else "Its quality is unknown.",
        attempts="\n\n".join(blocks),
        review_object="each attempt" if many else "the attempt",
        review=domain_of(problem).review,
        instruction=domain_of(problem).instruction,
    )


# ---------------------------------------------------------------------------------------------------------------
# Relevant abstraction (other problems)

ABSTRACTION_TEMPLATE = """Problem:
{problem}

Below are lessons distilled from solving other, similar problems. Not all of them may apply here.

{lessons}

First, analyze which of these lessons apply to this problem and how. Then solve the problem step by step. \
{instruction}"""


def abstraction_text(problem: str, lessons: list[tuple[list[str], list[str]]]) -> str:
    """``lessons``: one ``(principles, pitfalls)`` pair per pool entry. No digits in template text."""
    blocks = []
    for principles, pitfalls in lessons:
        lines = ["### Lesson"]
        if principles:
            lines.append("Principles:")
            lines += [f"- {p}" for p in principles]
        if pitfalls:
            lines.append("Pitfalls:")
            lines += [f"- {p}" for p in pitfalls]
        blocks.append("\n".join(lines))
    return ABSTRACTION_TEMPLATE.format(
        problem=problem.strip(), lessons="\n\n".join(blocks), instruction=domain_of(problem).instruction
    )


# ---------------------------------------------------------------------------------------------------------------
# Summaries for the experience pool

SUMMARY_TEMPLATE = """Problem:
{problem}

A solution attempt:
{solution}

This attempt was {verdict}.

Distill what this attempt teaches into lessons that would help on other, similar problems. {rule} Write exactly three sections: FLOW OF THOUGHT (the high-level plan \
of a good solution, in one or two sentences), PRINCIPLES (general rules or methods that lead to a right \
solution, one per line starting with "- ") and PITFALLS (mistakes to avoid, one per line starting with "- ")."""

# The summary's reply is prefilled with its first heading: small models then keep to the format (SmolLM2-135M
# parsed 10 of 16 summaries with it, 0 of 16 without).
SUMMARY_PREFILL = "FLOW OF THOUGHT:"


def summary_messages(problem: str, solution: str, correct: bool) -> Messages:
    """The summary prompt; it ends with the assistant's prefilled first heading (see :func:`with_prefill`)."""
    # The verdict is safe here: a summary is only ever shown to *other* problems.
    verdict = "judged correct" if correct else "judged incorrect"
    return [
        *user(
            SUMMARY_TEMPLATE.format(
                problem=problem.strip(), solution=clip(solution), verdict=verdict, rule=domain_of(problem).summary_rule
            )
        ),
        {"role": "assistant", "content": SUMMARY_PREFILL},
    ]


def is_prefilled(messages: Messages) -> bool:
    """A conversation that ends with an assistant message is continued rather than answered."""
    return bool(messages) and messages[-1]["role"] == "assistant"


def with_prefill(messages: Messages, generated: str) -> str:
    """The full reply: the prefilled start (if any) followed by what the model generated."""
    if is_prefilled(messages):
        prefix = messages[-1]["content"]
        return prefix + ("" if generated.startswith((" ", "\n")) or not generated else " ") + generated
    return generated


@dataclass
class Summary:
    flow_of_thought: str = ""
    principles: list[str] = field(default_factory=list)
    pitfalls: list[str] = field(default_factory=list)


# Section names. Core names may head a bulleted line ("1. Principles:"); the looser synonyms only a plain line.
_CORE = {
    "flow_of_thought": r"flow[\s_-]+of[\s_-]+thoughts?",
    "principles": r"(?:key\s+|general\s+|core\s+)?principles?",
    "pitfalls": r"(?:common\s+|key\s+)?pitfalls?|mistakes\s+to\s+avoid",
}
_LOOSE = {
    "flow_of_thought": r"high[\s-]*level\s+plan|solution\s+plan|plan|approach|strategy",
    "principles": r"lessons?(?:\s+learned)?|insights?|rules?",
    "pitfalls": r"mistakes?|errors?(?:\s+to\s+avoid)?|cautions?|warnings?",
}


def _heading_re(names: dict[str, str]) -> re.Pattern:
    alternatives = "|".join(f"(?P<{key}>{pattern})" for key, pattern in names.items())
    return re.compile(rf"^(?:{alternatives})[ \t*_]*(?P<colon>:)?[ \t*_]*(?P<rest>.*)$", re.IGNORECASE)


_CORE_RE, _LOOSE_RE = _heading_re(_CORE), _heading_re(_LOOSE)
_LIST_MARKER = re.compile(r"^\s*(?:[-*\u2022+]|\d+[.)]|\(\d+\))\s+")
_BULLET_RE = re.compile(r"^\s*(?:[-*\u2022+]|\d+[.)]|\(\d+\)|[a-z][.)])\s+", re.IGNORECASE)
MAX_ITEMS = 8
MAX_ITEM_CHARS = 400


def _heading(line: str) -> tuple[str, str] | None:
    """``(section, rest of line)`` when ``line`` starts a section, else ``None``."""
    listed = bool(_LIST_MARKER.match(line))
    bare = _LIST_MARKER.sub("", line).strip().lstrip("#>*_ \t")
    for pattern, loose in ((_CORE_RE, False), (_LOOSE_RE, True)):
        match = pattern.match(bare)
        if not match:
            continue
        colon = match.group("colon")
        rest = match.group("rest").strip()
        if not colon and rest:
            continue  # "Planning the steps ..." is a sentence, not a heading
        if listed and (loose or not colon):
            return None  # a bullet item that merely is or starts with a section word
        section = next(k for k in ("flow_of_thought", "principles", "pitfalls") if match.group(k))
        return section, rest
    return None


def _items(block: str) -> list[str]:
    lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
    items: list[str] = []
    for line in lines:
        if _BULLET_RE.match(line) or not items:
            items.append(_BULLET_RE.sub("", line).strip())
        else:
            items[-1] = f"{items[-1]} {line}"  # a wrapped continuation line
    cleaned = []
    for item in items:
        item = item.strip(" *_`\"'")
        if len(item) >= 3 and re.search(r"[A-Za-z]", item):
            cleaned.append(item[:MAX_ITEM_CHARS])
    return cleaned[:MAX_ITEMS]


def _from_json(text: str) -> Summary | None:
    start = text.find("{")  # the outermost object, found in linear time
    end = text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(text[start : end + 1])
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    keys = {re.sub(r"[\s_-]+", "", k.lower()): v for k, v in data.items() if isinstance(k, str)}

    def as_list(value) -> list[str]:
        if isinstance(value, str):
            return _items(value)
        if isinstance(value, list):
            return [str(v).strip()[:MAX_ITEM_CHARS] for v in value if str(v).strip()][:MAX_ITEMS]
        return []

    flow = keys.get("flowofthought") or keys.get("plan") or ""
    return Summary(
        str(flow).strip() if not isinstance(flow, list) else " ".join(map(str, flow)),
        as_list(keys.get("principles")),
        as_list(keys.get("pitfalls")),
    )


def parse_summary(text: str) -> Summary | None:
    """Parse a model-written summary into a :class:`Summary`, or ``None`` when it does not parse.

    Accepts the sections in any order, with plain, markdown (``##``, ``**``) or numbered headings, bullet or
    numbered items, and JSON objects. A summary parses when it has at least one principle or pitfall.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.replace("\r\n", "\n").split("\n"):
        heading = _heading(line)
        if heading is not None and heading[0] not in sections:
            current = heading[0]
            sections[current] = [heading[1]] if heading[1] else []
        elif current is not None:
            sections[current].append(line)
    summary = Summary(
        flow_of_thought=" ".join(_items("\n".join(sections.get("flow_of_thought", []))))[:1000],
        principles=_items("\n".join(sections.get("principles", []))),
        pitfalls=_items("\n".join(sections.get("pitfalls", []))),
    )
    if not (summary.principles or summary.pitfalls):
        parsed = _from_json(text)
        if parsed is None or not (parsed.principles or parsed.pitfalls):
            return None
        summary = parsed
    return summary


def format_summary(summary: Summary) -> str:
    """The canonical text of a summary: what SFT teaches a model to write, and what the parser reads best."""
    lines = [f"{SUMMARY_PREFILL} {summary.flow_of_thought}".rstrip(), "PRINCIPLES:"]
    lines += [f"- {p}" for p in summary.principles]
    lines.append("PITFALLS:")
    lines += [f"- {p}" for p in summary.pitfalls]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# LLM-judged relevance

RELEVANCE_TEMPLATE = """Problem:
{problem}

Lessons from another problem:
{lessons}

Would these lessons help to solve the problem above? Answer with Yes or No."""


def relevance_messages(problem: str, principles: list[str], pitfalls: list[str]) -> Messages:
    lessons = "\n".join([f"- {p}" for p in principles] + [f"- Avoid: {p}" for p in pitfalls])
    return user(RELEVANCE_TEMPLATE.format(problem=problem.strip(), lessons=lessons))


# ---------------------------------------------------------------------------------------------------------------
# Privileged feedback (lanpo.feedback.privileged): built from a worked solution or the gold answer, shown during
# training only. Unlike the templates above these say what is right: they are the field's hint formats.

# GHPO's wording for a solution prefix (UFT and QuestA show the same thing under other headings).
REFERENCE_TEMPLATE = """{problem}

The following text is the beginning part of the answer, which you can refer to for solving the problem:
{prefix}

{instruction}"""


def reference_messages(problem: str, prefix: str) -> Messages:
    """A solution prefix after the problem (GHPO, UFT, QuestA)."""
    return user(
        REFERENCE_TEMPLATE.format(
            problem=problem.strip(), prefix=prefix.strip(), instruction=domain_of(problem).instruction
        )
    )


# Critique-GRPO's simple_gt critique, after the model's own attempt.
GOLD_TEMPLATE = """Problem:
{problem}

Below is an earlier solution to this problem.

### Earlier solution
{attempt}

Critique: The generated solution is {verdict}, {truth}.

Solve the problem again from the start, writing a complete solution. {instruction}"""


def gold_messages(problem: str, attempt: str, truth: str, correct: bool) -> Messages:
    """The model's attempt, the critique "the generated solution is (in)correct, {truth}" (``truth``: "the ground
    truth is X", :func:`lanpo.feedback.privileged.ground_truth`), and a request to solve again (Critique-GRPO's
    ``simple_gt``)."""
    return user(
        GOLD_TEMPLATE.format(
            problem=problem.strip(),
            attempt=clip(attempt),
            verdict="correct" if correct else "incorrect",
            truth=truth.strip(),
            instruction=domain_of(problem).instruction,
        )
    )


# SAGE's self-hinting: the policy, shown the reference solution, writes a hint at a level that must not give away
# the final answer. Levels grow from a nudge to an outline.
HINT_STRENGTHS = {
    1: "a one-sentence hint that names the method to use",
    2: "a short hint that names the key steps, in order",
    3: "a detailed hint that outlines every step but the last calculation",
}

SELF_HINT_TEMPLATE = """Problem:
{problem}

Reference solution:
{solution}

Write {strength}, to help a student solve the problem on their own. Do not state the final answer or the final \
result in any form. Write only the hint, after "Hint:"."""

HINT_PREFILL = "Hint:"


def self_hint_messages(problem: str, solution: str, level: int) -> Messages:
    """The request for a hint at ``level`` (1 to 3), its reply prefilled with ``Hint:``."""
    strength = HINT_STRENGTHS[max(1, min(level, max(HINT_STRENGTHS)))]
    text = SELF_HINT_TEMPLATE.format(problem=problem.strip(), solution=clip(solution), strength=strength)
    return [*user(text), {"role": "assistant", "content": HINT_PREFILL}]


MAX_HINT_CHARS = 600


def parse_hint(text: str) -> str | None:
    """The hint a model wrote after ``Hint:``: its first paragraph, or None when it holds no sentence (fewer than
    three words of letters) or runs past :data:`MAX_HINT_CHARS`."""
    if not isinstance(text, str):
        return None
    body = text.strip()
    if body.lower().startswith(HINT_PREFILL.lower()):
        body = body[len(HINT_PREFILL) :].strip()
    body = re.split(r"\n\s*\n", body, maxsplit=1)[0].strip()
    if len(re.findall(r"[A-Za-z]{2,}", body)) < 3 or len(body) > MAX_HINT_CHARS:
        return None
    return body


# QuestA's heading for a hint after the problem.
HINTED_TEMPLATE = """{problem}

## Hint.
{hint}

{instruction}"""


def hinted_messages(problem: str, hint: str) -> Messages:
    """The problem with a hint after it (QuestA's ``## Hint.``)."""
    return user(
        HINTED_TEMPLATE.format(problem=problem.strip(), hint=hint.strip(), instruction=domain_of(problem).instruction)
    )


# The scoring route (lanpo.score): what a teacher reads a plain rollout under. Only the shown part differs between a
# row's context and its wrong twins (another problem's answer or right rollout), so the style of a context cancels.
# Execution feedback (code): the model's attempt and what running it on the examples its problem shows did
# (lanpo.feedback.execution); the hidden tests are never run for it, and nothing of them is said.
EXECUTION_TEMPLATE = """Problem:
{problem}

Below is an earlier attempt at this problem, and what happened when it was run on the examples the problem shows.

### Earlier attempt
{attempt}

### Running it on the examples
{report}

First, explain what in the attempt caused what the run shows. Then write the function again from the start, \
fixing it. {instruction}"""


def execution_messages(problem: str, attempt: str, report: str) -> Messages:
    """The model's attempt and its execution report on the problem's public examples, and a request to fix it."""
    return user(
        EXECUTION_TEMPLATE.format(
            problem=problem.strip(),
            attempt=clip(attempt),
            report=report.strip(),
            instruction=domain_of(problem).instruction,
        )
    )


SCORE_GOLD_TEMPLATE = """{problem}

A note for solving it: {shown}.

{instruction}"""

SCORE_SIBLING_TEMPLATE = """{problem}

Below is a correct solution to this problem.

### Correct solution
{shown}

Solve the problem again from the start, writing a complete solution. {instruction}"""

# The scored row is the attempt the report is about: the context holds the report alone (SDPO's environment
# feedback), never the attempt's text, so the teacher cannot simply copy it.
SCORE_EXECUTION_TEMPLATE = """{problem}

An earlier attempt at this function was run on the examples the problem shows:
{shown}

Write the function again from the start, fixing what the run shows. {instruction}"""


def scoring_messages(source: str, problem: str, shown: str) -> Messages:
    """A scoring context of ``source`` gold (``shown``: "the ground truth is X"), sibling (``shown``: a right
    rollout of the group) or execution (``shown``: what the scored attempt did on the public examples); the
    reference source shows its prefix in :func:`reference_messages`' template."""
    template = {"gold": SCORE_GOLD_TEMPLATE, "sibling": SCORE_SIBLING_TEMPLATE, "execution": SCORE_EXECUTION_TEMPLATE}[
        source
    ]
    return user(
        template.format(problem=problem.strip(), shown=shown.strip(), instruction=domain_of(problem).instruction)
    )
