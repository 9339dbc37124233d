"""Distill trials into pool entries with any generate function (the policy, a frozen model, a stub).

A trial's summary may mention whether the trial was right (the entry is only ever shown to other problems),
but lessons that state the trial's own final answer are dropped, so no entry carries a solution.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from lanpo.engine.generation import GenerateFn
from lanpo.feedback import clean_lessons
from lanpo.pool.store import PoolEntry
from lanpo.prompts import Messages, parse_summary, summary_messages
from lanpo.verify.answers import extract_answer


@dataclass
class Trial:
    """One rollout to summarize. ``gold`` is used only to scrub answers from the lessons."""

    problem_id: str
    problem: str
    completion: str
    correct: bool
    gold: str | None = None
    reward: float | None = None
    step: int = 0
    rollout_id: str = ""
    summary_ids: list[int] = field(default_factory=list)  # the summary written so far (it may span generations)


def summary_prompt(trial: Trial) -> Messages:
    return summary_messages(trial.problem, trial.completion, trial.correct)


def entry_from_summary(trial: Trial, text: str, stats: Counter | None = None) -> PoolEntry | None:
    """Parse one generated summary into a pool entry; ``None`` (counted in ``stats``) when unusable."""
    stats = stats if stats is not None else Counter()
    summary = parse_summary(text)
    if summary is None:
        stats["parse_failed"] += 1
        return None
    answers = [trial.gold, extract_answer(trial.completion, "lenient", trial.problem)]
    principles, d1 = clean_lessons(summary.principles, answers)
    pitfalls, d2 = clean_lessons(summary.pitfalls, answers)
    for reason, n in (d1 + d2).items():
        stats["lessons_dropped"] += n
        stats[f"lessons_dropped:{reason}"] += n
    if not (principles or pitfalls):
        stats["empty_after_cleaning"] += 1
        return None
    stats["parsed"] += 1
    return PoolEntry(
        problem_id=trial.problem_id,
        problem=trial.problem,
        flow_of_thought=summary.flow_of_thought,
        principles=principles,
        pitfalls=pitfalls,
        step=trial.step,
        rollout_ids=[trial.rollout_id] if trial.rollout_id else [],
        correct=trial.correct,
        reward=trial.reward,
        model_step=trial.step,
    )


def summarize_trials(trials: Sequence[Trial], generate: GenerateFn, stats: Counter | None = None) -> list[PoolEntry]:
    """Summarize trials in one batch. Unparseable outputs are counted in ``stats`` and skipped.

    ``generate`` returns whole replies (including the prefilled first heading, see ``prompts.with_prefill``).
    """
    stats = stats if stats is not None else Counter()
    if not trials:
        return []
    texts = generate([summary_prompt(t) for t in trials])
    if len(texts) != len(trials):
        raise RuntimeError(f"The generate function returned {len(texts)} texts for {len(trials)} prompts.")
    stats["requested"] += len(trials)
    entries = [entry_from_summary(t, text, stats) for t, text in zip(trials, texts)]
    return [e for e in entries if e is not None]
