"""LANPO's changes to GRPO's objective, as pure functions of tensors.

TRL computes rewards, group-normalized advantages and the clipped surrogate + KL loss. LANPO changes two things,
each a switch of :class:`~lanpo.config.LanpoConfig`, and both act on the advantages TRL's loss consumes:

* ``advantage_grouping="separate"``: feedback and scratch rows of a group get separate baselines
  (:func:`separate_advantages`), so scratch rows, the test condition, are not pushed down merely because
  feedback made their neighbours better;
* ``context_in_loss="strip"``: the loss sees the plain prompt x although a feedback row was sampled under x
  plus a context c; each token's advantage is scaled by the truncated importance weight π(y|x) / π(y|x,c)
  (:func:`strip_weights`). Scaling an advantage by a positive weight scales that token's clipped-surrogate
  term by the same weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

EPS = 1e-4  # as TRL's GRPO adds to the standard deviation


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Unbiased standard deviation ignoring NaNs (as ``trl.trainer.utils.nanstd``)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dim, keepdim=keepdim) if dim is not None else (~torch.isnan(x)).sum()
    var = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=keepdim) * count / (count - 1)
    return torch.sqrt(var)


def totals(rewards_per_func: torch.Tensor, weights: torch.Tensor, accuracy_index: int | None) -> tuple[torch.Tensor,
                                                                                                      torch.Tensor]:
    """Per row: the weighted reward sum (as TRL logs it) and correctness (the accuracy reward > 0.5, else the
    total > 0). Rows no reward function scored count as 0 and wrong."""
    total = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    if accuracy_index is not None:
        return total, torch.nan_to_num(rewards_per_func[:, accuracy_index], nan=0.0) > 0.5
    return total, total > 0


def separate_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, has_feedback: Sequence[bool],
                        group_size: int, scale_rewards: str = "group",
                        aggregation: str = "sum_then_normalize") -> torch.Tensor:
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
    subgroups = [idx for start in range(0, len(flags), group_size) for value in (False, True)
                 if len(idx := [i for i in range(start, start + group_size) if bool(flags[i]) == value]) > 0]
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


def strip_weights(plain_logps: torch.Tensor, context_logps: torch.Tensor, completion_mask: torch.Tensor,
                  clip: float) -> torch.Tensor:
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
