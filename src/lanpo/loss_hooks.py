"""How LANPO's rows reach TRL's loss: feedback rows' weights, shaping and KL applied inside the loss's own forward,
keep-mode micro-batches bucketed by prompt length.

* Feedback rows trained on the plain prompt (``strip``, ``strip-sequence``, ``shaped``, ``unweighted``) were
  sampled under x + c. Their weights π(y|x) / π(y|x,c) need no forward pass of their own: π(y|x,c) is the
  sampler's log-probability (recorded at generation as log_softmax(logits / T), HF and vLLM alike) and π(y|x) is
  TRL's old log-probability, which is the loss forward's own (detached) value whenever TRL skips computing it.
  The weights scale the advantages of the micro-batch just before TRL's loss reads them. On a micro-batch of a
  step with feedback, TRL's loss runs with β = 0 and LANPO adds the KL of every row (TRL's k3 where it is
  on-policy, the weighted ½r² of :func:`lanpo.objective.feedback_kl` on feedback rows sampled under a context)
  and ``shaped``'s own policy term, normalized as TRL normalizes its loss. Steps without feedback (p_t = 0) run
  TRL's loss untouched.
* ``context_in_loss="keep"``: feedback rows carry long contexts; TRL pads every prompt of the generation batch to
  the longest and shuffles rows into micro-batches, so scratch rows pay for contexts too. When the micro-batches
  of a generation make one optimizer step and the loss normalization does not depend on which rows share a
  micro-batch, rows are sorted by prompt length into micro-batches and each is cut to its own widths: the same
  loss and gradients (to floating-point error), fewer padded tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lanpo import objective
from lanpo.engine.generation import left_pad

# TRL loss types whose total over the micro-batches of one optimizer step does not depend on their composition
# (bnpo divides by each micro-batch's own token count).
COMPOSITION_FREE_LOSSES = ("grpo", "dr_grpo", "dapo", "cispo", "luspo", "sapo", "vespo")


def bucket_by_prompt_length(batch: dict[str, Any], num_chunks: int) -> list[dict[str, Any]]:
    """``batch`` split into ``num_chunks`` equal micro-batches of rows of similar prompt length (longest first),
    each cut to its longest prompt and longest completion. Scalars are shared; lists are split like tensors."""
    lengths = batch["prompt_mask"].sum(1)
    order = torch.argsort(lengths.cpu(), descending=True, stable=True)
    size, width = len(order) // num_chunks, batch["completion_mask"].size(1)
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
class _LossCapture:
    """One micro-batch's feedback rows on their way through TRL's loss."""

    inputs: dict  # the micro-batch TRL's loss reads (a copy: its advantages are rewritten)
    feedback: torch.Tensor  # (N,) bool
    context: torch.Tensor | None  # (N, T) π(y|x,c) of feedback rows' tokens, NaN elsewhere; None under keep
    logps: torch.Tensor | None = None  # the loss forward's π_θ(y|x), with gradient
    old: torch.Tensor | None = None  # π_old(y|x), detached
    kl_weights: torch.Tensor | None = None  # truncated per-token π(y|x) / π(y|x,c): 1 on scratch rows
    shaped_advantages: torch.Tensor | None = None


def _rows(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row flags broadcast to a per-token tensor's shape."""
    return flags.to(like.device)[:, None].expand(like.shape[0], like.shape[-1])


class LossHooks:
    """Mixed into ``LanpoTrainer`` (before ``GRPOTrainer``): strip weights in the loss, keep-mode bucketing."""

    _capture: _LossCapture | None = None

    # -- keep: micro-batches by prompt length ------------------------------------------------------------------

    def _buckets_apply(self) -> bool:
        args = self.args
        return (
            args.context_in_loss == "keep"
            and args.steps_per_generation > 1
            and args.steps_per_generation == args.gradient_accumulation_steps
            and args.loss_type in COMPOSITION_FREE_LOSSES
            and not getattr(self, "_entropy_bonus_enabled", False)
            and args.group_plan(self.state.global_step).scratch < self.num_generations
        )

    def _prepare_inputs(self, generation_batch):
        if not (self.model.training and self._buckets_apply()):
            return super()._prepare_inputs(generation_batch)  # TRL's shuffle and split (p_t = 0 stays GRPO)
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
            self._buffered_inputs = bucket_by_prompt_length(
                self._generate_and_score_completions(generation_batch), steps
            )
        return self._buffered_inputs[self._step % steps]

    # -- feedback rows in the loss: their weights, shaping and KL -----------------------------------------------

    def _attach_feedback_inputs(self, output: dict) -> None:
        """Mark this step's feedback rows (``lanpo_has_feedback``) for the loss and, when they are trained on the
        plain prompt, add ``lanpo_context_logps``: π(y|x,c) per completion token of feedback rows (NaN elsewhere),
        from the sampler; rows a generate function returned no log-probabilities for get one no-grad forward."""
        rows, device = self._rows, self.accelerator.device
        output["lanpo_has_feedback"] = torch.tensor([r.has_feedback for r in rows], device=device)
        if not self.args.strips_context():
            return
        missing = [r.has_feedback and r.sampler_logps is None for r in rows]
        any_missing = self._any_process(any(missing))  # every process takes part in the fallback forward
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        width = completion_ids.size(1)
        logps = torch.full(completion_ids.shape, float("nan"), device=device)
        for i, row in enumerate(rows):
            if row.has_feedback and row.sampler_logps:
                values = torch.tensor([float("nan") if v is None else v for v in row.sampler_logps[:width]])
                logps[i, : len(values)] = values.to(device)
        if any_missing:
            ids, mask = left_pad(
                [r.context_ids if r.context_ids is not None else r.plain_ids for r in rows],
                self.processing_class.pad_token_id,
                device,
            )
            with torch.no_grad():
                forward, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([ids, completion_ids], 1),
                    torch.cat([mask, completion_mask], 1),
                    width,
                    batch_size=self.args.per_device_train_batch_size,
                )
            logps = torch.where(torch.tensor(missing, device=device)[:, None], forward, logps)
        output["lanpo_context_logps"] = logps

    def _compute_loss(self, model, inputs):
        if "lanpo_has_feedback" not in inputs:
            return super()._compute_loss(model, inputs)  # no feedback planned this step: TRL's loss, untouched
        inputs = dict(inputs)  # the buffered micro-batch is reused by later iterations: leave it untouched
        capture = _LossCapture(inputs, inputs.pop("lanpo_has_feedback").bool(), inputs.pop("lanpo_context_logps", None))
        self._capture, (beta, self.beta) = capture, (self.beta, 0.0)  # TRL's loss without its KL term
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._capture, self.beta = None, beta
        return loss + self._feedback_terms(capture)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        capture = self._capture
        if capture is not None and capture.logps is None:  # the loss's forward: weights before TRL reads them
            capture.logps = result[0]
            old = capture.inputs.get("old_per_token_logps")
            capture.old = result[0].detach() if old is None else old  # TRL's own rule for π_old(y|x)
            if capture.context is not None:
                self._reweight(capture)
        return result

    def _reweight(self, capture: _LossCapture) -> None:
        """Feedback rows' advantages as ``context_in_loss`` wants them, computed from π_old(y|x) (TRL's old
        log-probabilities, or the loss forward's own when TRL skips them) and the sampler's π(y|x,c)."""
        args, inputs, context = self.args, capture.inputs, capture.context
        mask = inputs["completion_mask"]
        capture.kl_weights = objective.strip_weights(capture.old, context, mask, args.strip_ratio_clip)
        if args.context_in_loss == "shaped":  # its own term below; TRL's surrogate sees no advantage on these rows
            advantages = capture.shaped_advantages = inputs["advantages"]
            flags = capture.feedback.to(advantages.device)
            flags = flags if advantages.dim() == 1 else _rows(flags, advantages)
            inputs["advantages"] = torch.where(flags, torch.zeros_like(advantages), advantages)
            return
        if args.context_in_loss == "unweighted":
            return
        weights = (
            capture.kl_weights
            if args.context_in_loss == "strip"
            else objective.sequence_strip_weights(capture.old, context, mask, args.strip_ratio_clip)
        )
        inputs["advantages"] = objective.weight_advantages(inputs["advantages"], weights)
        applied = mask.bool() & torch.isfinite(context)  # feedback rows' tokens
        stats = torch.stack(
            [
                (weights * applied).sum(),
                applied.sum().float(),
                ((weights >= args.strip_ratio_clip) & applied).sum().float(),
            ]
        )
        total = self.accelerator.gather(stats[None]).sum(0)
        if total[1] > 0:
            self._metrics["train"]["lanpo/strip_weight_mean"].append(float(total[0] / total[1]))
            self._metrics["train"]["lanpo/strip_weight_clipped"].append(float(total[2] / total[1]))

    def _feedback_terms(self, capture: _LossCapture) -> torch.Tensor:
        """What LANPO adds to TRL's loss (run with β = 0) on a micro-batch with feedback rows: the shaped policy
        term of feedback rows and every row's KL (TRL's k3 on rows sampled under their own prompt, the weighted
        ½r² on rows sampled under a context), normalized as TRL normalizes its own."""
        args, inputs, logps, old = self.args, capture.inputs, capture.logps, capture.old
        mask = (
            inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        )
        per_token = torch.zeros_like(logps)
        if capture.shaped_advantages is not None:
            shaped = objective.shaped_policy_loss(logps, capture.shaped_advantages, args.shaping_gamma)
            per_token = torch.where(_rows(capture.feedback, shaped), shaped, per_token)
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            off_policy = (
                _rows(capture.feedback, logps)
                if capture.context is not None
                else torch.zeros_like(logps, dtype=torch.bool)
            )
            # k3 only where it is on-policy: elsewhere its inputs are made equal, so that no exp(r) of a feedback
            # token reaches the backward pass (torch.where would multiply its infinite derivative by 0: NaN)
            on_logps = torch.where(off_policy, ref, logps)
            coef = (
                self._kl_ratio(on_logps, torch.where(off_policy, ref, old), mask)
                if args.use_bias_correction_kl
                else None
            )
            kl = objective.trl_k3(ref, on_logps, coef)
            if capture.context is not None:
                kl = torch.where(off_policy, objective.feedback_kl(ref, logps, capture.kl_weights), kl)
            per_token = per_token + self.beta * kl
            self._log_kl(kl.detach(), mask, capture.feedback)
        scale = objective.LossScale(
            args.loss_type,
            self.current_gradient_accumulation_steps,
            self.max_completion_length,
            float(inputs["num_items_in_batch"]),
            self.accelerator.num_processes,
            args.steps_per_generation,
        )
        return objective.aggregate(per_token, mask, scale)

    def _kl_ratio(self, logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """TRL's π_θ / π_old as its bias-corrected KL uses it, per token or per sequence."""
        log_ratio = logps - old
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        return torch.exp(log_ratio)

    def _log_kl(self, kl: torch.Tensor, mask: torch.Tensor, feedback: torch.Tensor) -> None:
        """``kl`` (every token, as TRL logs it), ``kl/scratch`` and ``kl/feedback``, over every process."""
        feedback_mask = mask * feedback[:, None].to(mask.dtype)
        parts = [
            (kl * mask).sum(),
            mask.sum(),
            (kl * (mask - feedback_mask)).sum(),
            (mask - feedback_mask).sum(),
            (kl * feedback_mask).sum(),
            feedback_mask.sum(),
        ]
        totals = self.accelerator.reduce(torch.stack([p.float() for p in parts]), reduction="sum")
        for name, k in (("kl", 0), ("kl/scratch", 2), ("kl/feedback", 4)):
            if totals[k + 1] > 0:
                self._metrics["train"][name].append(float(totals[k] / totals[k + 1]))

    def _strip_vllm_correction(self, output: dict) -> None:
        """The strip family under vLLM: TRL's importance correction compares the sampler under x + c with π(y|x), so on
        feedback rows it is set to 1 (the strip weight stands in for it), and TRL's ``sampling/*`` values of this
        step are replaced by those of what is applied: the ratio after that, and the sampler/trainer log-prob gap
        of scratch rows (a feedback row's gap is the context's effect, not a sampler mismatch)."""
        has_feedback = torch.tensor([r.has_feedback for r in self._rows], device=output["advantages"].device)[:, None]
        ratio = output["importance_sampling_ratio"]
        output["importance_sampling_ratio"] = ratio = torch.where(has_feedback, torch.ones_like(ratio), ratio)
        # off_policy_mask_threshold compares the loss forward with the sampler: on a feedback row that gap is the
        # context's effect and would mask the row; the drift of π(y|x) since generation is what it should see
        sampling = output["sampling_per_token_logps"]
        output["sampling_per_token_logps"] = torch.where(has_feedback, output["old_per_token_logps"], sampling)
        metrics = self._metrics["train"]
        mask = output["completion_mask"].bool()
        flat = ratio[mask] if ratio.shape == mask.shape else ratio.flatten()
        delta = (output["old_per_token_logps"] - sampling).abs()
        delta = delta[mask & ~has_feedback & ~torch.isnan(delta)]
        nan = torch.tensor(float("nan"), device=ratio.device)
        parts = [flat.min(), flat.mean(), flat.max()] if flat.numel() else [nan] * 3
        parts += [delta.mean(), delta.max()] if delta.numel() else [nan] * 2
        values = self.accelerator.gather(torch.stack(parts)[None])
        finite = ~torch.isnan(values)
        reduce = [torch.min, torch.mean, torch.max, torch.mean, torch.max]
        names = [
            "importance_sampling_ratio/min",
            "importance_sampling_ratio/mean",
            "importance_sampling_ratio/max",
            "sampling_logp_difference/mean",
            "sampling_logp_difference/max",
        ]
        for k, (name, op) in enumerate(zip(names, reduce)):
            column = values[:, k][finite[:, k]]
            if metrics.get(f"sampling/{name}"):
                metrics[f"sampling/{name}"][-1] = float(op(column)) if column.numel() else float("nan")
