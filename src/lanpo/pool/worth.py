"""Each pool entry's worth, learned from LANPO's own mixed groups.

A group of G rollouts of one problem holds, in the same step, rows generated from scratch and rows shown feedback.
So an abstraction row's **lift**, its reward minus the mean reward of its group's scratch rows, is a randomized
within-problem contrast: the same problem, the same step, the same policy, with and without the lessons shown.
Every shown entry is credited with the lift of the row it was shown to (a row whose group has no scratch row is
not credited: there is nothing to contrast it with), and with the row's raw reward and 0/1 success, which is what
RetroAgent's utility (and MemRL's, EvolveR's) uses. Reflection rows get the same bookkeeping per problem: is
reflecting on this problem's own attempt worth it?

Credit where a context shows several entries: each of them gets the row's whole lift, one use each. The entries of
one context then share its credit, a confound that averages out only as entries meet in other combinations; under
the ``simutil`` and ``lift`` rankings, training therefore shows one lesson a row (RetroAgent's rule), and credit is
exact. The statistics are numbers and ids only: nothing of a problem's text or gold answer is kept here.

Rankings (``retrieval_rank``): ``similarity`` (the relevance score alone, as before); ``simutil``, RetroAgent's
SimUtil-UCB exactly (:func:`simutil_score`); ``lift``, a shrunk mean of lift with a confidence bound
(:class:`Worth`): explored by its upper bound in training, ranked by its mean at evaluation, and an entry whose
upper bound is below zero after :data:`MIN_USES` uses is not shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args

Ranking = Literal["similarity", "simutil", "lift"]
RANKINGS: tuple[Ranking, ...] = get_args(Ranking)

# RetroAgent's SimUtil-UCB (arXiv 2603.08561; zhangxy-2019/RetroAgent agent_system/memory/memory.py): score =
# alpha * cos + (1 - alpha) * (u + kappa * sqrt(ln N / n)), n an entry's count (1 when it is made), N the sum of
# counts, u an EMA of the 0/1 success of the rows it was shown to, entries below the similarity floor dropped.
SIMUTIL_ALPHA = 0.6  # the code's default (the paper says 0.7)
SIMUTIL_KAPPA = 1.0
SIMUTIL_BETA = 0.05  # the paper's EMA rate (the code's default is 0.1)
SIMUTIL_START = 0.5  # u of an entry never shown
SIMUTIL_FLOOR = 0.4  # similarity below which an entry is not a candidate

# lift: a mean shrunk toward 0 by PRIOR_USES pseudo-uses, its spread from the uses seen (PRIOR_SD until there are
# two), and a bound of Z standard errors. At a reward rate near 0.15 one observation has sd ~0.3, so ~30 uses
# resolve a 0.05 effect; an entry is judged harmful only after MIN_USES uses.
PRIOR_USES = 4.0
PRIOR_SD = 0.3
Z = 1.0
MIN_USES = 8


@dataclass(frozen=True)
class Worth:
    """One entry's (or one problem's reflection) record: ``uses`` (rows shown it), ``credited`` (of those, rows
    whose group had scratch rows), the sums of their lift and its square, the sum of raw rewards, RetroAgent's
    utility ``success_ema`` and the last step it was shown."""

    uses: int = 0
    credited: int = 0
    lift_sum: float = 0.0
    lift_sq: float = 0.0
    reward_sum: float = 0.0
    success_ema: float = SIMUTIL_START
    last_step: int = -1

    def observe(self, lift: float | None, reward: float, success: bool, step: int) -> Worth:
        """The record after one more row shown this entry."""
        return replace(
            self,
            uses=self.uses + 1,
            credited=self.credited + (lift is not None),
            lift_sum=self.lift_sum + (lift or 0.0),
            lift_sq=self.lift_sq + (lift or 0.0) ** 2,
            reward_sum=self.reward_sum + reward,
            success_ema=(1 - SIMUTIL_BETA) * self.success_ema + SIMUTIL_BETA * float(bool(success)),
            last_step=max(self.last_step, step),
        )

    @property
    def mean_lift(self) -> float:
        """The lift's mean, shrunk toward 0 by :data:`PRIOR_USES` pseudo-uses (0 for an entry never credited)."""
        return self.lift_sum / (self.credited + PRIOR_USES)

    @property
    def spread(self) -> float:
        """The standard deviation of one observation of lift (:data:`PRIOR_SD` until two are seen)."""
        if self.credited < 2:
            return PRIOR_SD
        mean = self.lift_sum / self.credited
        variance = max(0.0, (self.lift_sq - self.credited * mean * mean) / (self.credited - 1))
        return math.sqrt(variance)

    @property
    def half_width(self) -> float:
        return Z * self.spread / math.sqrt(self.credited + PRIOR_USES)

    @property
    def upper(self) -> float:
        return self.mean_lift + self.half_width

    @property
    def lower(self) -> float:
        return self.mean_lift - self.half_width

    @property
    def hurts(self) -> bool:
        """Judged harmful: enough uses, and even the optimistic bound of its lift is below zero."""
        return self.credited >= MIN_USES and self.upper < 0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.uses if self.uses else None


# ---------------------------------------------------------------------------------------------------------------
# What one step teaches


def row_lifts(rewards: Sequence[float], scratch: Sequence[bool], group_size: int) -> list[float | None]:
    """Each row's reward minus the mean reward of its group's scratch rows (groups are ``group_size`` consecutive
    rows); None for every row of a group without a scratch row."""
    if len(rewards) != len(scratch):
        raise ValueError(f"{len(rewards)} rewards but {len(scratch)} scratch flags.")
    lifts: list[float | None] = []
    for start in range(0, len(rewards), group_size):
        plain = [r for r, s in zip(rewards[start : start + group_size], scratch[start : start + group_size]) if s]
        base = sum(plain) / len(plain) if plain else None
        lifts += [None if base is None else r - base for r in rewards[start : start + group_size]]
    return lifts


@dataclass(frozen=True)
class Observation:
    """One row shown one entry (``key`` an entry id) or one problem's own attempt (``key`` a problem id)."""

    key: int | str
    lift: float | None
    reward: float
    success: bool


def observations(rows, rewards: Sequence[float], correct: Sequence[bool], group_size: int) -> tuple[list, list]:
    """(entry observations, reflection observations) of one step's rows (:class:`lanpo.rollout.Row`): every entry
    an abstraction row was shown, and the problem of every reflection row, with the row's lift, reward and
    success."""
    lifts = row_lifts(list(rewards), [not r.has_feedback for r in rows], group_size)
    entries, reflections = [], []
    for row, lift, reward, right in zip(rows, lifts, rewards, correct):
        if not row.has_feedback:
            continue
        if row.kind == "abstraction":
            for shown in row.retrieved:
                if isinstance(shown, dict) and isinstance(shown.get("entry_id"), int):
                    entries.append(Observation(shown["entry_id"], lift, float(reward), bool(right)))
        elif row.kind == "reflection":
            reflections.append(Observation(row.problem_id, lift, float(reward), bool(right)))
    return entries, reflections


def fold(records: dict, found: Sequence[Observation], step: int) -> dict:
    """``records`` (key -> :class:`Worth`) after the step's observations, in order."""
    out = dict(records)
    for seen in found:
        out[seen.key] = out.get(seen.key, Worth()).observe(seen.lift, seen.reward, seen.success, step)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Ranking


def simutil_score(similarity: float, worth: Worth, total_counts: float) -> float:
    """RetroAgent's SimUtil-UCB: alpha * similarity + (1 - alpha) * (u + kappa * sqrt(ln N / n)), with n the
    entry's count (its uses plus the 1 it is made with) and N the pool's sum of counts."""
    count = worth.uses + 1
    bonus = SIMUTIL_KAPPA * math.sqrt(math.log(max(total_counts, 1.0)) / count)
    return SIMUTIL_ALPHA * similarity + (1 - SIMUTIL_ALPHA) * (worth.success_ema + bonus)


def rank(
    ranking: Ranking,
    candidates: Sequence[tuple[int, float]],
    records: dict,
    total_counts: float,
    explore: bool,
) -> list[tuple[int, float]]:
    """``candidates`` (entry id, similarity) in the order ``ranking`` shows them, each with its score; entries the
    ranking will not show are left out (``simutil``: below the similarity floor; ``lift``: judged harmful).
    ``explore``: training (upper bounds, exploration bonuses); else evaluation (means, no bonus)."""
    scored = []
    for entry_id, similarity in candidates:
        worth = records.get(entry_id, Worth())
        if ranking == "similarity":
            score = similarity
        elif ranking == "simutil":
            if similarity < SIMUTIL_FLOOR:
                continue
            score = (
                simutil_score(similarity, worth, total_counts)
                if explore
                else (SIMUTIL_ALPHA * similarity + (1 - SIMUTIL_ALPHA) * worth.success_ema)
            )
        elif ranking == "lift":
            if worth.hurts:
                continue
            score = worth.upper if explore else worth.mean_lift
        else:
            raise ValueError(f"retrieval_rank must be one of {', '.join(RANKINGS)}, got {ranking!r}.")
        scored.append((entry_id, score, similarity))
    scored.sort(key=lambda item: (-item[1], -item[2], item[0]))
    return [(entry_id, score) for entry_id, score, _ in scored]


def expected_to_help(ranking: Ranking, ranked: Sequence[tuple[int, float]]) -> bool:
    """Whether any entry of a ranked list is expected to help the row: under ``lift``, a score (the upper bound in
    training, the mean at evaluation) above zero; the other rankings show whatever passed their filters."""
    return any(score > 0 for _, score in ranked) if ranking == "lift" else bool(ranked)


# ---------------------------------------------------------------------------------------------------------------
# Metrics


def shown_metrics(pool, rows) -> dict[str, float]:
    """The worth of what this step's rows were shown, as it stood when they were shown (before this step's
    credit): ``pool/worth/shown_mean_lift`` (the shrunk mean lift of the entries shown, never-shown ones at 0),
    ``pool/worth/shown_helping_share`` (of the entries shown, those whose mean lift is above 0), ``pool/worth/
    entries_judged`` (entries of the pool credited at least :data:`MIN_USES` times) and ``pool/worth/harmful``
    (of those, the ones judged harmful)."""
    shown = [s["entry_id"] for r in rows if r.kind == "abstraction" and r.has_feedback for s in r.retrieved]
    shown = [i for i in shown if isinstance(i, int)]
    judged = list(pool.judged_worth(MIN_USES).values())  # read apart: a step never reads the whole pool's records
    metrics = {
        "pool/worth/entries_judged": float(len(judged)),
        "pool/worth/harmful": float(sum(w.hurts for w in judged)),
    }
    if shown:
        records = pool.entry_worth(set(shown))
        values = [records.get(i, Worth()).mean_lift for i in shown]
        metrics["pool/worth/shown_mean_lift"] = sum(values) / len(values)
        metrics["pool/worth/shown_helping_share"] = sum(v > 0 for v in values) / len(values)
    return metrics
