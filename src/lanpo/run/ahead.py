"""The next step's batches, pulled a step early, and the plain attempts at their problems made in this step's call.

A reflection (or gold, or execution) row shows one of its problem's own attempts. Under ``generation_rounds one``
(and ``reflection_source ahead``) the step before a problem's first visit attempts it from the plain prompt in its
own generation call, so the visit finds an attempt stored and needs no second call. For that the trainer pulls the
next optimizer step's batches from transformers' epoch iterator a step early (:meth:`NextBatches.take`) and hands
them out at the next step, in the same order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from itertools import islice

from lanpo.data.loaders import problem_of
from lanpo.plan import Attempts, StepPlan
from lanpo.pool.store import ExperiencePool
from lanpo.rollout import Ahead

logger = logging.getLogger(__name__)


class NextBatches:
    """Transformers' prefetch of an optimizer step's batches, with the next step's pulled early where attempts are
    made ahead. ``peeked``: the next step's batches; ``handed``: the batch this step's generation comes from."""

    def __init__(self) -> None:
        self.peeked: list = []
        self.handed: list = []
        self._from = None  # the epoch iterator ``peeked`` came from
        self._warned = False

    def take(self, epoch_iterator, num_batches: int) -> list:
        """This step's ``num_batches`` batches (those pulled early first), and the next step's pulled now."""
        if self._from is not epoch_iterator:  # a new epoch, or a resumed run: nothing pulled early
            self.peeked, self._from = [], epoch_iterator
        batches, self.peeked = self.peeked[:num_batches], self.peeked[num_batches:]
        batches += islice(epoch_iterator, num_batches - len(batches))
        self.peeked += islice(epoch_iterator, max(0, num_batches - len(self.peeked)))
        self.handed = batches[:1]
        return batches

    def attempts(
        self,
        inputs: Sequence[dict],
        per_problem: int,
        pool: ExperiencePool,
        tokenize: Callable[[list], list[list[int]]],
    ) -> list[Ahead]:
        """``per_problem`` plain attempts (:func:`attempts_per_problem`) at each problem of the next step that has none
        stored (nor rows in this step); none at the last step of an epoch (there is no next batch to pull).

        What the peek assumes, and checks: TRL generates a step's rows from the first batch transformers hands out
        for that step, so the next step generates from the first batch pulled ahead. A generation from any other
        batch (a TRL that buffers otherwise) attempts nothing ahead, said once."""
        if not self.peeked:
            return []
        handed = [problem_of(item)[0] for batch in self.handed for item in batch]
        if handed != [problem_of(item)[0] for item in inputs]:
            if not self._warned:
                logger.warning(
                    "attempts ahead: this generation did not come from the step's first batch, so the batch pulled "
                    "ahead may not be the next generation's; nothing is attempted ahead."
                )
                self._warned = True
            return []
        seen = {problem_of(item)[0] for item in inputs}  # this step's own attempts are stored anyway
        wanted = []
        for item in self.peeked[0] if per_problem else []:
            problem_id, problem = problem_of(item)
            if problem_id in seen:  # G rows a problem: asked once
                continue
            seen.add(problem_id)
            if not pool.attempts(problem_id, limit=1):
                wanted.append((problem_id, problem, item["prompt"]))
        prompts = tokenize([prompt for _, _, prompt in wanted]) if wanted else []
        return [
            Ahead(problem_id, problem, ids)
            for (problem_id, problem, _), ids in zip(wanted, prompts)
            for _ in range(per_problem)
        ]


def attempts_per_problem(plan: StepPlan, attempts: Attempts) -> int:
    """How many plain attempts at a next step's problem this step makes (0: none). Under ``generation_rounds one``,
    with a ``reflection_source`` that does not keep to stored attempts (auto, ahead; not pool), as many as a group's
    rows that show an attempt (at most its scratch rows, at least one), and one at least under ``feedback_trigger
    unsolved``, whose trigger scores them. Under ``phased`` with ``reflection_source ahead``, as before: for its
    reflection rows under ``feedback_trigger always`` only."""
    group = plan.group
    if not plan.has_feedback:
        return 0
    if plan.one_round:
        if not attempts.this_step:
            return 0
        needed = min(group.attempt_rows, max(1, group.scratch))
        return max(1, needed) if plan.trigger == "unsolved" else needed
    if attempts.ahead and plan.trigger == "always":
        return min(group.rows_of("reflection"), max(1, group.scratch))
    return 0
