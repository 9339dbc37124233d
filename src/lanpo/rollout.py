"""One LANPO generation batch, top to bottom: plan each group, build feedback contexts, generate, pick trials.

A batch holds whole groups of G rows of one problem each. Per group (:func:`plan_group`):

1. **scratch** rows get the plain prompt;
2. **abstraction** rows get principles and pitfalls of pool entries of *other* problems that pass the
   relevance filter γ (one retrieval per group); no entry passes → plain prompt (a fallback, counted);
3. **reflection** rows get the model's own earlier attempt at the same problem, ungraded: attempts stored in
   earlier steps (``reflection_source="pool"``: they join the first phase), this step's scratch rollouts
   (``"step"``: a second generation phase), or stored attempts where the problem has some and this step's
   otherwise (``"auto"``, the default: only groups without stored attempts wait for a second phase); none →
   plain prompt (counted).

Phase A generates scratch, abstraction (and pool-reflection) rows together with the summary prompts of earlier
trials, so summaries cost no sequential generation of their own. A summary has its own length limit
(``summary_max_length``): one that has not ended when the rollouts' limit cuts it rides again in the next step's
batch, continuing from the tokens it has (:func:`continue_summaries`; summaries are never trained on, so writing
them across a policy update is harmless). Phase B generates step-reflection rows. Nothing here imports TRL: the
model is reached through the callables of :class:`RolloutModel`.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from lanpo.feedback import build_abstraction_prompt, build_reflection_prompt
from lanpo.pool.retrieval import Retriever
from lanpo.pool.store import Attempt, ExperiencePool
from lanpo.prompts import Messages, clip, with_prefill
from lanpo.summarize import Trial, summary_prompt

FEEDBACK_KINDS = ("reflection", "abstraction")


class GroupPlan(NamedTuple):
    """How many rows of a group of G each kind gets."""

    scratch: int
    reflection: int
    abstraction: int

    @property
    def feedback(self) -> int:
        return self.reflection + self.abstraction


def plan_group(g: int, feedback_ratio: float, reflection_share: float) -> GroupPlan:
    """The rows of a group of ``g`` by kind: round(p_t·g) get feedback (half up)."""
    feedback = int(feedback_ratio * g + 0.5)
    reflection = int(feedback * reflection_share + 0.5)
    return GroupPlan(g - feedback, reflection, feedback - reflection)


@dataclass
class Row:
    """What lanpo knows about one rollout row of the current generation batch."""

    problem_id: str
    problem: str
    gold: str
    kind: str = "scratch"  # scratch | reflection | abstraction (what the plan asked for)
    context: Messages | None = None  # the feedback prompt actually used (None: plain prompt)
    fallback: str = ""  # why a planned feedback row got the plain prompt (no_attempt, no_relevant_entry, ...)
    completion_ids: list[int] = field(default_factory=list)
    text: str = ""
    plain_ids: list[int] = field(default_factory=list)
    context_ids: list[int] | None = None
    sampler_logps: list[float] | None = None  # per completion token, as the sampler drew it (strip mode's π(y|x,c))
    retrieved: list[dict] = field(default_factory=list)  # abstraction rows: the pool entries that passed γ
    triggered: bool | None = None  # feedback_trigger unsolved: whether its group failed from scratch (None: always)
    truncated: bool = False  # its completion reached its length limit without ending

    @property
    def has_feedback(self) -> bool:
        return self.context is not None


@dataclass
class RolloutModel:
    """What a rollout needs from the policy, as plain callables (the trainer wires in TRL's)."""

    tokenize: Callable[[list[Messages]], list[list[int]]]  # solve and feedback prompts → prompt ids
    tokenize_summary: Callable[[Messages], list[int]]  # a prefilled summary prompt → prompt ids
    generate_ids: Callable[[list[list[int]]], tuple[list[list[int]], list | None]]  # one completion per row
    decode: Callable[[list[int]], str]
    summary_ids: Callable[[list[list[int]]], list[list[int]]] | None = None  # summaries apart, their own length
    summary_max_length: int | None = None  # a summary ends here at the latest
    max_new_tokens: int | None = None  # generate_ids' length limit: a shorter completion has ended
    stop_ids: frozenset[int] = frozenset()  # end-of-sequence tokens
    feedback_ids: Callable[[list[list[int]]], tuple[list[list[int]], list | None]] | None = None  # feedback rows'
    # own length limit (None: generated with the rest, at generate_ids' limit)
    score: Callable[[list[Row]], list[bool]] | None = None  # feedback_trigger unsolved: which rows are right


def problem_of(row: dict) -> tuple[str, str]:
    """``(problem_id, problem)`` of a dataset row: its own columns, else derived from the prompt."""
    problem = row.get("problem")
    if not problem:
        prompt = row["prompt"]
        problem = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    problem_id = row.get("problem_id") or "h-" + hashlib.sha1(problem.encode()).hexdigest()[:12]
    return str(problem_id), str(problem)


def make_rows(inputs: Sequence[dict], g: int, plan: GroupPlan | tuple[int, int, int] | None = None) -> list[Row]:
    """One :class:`Row` per input, kinds assigned by ``plan`` within each group of ``g`` (``None``: all scratch)."""
    plan = GroupPlan(*plan) if plan is not None else None
    rows = []
    for i, item in enumerate(inputs):
        pid, problem = problem_of(item)
        kind = "scratch"
        if plan is not None:
            j = i % g
            kind = (
                "scratch" if j < plan.scratch else "reflection" if j < plan.scratch + plan.reflection else "abstraction"
            )
        rows.append(Row(pid, problem, str(item["answer"]), kind))
    return rows


def attach_abstractions(
    rows: list[Row], g: int, retriever: Retriever, counts: Counter, judge: AbstractContextManager | None = None
) -> None:
    """Give abstraction rows their context: one retrieval per group that has any (none passing γ: plain)."""
    groups = [s for s in range(0, len(rows), g) if any(r.kind == "abstraction" for r in rows[s : s + g])]
    if not groups:
        return
    with judge or nullcontext():
        found = retriever.retrieve_many([(rows[s].problem_id, rows[s].problem) for s in groups])
    for s, hits in zip(groups, found):
        result = build_abstraction_prompt(rows[s].problem, [h.entry for h in hits], problem_id=rows[s].problem_id)
        counts["lessons_dropped"] += sum(n for reason, n in result.dropped_lessons.items() if reason != "same_problem")
        shown = [{"entry_id": h.entry.id, "relevance": round(float(h.relevance), 4)} for h in hits]
        for row in rows[s : s + g]:
            if row.kind == "abstraction":
                row.context, row.fallback, row.retrieved = result.messages, result.reason, shown


def attach_reflections(group: list[Row], attempts: list[str], pool: ExperiencePool) -> None:
    """Give a group's reflection rows their contexts: ``attempts``, else the problem's attempts in the pool."""
    reflecting = [r for r in group if r.kind == "reflection"]
    if not reflecting:
        return
    if not attempts:
        attempts = [a.text for a in pool.attempts(group[0].problem_id) if a.text.strip()]
    for j, row in enumerate(reflecting):
        result = build_reflection_prompt(row.problem, [attempts[j % len(attempts)]] if attempts else [])
        row.context, row.fallback = result.messages, result.reason


def _tokenize_contexts(model: RolloutModel, rows: list[Row]) -> None:
    with_context = [r for r in rows if r.context is not None]
    if with_context:
        for row, ids in zip(with_context, model.tokenize([r.context for r in with_context])):
            row.context_ids = ids


def _generate(
    model: RolloutModel, rows: list[Row], extra: list[list[int]], index: list[int], feedback: bool = False
) -> list[list[int]]:
    """Generate the rows at ``index`` (their context, else plain prompt) plus ``extra`` prompts in one batch
    (``feedback``: with the feedback rows' own length limit, where one is set)."""
    generate = model.feedback_ids if feedback and model.feedback_ids is not None else model.generate_ids
    completions, sampled = generate([rows[i].context_ids or rows[i].plain_ids for i in index] + extra)
    for k, i in enumerate(index):
        rows[i].completion_ids = completions[k]
        rows[i].text = model.decode(completions[k])
        if sampled is not None:
            rows[i].sampler_logps = sampled[k]
    return completions[len(index) :]


def lanpo_rollout(
    rows: list[Row],
    plain_ids: list[list[int]],
    g: int,
    model: RolloutModel,
    *,
    retriever: Retriever,
    pool: ExperiencePool,
    reflection_source: str,
    keep_context: bool,
    pending: list[Trial],
    timer: Counter,
    counts: Counter,
    judge: AbstractContextManager | None = None,
) -> tuple[dict[str, Any], list[tuple[Trial, str]], list[Trial]]:
    """Generate one completion per row; returns TRL's rollout output, the summaries that ended as ``(trial, text)``
    and the trials whose summaries go on in the next batch."""
    start = time.perf_counter()
    attach_abstractions(rows, g, retriever, counts, judge)
    for row, ids in zip(rows, plain_ids):
        row.plain_ids = ids
    deferred = set()  # groups whose reflection rows wait for this step's scratch attempts (phase B)
    for s in range(0, len(rows), g):
        if any(r.kind == "reflection" for r in rows[s : s + g]):
            stored = reflection_source != "step" and bool(pool.attempts(rows[s].problem_id, limit=1))
            if stored or reflection_source == "pool":  # the context is known now: these rows join phase A
                attach_reflections(rows[s : s + g], [], pool)
            else:
                deferred.add(s)
    timer["retrieve"] += time.perf_counter() - start

    phase_a = [i for i, r in enumerate(rows) if r.kind != "reflection" or i - i % g not in deferred]
    _tokenize_contexts(model, [rows[i] for i in phase_a])
    if model.feedback_ids is not None:  # feedback rows have their own length limit: a generation of their own
        apart = [i for i in phase_a if rows[i].has_feedback]
        phase_a = [i for i in phase_a if not rows[i].has_feedback]
        if apart:
            start = time.perf_counter()
            _generate(model, rows, [], apart, feedback=True)
            timer["generate"] += time.perf_counter() - start
    start = time.perf_counter()
    summaries = _generate(model, rows, [_summary_input(model, t) for t in pending], phase_a)
    elapsed = time.perf_counter() - start
    rollout_tokens = sum(len(rows[i].completion_ids) for i in phase_a)
    share = sum(len(c) for c in summaries) / max(1, rollout_tokens + sum(len(c) for c in summaries))
    timer["generate"] += elapsed * (1 - share)
    timer["summarize"] += elapsed * share  # token-share estimate: summaries ride in this batch
    finished, carried = continue_summaries(model, pending, summaries)

    phase_b = [i for i, r in enumerate(rows) if r.kind == "reflection" and i - i % g in deferred]
    if phase_b:  # reward-agnostic reflection on this step's scratch attempts at the same problem
        start = time.perf_counter()
        for s in sorted(deferred):
            group = rows[s : s + g]
            attach_reflections(group, [r.text for r in group if r.kind == "scratch" and r.text.strip()], pool)
        _tokenize_contexts(model, [rows[i] for i in phase_b])
        timer["retrieve"] += time.perf_counter() - start
        start = time.perf_counter()
        _generate(model, rows, [], phase_b, feedback=True)
        timer["generate"] += time.perf_counter() - start
    return _output(rows, keep_context), finished, carried


def _output(rows: list[Row], keep_context: bool) -> dict[str, Any]:
    """TRL's rollout output: one prompt and completion per row (the sampler's log-probabilities when it gave
    every row's)."""
    return {
        "prompt_ids": [(r.context_ids if keep_context and r.context_ids is not None else r.plain_ids) for r in rows],
        "completion_ids": [r.completion_ids for r in rows],
        "logprobs": [r.sampler_logps for r in rows] if all(r.sampler_logps is not None for r in rows) else None,
        "lanpo_kind": [r.kind if r.has_feedback else "scratch" for r in rows],
    }


def unsolved_rollout(
    rows: list[Row],
    plain_ids: list[list[int]],
    g: int,
    model: RolloutModel,
    *,
    plan: GroupPlan,
    pass_rate: float,
    retriever: Retriever,
    pool: ExperiencePool,
    keep_context: bool,
    pending: list[Trial],
    timer: Counter,
    counts: Counter,
    judge: AbstractContextManager | None = None,
) -> tuple[dict[str, Any], list[tuple[Trial, str]], list[Trial]]:
    """``feedback_trigger="unsolved"``: feedback only where plain rollouts give GRPO no signal.

    Phase A is GRPO's rollout: every row from its plain prompt (with the summaries riding along). A group whose
    pass rate is at most ``pass_rate`` is triggered: ``plan.feedback`` of its failed rows (as many as failed,
    if fewer) are planned as feedback, ``plan.reflection`` of them reflections on the group's own failed
    attempts (so the context shows an attempt known to be wrong: reward information, unlike ``always``), the
    rest abstractions, and phase B regenerates them with their contexts. A planned row whose context cannot be
    built keeps its scratch completion (a fallback, counted). Groups that solve the problem get no feedback.
    """
    for row, ids in zip(rows, plain_ids):
        row.kind, row.plain_ids = "scratch", ids
    start = time.perf_counter()
    summaries = _generate(model, rows, [_summary_input(model, t) for t in pending], list(range(len(rows))))
    timer["generate"] += time.perf_counter() - start
    finished, carried = continue_summaries(model, pending, summaries)
    right = model.score(rows)
    attempts: dict[int, list[str]] = {}
    for s in range(0, len(rows), g):
        group = range(s, s + g)
        triggered = sum(right[i] for i in group) <= pass_rate * g
        for i in group:
            rows[i].triggered = triggered
        if not triggered or plan.feedback == 0:
            continue
        failed = [i for i in group if not right[i]]
        chosen = failed[: plan.feedback]
        reflections = round(len(chosen) * plan.reflection / plan.feedback)
        for k, i in enumerate(chosen):
            rows[i].kind = "reflection" if k < reflections else "abstraction"
        attempts[s] = [rows[i].text for i in failed if rows[i].text.strip()]
    start = time.perf_counter()
    attach_abstractions(rows, g, retriever, counts, judge)
    for s, texts in attempts.items():
        attach_reflections(rows[s : s + g], texts, pool)
    phase_b = [i for i, r in enumerate(rows) if r.has_feedback]
    _tokenize_contexts(model, [rows[i] for i in phase_b])
    timer["retrieve"] += time.perf_counter() - start
    if phase_b:
        start = time.perf_counter()
        _generate(model, rows, [], phase_b, feedback=True)
        timer["generate"] += time.perf_counter() - start
    return _output(rows, keep_context), finished, carried


def _summary_input(model: RolloutModel, trial: Trial) -> list[int]:
    return model.tokenize_summary(summary_prompt(trial)) + trial.summary_ids


def _summary_text(model: RolloutModel, trial: Trial) -> str:
    return with_prefill(summary_prompt(trial), model.decode(trial.summary_ids))


def continue_summaries(
    model: RolloutModel, pending: list[Trial], completions: list[list[int]], final: bool = False
) -> tuple[list[tuple[Trial, str]], list[Trial]]:
    """Append each trial's new tokens to its summary (cut at ``summary_max_length``); ``(finished (trial, text),
    carried)``: a summary has finished at an end-of-sequence token, at its limit, or when a completion stopped
    short of the generation's limit; the others are carried to the next batch (``final``: none is)."""
    limit, finished, carried = model.summary_max_length, [], []
    for trial, new in zip(pending, completions):
        trial.summary_ids = (trial.summary_ids + list(new))[:limit]
        stopped = not new or new[-1] in model.stop_ids or len(new) < (model.max_new_tokens or 0)
        if final or stopped or limit is None or len(trial.summary_ids) >= limit:
            finished.append((trial, _summary_text(model, trial)))
        else:
            carried.append(trial)
    return finished, carried


def summarize_apart(model: RolloutModel, pending: list[Trial]) -> list[str]:
    """The rest of ``pending``'s summaries, generated in a batch of their own (with their own length limit where
    the model has :attr:`RolloutModel.summary_ids`)."""
    ids = [_summary_input(model, t) for t in pending]
    completions = model.summary_ids(ids) if model.summary_ids else model.generate_ids(ids)[0]
    return [text for _, text in continue_summaries(model, pending, completions, final=True)[0]]


def choose_trials(
    rows: list[Row], rewards: Sequence[float], correct: Sequence[bool], g: int, budget: int, step: int, rank: int = 0
) -> list[Trial]:
    """Per group, up to ``budget`` trials to summarize: right and wrong ones alternate when both exist."""
    trials = []
    for s in range(0, len(rows) if budget else 0, g):
        idx = [i for i in range(s, s + g) if rows[i].text.strip()]
        right = [i for i in idx if correct[i]]
        wrong = [i for i in idx if not correct[i]]
        order = [x for pair in zip(right, wrong) for x in pair] + right[len(wrong) :] + wrong[len(right) :]
        for i in order[:budget]:
            r = rows[i]
            trials.append(
                Trial(
                    r.problem_id,
                    r.problem,
                    r.text,
                    bool(correct[i]),
                    gold=r.gold,
                    reward=float(rewards[i]),
                    step=step,
                    rollout_id=f"{step}:{rank}:{i}",
                )
            )
    return trials


def attempts_to_store(rows: list[Row], step: int) -> list[Attempt]:
    """Rollouts from the plain prompt become stored attempts (text only, no grade) for later reflection: scratch
    rows, and feedback rows that fell back to the plain prompt (at p_t 1.0 the only attempts a problem gets)."""
    return [
        Attempt(r.problem_id, r.problem, clip(r.text), step=step) for r in rows if not r.has_feedback and r.text.strip()
    ]
