"""Per-token log-probabilities of completions for the loss, the reference and the old-policy passes.

TRL computes them with a fused LM head (``trl.trainer.utils.add_fused_lm_head``): the backbone, then the head in
tiles, folded into an online log-sum-exp, never materializing ``(tokens, vocab)`` logits. On a device without
Triton (a CPU) it projects *every* position of the batch, prompt and padding included, and its backward
accumulates the gradient GEMMs in fp32: at the verdict grid's shape (32 rows × about 140 tokens, 49,152 columns,
bf16 autocast) a forward and backward of the update costs 1.8× what the same forward and backward costs with the
head run on the completion tokens alone (``benchmarks/step_floor.py``).

``logprob_head="compact"`` (:func:`add_compact_lm_head`) is that second way: the backbone, then the head on the
positions whose label counts (the completion tokens), a chunk of tokens at a time, with torch's ``log_softmax``
and autograd; the entropy TRL's metric reads is computed without gradient unless an entropy bonus trains on it.
It changes numerics at the level of rounding (log-sum-exp in one pass instead of online): the per-token values
differ from TRL's by about 1e-6 relative. It keeps a chunk's log-softmax for the backward (``chunk_tokens`` ×
vocab floats). Models whose head TRL scales or soft-caps, multimodal inputs and pre-shifted labels keep TRL's head.
"""

from __future__ import annotations

import logging
import types

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

CHUNK_TOKENS = 512  # rows of logits at a time: 512 × 49,152 fp32 is 100 MB

_SCALED_HEAD = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


class HeadRequest:
    """What the next forward through a compact head should return beyond log-probabilities: set by the trainer
    around each of TRL's log-probability calls (whose ``compute_entropy`` the model's forward never sees)."""

    def __init__(self, entropy_grad: bool) -> None:
        self.entropy = True  # TRL's forwards outside its log-probability calls (none today) get everything
        self.entropy_grad = entropy_grad  # an entropy bonus trains on the entropy


def scales_its_head(model) -> str | None:
    """The config field by which a model scales or soft-caps its logits (TRL's head handles those), else None."""
    config = model.config.get_text_config()
    return next((name for name in _SCALED_HEAD if getattr(config, name, None) not in (None, 1.0)), None)


def completion_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    entropy: bool,
    entropy_grad: bool,
    chunk_tokens: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and (optionally) the entropy of ``softmax(hidden @ weight.T / temperature)`` for each row of
    ``hidden`` (N, H), ``chunk_tokens`` rows at a time. The projection runs in the autocast dtype when autocast is
    on (as TRL's tiles do); the softmax in fp32."""
    inv_t = 1.0 / temperature
    logps, entropies = [], []
    for start in range(0, hidden.size(0), chunk_tokens):
        logits = F.linear(hidden[start : start + chunk_tokens], weight, bias).float() * inv_t
        log_softmax = logits.log_softmax(-1)
        logps.append(log_softmax.gather(-1, targets[start : start + chunk_tokens, None]).squeeze(-1))
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropies.append(-(log_softmax.exp() * log_softmax).sum(-1))
    if not logps:  # no scored token: an empty result still connected to the graph
        logps = [hidden.sum(-1)[:0].float()]
        entropies = [logps[0]] if entropy else []
    return torch.cat(logps), torch.cat(entropies) if entropy else None


def add_compact_lm_head(model, temperature: float, request: HeadRequest, chunk_tokens: int = CHUNK_TOKENS) -> bool:
    """Route ``model(..., labels=..., fused_lm_head=True)`` (TRL's log-probability call, after TRL's own
    ``add_fused_lm_head``) through :func:`completion_log_probs`. Returns False, leaving TRL's head, for a model
    that scales its logits."""
    scaled = scales_its_head(model)
    if scaled:
        logger.warning("logprob_head=compact: %s scales its logits (%s); keeping TRL's head.", type(model), scaled)
        return False
    from trl.trainer.utils import FusedCausalLMOutput

    fused_forward = model.forward  # TRL's: everything this head does not handle goes there

    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kwargs):
        own = fused_lm_head and shift_labels is None and labels is not None
        own = own and not any(key.startswith(("pixel_", "image_")) for key in kwargs)
        own = own and not kwargs.get("output_router_logits") and not getattr(self.config, "output_router_logits", 0)
        if not own:
            return fused_forward(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        labels = labels[:, 1:].to(hidden.device)
        mask = labels != -100
        head = self.get_output_embeddings()
        logps, entropy = completion_log_probs(
            hidden[mask],
            head.weight,
            head.bias,
            labels[mask],
            temperature,
            request.entropy,
            request.entropy_grad,
            chunk_tokens,
        )
        # scattered back into (batch, positions): zero where the label does not count, as TRL's head returns
        logps = logps.new_zeros(mask.shape).masked_scatter(mask, logps)
        if entropy is not None:
            entropy = entropy.new_zeros(mask.shape).masked_scatter(mask, entropy)
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(loss=-logps.sum() / count, log_probs=logps, entropy=entropy, label_mask=mask)

    model.forward = types.MethodType(forward, model)
    return True


def add_compact_heads(models, temperature: float, entropy_grad: bool) -> HeadRequest | None:
    """``logprob_head="compact"``: ``models`` (the policy, a PEFT policy's base model, the reference model, a
    teacher's own weights; None skipped) give their log-probabilities from the completion tokens alone, patched over
    TRL's fused head where TRL patched it. The request the trainer sets ``entropy`` on before each forward, or None
    where any model kept TRL's head."""
    from accelerate.utils import is_peft_model

    request = HeadRequest(entropy_grad=entropy_grad)
    models = [m.get_base_model() if is_peft_model(m) else m for m in models if m is not None]
    patched = [add_compact_lm_head(m, temperature, request) for m in models]
    return request if all(patched) else None
