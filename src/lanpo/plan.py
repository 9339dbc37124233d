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

# The row kinds a group plan gives feedback to, one per feedback source (lanpo.feedback.registry).
SELF_KINDS = ("reflection", "abstraction")  # feedback_source self: LANPO's label-free sources
PRIVILEGED_KINDS = ("reference", "gold", "self-hint")  # the others: each a feedback_source of its own
FEEDBACK_KINDS = SELF_KINDS + PRIVILEGED_KINDS
HINT_TOP = 3  # hint levels run 1..HINT_TOP (reference: 1/4, 2/4, 3/4 of a solution's steps)


class GroupPlan(NamedTuple):
    """How many rows of a group of G each kind gets: under ``feedback_source self`` reflection and abstraction
    rows, under a privileged source ``hinted`` rows of that source's kind."""

    scratch: int
    reflection: int
    abstraction: int
    hinted: int = 0
    source: str = "self"

    @property
    def feedback(self) -> int:
        return self.reflection + self.abstraction + self.hinted

    def kind_of(self, j: int) -> str:
        """The kind of a group's ``j``-th row: scratch rows first, then reflection, abstraction, hinted."""
        if j < self.scratch:
            return "scratch"
        if j < self.scratch + self.reflection:
            return "reflection"
        return "abstraction" if j < self.scratch + self.reflection + self.abstraction else self.source


def plan_group(g: int, feedback_ratio: float, reflection_share: float, source: str = "self") -> GroupPlan:
    """The rows of a group of ``g`` by kind: round(p_t·g) get feedback (half up); under ``self`` split between
    reflection and abstraction by ``reflection_share``, else all of the privileged ``source``."""
    feedback = int(feedback_ratio * g + 0.5)
    if source != "self":
        return GroupPlan(g - feedback, 0, 0, feedback, source)
    reflection = int(feedback * reflection_share + 0.5)
    return GroupPlan(g - feedback, reflection, feedback - reflection)


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


# Where a scoring context comes from (feedback_route score): the privileged sources that need no generation of their
# own, and ``sibling``, a right rollout of the same group (SDPO), which needs no gold.
SCORE_SOURCES = ("gold", "reference", "sibling")


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

    @property
    def has_feedback(self) -> bool:
        """Whether any row of this step may get feedback (False: the step is exactly GRPO's)."""
        return self.group.feedback > 0
