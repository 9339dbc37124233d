"""The metrics lanpo logs beside TRL's own: their names and meanings (:data:`METRICS`, the source of
docs/reference/metrics.md), and the per-step maths that turns a step's rows into them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from lanpo.plan import KINDS
from lanpo.rollout import Row

# Every metric lanpo logs beside TRL's own (`loss`, `reward`, `kl`, `entropy`, `completions/*`, `clip_ratio/*`,
# ...), with its meaning: docs/reference/metrics.md is generated from it, and a test checks that a run logs no
# lanpo metric missing here. ``<x>`` stands for a part that varies.
METRICS: dict[str, str] = {
    "lanpo/feedback_ratio": "p_t planned for this step (the schedule's value)",
    "lanpo/feedback_share": "realized p_t: share of rows generated with a feedback context",
    "lanpo/fallback_share": "share of rows planned as feedback that got the plain prompt",
    "lanpo/fallback/<reason>": "the same, by reason (no_attempt, no_relevant_entry, ...)",
    "lanpo/feedback_tokens_per_prompt": "tokens a feedback context added to a prompt, on average",
    "reward/<kind>/mean": "mean reward of rows of a kind: scratch, feedback, reflection, abstraction",
    "accuracy/<kind>/mean": "share of rows of a kind whose answer the verifier credits",
    "completions/truncated/<kind>": "share of scratch / feedback rows that reached their length limit",
    "lanpo/feedback_lift": "accuracy of feedback rows minus that of the scratch rows of the same groups",
    "pool/worth/shown_mean_lift": "mean lift (reward minus its group's scratch mean, shrunk) of the pool entries this "
    "step's abstraction rows were shown, as it stood when they were shown",
    "pool/worth/shown_helping_share": "of the entries this step's abstraction rows were shown, the share whose mean "
    "lift was above 0",
    "pool/worth/entries_judged": "pool entries credited with enough rows to judge (lanpo.pool.worth.MIN_USES)",
    "pool/worth/harmful": "of those, the entries whose upper bound of lift is below 0 (the lift ranking hides them)",
    "lanpo/feedback_lift/<kind>": "the same, for the feedback rows of one source (reflection, abstraction, reference, "
    "gold, self-hint)",
    "lanpo/transfer": "of the problems first solved only by a feedback row (no scratch row right before), the share "
    "a scratch row solved at a later step (this run so far)",
    "lanpo/transfer_problems": "problems first solved only by a feedback row, this run so far",
    "lanpo/hint_reliance": "strip family: mean over right feedback rows of mean per-token log pi(y|x,c) minus mean "
    "per-token log pi_old(y|x) (HiLL's reliance as an NLL gap; near 0: y would be written without the context)",
    "hint/level_mean": "reference, self-hint: mean hint level of the rows that carried one",
    "hint/accuracy/<level>": "reference, self-hint: share of rows right at a hint level (L1, L2, L3)",
    "hint/rows/<level>": "reference, self-hint: rows generated at a hint level",
    "hint/escalated": "hint_escalation: hinted rows re-generated a level up this step",
    "hint/self_hint_written": "self-hint: hints the policy wrote this step",
    "hint/self_hint_unparsed": "self-hint: hints that did not parse (their rows got the reference context)",
    "hint/self_hint_states_answer": "self-hint: hints dropped for stating the final answer (rows got the plain prompt)",
    "lanpo/all_fail_share": "share of groups in which every row failed (no reward signal but failure; every arm)",
    "lanpo/triggered_share": "feedback_trigger unsolved: share of groups triggered (generation_rounds one: the "
    "problem's stored attempts' pass rate at most feedback_trigger_pass_rate; phased: the step's scratch rows')",
    "lanpo/trigger_no_attempt": "feedback_trigger unsolved, generation_rounds one: groups whose problem had no stored "
    "attempt to score (all scratch)",
    "lanpo/rescued_share": "feedback_trigger unsolved: share of groups where a feedback row is right though "
    "every scratch row was wrong",
    "lanpo/rescue_rate": "feedback_trigger unsolved: rescued groups over triggered groups (steps with any)",
    "lanpo/ahead_attempts": "attempts at the next step's problems generated in this step's call (generation_rounds "
    "one, or reflection_source ahead)",
    "lanpo/generation_rounds": "calls into the generation engine this step (this process's), in order: on a GPU each "
    "costs about its longest row's decode steps, whatever its rows",
    "lanpo/round<k>/rows": "rows the step's k-th generation call generated (its rows, riding summaries and attempts)",
    "lanpo/round<k>/longest": "tokens of the longest completion of the step's k-th generation call",
    "lanpo/shown_attempt_age": "steps between the model that wrote an attempt a feedback row shows and the one shown "
    "it (generation_rounds one: 1 where attempted ahead, more from an earlier visit; phased: 0 on a first visit)",
    "lanpo/pool_size": "entries in the experience pool",
    "lanpo/pool_problems": "problems with at least one entry in the pool",
    "lanpo/lessons_dropped": "lessons left out of abstraction contexts (stating an answer, holding code, talking about "
    "grades)",
    "retrieval/hit_rate": "share of retrievals that found an entry over gamma",
    "retrieval/relevance_pass_rate": "share of scored candidates whose relevance reached gamma",
    "retrieval/candidates_per_query": "BM25 candidates scored per retrieval",
    "summaries/requested": "trials sent to be summarized",
    "summaries/parse_failures": "summaries that did not parse into principles and pitfalls",
    "summaries/parse_rate": "summaries that parsed, over those that ended",
    "summaries/added": "pool entries written this step",
    "summaries/carried": "summaries cut by the rollouts' length limit, going on in the next batch",
    "lanpo/strip_weight_mean": "strip / strip-sequence: mean importance weight on feedback tokens",
    "lanpo/strip_weight_clipped": "strip / strip-sequence: share of feedback tokens whose weight hit the clip",
    "score/delta_mean": "feedback_route score: mean signal on scored tokens (additive: the clipped log-ratio teacher "
    "over policy; contrastive: the kept residual)",
    "score/clip_fraction": "feedback_route score: share of scored tokens whose signal reached its bound",
    "score/answer_share": "feedback_route score: share of the signal's size on the tokens writing the final answer",
    "score/rows": "feedback_route score: rows the teacher scored this step",
    "lanpo/score_no_context": "feedback_route score: failed plain rows the teacher had no context for (no right "
    "sibling, no solution)",
    "eval/<benchmark>/transfer_gold": "feedback_route score: mean log-ratio of the teacher under the gold context over "
    "the policy, on the held-out rollouts (the teacher-student gap: it closes as the policy absorbs the context)",
    "kl/scratch": "KL estimate over scratch rows' tokens (TRL's k3: the policy's drift from the reference)",
    "kl/feedback": "KL estimate over feedback rows' tokens (importance-weighted k2 where sampled under a context)",
    "step_time": "seconds of the optimizer step, rollouts included",
    "time/<part>": "seconds of the step spent in generate, summarize, retrieve, reward, teacher, score, update",
    "verifier/no_answer_rate": "share of completions with no final answer",
    "verifier/hedged_rate": "share of completions that state several values (scored 0)",
    "verifier/timeouts": "answers whose verification ran past the time limit (scored 0)",
    "verifier/unreadable": "outputs one of lanpo's answer readers failed on (scored 0; the first of each error is "
    "logged with its text)",
    "code/<outcome>": "code problems: sandboxed runs this step that passed, failed, error (no such function, does "
    "not compile), timeout, crashed (a limit or a signal killed it, or it exited before its report), forged (a "
    "report that was not the runner's), no_code (nothing to extract)",
    "eval/<benchmark>/<mode>/mean@<k>": "held-out accuracy during training (eval_every); also _stderr, pass@<k>",
    "eval/<benchmark>/<mode>/pass@<k>": "held-out: share of problems with a right answer among k samples",
    "eval/<benchmark>/<mode>/context_rate": "retrieval mode: share of held-out prompts that got a context",
    "eval/seconds": "seconds one evaluation during training took",
}


def metric_pattern(name: str) -> str:
    """The METRICS key a logged name belongs to (``reward/scratch/mean`` → ``reward/<kind>/mean``)."""
    import re

    for key in METRICS:
        regex = "^" + re.sub(r"<[a-z]+>", "[^/]+", re.escape(key).replace(r"\<", "<").replace(r"\>", ">")) + "$"
        if re.match(regex, name):
            return key
    return ""


class RowRecord(NamedTuple):
    """What step metrics need of one row (small, so every process can gather every row's)."""

    kind: str  # what the plan asked for: scratch | reflection | abstraction
    has_feedback: bool  # whether it was generated with feedback (a planned one may have fallen back)
    reward: float
    correct: bool
    context_tokens: int  # how many tokens the feedback context added to the prompt
    fallback: str | None  # why planned feedback fell back to the plain prompt
    group: str = ""  # which group of G it belongs to (unique in a step over every process)
    triggered: bool | None = None  # feedback_trigger unsolved: its group failed from scratch (None: always)
    truncated: bool = False  # its completion reached its length limit
    problem_id: str = ""
    level: int | None = None  # privileged sources: the hint level its context carried


def row_record(row: Row, reward: float, correct: bool, group: str = "") -> RowRecord:
    extra = len(row.context_ids) - len(row.plain_ids) if row.context_ids is not None else 0
    return RowRecord(
        row.kind,
        row.has_feedback,
        float(reward),
        bool(correct),
        extra,
        row.fallback,
        group,
        row.triggered,
        row.truncated,
        row.problem_id,
        row.level if row.has_feedback else None,
    )


def feedback_metrics(records: Sequence[RowRecord], feedback_ratio: float) -> dict[str, float]:
    """Planned vs realized feedback, and reward and accuracy by kind, over every process's rows."""
    planned = [x for x in records if x.kind in KINDS]
    with_feedback = [x for x in records if x.has_feedback]
    metrics = {
        "lanpo/feedback_ratio": feedback_ratio,
        "lanpo/feedback_share": len(with_feedback) / len(records),
        "lanpo/fallback_share": sum(not x.has_feedback for x in planned) / len(planned) if planned else 0.0,
    }
    for reason in sorted({x.fallback for x in planned if not x.has_feedback}):  # why planned feedback fell back
        metrics[f"lanpo/fallback/{reason or 'unknown'}"] = sum(
            x.fallback == reason and not x.has_feedback for x in planned
        ) / len(planned)
    if with_feedback:
        metrics["lanpo/feedback_tokens_per_prompt"] = sum(x.context_tokens for x in with_feedback) / len(with_feedback)
    groups = {
        "feedback": with_feedback,
        "scratch": [x for x in records if not x.has_feedback],
        **{kind: [x for x in with_feedback if x.kind == kind] for kind in KINDS},
    }
    for name, part in groups.items():
        if part:
            metrics[f"reward/{name}/mean"] = sum(x.reward for x in part) / len(part)
            metrics[f"accuracy/{name}/mean"] = sum(x.correct for x in part) / len(part)
    for name in ("scratch", "feedback"):
        if groups[name]:
            metrics[f"completions/truncated/{name}"] = sum(x.truncated for x in groups[name]) / len(groups[name])
    metrics.update(lift_and_trigger_metrics(records))
    return metrics


def lift_and_trigger_metrics(records: Sequence[RowRecord]) -> dict[str, float]:
    """``lanpo/all_fail_share``: groups in which every row failed (GRPO learns nothing from them but a KL pull).
    ``lanpo/feedback_lift``: accuracy of feedback rows minus that of the scratch rows of the same groups
    (groups holding both kinds; absent where no group holds both). Under feedback_trigger unsolved, at every step
    ``lanpo/triggered_share`` (groups that failed from scratch) and ``lanpo/rescued_share`` (groups where a
    feedback row is right though every scratch row was wrong), and ``lanpo/rescue_rate`` (rescued over triggered
    groups) where any group was triggered."""
    by_group: dict[str, list[RowRecord]] = {}
    for x in records:
        by_group.setdefault(x.group, []).append(x)
    mixed = [
        rows
        for rows in by_group.values()
        if any(x.has_feedback for x in rows) and not all(x.has_feedback for x in rows)
    ]
    metrics: dict[str, float] = {
        "lanpo/all_fail_share": sum(not any(x.correct for x in rows) for rows in by_group.values()) / len(by_group)
    }
    if mixed:
        scratch = [x.correct for rows in mixed for x in rows if not x.has_feedback]
        base = sum(scratch) / len(scratch)
        feedback = [x for rows in mixed for x in rows if x.has_feedback]
        metrics["lanpo/feedback_lift"] = sum(x.correct for x in feedback) / len(feedback) - base
        for kind in sorted({x.kind for x in feedback}):
            part = [x.correct for x in feedback if x.kind == kind]
            metrics[f"lanpo/feedback_lift/{kind}"] = sum(part) / len(part) - base
    if any(x.triggered is not None for x in records):
        triggered = [rows for rows in by_group.values() if rows[0].triggered]
        rescued = sum(any(x.has_feedback and x.correct for x in rows) for rows in triggered)
        metrics["lanpo/triggered_share"] = len(triggered) / len(by_group)
        metrics["lanpo/rescued_share"] = rescued / len(by_group)  # of all groups: 0 when none was triggered
        if triggered:
            metrics["lanpo/rescue_rate"] = rescued / len(triggered)
    return metrics


def hint_metrics(records: Sequence[RowRecord], counts: dict) -> dict[str, float]:
    """Hint levels and success per level of the rows that carried a level, the escalations and the self-hint
    counters of this step (absent where no row carried a level and nothing was counted)."""
    leveled = [x for x in records if x.level is not None]
    metrics: dict[str, float] = {}
    if leveled:
        metrics["hint/level_mean"] = sum(x.level for x in leveled) / len(leveled)
        for level in sorted({x.level for x in leveled}):
            part = [x.correct for x in leveled if x.level == level]
            metrics[f"hint/accuracy/L{level}"] = sum(part) / len(part)
            metrics[f"hint/rows/L{level}"] = float(len(part))
    for name in ("hint_escalated", "self_hint_written", "self_hint_unparsed", "self_hint_states_answer"):
        if name in counts:
            metrics[f"hint/{name.removeprefix('hint_')}"] = float(counts[name])
    return metrics


class GroupOutcome(NamedTuple):
    """One group of a step, for :class:`Transfer`: whether a scratch row, and whether a feedback row, was right."""

    problem_id: str
    scratch_right: bool
    feedback_right: bool


def group_outcomes(records: Sequence[RowRecord]) -> list[GroupOutcome]:
    by_group: dict[str, list[RowRecord]] = {}
    for x in records:
        by_group.setdefault(x.group, []).append(x)
    return [
        GroupOutcome(
            rows[0].problem_id,
            any(x.correct and not x.has_feedback for x in rows),
            any(x.correct and x.has_feedback for x in rows),
        )
        for rows in by_group.values()
    ]


class Transfer:
    """Transfer of feedback-only success to the plain policy: the problems first solved only by a feedback row (no
    scratch row of the problem right at that step or before), and of those the ones a scratch row solved at a later
    step. Kept across steps (and checkpoints: :meth:`state_dict`)."""

    def __init__(self) -> None:
        self.first_with_feedback: dict[str, int] = {}  # problem -> the step feedback alone solved it
        self.later_from_scratch: dict[str, int] = {}  # of those, problem -> the step a scratch row first did
        self.solved_from_scratch: set[str] = set()

    def update(self, step: int, outcomes: Sequence[GroupOutcome]) -> None:
        for pid, scratch_right, feedback_right in outcomes:
            if scratch_right:
                if pid in self.first_with_feedback and pid not in self.later_from_scratch:
                    self.later_from_scratch[pid] = step
                self.solved_from_scratch.add(pid)
            elif feedback_right and pid not in self.solved_from_scratch and pid not in self.first_with_feedback:
                self.first_with_feedback[pid] = step

    def metrics(self) -> dict[str, float]:
        if not self.first_with_feedback:
            return {}
        return {
            "lanpo/transfer": len(self.later_from_scratch) / len(self.first_with_feedback),
            "lanpo/transfer_problems": float(len(self.first_with_feedback)),
        }

    def state_dict(self) -> dict:
        return {
            "first_with_feedback": self.first_with_feedback,
            "later_from_scratch": self.later_from_scratch,
            "solved_from_scratch": sorted(self.solved_from_scratch),
        }

    def load_state_dict(self, state: dict) -> None:
        self.first_with_feedback = {str(k): int(v) for k, v in state.get("first_with_feedback", {}).items()}
        self.later_from_scratch = {str(k): int(v) for k, v in state.get("later_from_scratch", {}).items()}
        self.solved_from_scratch = {str(k) for k in state.get("solved_from_scratch", [])}


def step_metrics(
    records: Sequence[RowRecord],
    feedback_ratio: float,
    pool_stats: dict,
    retrieval: dict[str, float],
    summaries: dict,
    counts: dict,
) -> dict[str, float]:
    """Every lanpo metric of one step: feedback, pool, retrieval, summary parsing."""
    metrics = {
        **feedback_metrics(records, feedback_ratio),
        "lanpo/pool_size": float(pool_stats["entries"]),
        "lanpo/pool_problems": float(pool_stats["problems"]),
        **retrieval,
        "lanpo/lessons_dropped": float(counts.get("lessons_dropped", 0)),
        **({"lanpo/ahead_attempts": float(counts["ahead_attempts"])} if counts.get("ahead_attempts") else {}),
        **(
            {"lanpo/trigger_no_attempt": float(counts["trigger_no_attempt"])}
            if counts.get("trigger_no_attempt")
            else {}
        ),
        **hint_metrics(records, counts),
        # execution feedback: what the attempts it showed did on their problems' public examples, by outcome
        **{f"execution/{key}": float(value) for key, value in counts.items() if key.startswith("public_")},
    }
    if summaries.get("requested"):
        failed = summaries.get("parse_failed", 0)
        metrics.update(
            {
                "summaries/requested": float(summaries["requested"]),
                "summaries/parse_failures": float(failed),
                "summaries/parse_rate": (summaries["requested"] - failed) / summaries["requested"],
                "summaries/added": float(summaries.get("parsed", 0)),
            }
        )
    if "carried" in summaries:
        metrics["summaries/carried"] = float(summaries["carried"])  # not ended yet: they go on in the next batch
    return metrics  # strip weights are logged where they are applied, in the loss (lanpo.loss)


def real_prompts(logged: list, contexts: list) -> None:
    """Put each feedback row's real prompt (its context) into TRL's completions-table prompts, paired from the
    newest: TRL logs every row with its plain prompt."""
    for k, context in zip(range(len(logged) - 1, -1, -1), reversed(contexts)):
        logged[k] = context if context is not None else logged[k]


def time_metrics(timer: dict) -> dict[str, float]:
    """Seconds per phase of one step: generate, summarize, retrieve, reward (verification), teacher (the scoring
    route's forwards under the context), update (loss forward, backward, optimizer) and ``time/score``, the rest of
    the rollout (reference and old log-probabilities)."""
    phases = ("generate", "summarize", "retrieve", "reward", "teacher")
    metrics = {f"time/{key}": float(timer.get(key, 0.0)) for key in (*phases, "update")}
    rest = timer.get("rollout_total", 0.0) - sum(timer.get(k, 0.0) for k in phases)
    return {**metrics, "time/score": max(0.0, rest)}
