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


def separate_advantages(rewards: torch.Tensor, has_feedback: Sequence[bool], group_size: int,
                        scale_rewards: str = "group") -> torch.Tensor:
    """Advantages with feedback and scratch rows of each group of ``group_size`` normalized apart.

    ``scale_rewards`` as in TRL: ``group`` divides by the subgroup's std, ``batch`` by the std of all
    ``rewards``, ``none`` not at all. A subgroup of one row has no baseline: its advantage is 0.
    """
    out = torch.zeros_like(rewards, dtype=torch.float32)
    batch_std = rewards.std() if rewards.numel() > 1 else torch.tensor(0.0)
    for start in range(0, len(rewards), group_size):
        for with_feedback in (False, True):
            idx = [i for i in range(start, min(start + group_size, len(rewards))) if has_feedback[i] == with_feedback]
            if len(idx) < 2:
                continue
            sub = rewards[idx]
            adv = sub - sub.mean()
            if scale_rewards == "group":
                adv = adv / (sub.std() + EPS)
            elif scale_rewards == "batch":
                adv = adv / (batch_std + EPS)
            out[idx] = adv.float()
    return out


def strip_weights(plain_logps: torch.Tensor, context_logps: torch.Tensor, completion_mask: torch.Tensor,
                  clip: float) -> torch.Tensor:
    """Per-token weights min(π(y|x) / π(y|x,c), ``clip``) from log-probabilities; 1 on padding tokens.

    Rows sampled without a context pass their plain log-probabilities as ``context_logps`` (weight exactly 1).
    """
    weights = torch.exp((plain_logps - context_logps).clamp(max=20)).clamp(max=clip)
    return weights * completion_mask + (1 - completion_mask)


def weight_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages ``(N, T)`` from per-row ``(N,)`` or per-token ``(N, T)`` advantages and weights."""
    return advantages.unsqueeze(1) * weights if advantages.dim() == 1 else advantages * weights
