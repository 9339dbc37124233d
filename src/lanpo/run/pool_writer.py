"""What a training run writes into its experience pool, and the summaries still on their way there.

A step's chosen trials are summarized by the policy in a later generation call: their summary prompts ride in the
next step's call (a summary that reaches the call's length limit goes on in the one after), or, where a step has no
call to ride in, in a call of their own under a forked random state (so ``p_t = 0`` stays TRL's GRPO). Every process
keeps the same pool: entries and attempts are gathered from every process and written in one order. The pending
trials go into each checkpoint (by problem, without their golds: :mod:`lanpo.run.checkpoints`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lanpo.pool.store import Attempt, ExperiencePool, StepWorth
from lanpo.run.meter import StepMeter
from lanpo.summarize import SummaryModel, Trial, entry_from_summary, summarize_apart

Gather = Callable[[list], list]  # accelerate's gather_object: every process's list, in process order


class PoolWriter:
    """The run's writes into ``pool``: summaries as they finish, each step's attempts and worth records, and the
    trials whose summaries are pending (``pending``)."""

    def __init__(self, pool: ExperiencePool, meter: StepMeter, gather: Gather, processes: int = 1) -> None:
        self.pool, self.meter, self.gather, self.processes = pool, meter, gather, processes
        self.pending: list[Trial] = []

    def ride(self) -> list[Trial]:
        """The pending trials, handed to the generation call they ride in (pending is empty until :meth:`carry`)."""
        riding, self.pending = self.pending, []
        return riding

    def carry(self, trials: list[Trial]) -> None:
        """Trials whose summaries reached the call's limit: they go on in the next call."""
        self.pending = trials + self.pending
        self.meter.summaries["carried"] += len(trials)

    def queue(self, trials: Sequence[Trial]) -> None:
        """A step's chosen trials, summarized in a later call."""
        self.pending += list(trials)

    def add(self, trials: Sequence[Trial], texts: Sequence[str]) -> None:
        """Parse each finished summary into an entry (unusable ones counted) and add every process's, in process
        order. Every process calls it."""
        with self.meter.timed("summarize"):
            stats = self.meter.summaries
            stats["requested"] += len(trials)
            entries = [e for e in (entry_from_summary(t, text, stats) for t, text in zip(trials, texts)) if e]
            for batch in self.gather([entries]):  # same entries, same order, on every process
                self.pool.add(batch)

    def summarize_apart(self, model: SummaryModel) -> None:
        """The pending summaries in a call of their own, under a forked random state. Every process calls it (it
        generates when any process has a summary pending)."""
        pending = self.ride()
        if not self._any([bool(pending)]):
            return
        with self.meter.timed("summarize"):
            with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
                texts = summarize_apart(model, pending)
        self.add(pending, texts)

    def store_step(self, attempts: list[Attempt], taught: StepWorth) -> None:
        """A step's attempts and what its feedback rows taught about the entries and reflections they were shown
        (:mod:`lanpo.pool.worth`), from every process, each process's in one transaction."""
        for batch, seen in self.gather([(attempts, taught)]):
            self.pool.add_attempts(batch, seen)

    def _any(self, flags: list[bool]) -> bool:
        return any(flag for part in self.gather([flags]) for flag in part) if self.processes > 1 else any(flags)
