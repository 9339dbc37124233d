"""A step's plan, decided once: how many rows of each group get which feedback, what triggers it, and how feedback
rows reach the loss.

The trainer builds one :class:`StepPlan` when a generation batch starts (``LanpoConfig.step_plan``) and carries it
on the batch; the rollout, the post-rollout steps and the loss read it and nothing recomputes it. The
``context_in_loss`` string is decoded here, once, into an :class:`Objective`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# TRL loss types whose total over the micro-batches of one optimizer step does not depend on their composition
# (bnpo divides by each micro-batch's own token count).
COMPOSITION_FREE_LOSSES = ("grpo", "dr_grpo", "dapo", "cispo", "luspo", "sapo", "vespo")

HINT_TOP = 3  # hint levels run 1..HINT_TOP (reference: 1/4, 2/4, 3/4 of a solution's steps)


@dataclass(frozen=True)
class FeedbackKind:
    """A kind of feedback row, as the plan knows it (its source lives in :mod:`lanpo.feedback.registry`)."""

    name: str
    privileged: bool  # its context shows what the policy's own trials do not (a solution, the gold answer)
    joins_self: bool = False  # one of ``feedback_source self``'s kinds; else a ``feedback_source`` of its own
    reads_solutions: bool = False  # its contexts show parts of worked solutions (a run checks it has some)
    reads_attempts: bool = False  # its contexts show one of the problem's own attempts (reflection_source finds it)


# Every feedback row kind, by name: the built-in ones here, a new one added with its source by
# lanpo.feedback.registry.register (which keeps the two in step).
KINDS: dict[str, FeedbackKind] = {
    kind.name: kind
    for kind in (
        FeedbackKind("reflection", privileged=False, joins_self=True, reads_attempts=True),  # LANPO's label-free
        FeedbackKind("abstraction", privileged=False, joins_self=True),
        FeedbackKind("reference", privileged=True, reads_solutions=True),
        FeedbackKind("gold", privileged=True, reads_attempts=True),
        FeedbackKind("self-hint", privileged=True, reads_solutions=True),
        FeedbackKind("execution", privileged=False, reads_attempts=True),  # code: an attempt run on its examples
    )
}
SELF_KINDS = tuple(k for k, kind in KINDS.items() if kind.joins_self)  # the built-in ones (reflection_share splits)
PRIVILEGED_KINDS = tuple(k for k, kind in KINDS.items() if kind.privileged)  # the built-in ones (eval probes them)

# Where a scoring context comes from (feedback_route score): the privileged sources that need no generation of their
# own, ``sibling``, a right rollout of the same group (SDPO), which needs no gold, and ``execution`` (code), what a
# row's own attempt did on its problem's public examples (SDPO's environment feedback).
SCORE_SOURCES = ("gold", "reference", "sibling", "execution")


def register_kind(kind: FeedbackKind) -> None:
    """Add a feedback row kind (``lanpo.feedback.registry.register`` calls this with its source)."""
    if kind.name in ("scratch", "self", "sibling") or kind.joins_self:
        raise ValueError(
            f"feedback kind {kind.name!r}: a new kind is a feedback_source of its own, named apart from scratch, "
            "self and sibling (feedback_source self's kinds are split by reflection_share, which names them)."
        )
    if KINDS.get(kind.name, kind) != kind:
        raise ValueError(f"feedback kind {kind.name!r} is registered already, as {KINDS[kind.name]}.")
    KINDS[kind.name] = kind


def feedback_sources() -> tuple[str, ...]:
    """What ``feedback_source`` accepts: ``self`` (its kinds together), each other kind, and ``sibling`` (scoring
    only)."""
    own = tuple(k for k, kind in KINDS.items() if not kind.joins_self)
    return ("self", *own, *(s for s in SCORE_SOURCES if s not in own))


def is_privileged(kind: str) -> bool:
    """Whether rows of ``kind`` were written under a privileged context (never summarized into the pool)."""
    return kind in KINDS and KINDS[kind].privileged


class GroupPlan(NamedTuple):
    """How many rows of a group of G each kind gets: ``scratch`` plain rows first, then ``kinds``, (kind, rows)
    pairs in row order (under ``feedback_source self`` reflection then abstraction, else the one source's kind)."""

    scratch: int
    kinds: tuple[tuple[str, int], ...] = ()

    @property
    def feedback(self) -> int:
        return sum(n for _, n in self.kinds)

    def rows_of(self, kind: str) -> int:
        """How many rows of a group ``kind`` gets."""
        return sum(n for k, n in self.kinds if k == kind)

    @property
    def attempt_rows(self) -> int:
        """How many rows of a group show one of the problem's own attempts (:attr:`FeedbackKind.reads_attempts`)."""
        return sum(n for k, n in self.kinds if k in KINDS and KINDS[k].reads_attempts)

    def kind_of(self, j: int) -> str:
        """The kind of a group's ``j``-th row: scratch rows first, then each kind's rows in order."""
        end = self.scratch
        if j < end:
            return "scratch"
        for kind, n in self.kinds:
            end += n
            if j < end:
                return kind
        raise IndexError(f"row {j} of a group of {end}")

    def split(self, n: int) -> list[str]:
        """The kinds of ``n`` rows shared out as this plan shares its feedback rows (cumulative shares, rounded
        half to even): ``feedback_trigger unsolved`` gives a failed group's chosen rows their kinds this way."""
        kinds, cumulative, start = [], 0, 0
        for kind, count in self.kinds:
            cumulative += count
            end = n if cumulative == self.feedback else round(n * cumulative / self.feedback)
            kinds += [kind] * (end - start)
            start = end
        return kinds


def plan_group(g: int, feedback_ratio: float, reflection_share: float, source: str = "self") -> GroupPlan:
    """The rows of a group of ``g`` by kind: round(p_t·g) get feedback (half up); under ``self`` split between
    reflection and abstraction by ``reflection_share``, else all of the kind ``source`` names."""
    feedback = int(feedback_ratio * g + 0.5)
    if source != "self":
        return GroupPlan(g - feedback, ((source, feedback),) if feedback else ())
    reflection = int(feedback * reflection_share + 0.5)
    kinds = (("reflection", reflection), ("abstraction", feedback - reflection))
    return GroupPlan(g - feedback, tuple((k, n) for k, n in kinds if n))


@dataclass(frozen=True)
class Objective:
    """How a feedback row (sampled under x + c) reaches the loss: the ``context_in_loss`` choice, decoded."""

    name: str
    strips_context: bool  # trained on the plain prompt x (the zero-shot policy), not on x + c
    strip_weight: str | None = None  # "token" or "sequence": π(y|x)/π(y|x,c) weights the advantages; None: not
    shaped: bool = False  # feedback rows leave TRL's surrogate for the shaped term f(π) = π/(π+γ)

    @property
    def keeps_context(self) -> bool:
        return not self.strips_context


OBJECTIVES = {
    "strip": Objective("strip", strips_context=True, strip_weight="token"),
    "strip-sequence": Objective("strip-sequence", strips_context=True, strip_weight="sequence"),
    "shaped": Objective("shaped", strips_context=True, shaped=True),
    "unweighted": Objective("unweighted", strips_context=True),
    "keep": Objective("keep", strips_context=False),
}


@dataclass(frozen=True)
class Attempts:
    """``reflection_source`` decoded: which of a problem's own attempts a reflection (or gold) row may show."""

    name: str
    stored: bool  # attempts stored in earlier steps
    this_step: bool  # this step's scratch rollouts (the rollout asks again after generating them)
    ahead: bool = False  # the trainer attempts the next step's problems a step early, so stored ones are ready


ATTEMPTS = {
    "auto": Attempts("auto", stored=True, this_step=True),  # stored where the problem has some, else this step's
    "step": Attempts("step", stored=False, this_step=True),
    "pool": Attempts("pool", stored=True, this_step=False),
    "ahead": Attempts("ahead", stored=True, this_step=True, ahead=True),
}


@dataclass(frozen=True)
class Grouping:
    """``advantage_grouping`` decoded: which rows of a group form a row's baseline."""

    name: str
    shared: bool  # TRL's: one baseline over the whole group
    by_kind: bool = False  # feedback rows and scratch rows each against their own (else: against the scratch rows)


GROUPINGS = {
    "shared": Grouping("shared", shared=True),
    "separate": Grouping("separate", shared=False, by_kind=True),
    "scratch-baseline": Grouping("scratch-baseline", shared=False),
}


@dataclass(frozen=True)
class Scoring:
    """How a feedback context reaches the loss without generating rows (``feedback_route score``/``both``): a
    teacher, the policy given the context, scores each chosen plain rollout, and the per-token log-ratio joins the
    advantage (:mod:`lanpo.score`). Decoded once from the config, like :class:`Objective`."""

    source: str  # a SCORE_SOURCES entry: what the context shows
    form: str  # "additive" (SDPO / OPSD: A_t = A + coef * clip(log-ratio)) or "contrastive" (RLCSD)
    teacher: str  # "initial" (frozen start model), "live" (the policy itself) or "ema"
    coef: float  # lambda
    clip: float  # additive: |log-ratio| bound
    rows: str  # "failed": rows the verifier did not credit; "all"
    level: int = 2  # reference: the hint level its context shows
    wrong: int = 2  # contrastive: wrong contexts (other problems' answers or solutions in the identical template)
    control: bool = False  # score under a wrong context instead of the right one (a style and compute control)

    @property
    def contrastive(self) -> bool:
        """RLCSD's form: the right context against ``wrong`` others (else the additive log-ratio)."""
        return self.form == "contrastive"

    @property
    def failed_only(self) -> bool:
        """Only rows the verifier did not credit are scored."""
        return self.rows == "failed"

    @property
    def own_teacher(self) -> bool:
        """The teacher has weights of its own (the frozen start model, or an EMA); else it is the live policy."""
        return self.teacher != "live"

    @property
    def ema(self) -> bool:
        """The teacher's own weights follow the policy (an EMA, moved after each optimizer step)."""
        return self.teacher == "ema"


@dataclass(frozen=True)
class StepPlan:
    """Everything a step decides before it generates, in one immutable object."""

    step: int
    feedback_ratio: float  # p_t at this step (after the schedule)
    group: GroupPlan
    trigger: str  # "always": every group gets its feedback rows; "unsolved": only groups that fail from scratch
    trigger_pass_rate: float  # unsolved: a group is triggered at or below this share of right scratch rows
    objective: Objective
    bucket_by_prompt_length: bool  # keep: micro-batches sorted by prompt length (lanpo.loss.bucket_by_prompt_length)
    hint_escalation: int = 0  # privileged sources: rounds that re-generate still-failed hinted rows a level up
    hint_scale: float = 1.0  # privileged sources: the share of a hint kept at this step (hint_anneal_steps)
    scoring: Scoring | None = None  # feedback_route score or both: how the context scores plain rows (None: never)
    one_round: bool = False  # generation_rounds one: every row, summary and next-step attempt in one call

    @property
    def has_feedback(self) -> bool:
        """Whether any row of this step may get feedback (False: the step is exactly GRPO's)."""
        return self.group.feedback > 0
