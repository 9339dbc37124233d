"""The interface every feedback source implements.

A source turns the rows a step planned for it into contexts. It is asked once per step for all its groups (one
batched retrieval, one batched judge) and sees of each group only a :class:`FeedbackRequest`: the problem, how
many rows want a context, and the group's own attempts where the rollout hands them over. A request carries no
gold answer and no reward, so a source is label-free by construction. A context that cannot be built is a
:class:`Feedback` without messages and with a reason: the row falls back to the plain prompt and is counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from lanpo.pool.retrieval import Retriever
from lanpo.pool.store import ExperiencePool
from lanpo.prompts import Messages


class FeedbackRequest(NamedTuple):
    """What a source sees of one group: never its gold answer or a reward."""

    problem_id: str
    problem: str
    rows: int  # how many of the group's rows want this source's context
    attempts: tuple[str, ...] | None = None  # the group's own attempts handed over (None: the source finds its own)
    level: int | None = None  # privileged sources: the hint level asked for (None: the problem's on the ladder)
    scale: float = 1.0  # privileged sources: the share of a hint kept this step (hint_anneal_steps)
    step: int | None = None  # the step asking: the handed ``attempts`` were written by its model


class Feedback(NamedTuple):
    """One row's context, or ``messages`` None with the reason it could not be built."""

    messages: Messages | None
    reason: str = ""
    retrieved: tuple[dict, ...] = ()  # the pool entries shown ({"entry_id", "relevance"}), for retrievals.jsonl
    level: int | None = None  # privileged sources: the hint level the context carries
    shown_step: int | None = None  # the step whose model wrote the attempt the context shows (None: it shows none)


class FeedbackSource:
    """A kind of feedback row: ``kind`` is the row kind a :class:`lanpo.plan.GroupPlan` gives it."""

    kind: ClassVar[str]
    privileged: ClassVar[bool] = False  # built from a worked solution or the gold answer (training only)
    # runs collective work (generation, a judge's forwards): every process asks it once a step, with or without groups
    collective: ClassVar[bool] = False
    leveled: ClassVar[bool] = False  # its contexts come at hint levels (FeedbackRequest.level; escalation)

    @classmethod
    def for_run(cls, kit: SourceKit) -> FeedbackSource:
        """The source a training run asks, built from its pool, retriever and config."""
        raise NotImplementedError

    def ready(self, request: FeedbackRequest) -> bool:
        """Whether the context can be built before this step's scratch rows are generated (else the rollout asks
        again after them, handing over their texts as ``attempts``)."""
        return True

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        """One list per request, one :class:`Feedback` per row it asked for; ``counts`` gathers this step's
        counters (logged as ``lanpo/<name>``)."""
        raise NotImplementedError


@dataclass
class SourceKit:
    """What a run hands its sources to build themselves from (:meth:`FeedbackSource.for_run`)."""

    args: Any  # the run's LanpoConfig
    pool: ExperiencePool
    retriever: Retriever
    judge: Callable[[], AbstractContextManager] | None = None  # the full policy for the LLM relevance judge
    privileged: Any = None  # lanpo.feedback.privileged.PrivilegedKit: references and hint levels (privileged only)
    run_code: Callable[[list], list] | None = None  # the reward's sandbox (Sandbox.run_many): execution feedback
