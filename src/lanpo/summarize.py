"""Distill trials into pool entries with any generate function (the policy, a frozen model, a stub).

A trial's summary may mention whether the trial was right (the entry is only ever shown to other problems),
but lessons that state the trial's own final answer are dropped, so no entry carries a solution.

During training a summary costs no generation of its own: its prompt rides in the next rollout batch, and one
that the rollouts' length limit cuts goes on in the batch after, from the tokens it has, until it ends or reaches
``summary_max_length`` (:func:`continue_summaries`; summaries are never trained on, so writing one across a policy
update is harmless). :func:`summarize_apart` finishes the rest in a batch of their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lanpo.engine.generation import GenerateFn
from lanpo.feedback.labels import clean_lessons
from lanpo.pool.store import PoolEntry
from lanpo.prompts import Messages, parse_summary, summary_messages, with_prefill
from lanpo.verify.answers import extract_answer
from lanpo.verify.sandbox import GoldKind


@dataclass
class Trial:
    """One rollout to summarize. ``gold`` is used only to scrub answers from the lessons."""

    problem_id: str
    problem: str
    completion: str
    correct: bool
    gold: str | None = None
    reward: float | None = None
    gold_kind: GoldKind = "math"  # what ``gold`` is (its data set's gold_kind)
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
    code = trial.gold_kind == "code"  # a code gold is a test suite: lessons that hold code go instead
    answers = ([] if code else [trial.gold]) + [extract_answer(trial.completion, "lenient", trial.problem)]
    principles, d1 = clean_lessons(summary.principles, answers, code)
    pitfalls, d2 = clean_lessons(summary.pitfalls, answers, code)
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


class SummaryModel(Protocol):
    """What writing summaries needs from the policy (``lanpo.rollout.RolloutModel`` has it)."""

    tokenize_summary: Callable[[Messages], list[int]]
    generate_ids: Callable[[list[list[int]]], tuple[list[list[int]], list | None]]
    decode: Callable[[list[int]], str]
    summary_ids: Callable[[list[list[int]]], list[list[int]]] | None
    summary_max_length: int | None
    max_new_tokens: int | None
    stop_ids: frozenset[int]


def summary_input(model: SummaryModel, trial: Trial) -> list[int]:
    return model.tokenize_summary(summary_prompt(trial)) + trial.summary_ids


def _summary_text(model: SummaryModel, trial: Trial) -> str:
    return with_prefill(summary_prompt(trial), model.decode(trial.summary_ids))


def continue_summaries(
    model: SummaryModel, pending: list[Trial], completions: list[list[int]], final: bool = False
) -> tuple[list[tuple[Trial, str]], list[Trial]]:
    """Append each trial's new tokens to its summary (cut at ``summary_max_length``); ``(finished (trial, text),
    carried)``: a summary has finished at an end-of-sequence token, at its limit, or when a completion stopped
    short of the generation's limit; the others are carried to the next batch (``final``: none is)."""
    limit = model.summary_max_length
    finished = []
    carried = []
    for trial, new in zip(pending, completions):
        trial.summary_ids = (trial.summary_ids + list(new))[:limit]
        stopped = not new or new[-1] in model.stop_ids or len(new) < (model.max_new_tokens or 0)
        if final or stopped or limit is None or len(trial.summary_ids) >= limit:
            finished.append((trial, _summary_text(model, trial)))
        else:
            carried.append(trial)
    return finished, carried


def summarize_apart(model: SummaryModel, pending: list[Trial]) -> list[str]:
    """The rest of ``pending``'s summaries, generated in a batch of their own (with their own length limit where
    the model has :attr:`SummaryModel.summary_ids`)."""
    ids = [summary_input(model, t) for t in pending]
    completions = model.summary_ids(ids) if model.summary_ids else model.generate_ids(ids)[0]
    return [text for _, text in continue_summaries(model, pending, completions, final=True)[0]]
