"""lanpo.loss: strip weights from the sampler's log-probabilities equal the two-pass computation; keep-mode
micro-batches bucketed by prompt length give the same loss and gradients as TRL's shuffled ones."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.utils import split_tensor_dict

import lanpo.loss
from lanpo.generation import left_pad
from lanpo.loss import bucket_by_prompt_length
from test_trainer import make_trainer, stub_summaries

LOGP_TOL = 1e-4  # fp32 on CPU: a KV-cached generation step vs one full forward


def _forward(trainer, prompts, completion_ids, completion_mask):
    ids, mask = left_pad(prompts, trainer.processing_class.pad_token_id)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([ids, completion_ids], 1), torch.cat([mask, completion_mask], 1),
            completion_ids.size(1))
    return logps


def test_strip_weights_from_the_sampler_equal_the_two_forward_computation(tiny_model_dir, tmp_path, monkeypatch):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss="strip", max_steps=2, temperature=0.7,
                           strip_ratio_clip=1e6)  # no clipping: compare the raw ratios
    stub_summaries(trainer)
    checked = {"rows": 0, "tokens": 0}
    attach = trainer._attach_context_logps

    def attach_and_reference(output):
        attach(output)
        rows = trainer._rows
        # the reference: one forward under each row's context (plain prompt for scratch rows), as before
        reference = _forward(trainer, [r.context_ids or r.plain_ids for r in rows], output["completion_ids"],
                             output["completion_mask"])
        feedback = torch.tensor([r.has_feedback for r in rows])[:, None] & output["completion_mask"].bool()
        if feedback.any():
            sampled = output["lanpo_context_logps"]
            assert (sampled[feedback] - reference[feedback]).abs().max() < LOGP_TOL
            checked["rows"] += int(feedback.any(1).sum())
        output["test_reference_context"] = torch.where(feedback, reference, torch.full_like(reference, float("nan")))

    trainer._attach_context_logps = attach_and_reference
    compute_loss, strip_weights, seen = trainer._compute_loss, lanpo.loss.objective.strip_weights, []

    def loss_with_reference(model, inputs):
        seen.append(dict(inputs))
        inputs = {k: v for k, v in inputs.items() if k != "test_reference_context"}
        return compute_loss(model, inputs)

    def checked_weights(plain, context, mask, clip):
        weights = strip_weights(plain, context, mask, clip)
        inputs = seen[-1]
        prompts = [ids[m.bool()].tolist() for ids, m in zip(inputs["prompt_ids"], inputs["prompt_mask"])]
        plain_forward = _forward(trainer, prompts, inputs["completion_ids"], inputs["completion_mask"])
        two_pass = strip_weights(plain_forward, inputs["test_reference_context"], mask, clip)
        applied = mask.bool() & torch.isfinite(context)
        assert torch.allclose(weights[applied], two_pass[applied], rtol=LOGP_TOL * 10, atol=0)
        assert torch.equal(weights[~applied], torch.ones_like(weights[~applied]))
        checked["tokens"] += int(applied.sum())
        return weights

    trainer._compute_loss = loss_with_reference
    monkeypatch.setattr(lanpo.loss.objective, "strip_weights", checked_weights)
    trainer.train()
    assert checked["rows"] > 0 and checked["tokens"] > 0


def test_strip_mode_runs_no_extra_forward_when_the_sampler_reports_log_probabilities(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss="strip", max_steps=2)
    stub_summaries(trainer)
    calls = []
    original = trainer._get_per_token_logps_and_entropies
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: calls.append(torch.is_grad_enabled()) or original(*a, **k)
    trainer.train()
    # per step: the reference model's forward (no grad, beta > 0) and the loss's forward (grad); nothing else
    assert calls.count(False) == 2 and calls.count(True) == 2, calls


def test_strip_mode_falls_back_to_a_forward_when_a_generator_reports_no_log_probabilities(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss="strip", max_steps=2)
    stub_summaries(trainer)
    original = trainer._generate_ids
    trainer._generate_ids = lambda ids: (original(ids)[0], None)
    trainer.train()
    means = [h["lanpo/strip_weight_mean"] for h in trainer.state.log_history if "lanpo/strip_weight_mean" in h]
    assert means and all(0 < m <= trainer.args.strip_ratio_clip for m in means)


def _generation_batch(trainer, rows=16, seed=0):
    """A TRL-shaped generation batch: left-padded prompts of very different lengths, right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(4, 60, (rows,), generator=g)]
    completions = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
                   for n in torch.randint(1, 12, (rows,), generator=g)]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    width = max(map(len, completions))
    completion_ids = torch.tensor([c + [0] * (width - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    with torch.no_grad():
        ref = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
            width)[0]
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": torch.randn(rows, generator=g),
            "ref_per_token_logps": ref - 0.1 * torch.rand(ref.shape, generator=g),
            "num_items_in_batch": completion_mask.sum()}


def _loss_and_grads(trainer, chunks):
    trainer.model.zero_grad()
    total = 0.0
    for chunk in chunks:
        loss = trainer._compute_loss(trainer.model, chunk)
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_bucketed_micro_batches_give_the_loss_and_gradients_of_trl_shuffled_ones(tiny_model_dir, tmp_path, loss_type):
    trainer = make_trainer(tiny_model_dir, tmp_path, loss_type=loss_type, per_device_train_batch_size=4,
                           gradient_accumulation_steps=4, num_generations=4)
    trainer.current_gradient_accumulation_steps = 4
    trainer.model.train()
    batch = _generation_batch(trainer)
    permutation = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    shuffled = {k: v[permutation] if v.ndim else v for k, v in batch.items()}
    expected_loss, expected_grads = _loss_and_grads(trainer, split_tensor_dict(shuffled, 4))
    buckets = bucket_by_prompt_length(batch, 4)
    loss, grads = _loss_and_grads(trainer, buckets)
    assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-6)
    for a, b in zip(grads, expected_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    padded = sum(int((1 - c["prompt_mask"]).sum()) for c in buckets)
    assert padded < int((1 - batch["prompt_mask"]).sum()) / 2  # the point: far fewer padded prompt tokens
    assert sorted(sum((c["prompt_mask"].sum(1).tolist() for c in buckets), [])) == \
        sorted(batch["prompt_mask"].sum(1).tolist())  # every row once


def test_keep_mode_with_several_micro_batches_trains_on_buckets(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss="keep", per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, num_generations=4, max_steps=2)
    stub_summaries(trainer)
    assert trainer.args.steps_per_generation == 2
    widths = []
    compute_loss = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: widths.append(inputs["prompt_ids"].size(1)) or \
        compute_loss(model, inputs)
    trainer.train()
    assert len(widths) == 4 and any(w != max(widths) for w in widths)  # micro-batches cut to their own widths


def test_prefill_in_buckets_continues_exactly_as_one_padded_prefill(tiny_model_dir):
    """Greedy completions and their log-probabilities are the same whether generate prefills the padded batch
    itself or continues from the two-bucket cache."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    import lanpo.generation as generation

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in (5, 7, 40, 3, 38, 45, 6)]
    ids, mask = left_pad(prompts, 0)
    assert generation.prefill_in_buckets(model, ids, mask) is not None
    config = GenerationConfig(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=[2])
    bucketed = generation.sample_with_logprobs(model, ids, mask, config, [2])
    original = generation.prefill_in_buckets
    try:
        generation.prefill_in_buckets = lambda *a: None
        plain = generation.sample_with_logprobs(model, ids, mask, config, [2])
    finally:
        generation.prefill_in_buckets = original
    assert bucketed[0] == plain[0]
    for a, b in zip(bucketed[1], plain[1]):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-4)
