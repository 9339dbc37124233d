"""One LANPO generation batch, top to bottom: the step's plan gives each group its rows by kind, the feedback sources
give feedback rows their contexts, the model generates, and trials are picked for summaries.

A batch holds whole groups of G rows of one problem each. Per group (:attr:`lanpo.plan.StepPlan.group`):

1. **scratch** rows get the plain prompt;
2. **feedback** rows get a context from the source of their kind (:mod:`lanpo.feedback`): **abstraction**,
   principles and pitfalls of pool entries of *other* problems that pass the relevance filter γ; **reflection**,
   the model's own earlier attempt at the same problem, ungraded. A context that cannot be built leaves the plain
   prompt (a fallback, counted).

``generation_rounds one`` (:func:`one_round_rollout`, the default): every row in one generation call, with the
summaries riding and the attempts at the next step's problems (:class:`Ahead`); contexts are built from what is known
before the call (stored attempts, the pool as it stands), and ``unsolved`` triggers on the verifier's scores of the
stored attempts (:func:`trigger_on_earlier`). ``generation_rounds phased``, the arrangement before:

``feedback_trigger always`` (:func:`lanpo_rollout`): phase A generates the scratch rows and every feedback row whose
context is ready, together with the summary prompts of earlier trials (:mod:`lanpo.summarize`: summaries ride along
and cost no sequential generation of their own) and, with ``reflection_source ahead``, plain attempts at the next
step's problems that have none stored (:class:`Ahead`: the next step's reflections are then ready); phase B
generates the rows whose source waited for this step's scratch attempts (reflection on this step's rollouts).
``unsolved`` (:func:`unsolved_rollout`): GRPO's rollout first, then feedback only for groups that failed, with the
summaries riding in that second phase (a step where every group solved its problem generates what GRPO's does).
Nothing here imports TRL: the model is reached through the callables of :class:`RolloutModel`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from lanpo.data.loaders import problem_of
from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource
from lanpo.plan import HINT_TOP, GroupPlan, StepPlan, is_privileged
from lanpo.pool.store import Attempt
from lanpo.prompts import Messages, clip
from lanpo.summarize import Trial, continue_summaries, summary_input
from lanpo.verify.sandbox import GoldKind


@dataclass
class Row:
    """What lanpo knows about one rollout row of the current generation batch."""

    problem_id: str
    problem: str
    gold: str
    kind: str = "scratch"  # scratch, or the feedback kind the plan asked for (lanpo.plan.KINDS)
    gold_kind: GoldKind = "math"  # what ``gold`` is: its data set's gold_kind column
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
    level: int | None = None  # privileged sources: the hint level its context carries
    shown_step: int | None = None  # the step whose model wrote the attempt its context shows (None: it shows none)

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
    feedback_max_new_tokens: int | None = None  # that limit, where feedback_ids is set
    limited_ids: Callable[[list[list[int]], list[int]], tuple[list[list[int]], list | None]] | None = None  # one
    # call, each row to its own limit (generation_rounds one, where feedback rows have a limit of their own)
    score: Callable[[list[Row]], list[bool]] | None = None  # feedback_trigger unsolved: which rows are right
    collective: bool = False  # every process must join every generation call (several processes: a call pads to
    # the widest process), so a process with nothing to generate still calls


def make_rows(inputs: Sequence[dict], g: int, plan: GroupPlan | None = None) -> list[Row]:
    """One :class:`Row` per input, kinds assigned by ``plan`` within each group of ``g`` (``None``: all scratch)."""
    return [
        Row(
            *problem_of(item),
            str(item["answer"]),
            plan.kind_of(i % g) if plan is not None else "scratch",
            gold_kind=item["gold_kind"],
        )
        for i, item in enumerate(inputs)
    ]


@dataclass
class Ahead:
    """A plain attempt at a problem of the next step, generated in this step's batch (``reflection_source ahead``):
    stored for reflection, never scored or trained on."""

    problem_id: str
    problem: str
    prompt_ids: list[int]
    text: str = ""


@dataclass
class StepContext:
    """What a step's rollout needs besides its rows and the model: the plan, the sources it asks, the summaries that
    ride along, and where it counts."""

    plan: StepPlan
    sources: Mapping[str, FeedbackSource]  # by row kind (lanpo.feedback.registry)
    pending: list[Trial] = field(default_factory=list)  # trials whose summaries ride in this batch
    timer: Counter = field(default_factory=Counter)  # seconds by part of the step
    counts: Counter = field(default_factory=Counter)  # this step's counters (lanpo/lessons_dropped, ...)
    ahead: list[Ahead] = field(default_factory=list)  # attempts at the next step's problems riding in phase A
    earlier: Callable[[str], Sequence[str]] | None = None  # a problem's stored attempts, newest first
    # (generation_rounds one, feedback_trigger unsolved: the trigger reads their verifier scores)


Waiting = set[tuple[int, str]]  # (a group's first row, a row kind) whose contexts wait for this step's attempts


def ask_sources(
    rows: list[Row],
    g: int,
    context: StepContext,
    *,
    attempts: Mapping[int, Sequence[str]] | None = None,
    only: Waiting | None = None,
    ready_only: bool = False,
) -> Waiting:
    """Give the feedback rows of each group their contexts, asking each source once for all its groups.

    ``attempts`` hands a group (by its first row) its own attempts; ``only`` limits the groups and kinds asked;
    ``ready_only`` leaves waiting those whose source needs this step's attempts (:meth:`FeedbackSource.ready`).
    Returns what was left waiting.
    """
    waiting: Waiting = set()
    scale = context.plan.hint_scale
    for kind, source in context.sources.items():
        asked = []
        for s in range(0, len(rows), g):
            wanted = [r for r in rows[s : s + g] if r.kind == kind]
            if not wanted or (only is not None and (s, kind) not in only):
                continue
            given = attempts.get(s) if attempts is not None else None
            own = None if given is None else tuple(given)
            request = FeedbackRequest(
                rows[s].problem_id, rows[s].problem, len(wanted), own, scale=scale, step=context.plan.step
            )
            if ready_only and not source.ready(request):
                waiting.add((s, kind))
            else:
                asked.append((wanted, request))
        if asked or (source.collective and only is None):  # collective work: every process asks it once
            _apply(asked, source.contexts([request for _, request in asked], context.counts))
    return waiting


def _apply(asked: list[tuple[list[Row], FeedbackRequest]], built: list[list[Feedback]]) -> None:
    for (wanted, _), contexts in zip(asked, built):
        for row, feedback in zip(wanted, contexts):
            row.context, row.fallback = feedback.messages, feedback.reason
            row.retrieved = list(feedback.retrieved)
            row.level = feedback.level
            row.shown_step = feedback.shown_step


def _tokenize_contexts(model: RolloutModel, rows: list[Row]) -> None:
    with_context = [r for r in rows if r.context is not None]
    if with_context:
        for row, ids in zip(with_context, model.tokenize([r.context for r in with_context])):
            row.context_ids = ids


def _generate(
    model: RolloutModel,
    rows: list[Row],
    extra: list[list[int]],
    index: list[int],
    feedback: bool = False,
    own_limits: bool = False,
) -> list[list[int]]:
    """Generate the rows at ``index`` (their context, else plain prompt) plus ``extra`` prompts in one batch
    (``feedback``: with the feedback rows' own length limit, where one is set; ``own_limits``: each feedback row to
    that limit and the rest to the rollouts', still in one call). Nothing to generate makes no call, unless the
    model's calls are collective: then this process joins the others' call with no rows of its own."""
    if not index and not extra and not model.collective:
        return []
    prompts = [rows[i].context_ids or rows[i].plain_ids for i in index] + extra
    if own_limits and model.limited_ids is not None and model.feedback_max_new_tokens is not None:
        limits = [model.feedback_max_new_tokens if rows[i].has_feedback else model.max_new_tokens for i in index]
        limits += [model.max_new_tokens] * len(extra)
        completions, sampled = model.limited_ids(prompts, limits)
    else:
        generate = model.feedback_ids if feedback and model.feedback_ids is not None else model.generate_ids
        completions, sampled = generate(prompts)
    for k, i in enumerate(index):
        rows[i].completion_ids = completions[k]
        rows[i].text = model.decode(completions[k])
        if sampled is not None:
            rows[i].sampler_logps = sampled[k]
    return completions[len(index) :]


@contextmanager
def _timed(timer: Counter, part: str) -> Iterator[None]:
    """Add the seconds of a ``with`` block to ``timer[part]``."""
    start = time.perf_counter()
    yield
    timer[part] += time.perf_counter() - start


def _generate_with_summaries(
    model: RolloutModel,
    rows: list[Row],
    pending: list[Trial],
    indices: list[int],
    timer: Counter,
    ahead: Sequence[Ahead] = (),
    own_limits: bool = False,
) -> list[list[int]]:
    """``rows[indices]`` generated with the pending summaries (and ``ahead``'s attempts, whose texts it sets) riding
    in the same batch (``own_limits``: feedback rows to their own limit, :func:`_generate`); the batch's seconds go
    to ``generate`` and ``summarize`` by their shares of its tokens (an estimate: they decode side by side)."""
    start = time.perf_counter()
    extra = [summary_input(model, t) for t in pending] + [a.prompt_ids for a in ahead]
    extra = _generate(model, rows, extra, indices, own_limits=own_limits)
    summaries, attempts = extra[: len(pending)], extra[len(pending) :]
    for attempt, ids in zip(ahead, attempts):
        attempt.text = model.decode(ids)
    elapsed = time.perf_counter() - start
    rollout_tokens = sum(len(rows[i].completion_ids) for i in indices) + sum(len(c) for c in attempts)
    summary_tokens = sum(len(c) for c in summaries)
    share = summary_tokens / max(1, rollout_tokens + summary_tokens)
    timer["generate"] += elapsed * (1 - share)
    timer["summarize"] += elapsed * share
    return summaries


def lanpo_rollout(
    rows: list[Row], plain_ids: list[list[int]], g: int, model: RolloutModel, context: StepContext
) -> tuple[dict[str, Any], list[tuple[Trial, str]], list[Trial]]:
    """Generate one completion per row; returns TRL's rollout output, the summaries that ended as ``(trial, text)``
    and the trials whose summaries go on in the next batch."""
    timer = context.timer
    with _timed(timer, "retrieve"):
        for row, ids in zip(rows, plain_ids):
            row.plain_ids = ids
        waiting = ask_sources(rows, g, context, ready_only=True)

    phase_a = [i for i, r in enumerate(rows) if (i - i % g, r.kind) not in waiting]
    _tokenize_contexts(model, [rows[i] for i in phase_a])
    if model.feedback_ids is not None:  # feedback rows have their own length limit: a generation of their own
        apart = [i for i in phase_a if rows[i].has_feedback]
        phase_a = [i for i in phase_a if not rows[i].has_feedback]
        with _timed(timer, "generate"):
            _generate(model, rows, [], apart, feedback=True)
    summaries = _generate_with_summaries(model, rows, context.pending, phase_a, timer, context.ahead)
    finished, carried = continue_summaries(model, context.pending, summaries)

    phase_b = [i for i, r in enumerate(rows) if (i - i % g, r.kind) in waiting]
    if phase_b:  # contexts on this step's scratch attempts at the same problem (reward-agnostic reflection)
        with _timed(timer, "retrieve"):
            groups = {s for s, _ in waiting}
            own = {s: [r.text for r in rows[s : s + g] if r.kind == "scratch" and r.text.strip()] for s in groups}
            ask_sources(rows, g, context, attempts=own, only=waiting)
            _tokenize_contexts(model, [rows[i] for i in phase_b])
    with _timed(timer, "generate"):  # every process calls: another one may have rows waiting
        _generate(model, rows, [], phase_b, feedback=True)
    escalate_hints(rows, g, model, context)
    return _output(rows, context.plan.objective.keeps_context), finished, carried


def one_round_rollout(
    rows: list[Row], plain_ids: list[list[int]], g: int, model: RolloutModel, context: StepContext
) -> tuple[dict[str, Any], list[tuple[Trial, str]], list[Trial]]:
    """``generation_rounds one``: every row of the step in one generation call, with the pending summaries and the
    attempts at the next step's problems (``context.ahead``) riding in it.

    Feedback contexts are built from what is known before the call: the newest stored attempt at the problem
    (written a step earlier where the trainer attempted it ahead, else at an earlier visit), the pool as it stands,
    what a stored attempt did on the problem's public examples (execution). A row whose source has nothing to show
    (a problem's first visit without an attempt ahead) goes plain with its fallback reason, never waits. Under
    ``feedback_trigger unsolved`` a group is triggered by the verifier's scores of the problem's stored attempts
    (:func:`trigger_on_earlier`), not by this step's. ``hint_escalation`` adds its own calls after this one."""
    timer = context.timer
    with _timed(timer, "retrieve"):
        for row, ids in zip(rows, plain_ids):
            row.plain_ids = ids
        if context.plan.trigger == "unsolved" and context.plan.has_feedback:
            trigger_on_earlier(rows, g, model, context)
        ask_sources(rows, g, context)
        _tokenize_contexts(model, rows)
    index = list(range(len(rows)))
    summaries = _generate_with_summaries(model, rows, context.pending, index, timer, context.ahead, own_limits=True)
    finished, carried = continue_summaries(model, context.pending, summaries)
    escalate_hints(rows, g, model, context)
    return _output(rows, context.plan.objective.keeps_context), finished, carried


def trigger_on_earlier(rows: list[Row], g: int, model: RolloutModel, context: StepContext) -> None:
    """``feedback_trigger unsolved`` in one call: a group is triggered where the verifier credits at most
    ``trigger_pass_rate`` of its problem's stored attempts (``context.earlier``: up to ``pool_attempts_cap``, written
    a step earlier where the trainer attempted the problem ahead, else at an earlier visit), and keeps its planned
    feedback rows; any other group is all scratch. Coarser than the phased trigger, which read the step's own G
    scratch rows: a handful of attempts, by an older policy. A group whose problem has no stored attempt cannot be
    judged: all scratch, counted as ``lanpo/trigger_no_attempt``. The scores decide the trigger only: the contexts
    are built from the attempts alone, whatever their scores (a source never sees one)."""
    for s in range(0, len(rows), g):
        group = rows[s : s + g]
        texts = [t for t in (context.earlier(group[0].problem_id) if context.earlier else ()) if t.strip()]
        probes = [
            Row(group[0].problem_id, group[0].problem, group[0].gold, gold_kind=group[0].gold_kind, text=t)
            for t in texts
        ]
        right = model.score(probes) if probes and model.score is not None else []
        triggered = bool(texts) and sum(right) <= context.plan.trigger_pass_rate * len(texts)
        if not texts:
            context.counts["trigger_no_attempt"] += 1
        for row in group:
            row.triggered = triggered
            if not triggered:
                row.kind = "scratch"


def escalate_hints(rows: list[Row], g: int, model: RolloutModel, context: StepContext) -> None:
    """``hint_escalation``: up to ``plan.hint_escalation`` rounds in which the hinted rows the verifier does not
    credit are re-generated with their source's next hint level (GHPO, SAGE: escalated within the step until a
    rollout succeeds); a row at the top level, or whose stronger context cannot be built, keeps its completion.
    Every process runs every round (a round with nothing to re-generate costs nothing on one process)."""
    sources = {kind: s for kind, s in context.sources.items() if s.leveled}
    if not sources or model.score is None:
        return
    for _ in range(context.plan.hint_escalation):
        hinted = [i for i, r in enumerate(rows) if r.has_feedback and r.level is not None and r.kind in sources]
        right = model.score([rows[i] for i in hinted]) if hinted else []
        failed: dict[tuple[int, str], list[int]] = {}
        for i, ok in zip(hinted, right):
            if not ok and rows[i].level < HINT_TOP:
                failed.setdefault((i - i % g, rows[i].kind), []).append(i)
        again = []
        with _timed(context.timer, "retrieve"):
            for kind, source in sources.items():
                groups = [index for (_, k), index in failed.items() if k == kind]
                if not groups and not source.collective:
                    continue
                requests = [
                    FeedbackRequest(
                        rows[index[0]].problem_id,
                        rows[index[0]].problem,
                        len(index),
                        level=rows[index[0]].level + 1,
                        scale=context.plan.hint_scale,
                    )
                    for index in groups
                ]
                for index, built in zip(groups, source.contexts(requests, context.counts)):
                    for i, feedback in zip(index, built):
                        if feedback.messages is not None:
                            rows[i].context, rows[i].level = feedback.messages, feedback.level
                            again.append(i)
            _tokenize_contexts(model, [rows[i] for i in again])
        context.counts["hint_escalated"] += len(again)
        with _timed(context.timer, "generate"):  # every process calls, with or without rows of its own
            _generate(model, rows, [], sorted(again), feedback=True)


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
    rows: list[Row], plain_ids: list[list[int]], g: int, model: RolloutModel, context: StepContext
) -> tuple[dict[str, Any], list[tuple[Trial, str]], list[Trial]]:
    """``feedback_trigger="unsolved"``: feedback only where plain rollouts give GRPO no signal.

    Phase A is GRPO's rollout: every row from its plain prompt (the summaries ride in phase B). A group whose
    pass rate is at most the plan's ``trigger_pass_rate`` is triggered: ``plan.group.feedback`` of its failed rows
    (as many as failed, if fewer) are planned as feedback, shared among the plan's kinds in its shares
    (:meth:`lanpo.plan.GroupPlan.split`; a reflection shows the group's own failed attempts, so the context shows
    an attempt known to be wrong: reward information, unlike ``always``), and phase B regenerates them with their
    contexts. A planned row whose
    context cannot be built keeps its scratch completion (a fallback, counted). Groups that solve the problem get
    no feedback.
    """
    plan = context.plan.group
    timer = context.timer
    for row, ids in zip(rows, plain_ids):
        row.kind = "scratch"
        row.plain_ids = ids
    pending = context.pending
    # The summaries ride in the feedback phase, which runs only where a group failed: on a step where none did they
    # wait, so such a step costs what GRPO's does, unless more wait than the batch has rows (then they ride in the
    # plain rollout, as they do where feedback rows have a length limit of their own).
    wait = model.feedback_ids is None and len(pending) <= len(rows)
    riding = [] if wait else pending
    summaries = _generate_with_summaries(model, rows, riding, list(range(len(rows))), timer)
    finished, carried = continue_summaries(model, riding, summaries)
    right = model.score(rows)
    attempts: dict[int, list[str]] = {}
    for s in range(0, len(rows), g):
        group = range(s, s + g)
        triggered = sum(right[i] for i in group) <= context.plan.trigger_pass_rate * g
        for i in group:
            rows[i].triggered = triggered
        if not triggered or plan.feedback == 0:
            continue
        failed = [i for i in group if not right[i]]
        chosen = failed[: plan.feedback]
        for i, kind in zip(chosen, plan.split(len(chosen))):  # the plan's kinds in its shares
            rows[i].kind = kind
        attempts[s] = [rows[i].text for i in failed if rows[i].text.strip()]
    with _timed(timer, "retrieve"):
        ask_sources(rows, g, context, attempts=attempts)
        phase_b = [i for i, r in enumerate(rows) if r.has_feedback]
        _tokenize_contexts(model, [rows[i] for i in phase_b])
    if wait and phase_b:
        summaries = _generate_with_summaries(model, rows, pending, phase_b, timer)
        finished, carried = continue_summaries(model, pending, summaries)
    else:
        with _timed(timer, "generate"):  # every process calls: another one's groups may have failed
            _generate(model, rows, [], phase_b, feedback=True)
        if wait:
            carried = list(pending)  # no feedback phase here: they wait for the next one
    escalate_hints(rows, g, model, context)
    return _output(rows, context.plan.objective.keeps_context), finished, carried


# The rollout of each feedback_trigger under generation_rounds phased (one: one_round_rollout for both).
ROLLOUTS = {"always": lanpo_rollout, "unsolved": unsolved_rollout}


def rollout_of(plan: StepPlan) -> Callable:
    """The rollout a step's plan asks for."""
    return one_round_rollout if plan.one_round else ROLLOUTS[plan.trigger]


def choose_trials(
    rows: list[Row], rewards: Sequence[float], correct: Sequence[bool], g: int, budget: int, step: int, rank: int = 0
) -> list[Trial]:
    """Per group, up to ``budget`` trials to summarize: right and wrong ones alternate when both exist. A row
    written under a privileged context (a solution's steps, the gold answer) is never summarized: what it copied
    would reach the pool's lessons."""
    trials = []
    for s in range(0, len(rows) if budget else 0, g):
        idx = [
            i
            for i in range(s, s + g)
            if rows[i].text.strip() and not (rows[i].has_feedback and is_privileged(rows[i].kind))
        ]
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
                    gold_kind=r.gold_kind,
                    step=step,
                    rollout_id=f"{step}:{rank}:{i}",
                )
            )
    return trials


def attempts_to_store(rows: list[Row], step: int, ahead: Sequence[Ahead] = ()) -> list[Attempt]:
    """Rollouts from the plain prompt become stored attempts (text only, no grade) for later reflection: scratch
    rows, feedback rows that fell back to the plain prompt (at p_t 1.0 the only attempts a problem gets), and the
    attempts at the next step's problems that rode in the batch (``ahead``)."""
    plain = [(r.problem_id, r.problem, r.text) for r in rows if not r.has_feedback]
    plain += [(a.problem_id, a.problem, a.text) for a in ahead]
    return [Attempt(pid, problem, clip(text), step=step) for pid, problem, text in plain if text.strip()]
