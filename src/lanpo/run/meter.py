"""One step's meter: what a training step counts as it goes, in one object the trainer's hooks hand around.

Seconds by part of the step (``time/*``: generate, summarize, retrieve, reward, teacher, update), the generation's
counters (``lanpo/<name>``: fallbacks, lessons dropped, attempts ahead, execution outcomes, hint escalations), the
summaries' parse counts (``summaries/*``), the scoring route's sums (``score/*``) and the **generation rounds**: every
call into the generation engine during the step, with its rows and its longest completion, in order
(``lanpo/generation_rounds``, ``lanpo/round<k>/rows``, ``lanpo/round<k>/longest``). On a GPU a round costs about its
decode steps whatever its rows, so the rounds, not the rows, set a step's generation time (docs/training.md).

Two horizons: the generation's counters and rounds are read and cleared when a generation batch is logged
(:meth:`take_generation`); the seconds and scoring sums when an optimizer step ends (:meth:`take_step`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from lanpo.run.metrics import time_metrics

SCORE_SUMS = 6  # lanpo.score.rewrite_advantages' sums


class Round(NamedTuple):
    """One call into the generation engine: how many rows it generated (this process's) and its longest completion
    in tokens."""

    rows: int
    longest: int


@dataclass
class StepMeter:
    seconds: Counter = field(default_factory=Counter)  # by part of the step (lanpo.run.metrics.time_metrics)
    counts: Counter = field(default_factory=Counter)  # the generation's counters, logged as lanpo/<name>
    summaries: Counter = field(default_factory=Counter)  # requested, parse_failed, parsed, carried
    rounds: list[Round] = field(default_factory=list)  # this generation's calls into the engine, in order
    score_sums: torch.Tensor = field(default_factory=lambda: torch.zeros(SCORE_SUMS))

    @contextmanager
    def timed(self, part: str) -> Iterator[None]:
        """Add the seconds of a ``with`` block to ``part``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start

    def counted(self, generate: Callable) -> Callable:
        """``generate`` (prompt ids, ... -> completions, or a tuple (completions, log-probabilities)) with each call
        recorded as a round."""

        def call(prompt_ids, *args, **kwargs):
            result = generate(prompt_ids, *args, **kwargs)
            self.add_round(result[0] if isinstance(result, tuple) else result)
            return result

        return call

    def add_round(self, completions: list) -> None:
        self.rounds.append(Round(len(completions), max((len(c) for c in completions), default=0)))

    def take_generation(self) -> tuple[Counter, Counter, dict[str, float]]:
        """The generation's counters, its summary counts and its rounds' metrics; cleared for the next one."""
        rounds = {"lanpo/generation_rounds": float(len(self.rounds))}
        for k, r in enumerate(self.rounds, 1):
            rounds[f"lanpo/round{k}/rows"] = float(r.rows)
            rounds[f"lanpo/round{k}/longest"] = float(r.longest)
        counts, summaries = self.counts, self.summaries
        self.counts, self.summaries, self.rounds = Counter(), Counter(), []
        return counts, summaries, rounds

    def take_step(self) -> tuple[dict[str, float], torch.Tensor]:
        """The optimizer step's ``time/*`` metrics and its scoring sums; cleared for the next step."""
        seconds, sums = time_metrics(self.seconds), self.score_sums
        self.seconds, self.score_sums = Counter(), torch.zeros(SCORE_SUMS)
        return seconds, sums
