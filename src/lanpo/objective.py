"""LANPO's changes to GRPO's objective, as pure functions of tensors.

TRL computes rewards, group-normalized advantages and the clipped surrogate + KL loss. A feedback row was sampled
under the problem x plus a context c; how it reaches the loss is ``context_in_loss``:

===================  ======================================================================  =====================
choice               what a feedback row's tokens are trained with                           source
===================  ======================================================================  =====================
``strip``            π(y|x), advantage × min(π(y_t|x,y<t) / π(y_t|x,c,y<t), clip) per token    Guide-GRPO
``strip-sequence``   π(y|x), advantage × min(geometric mean over the row of that ratio, clip)  GSPO-style
``shaped``           π(y|x), no importance weight, loss −A·f(π) with f(π) = π / (π + γ),       LUFFY, Critique-GRPO
                     no clip
``unweighted``       π(y|x), the plain advantage (no weight)                                  RLTF-SD
``keep``             π(y|x,c): the context stays in the prompt                                SAGE, QuestA, iGRPO
===================  ======================================================================  =====================

The KL term: TRL's k3 = e^r − r − 1 (r = log π_ref − log π_θ) is an on-policy estimator; taken on tokens sampled
under a context it is unbounded, and with TRL's bias correction its gradient (analytically −r) is computed as a
difference of exponentials that is exactly 0 from r ≈ 20.7 and NaN from r ≈ 89 in fp32. Feedback rows of the
strip family therefore get :func:`feedback_kl`, ½r² weighted by the truncated per-token importance weight: its
gradient is −w·r, finite for every r, and equals bias-corrected k3's on-policy. Scratch rows (and ``keep``
feedback rows, which are on-policy under their own prompt) keep TRL's k3 (:func:`trl_k3`).

``advantage_grouping``: ``shared`` is TRL's (one group of G); ``separate`` normalizes feedback and scratch rows of
a group apart (:func:`separate_advantages`); ``scratch-baseline`` centres feedback rows on the scratch rows' mean
(RLTF-SD; :func:`scratch_baseline_advantages`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

EPS = 1e-4  # as TRL's GRPO adds to the standard deviation


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased standard deviation ignoring NaNs (as ``trl.trainer.utils.nanstd``)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=keepdim) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=keepdim) * count / (count - 1)
    return torch.sqrt(var)


def totals(
    rewards_per_func: torch.Tensor, weights: torch.Tensor, accuracy_index: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the weighted reward sum (as TRL logs it) and correctness (the accuracy reward > 0.5, else the
    total > 0). Rows no reward function scored count as 0 and wrong."""
    total = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    if accuracy_index is not None:
        return total, torch.nan_to_num(rewards_per_func[:, accuracy_index], nan=0.0) > 0.5
    return total, total > 0


def separate_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    has_feedback: Sequence[bool],
    group_size: int,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """Advantages of the whole (gathered) batch with feedback and scratch rows of each group normalized apart.

    TRL's semantics, applied per subgroup instead of per group: rows that no reward function scored (all NaN)
    are excluded from every baseline and get advantage 0; ``scale_rewards`` ``group`` divides by the subgroup's
    std, ``batch`` by the std of the whole batch, ``none`` not at all; ``aggregation`` ``normalize_then_sum``
    normalizes each reward function within the subgroup, sums, then normalizes over the batch. A subgroup with
    fewer than two scored rows has no baseline: advantage 0.
    """
    weights = weights.to(rewards_per_func.device).unsqueeze(0)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    flags = torch.tensor(list(has_feedback), device=rewards_per_func.device)
    subgroups = [
        idx
        for start in range(0, len(flags), group_size)
        for value in (False, True)
        if len(idx := [i for i in range(start, start + group_size) if bool(flags[i]) == value]) > 0
    ]
    if aggregation == "normalize_then_sum":
        per_func = torch.full_like(rewards_per_func, float("nan"))
        for idx in subgroups:
            sub = rewards_per_func[idx]
            per_func[idx] = (sub - torch.nanmean(sub, dim=0, keepdim=True)) / (nanstd(sub, dim=0, keepdim=True) + EPS)
        rewards = (per_func * weights).nansum(dim=1)
        rewards[unscorable] = float("nan")
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + EPS)
    elif aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = float("nan")
        batch_std = nanstd(rewards) if rewards.numel() > 1 else torch.tensor(0.0)
        advantages = torch.full_like(rewards, float("nan"))
        for idx in subgroups:
            sub = rewards[idx]
            centred = sub - torch.nanmean(sub)
            scale = {"group": nanstd(sub), "batch": batch_std}.get(scale_rewards)
            advantages[idx] = centred / (scale + EPS) if scale is not None else centred
    else:
        raise ValueError(f"Unknown multi_objective_aggregation {aggregation!r}.")
    for idx in subgroups:  # no baseline for a lone scored row
        if int((~unscorable[idx]).sum()) < 2:
            advantages[idx] = 0.0
    return torch.nan_to_num(advantages, nan=0.0).float()


def strip_weights(
    plain_logps: torch.Tensor, context_logps: torch.Tensor, completion_mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """Per-token weights min(π(y|x) / π(y|x,c), ``clip``) from log-probabilities; 1 on padding tokens.

    Rows sampled without a context pass their plain log-probabilities as ``context_logps`` (weight exactly 1), and
    so does a token whose sampler log-probability is not finite (vLLM can report NaN).
    """
    context_logps = torch.where(torch.isfinite(context_logps), context_logps, plain_logps)  # NaN sampler logps: 1
    weights = torch.exp((plain_logps - context_logps).clamp(max=20)).clamp(max=clip)
    return weights * completion_mask + (1 - completion_mask)


def weight_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``(N, T)`` from per-row ``(N,)`` or per-token ``(N, T)`` advantages and weights."""
    return advantages.unsqueeze(1) * weights if advantages.dim() == 1 else advantages * weights


def scratch_baseline_advantages(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    has_feedback: Sequence[bool],
    group_size: int,
    scale_rewards: str = "group",
) -> torch.Tensor:
    """Advantages with the scratch rows as every row's baseline (RLTF-SD).

    Scratch rows are normalized among themselves (TRL's semantics on their subgroup). A feedback row's advantage
    is its reward minus the mean of its group's scratch rows, divided by the std of the whole group (``group``),
    of the batch (``batch``) or by nothing (``none``): the scratch rows' own std is 0 exactly when they all agree,
    which is when a right feedback row carries the most information. Rows no reward function scored are left
    out of every baseline and get 0; a group with no scored scratch row gives its feedback rows 0.
    """
    rewards = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = float("nan")
    flags = torch.tensor(list(has_feedback), device=rewards.device, dtype=torch.bool)
    batch_std = nanstd(rewards) if rewards.numel() > 1 else torch.tensor(0.0)
    advantages = torch.zeros_like(rewards)
    for start in range(0, len(rewards), group_size):
        group, feedback = rewards[start : start + group_size], flags[start : start + group_size]
        scratch = group[~feedback]
        if torch.isnan(scratch).all():
            continue
        baseline = torch.nanmean(scratch)
        group_scale = {"group": nanstd(group), "batch": batch_std}.get(scale_rewards)
        scratch_scale = {"group": nanstd(scratch), "batch": batch_std}.get(scale_rewards)
        centred = group - baseline
        if scale_rewards in ("group", "batch"):
            centred = torch.where(feedback, centred / (group_scale + EPS), centred / (scratch_scale + EPS))
        advantages[start : start + group_size] = centred
    return torch.nan_to_num(advantages, nan=0.0).float()


def sequence_strip_weights(
    plain_logps: torch.Tensor, context_logps: torch.Tensor, completion_mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """Per-row weights min(exp(mean_t log π(y_t|x,y<t) − log π(y_t|x,c,y<t)), ``clip``), the geometric mean of the
    per-token ratios over the row (GSPO's sequence-level ratio), broadcast over its tokens; 1 on padding and on rows
    without a context (their ``context_logps`` are not finite)."""
    finite = torch.isfinite(context_logps) & completion_mask.bool()
    log_ratio = torch.where(finite, plain_logps - context_logps, torch.zeros_like(plain_logps))
    count = finite.sum(1, keepdim=True)
    mean = log_ratio.sum(1, keepdim=True) / count.clamp(min=1)
    weights = torch.exp(mean.clamp(max=20)).clamp(max=clip).expand_as(plain_logps)
    weights = torch.where(count > 0, weights, torch.ones_like(weights))
    return weights * completion_mask + (1 - completion_mask)


def shaped_policy_loss(logps: torch.Tensor, advantages: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token loss −A·f(π) with f(π) = π / (π + γ), π = exp(log π(y_t|x,y<t)) (LUFFY's policy shaping): no
    importance weight, no clip. Its gradient, −A·γπ/(π+γ)²·∇log π, lifts low-probability guided tokens that a
    plain −A·∇log π would leave to the clip, and vanishes as π → 1."""
    probs = torch.exp(logps)
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    return -advantages * probs / (probs + gamma)


def trl_k3(ref_logps: torch.Tensor, logps: torch.Tensor, coef: torch.Tensor | None) -> torch.Tensor:
    """TRL's per-token KL estimate k3 = e^r − r − 1, r = log π_ref − log π_θ, times the importance ratio ``coef``
    (π_θ / π_old) when bias correction is on: exactly TRL 1.16's expression, for on-policy tokens."""
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    return kl * coef if coef is not None else kl


def feedback_kl(ref_logps: torch.Tensor, logps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate for tokens sampled under a context: w·½r², r = log π_ref − log π_θ, with ``weights``
    the (detached) truncated importance weights π(y_t|x) / π(y_t|x,c). Value and gradient (−w·r) are finite in
    fp32 and bf16 for any finite r; on-policy (w = 1) the gradient equals bias-corrected k3's."""
    r = ref_logps - logps
    return weights.detach() * 0.5 * r * r


@dataclass
class LossScale:
    """What TRL's loss divides a micro-batch's summed per-token loss by, for each ``loss_type``."""

    loss_type: str
    accumulation_steps: int  # current_gradient_accumulation_steps
    max_completion_length: int
    num_items_in_batch: float  # completion tokens of the whole generation batch, over every process
    num_processes: int
    steps_per_generation: int


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, scale: LossScale) -> torch.Tensor:
    """A micro-batch's loss from its per-token terms, normalized as TRL 1.16's ``_compute_loss`` does in training
    (so a term added here is weighted like TRL's own)."""
    per_token = per_token * mask
    if scale.loss_type in ("grpo", "sapo"):
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / scale.accumulation_steps
    if scale.loss_type == "bnpo":
        return per_token.sum() / mask.sum().clamp(min=1.0) / scale.accumulation_steps
    if scale.loss_type == "dr_grpo":
        return per_token.sum() / (per_token.size(0) * scale.max_completion_length) / scale.accumulation_steps
    if scale.loss_type in ("cispo", "dapo", "vespo"):
        normalizer = max(scale.num_items_in_batch, 1.0) / scale.num_processes
        return per_token.sum() / (normalizer * scale.accumulation_steps / scale.steps_per_generation)
    if scale.loss_type == "luspo":
        return per_token.sum(-1).mean() / scale.accumulation_steps
    raise ValueError(f"Unknown loss_type {scale.loss_type!r}.")
