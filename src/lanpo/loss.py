"""How LANPO's rows reach TRL's loss: pure functions of a micro-batch and its step's plan (``lanpo_plan``, carried
on the batch); ``LanpoTrainer`` calls them from TRL's loss hooks.

* Feedback rows trained on the plain prompt (every :class:`~lanpo.plan.Objective` that strips the context) were
  sampled under x + c. Their weights π(y|x) / π(y|x,c) need no forward pass of their own: π(y|x,c) is the
  sampler's log-probability (recorded at generation as log_softmax(logits / T), HF and vLLM alike) and π(y|x) is
  TRL's old log-probability, which is the loss forward's own (detached) value whenever TRL skips computing it.
  The weights scale the advantages of the micro-batch just before TRL's loss reads them (:func:`reweight`). On a
  micro-batch of a step with feedback, TRL's loss runs with β = 0 and LANPO adds the KL of every row (TRL's k3
  where it is on-policy, the weighted ½r² of :func:`lanpo.objective.feedback_kl` on feedback rows sampled under a
  context) and ``shaped``'s own policy term, normalized as TRL normalizes its loss (:func:`feedback_terms`).
  Steps without feedback (p_t = 0) run TRL's loss untouched.
* ``context_in_loss="keep"``: feedback rows carry long contexts; TRL pads every prompt of the generation batch to
  the longest and shuffles rows into micro-batches, so scratch rows pay for contexts too. Where the plan allows
  it (:attr:`~lanpo.plan.StepPlan.bucket_by_prompt_length`), rows are sorted by prompt length into micro-batches
  and each is cut to its own widths: the same loss and gradients (to floating-point error), fewer padded tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from lanpo import objective, score
from lanpo.plan import StepPlan

# The keys a step's batch carries for the loss, besides TRL's own.
PLAN = "lanpo_plan"
HAS_FEEDBACK = "lanpo_has_feedback"
CONTEXT_LOGPS = "lanpo_context_logps"
CORRECT = "lanpo_correct"  # which rows the verifier credits (hint reliance is measured on those)


def with_plan(batch: dict[str, Any], plan: StepPlan, rows: int) -> None:
    """Carry the step's plan on its batch: one reference per row, so that TRL's shuffle and split hand it to every
    micro-batch."""
    batch[PLAN] = [plan] * rows


def plan_of(batch: dict[str, Any]) -> StepPlan | None:
    """The plan a (micro-)batch was generated under; None for a batch lanpo did not build (evaluation)."""
    plans = batch.get(PLAN)
    return plans[0] if plans else None


def bucket_by_prompt_length(batch: dict[str, Any], num_chunks: int) -> list[dict[str, Any]]:
    """``batch`` split into ``num_chunks`` equal micro-batches of rows of similar prompt length (longest first),
    each cut to its longest prompt and longest completion. Scalars are shared; lists are split like tensors."""
    lengths = batch["prompt_mask"].sum(1)
    order = torch.argsort(lengths.cpu(), descending=True, stable=True)
    size = len(order) // num_chunks
    width = batch["completion_mask"].size(1)
    chunks = []
    for c in range(num_chunks):
        idx = order[c * size : (c + 1) * size]
        prompt_mask, completion_mask = batch["prompt_mask"][idx], batch["completion_mask"][idx]
        first = int(prompt_mask.any(0).int().argmax()) if prompt_mask.any() else prompt_mask.size(1)
        used = completion_mask.any(0).nonzero()
        end = max(1, int(used[-1]) + 1 if len(used) else 1)
        chunk = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0:
                value = value[idx.to(value.device)]
                if key in ("prompt_ids", "prompt_mask"):
                    value = value[:, first:]
                elif value.ndim >= 2 and value.size(1) == width:
                    value = value[:, :end]
            elif isinstance(value, list):
                value = [value[i] for i in idx.tolist()]
            chunk[key] = value
        chunks.append(chunk)
    return chunks


@dataclass
class LossCapture:
    """One micro-batch's feedback rows on their way through TRL's loss."""

    plan: StepPlan
    inputs: dict  # the micro-batch TRL's loss reads: a copy without lanpo's keys (its advantages are rewritten)
    feedback: torch.Tensor  # (N,) bool
    context: torch.Tensor | None  # (N, T) π(y|x,c) of feedback rows' tokens, NaN elsewhere; None under keep
    logps: torch.Tensor | None = None  # the loss forward's π_θ(y|x), with gradient
    old: torch.Tensor | None = None  # π_old(y|x), detached
    kl_weights: torch.Tensor | None = None  # truncated per-token π(y|x) / π(y|x,c): 1 on scratch rows
    shaped_advantages: torch.Tensor | None = None
    correct: torch.Tensor | None = None  # (N,) bool: rows the verifier credits


def capture(batch: dict[str, Any]) -> LossCapture | None:
    """The capture of a micro-batch whose step planned feedback; None where TRL's loss runs untouched."""
    plan = plan_of(batch)
    if plan is None or not plan.has_feedback:
        return None
    inputs = {k: v for k, v in batch.items() if k not in (PLAN, HAS_FEEDBACK, CONTEXT_LOGPS, CORRECT, *score.KEYS)}
    correct = batch.get(CORRECT)
    return LossCapture(
        plan,
        inputs,
        batch[HAS_FEEDBACK].bool(),
        batch.get(CONTEXT_LOGPS),
        correct=correct.bool() if correct is not None else None,
    )


def reliance_sums(capture: LossCapture) -> torch.Tensor | None:
    """This micro-batch's (sum of per-row hint reliance, rows) over the right feedback rows
    (:func:`lanpo.feedback.privileged.hint_reliance`: mean per-token log π(y|x,c) minus mean per-token log π_old(y|x));
    None where the loss does not hold both (keep, or no correctness carried)."""
    if capture.context is None or capture.correct is None or capture.old is None:
        return None
    mask = capture.inputs["completion_mask"].bool() & torch.isfinite(capture.context)
    counts = mask.sum(1)
    rows = capture.feedback.to(mask.device) & capture.correct.to(mask.device) & (counts > 0)
    if not rows.any():
        return torch.zeros(2, device=mask.device)
    hinted = torch.where(mask, capture.context, 0.0).sum(1) / counts.clamp(min=1)
    plain = torch.where(mask, capture.old.float(), 0.0).sum(1) / counts.clamp(min=1)
    return torch.stack([(hinted - plain)[rows].sum(), rows.sum().float()])


def _rows(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row flags broadcast to a per-token tensor's shape."""
    return flags.to(like.device)[:, None].expand(like.shape[0], like.shape[-1])


def record_forward(capture: LossCapture, logps: torch.Tensor) -> None:
    """The loss forward's π_θ(y|x), and π_old(y|x) by TRL's own rule (its old log-probabilities, else the forward's
    detached values)."""
    capture.logps = logps
    old = capture.inputs.get("old_per_token_logps")
    capture.old = logps.detach() if old is None else old


def reweight(capture: LossCapture, clip: float) -> torch.Tensor | None:
    """Feedback rows' advantages as the plan's objective wants them, computed from π_old(y|x) and the sampler's
    π(y|x,c) (before TRL's loss reads them). Returns this process's (sum of weights, weighted tokens, clipped
    tokens) where weights were applied, else None."""
    inputs = capture.inputs
    context = capture.context
    chosen = capture.plan.objective
    mask = inputs["completion_mask"]
    capture.kl_weights = objective.strip_weights(capture.old, context, mask, clip)
    if chosen.shaped:  # its own term in feedback_terms; TRL's surrogate sees no advantage on these rows
        advantages = capture.shaped_advantages = inputs["advantages"]
        flags = capture.feedback.to(advantages.device)
        flags = flags if advantages.dim() == 1 else _rows(flags, advantages)
        inputs["advantages"] = torch.where(flags, torch.zeros_like(advantages), advantages)
        return None
    if chosen.strip_weight is None:  # unweighted: the plain advantage
        return None
    if chosen.strip_weight == "sequence":
        weights = objective.sequence_strip_weights(capture.old, context, mask, clip)
    else:
        weights = capture.kl_weights
    inputs["advantages"] = objective.weight_advantages(inputs["advantages"], weights)
    applied = mask.bool() & torch.isfinite(context)  # feedback rows' tokens
    return torch.stack([(weights * applied).sum(), applied.sum().float(), ((weights >= clip) & applied).sum().float()])


@dataclass(frozen=True)
class KLSettings:
    """How TRL's own KL term is computed, from its config."""

    beta: float
    bias_corrected: bool  # use_bias_correction_kl
    sequence_level: bool  # importance_sampling_level == "sequence"


def completion_mask(inputs: dict) -> torch.Tensor:
    """The tokens TRL's loss counts."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def _kl_ratio(logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, sequence_level: bool) -> torch.Tensor:
    """TRL's π_θ / π_old as its bias-corrected KL uses it, per token or per sequence."""
    log_ratio = logps - old
    if sequence_level:
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    return torch.exp(log_ratio)


def feedback_terms(
    capture: LossCapture, kl: KLSettings, shaping_gamma: float, scale: objective.LossScale
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What LANPO adds to TRL's loss (run with β = 0) on a micro-batch with feedback rows: the shaped policy term of
    feedback rows and every row's KL (TRL's k3 on rows sampled under their own prompt, the weighted ½r² on rows
    sampled under a context), normalized as TRL normalizes its own. Returns the term and the per-token KL
    (detached, for the logs; None at β = 0)."""
    inputs, logps, old = capture.inputs, capture.logps, capture.old
    mask = completion_mask(inputs)
    per_token = torch.zeros_like(logps)
    if capture.shaped_advantages is not None:
        shaped = objective.shaped_policy_loss(logps, capture.shaped_advantages, shaping_gamma)
        per_token = torch.where(_rows(capture.feedback, shaped), shaped, per_token)
    logged = None
    if kl.beta != 0.0:
        ref = inputs["ref_per_token_logps"]
        if capture.context is not None:
            off_policy = _rows(capture.feedback, logps)
        else:
            off_policy = torch.zeros_like(logps, dtype=torch.bool)
        # k3 only where it is on-policy: elsewhere its inputs are made equal, so that no exp(r) of a feedback
        # token reaches the backward pass (torch.where would multiply its infinite derivative by 0: NaN)
        on_logps = torch.where(off_policy, ref, logps)
        coef = None
        if kl.bias_corrected:
            coef = _kl_ratio(on_logps, torch.where(off_policy, ref, old), mask, kl.sequence_level)
        per_token_kl = objective.trl_k3(ref, on_logps, coef)
        if capture.context is not None:
            per_token_kl = torch.where(off_policy, objective.feedback_kl(ref, logps, capture.kl_weights), per_token_kl)
        per_token = per_token + kl.beta * per_token_kl
        logged = per_token_kl.detach()
    return objective.aggregate(per_token, mask, scale), logged


def kl_sums(kl: torch.Tensor, mask: torch.Tensor, feedback: torch.Tensor) -> torch.Tensor:
    """This process's (KL sum, tokens) over every row, scratch rows and feedback rows: six numbers to reduce into
    ``kl``, ``kl/scratch`` and ``kl/feedback``."""
    feedback_mask = mask * feedback[:, None].to(mask.dtype)
    parts = [
        (kl * mask).sum(),
        mask.sum(),
        (kl * (mask - feedback_mask)).sum(),
        (mask - feedback_mask).sum(),
        (kl * feedback_mask).sum(),
        feedback_mask.sum(),
    ]
    return torch.stack([p.float() for p in parts])


@dataclass(frozen=True)
class SamplingCorrection:
    """TRL's vLLM importance-sampling correction, from its config."""

    mode: str  # vllm_importance_sampling_mode: token_truncate, token_mask, sequence_truncate, sequence_mask
    clip_min: float | None
    clip_max: float | None


def importance_sampling_ratio(
    old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, correction: SamplingCorrection
) -> torch.Tensor:
    """π_old / π_sampler as TRL's ``_generate_and_score_completions`` computes it (per token, or per sequence with a
    (B, 1) shape), truncated or masked to [clip_min, clip_max]; tokens the sampler could not score (NaN) get 1."""
    log_ratio = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if correction.mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    ratio = torch.exp(log_ratio)
    if correction.mode.endswith("truncate"):
        return torch.clamp(ratio, min=correction.clip_min, max=correction.clip_max)
    low = -math.inf if correction.clip_min is None else correction.clip_min
    high = math.inf if correction.clip_max is None else correction.clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def correct_in_loss(inputs: dict, old: torch.Tensor, correction: SamplingCorrection) -> None:
    """π_old taken from the loss forward (``old_logps_from_loss``): TRL's old log-probabilities and its importance
    ratio written into the micro-batch before TRL's loss reads them, as its generation would have."""
    inputs["old_per_token_logps"] = old
    inputs["importance_sampling_ratio"] = importance_sampling_ratio(
        old, inputs["sampling_per_token_logps"], completion_mask(inputs), correction
    )


def strip_vllm_correction(output: dict, has_feedback: torch.Tensor) -> torch.Tensor:
    """The strip family under vLLM: TRL's importance correction compares the sampler under x + c with π(y|x), so on
    feedback rows it is set to 1 (the strip weight stands in for it). Returns this process's values of TRL's
    ``sampling/*`` metrics as they now apply (min, mean, max of the ratio; mean and max of the sampler/trainer
    log-prob gap of scratch rows, since a feedback row's gap is the context's effect, not a sampler mismatch)."""
    has_feedback = has_feedback[:, None]
    ratio = output["importance_sampling_ratio"]
    output["importance_sampling_ratio"] = ratio = torch.where(has_feedback, torch.ones_like(ratio), ratio)
    # off_policy_mask_threshold compares the loss forward with the sampler: on a feedback row that gap is the
    # context's effect and would mask the row; the drift of π(y|x) since generation is what it should see
    sampling = output["sampling_per_token_logps"]
    output["sampling_per_token_logps"] = torch.where(has_feedback, output["old_per_token_logps"], sampling)
    mask = output["completion_mask"].bool()
    flat = ratio[mask] if ratio.shape == mask.shape else ratio.flatten()
    delta = (output["old_per_token_logps"] - sampling).abs()
    delta = delta[mask & ~has_feedback & ~torch.isnan(delta)]
    nan = torch.tensor(float("nan"), device=ratio.device)
    parts = [flat.min(), flat.mean(), flat.max()] if flat.numel() else [nan] * 3
    parts += [delta.mean(), delta.max()] if delta.numel() else [nan] * 2
    return torch.stack(parts)
