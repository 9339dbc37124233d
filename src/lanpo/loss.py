"""How LANPO's rows reach TRL's loss: strip weights applied inside the loss's own forward, keep-mode micro-batches
bucketed by prompt length.

* ``context_in_loss="strip"``: a feedback row was sampled under x + c and is trained on x. Its per-token weight
  π(y|x) / π(y|x,c) needs no forward pass of its own: π(y|x,c) is the sampler's log-probability (recorded at
  generation, HF and vLLM alike) and π(y|x) is TRL's old log-probability, which is the loss forward's own
  (detached) value whenever TRL skips computing it (one update per generation). The weights scale the advantages
  of the micro-batch just before TRL's loss reads them.
* ``context_in_loss="keep"``: feedback rows carry long contexts; TRL pads every prompt of the generation batch to
  the longest and shuffles rows into micro-batches, so scratch rows pay for contexts too. When the micro-batches
  of a generation make one optimizer step and the loss normalization does not depend on which rows share a
  micro-batch, rows are sorted by prompt length into micro-batches and each is cut to its own widths: the same
  loss and gradients (to floating-point error), fewer padded tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from . import objective
from .generation import left_pad

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
        idx = order[c * size:(c + 1) * size]
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


class LossHooks:
    """Mixed into ``LanpoTrainer`` (before ``GRPOTrainer``): strip weights in the loss, keep-mode bucketing."""

    _strip_pending: tuple[torch.Tensor, dict] | None = None

    # -- keep: micro-batches by prompt length ------------------------------------------------------------------

    def _buckets_apply(self) -> bool:
        args = self.args
        return (args.context_in_loss == "keep" and args.steps_per_generation > 1
                and args.steps_per_generation == args.gradient_accumulation_steps
                and args.loss_type in COMPOSITION_FREE_LOSSES and not getattr(self, "_entropy_bonus_enabled", False)
                and args.group_plan(self.state.global_step)[0] < self.num_generations)

    def _prepare_inputs(self, generation_batch):
        if not (self.model.training and self._buckets_apply()):
            return super()._prepare_inputs(generation_batch)  # TRL's shuffle and split (p_t = 0 stays GRPO)
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
            self._buffered_inputs = bucket_by_prompt_length(self._generate_and_score_completions(generation_batch),
                                                            steps)
        return self._buffered_inputs[self._step % steps]

    # -- strip: weights from the sampler's and the loss's own log-probabilities ---------------------------------

    def _attach_context_logps(self, output: dict) -> None:
        """``output["lanpo_context_logps"]``: π(y|x,c) per completion token of feedback rows (NaN elsewhere: weight
        1), from the sampler; rows a generate function returned no log-probabilities for get one no-grad forward."""
        rows, device = self._rows, self.accelerator.device
        missing = [r.has_feedback and r.sampler_logps is None for r in rows]
        any_missing = self._any_process(any(missing))  # every process takes part in the fallback forward
        if not any_missing and not self._any_process(any(r.has_feedback for r in rows)):
            return
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        width = completion_ids.size(1)
        logps = torch.full(completion_ids.shape, float("nan"), device=device)
        for i, row in enumerate(rows):
            if row.has_feedback and row.sampler_logps:
                values = torch.tensor([float("nan") if v is None else v for v in row.sampler_logps[:width]])
                logps[i, :len(values)] = values.to(device)
        if any_missing:
            ids, mask = left_pad([r.context_ids if r.context_ids is not None else r.plain_ids for r in rows],
                                 self.processing_class.pad_token_id, device)
            with torch.no_grad():
                forward, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([ids, completion_ids], 1), torch.cat([mask, completion_mask], 1), width,
                    batch_size=self.args.per_device_train_batch_size)
            logps = torch.where(torch.tensor(missing, device=device)[:, None], forward, logps)
        output["lanpo_context_logps"] = logps

    def _compute_loss(self, model, inputs):
        if "lanpo_context_logps" not in inputs:
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # the buffered micro-batch is reused by later iterations: leave it untouched
        self._strip_pending = (inputs.pop("lanpo_context_logps"), inputs)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._strip_pending = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._strip_pending is not None:  # the loss's forward: weight the advantages before TRL reads them
            (context, inputs), self._strip_pending = self._strip_pending, None
            old = inputs.get("old_per_token_logps")
            plain = result[0].detach() if old is None else old  # TRL's own rule for π_old(y|x)
            mask = inputs["completion_mask"]
            weights = objective.strip_weights(plain, context, mask, self.args.strip_ratio_clip)
            inputs["advantages"] = objective.weight_advantages(inputs["advantages"], weights)
            applied = mask.bool() & torch.isfinite(context)  # feedback rows' tokens
            stats = torch.stack([(weights * applied).sum(), applied.sum().float(),
                                 ((weights >= self.args.strip_ratio_clip) & applied).sum().float()])
            total = self.accelerator.gather(stats[None]).sum(0)
            if total[1] > 0:
                self._metrics["train"]["lanpo/strip_weight_mean"].append(float(total[0] / total[1]))
                self._metrics["train"]["lanpo/strip_weight_clipped"].append(float(total[2] / total[1]))
        return result

    def _strip_vllm_correction(self, output: dict) -> None:
        """Strip mode under vLLM: TRL's importance correction compares the sampler under x + c with π(y|x), so on
        feedback rows it is set to 1 (the strip weight stands in for it), and TRL's ``sampling/*`` values of this
        step are replaced by those of what is applied: the ratio after that, and the sampler/trainer log-prob gap
        of scratch rows (a feedback row's gap is the context's effect, not a sampler mismatch)."""
        has_feedback = torch.tensor([r.has_feedback for r in self._rows], device=output["advantages"].device)[:, None]
        ratio = output["importance_sampling_ratio"]
        output["importance_sampling_ratio"] = ratio = torch.where(has_feedback, torch.ones_like(ratio), ratio)
        metrics = self._metrics["train"]
        mask = output["completion_mask"].bool()
        flat = ratio[mask] if ratio.shape == mask.shape else ratio.flatten()
        delta = (output["old_per_token_logps"] - output["sampling_per_token_logps"]).abs()
        delta = delta[mask & ~has_feedback & ~torch.isnan(delta)]
        nan = torch.tensor(float("nan"), device=ratio.device)
        parts = [flat.min(), flat.mean(), flat.max()] if flat.numel() else [nan] * 3
        parts += [delta.mean(), delta.max()] if delta.numel() else [nan] * 2
        values = self.accelerator.gather(torch.stack(parts)[None])
        finite = ~torch.isnan(values)
        reduce = [torch.min, torch.mean, torch.max, torch.mean, torch.max]
        names = ["importance_sampling_ratio/min", "importance_sampling_ratio/mean", "importance_sampling_ratio/max",
                 "sampling_logp_difference/mean", "sampling_logp_difference/max"]
        for k, (name, op) in enumerate(zip(names, reduce)):
            column = values[:, k][finite[:, k]]
            if metrics.get(f"sampling/{name}"):
                metrics[f"sampling/{name}"][-1] = float(op(column)) if column.numel() else float("nan")
