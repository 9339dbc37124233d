"""logprob_head="compact": log-probabilities, entropies and their gradients as exact as TRL's fused head on any
shape (against float64), and the loss, gradients, reference and entropy of a model equal to TRL's (fp32, rtol 1e-5); the entropy carries a gradient only where a bonus trains on it; models that scale their
logits keep TRL's head."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.kernels import ChunkedLogProbFunction

from lanpo.engine.logprobs import completion_log_probs, scales_its_head
from test_loss import _generation_batch, _loss_and_grads
from test_trainer import make_trainer

TOL = dict(rtol=1e-5, atol=1e-6)  # at a model's scale (logits of a few units), against TRL's values


def _trl(hidden, weight, bias, targets, temperature):
    logps, entropy, *_ = ChunkedLogProbFunction.apply(
        hidden, weight, bias, targets, temperature, 32768, None, 1.0, ("log_probs", "entropy")
    )
    return logps, entropy


def _exact(hidden, weight, bias, targets, temperature, up):
    """float64 log-probabilities, entropies and the gradients of (logps * up).sum() + entropy.sum()."""
    inputs = [x.detach().double().requires_grad_() for x in (hidden, weight) + ((bias,) if bias is not None else ())]
    logits = inputs[0] @ inputs[1].T + (inputs[2] if bias is not None else 0.0)
    log_softmax = (logits / temperature).log_softmax(-1)
    logps = log_softmax.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    grads = torch.autograd.grad((logps * up.double()).sum() + entropy.sum(), inputs) if len(targets) else None
    return logps.detach(), entropy.detach(), grads


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(0, 40),
    vocab=st.integers(2, 300),
    chunk=st.integers(1, 64),
    temperature=st.floats(0.2, 2.0),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_compact_log_probs_entropies_and_gradients_are_as_exact_as_trl_s_fused_head(
    tokens, vocab, chunk, temperature, with_bias, seed
):
    g = torch.Generator().manual_seed(seed)
    hidden = (3 * torch.randn(tokens, 16, generator=g)).requires_grad_()
    weight = torch.randn(vocab, 16, generator=g).requires_grad_()
    bias = torch.randn(vocab, generator=g).requires_grad_() if with_bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    up = torch.randn(tokens, generator=g)  # an arbitrary upstream gradient
    inputs = [hidden, weight] + ([bias] if with_bias else [])

    trl, trl_entropy = _trl(hidden, weight, bias, targets, temperature)
    trl_grads = torch.autograd.grad((trl * up).sum() + trl_entropy.sum(), inputs, allow_unused=True)
    got, got_entropy = completion_log_probs(hidden, weight, bias, targets, temperature, True, True, chunk)
    got_grads = torch.autograd.grad((got * up).sum() + got_entropy.sum(), inputs, allow_unused=True)
    logps, entropy, grads = _exact(hidden, weight, bias, targets, temperature, up)

    assert got.shape == trl.shape == (tokens,)
    if not tokens:  # nothing scored: no gradient, or TRL's zeros
        assert all(a is None or not a.any() for a in got_grads + trl_grads)
        return
    # fp32 rounding of a log-sum-exp over logits of size |z| is about eps * |z|: the floor of both errors
    floor = (
        8
        * torch.finfo(torch.float32).eps
        * max(float((hidden.detach() @ weight.detach().T).abs().max()) / temperature, 1.0)
    )

    def error(a, b):
        return float((a.detach().double() - b).abs().max())

    assert error(got, logps) <= error(trl, logps) + floor
    assert error(got_entropy, entropy) <= error(trl_entropy, entropy) + floor
    for ours, theirs, exact in zip(got_grads, trl_grads, grads):  # sums over tokens: scaled by their largest entry
        assert error(ours, exact) <= error(theirs, exact) + floor * float(exact.abs().max().clamp(min=1.0))


def test_the_entropy_carries_a_gradient_only_where_a_bonus_trains_on_it():
    hidden = torch.randn(5, 8, requires_grad=True)
    weight, targets = torch.randn(11, 8), torch.randint(0, 11, (5,))
    logps, entropy = completion_log_probs(hidden, weight, None, targets, 1.0, True, False)
    assert logps.requires_grad and not entropy.requires_grad
    _, entropy = completion_log_probs(hidden, weight, None, targets, 1.0, True, True)
    assert entropy.requires_grad
    assert completion_log_probs(hidden, weight, None, targets, 1.0, False, True)[1] is None


@pytest.mark.parametrize("field,value", [("final_logit_softcapping", 30.0), ("logit_scale", 0.5)])
def test_a_model_that_scales_its_logits_keeps_trl_s_head(tiny_model, field, value):
    tiny_model, _ = tiny_model
    assert scales_its_head(tiny_model) is None
    setattr(tiny_model.config, field, value)
    assert scales_its_head(tiny_model) == field


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_the_compact_head_gives_trl_s_loss_gradients_reference_and_entropy(tiny_model_dir, tmp_path, loss_type):
    trl = make_trainer(tiny_model_dir, tmp_path, "trl", loss_type=loss_type, logprob_head="trl")
    compact = make_trainer(tiny_model_dir, tmp_path, "compact", loss_type=loss_type, logprob_head="compact")
    assert compact._head_request is not None and trl._head_request is None
    for trainer in (trl, compact):
        trainer.current_gradient_accumulation_steps = 1
        trainer.model.train()
    batch = _generation_batch(trl)  # padded prompts of varied lengths, completions of varied lengths
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    width = batch["completion_ids"].size(1)
    with torch.no_grad():
        ref_trl = trl._get_per_token_logps_and_entropies(trl.ref_model, ids, mask, width)[0]
        ref_compact = compact._get_per_token_logps_and_entropies(compact.ref_model, ids, mask, width)[0]
        logps_trl, entropy_trl, _ = trl._get_per_token_logps_and_entropies(
            trl.model, ids, mask, width, compute_entropy=True
        )
        logps_compact, entropy_compact, _ = compact._get_per_token_logps_and_entropies(
            compact.model, ids, mask, width, compute_entropy=True
        )
    counted = batch["completion_mask"].bool()
    assert torch.allclose(ref_compact[counted], ref_trl[counted], **TOL)
    assert torch.allclose(logps_compact[counted], logps_trl[counted], **TOL)
    assert torch.allclose(entropy_compact[counted], entropy_trl[counted], **TOL)
    loss_trl, grads_trl = _loss_and_grads(trl, [batch])
    loss_compact, grads_compact = _loss_and_grads(compact, [batch])
    assert loss_compact == pytest.approx(loss_trl, rel=1e-5, abs=1e-7)
    assert len(grads_compact) == len(grads_trl)
    for a, b in zip(grads_compact, grads_trl):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_short_compact_run_trains_and_logs_finite_values(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, logprob_head="compact", feedback_ratio=0.5, max_steps=2)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logged) == 2
    for key in ("loss", "entropy", "kl", "grad_norm"):
        assert all(torch.isfinite(torch.tensor(h[key])) for h in logged), key
