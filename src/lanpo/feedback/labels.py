"""What a feedback context may not say: label talk (verdicts, grades, reference answers) and lessons that state an
answer. A context that cannot be built is a :class:`Context` of ``None`` with a reason: the caller falls back to
the plain prompt and counts it, never an exception in the middle of a run.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from lanpo.prompts import Messages
from lanpo.verify.answers import mentions_answer

# Label talk: verdicts, grades and reference answers. A feedback template never says these about an attempt,
# and an SFT reflection example that says them is not kept (lanpo.commands.sft_data).
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

# A lesson that states an answer ("the answer is 3", "\boxed{3}") is a solution, not a principle.
ANSWER_STATEMENT = re.compile(r"\\boxed|\b(?:final\s+)?answers?\s*(?:is|was|are|were|=|:)", re.IGNORECASE)

# A lesson that holds code is a solution, not a principle ("check the empty list" is a lesson; ``return sum(xs)`` is
# not). CODE_STATEMENT is what no lesson of any domain writes in words: a fence, a definition, an import line.
CODE_STATEMENT = re.compile(r"```|\bdef\s+\w+\s*\(|^\s*(?:import|from\s+\S+\s+import)\s", re.MULTILINE)
# For a code problem's lessons (its gold a test suite) also the pieces of code a sentence can hold, which a math lesson
# may write in words ("return to the equation", "y = f(x)", "for every pair:", "\lambda: ..."): a return, a lambda,
# a comprehension, an assert, a slice, any assignment, a method call, a statement header ending in a colon.
CODE_DETAIL = re.compile(
    r"\breturn\s+\S|\blambda\b[^:]*:|\[[^\]]*\bfor\b[^\]]*\bin\b[^\]]*\]|\bassert\s+\S|\w\[[^\]]*:[^\]]*\]"
    r"|\b[A-Za-z_]\w*\s*(?:\+|-|\*|/|//|%)?=\s*[^=\s]|\b[A-Za-z_]\w*\.[A-Za-z_]\w*\("
    r"|\b(?:if|elif|else|for|while|with|try|except)\b[^\n]*:\s*$",
    re.MULTILINE,
)


def holds_code(text: str, strict: bool = False) -> bool:
    """Whether a lesson or hint holds code (``strict``: a code problem's, see :data:`CODE_DETAIL`)."""
    return bool(CODE_STATEMENT.search(text) or (strict and CODE_DETAIL.search(text)))


@dataclass
class Context:
    """A feedback prompt, or ``None`` with the reason it could not be built (the row falls back to scratch)."""

    messages: Messages | None
    reason: str = ""
    used_entries: list[int] = field(default_factory=list)
    dropped_lessons: Counter = field(default_factory=Counter)


def template_talks_about_labels(text: str, own_texts: Iterable[str]) -> bool:
    """Label talk in a context outside the texts it quotes (the problem, the model's own attempts)."""
    rest = text
    for quoted in sorted(own_texts, key=len, reverse=True):
        rest = rest.replace(quoted.strip(), " ")
    return bool(LABEL_TALK.search(rest))


def clean_lessons(
    items: Sequence[str], source_answers: Iterable[str] = (), code: bool = False
) -> tuple[list[str], Counter]:
    """Lessons fit to show another problem: none that states an answer, holds code, talks about grades, states one of
    ``source_answers`` (its own problem's gold and final answer) in any form, or is only an answer. ``code``: the
    lessons come from a code problem (its gold a test suite, not among ``source_answers``), and any lesson that holds
    code is dropped (:func:`holds_code` strict)."""
    kept = []
    dropped = Counter()
    answers = [a for a in source_answers if a is not None and str(a).strip()]
    for item in items:
        item = item.strip() if isinstance(item, str) else ""
        if not item:
            reason = "empty"
        elif ANSWER_STATEMENT.search(item):
            reason = "states_an_answer"
        elif holds_code(item, strict=code):
            reason = "holds_code"
        elif LABEL_TALK.search(item):
            reason = "label_talk"
        elif any(mentions_answer(item, a) for a in answers):
            reason = "states_its_answer"
        elif not re.search(r"[A-Za-z]{3,}", item):
            reason = "answer_only"
        else:
            kept.append(item)
            continue
        dropped[reason] += 1
    return kept, dropped
