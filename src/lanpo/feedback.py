"""Language feedback contexts, and the guard that keeps labels out of them.

* :func:`build_reflection_prompt` — **reward-agnostic reflection**: the model's own earlier attempt(s) at the
  same problem, with no reward, no correctness and no gold answer; it critiques them, then solves anew.
* :func:`build_abstraction_prompt` — **relevant abstraction**: principles and pitfalls of pool entries of
  *other* problems (never their solutions or final answers); it first analyzes which apply, then solves.

Both pass through :func:`leakage_problems`: outside the model's own attempts, a feedback context may not
contain the current problem's gold answer or any reward / correctness marker. Abstraction lessons that would
break the rule are dropped (and counted); a reflection context that breaks it raises, because nothing but a
bug in lanpo could put a label there.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .pool import PoolEntry
from .prompts import Messages, abstraction_text, clip, reflection_text, user


class LeakageError(RuntimeError):
    """A feedback context would have shown the model its label or a grade."""


# Label talk: verdicts, grades and reference answers. A feedback context never says these about an attempt
# (outside the model's own text), and an SFT reflection example that says them is not kept (lanpo.sft_data).
LABEL_TALK_PATTERNS = [
    r"\breward(?:s|ed)?\b",
    r"\bscore[sd]?\s*[:=]",
    r"\b(?:in)?correct(?:ness)?\s*[:=\]]",
    r"\[\s*(?:in)?correct\s*\]",
    r"\b(?:attempt|answer|solution|response)\s+(?:is|was|looks)\s+(?:in)?correct\b",
    r"\b(?:attempt|answer|solution|response)\s+(?:is|was)\s+(?:right|wrong)\b",
    r"\b(?:gold(?:en)?|ground[-\s]?truth|expected|reference|true)\s+answer\b",
    r"\bcorrect\s+answer\s+is\b",
    r"\bground[-\s]?truth\b",
    r"\bjudged\s+(?:in)?correct\b",
    r"\bverdict\b",
    r"\bpass(?:ed)?\s*/\s*fail(?:ed)?\b",
    "[\u2713\u2714\u2717\u2718\u2705\u274c]",
]
LABEL_TALK = re.compile("|".join(LABEL_TALK_PATTERNS), re.IGNORECASE)


def answer_forms(gold: str) -> list[str]:
    """Ways a gold answer could be written in text: as given, without ``$``/spaces, and numeric variants."""
    gold = str(gold).strip().strip("$").strip()
    forms = {gold, re.sub(r"\s+", "", gold)}
    plain = gold.replace(",", "")
    if re.fullmatch(r"-?\d+(?:\.\d+)?", plain):
        value = float(plain)
        forms |= {plain, f"{value:g}"}
        if value.is_integer():
            forms |= {str(int(value)), f"{int(value):,}"}
    return sorted((f for f in forms if f), key=len, reverse=True)


def _contains_answer(text: str, gold: str) -> bool:
    for form in answer_forms(gold):
        # A number must stand alone (7 is not inside 17 or 7.5); other answers match as written.
        if re.fullmatch(r"-?[\d,.]+", form):
            if re.search(rf"(?<![\d.,]){re.escape(form)}(?![\d]|[.,]\d)", text):
                return True
        elif form in text or form in re.sub(r"\s+", "", text):
            return True
    return False


def leakage_problems(context: str, gold: str | None, allowed: Sequence[str] = ()) -> list[str]:
    """Reasons a feedback context leaks (empty when it is safe).

    ``allowed`` texts are cut out first: the problem statement (every prompt shows it) and the model's own
    attempts (what the model wrote itself it may see again).
    """
    rest = context
    for text in sorted(allowed, key=len, reverse=True):
        for variant in {text, text.strip(), clip(text)}:
            if variant:
                rest = rest.replace(variant, " ")
    problems = []
    if gold is not None and str(gold).strip() and _contains_answer(rest, gold):
        problems.append(f"contains the gold answer {gold!r}")
    marker = LABEL_TALK.search(rest)
    if marker:
        problems.append(f"contains the grading marker {marker.group(0)!r}")
    return problems


def build_reflection_prompt(problem: str, own_attempts: Sequence[str], gold: str | None = None) -> Messages:
    """The reward-agnostic reflection prompt for ``problem`` given the model's own earlier attempt(s).

    ``gold`` is only used to *check* the context (pass it whenever it is known); it is never shown.
    """
    attempts = [a for a in own_attempts if a and a.strip()]
    text = reflection_text(problem, attempts)
    problems = leakage_problems(text, gold, [problem, *attempts])
    if problems:
        raise LeakageError(f"Reflection context for {problem[:60]!r} {'; '.join(problems)}.")
    return user(text)


@dataclass
class AbstractionResult:
    messages: Messages | None  # None when no lesson survived: the caller falls back to a plain prompt
    used_entries: list[int] = field(default_factory=list)
    dropped_lessons: int = 0


# A lesson that states an answer ("the answer is 3", "\boxed{3}") is a solution, not a principle: whatever
# problem it came from, it never reaches a prompt.
ANSWER_STATEMENT = re.compile(r"\\boxed|\b(?:final\s+)?answers?\s*(?:is|was|are|were|=|:)", re.IGNORECASE)


def clean_lessons(items: Sequence[str], gold: str | None) -> tuple[list[str], int]:
    """Keep lessons that state no answer (of any problem), no current gold answer and no grading marker."""
    kept, dropped = [], 0
    for item in items:
        item = item.strip()
        if not item or ANSWER_STATEMENT.search(item) or leakage_problems(item, gold):
            dropped += 1
            continue
        kept.append(item)
    return kept, dropped


def build_abstraction_prompt(problem: str, entries: Sequence[PoolEntry], gold: str | None = None,
                             problem_id: str | None = None) -> AbstractionResult:
    """The relevant-abstraction prompt: principles and pitfalls of entries from *other* problems.

    Entries of the same problem (``problem_id``) are refused outright; lessons that would show the current
    gold answer or a grade are dropped. Returns ``messages=None`` when nothing usable remains.
    """
    lessons, used, dropped = [], [], 0
    for entry in entries:
        if problem_id is not None and entry.problem_id == problem_id:
            raise LeakageError(f"Abstraction for {problem_id} was given an entry of the same problem.")
        principles, d1 = clean_lessons(entry.principles, gold)
        pitfalls, d2 = clean_lessons(entry.pitfalls, gold)
        dropped += d1 + d2
        if principles or pitfalls:
            lessons.append((principles, pitfalls))
            if entry.id is not None:
                used.append(entry.id)
    if not lessons:
        return AbstractionResult(None, [], dropped)
    text = abstraction_text(problem, lessons)
    problems = leakage_problems(text, gold, [problem])
    if problems:  # cannot happen after clean_lessons unless the template itself leaks
        raise LeakageError(f"Abstraction context for {problem[:60]!r} {'; '.join(problems)}.")
    return AbstractionResult(user(text), used, dropped)
