"""An after-the-fact leak audit for tests: does a context show a gold answer or a grade outside what it quotes?

The library never runs this on a context (a check against the gold would make the context depend on the label);
tests run it on what the library built, as an auditor would.
"""

from __future__ import annotations

from collections.abc import Sequence

from lanpo.feedback import LABEL_TALK
from lanpo.prompts import clip
from lanpo.verify.answers import mentions_answer


def leakage_problems(context: str, gold: str | None, allowed: Sequence[str] = ()) -> list[str]:
    """Reasons ``context`` leaks, after cutting out ``allowed`` texts (the problem, the model's own attempts)."""
    rest = context
    for text in sorted(allowed, key=len, reverse=True):
        for variant in {text, text.strip(), clip(text)}:
            if variant:
                rest = rest.replace(variant, " ")
    problems = []
    if gold is not None and str(gold).strip() and mentions_answer(rest, str(gold)):
        problems.append(f"states the gold answer {gold!r}")
    if marker := LABEL_TALK.search(rest):
        problems.append(f"talks about grades: {marker.group(0)!r}")
    return problems
