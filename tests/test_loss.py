"""lanpo.loss: strip weights from the sampler's log-probabilities equal the two-pass computation; keep-mode
micro-batches bucketed by prompt length give the same loss and gradients as TRL's shuffled ones."""

from __future__ import annotations

import math

import pytest
import torch
from trl.trainer.utils import split_tensor_dict

import lanpo.loss
import lanpo.step
from lanpo.engine.generation import left_pad
from lanpo.loss import bucket_by_prompt_length
from test_trainer import make_trainer, stub_summaries

LOGP_TOL = 1e-4  # fp32 on CPU: a KV-cached generation step vs one full forward


def _forward(trainer, prompts, completion_ids, completion_mask):
    ids, mask = left_pad(prompts, trainer.processing_class.pad_token_id)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([ids, completion_ids], 1),
            torch.cat([mask, completion_mask], 1),
            completion_ids.size(1),
        )
    return logps


def test_strip_weights_from_the_sampler_equal_the_two_forward_computation(tiny_model_dir, tmp_path, monkeypatch):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, context_in_loss="strip", max_steps=2, temperature=0.7, strip_ratio_clip=1e6
    )  # no clipping: compare the raw ratios
    stub_summaries(trainer)
    checked = {"rows": 0, "tokens": 0}
    attach = lanpo.step.attach_feedback_inputs

    def attach_and_reference(parts, output, generation):
        attach(parts, output, generation)
        rows = generation.rows
        # the reference: one forward under each row's context (plain prompt for scratch rows), as before
        reference = _forward(
            trainer, [r.context_ids or r.plain_ids for r in rows], output["completion_ids"], output["completion_mask"]
        )
        feedback = torch.tensor([r.has_feedback for r in rows])[:, None] & output["completion_mask"].bool()
        if feedback.any():
            sampled = output["lanpo_context_logps"]
            assert (sampled[feedback] - reference[feedback]).abs().max() < LOGP_TOL
            checked["rows"] += int(feedback.any(1).sum())
        output["test_reference_context"] = torch.where(feedback, reference, torch.full_like(reference, float("nan")))

    monkeypatch.setattr(lanpo.step, "attach_feedback_inputs", attach_and_reference)
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
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (
        calls.append(torch.is_grad_enabled()) or original(*a, **k)
    )
    trainer.train()
    # per step: the reference model's forward (no grad, beta > 0) and the loss's forward (grad); nothing else
    assert calls.count(False) == 2 and calls.count(True) == 2, calls


def test_strip_mode_falls_back_to_a_forward_when_a_generator_reports_no_log_probabilities(
    tiny_model_dir, tmp_path, monkeypatch
):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss="strip", max_steps=2, generation_rounds="phased")
    stub_summaries(trainer)
    original = trainer._generate_ids
    trainer._generate_ids = lambda ids: (original(ids)[0], None)
    attach, checked = lanpo.step.attach_feedback_inputs, []

    def attach_and_check(parts, output, generation):
        attach(parts, output, generation)
        rows = generation.rows
        assert all(r.sampler_logps is None for r in rows)
        reference = _forward(
            trainer, [r.context_ids or r.plain_ids for r in rows], output["completion_ids"], output["completion_mask"]
        )
        feedback = torch.tensor([r.has_feedback for r in rows])[:, None] & output["completion_mask"].bool()
        assert feedback.any()
        assert (output["lanpo_context_logps"][feedback] - reference[feedback]).abs().max() < LOGP_TOL
        scratch = ~torch.tensor([r.has_feedback for r in rows])
        assert torch.isnan(output["lanpo_context_logps"][scratch]).all()
        checked.append(int(feedback.sum()))

    monkeypatch.setattr(lanpo.step, "attach_feedback_inputs", attach_and_check)
    trainer.train()
    assert len(checked) == 2


def _generation_batch(trainer, rows=16, seed=0):
    """A TRL-shaped generation batch: left-padded prompts of very different lengths, right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    prompts = [
        torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in torch.randint(4, 60, (rows,), generator=g)
    ]
    completions = [
        torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in torch.randint(1, 12, (rows,), generator=g)
    ]
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    width = max(map(len, completions))
    completion_ids = torch.tensor([c + [0] * (width - len(c)) for c in completions])
    completion_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    with torch.no_grad():
        ref = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            width,
        )[0]
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=g),
        "ref_per_token_logps": ref - 0.1 * torch.rand(ref.shape, generator=g),
        "num_items_in_batch": completion_mask.sum(),
    }


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
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        loss_type=loss_type,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_generations=4,
    )
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
    assert sorted(sum((c["prompt_mask"].sum(1).tolist() for c in buckets), [])) == sorted(
        batch["prompt_mask"].sum(1).tolist()
    )  # every row once


def test_keep_mode_with_several_micro_batches_trains_on_buckets(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        context_in_loss="keep",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_steps=2,
    )
    stub_summaries(trainer)
    assert trainer.args.steps_per_generation == 2
    widths = []
    compute_loss = trainer._compute_loss
    trainer._compute_loss = lambda model, inputs: (
        widths.append(inputs["prompt_ids"].size(1)) or compute_loss(model, inputs)
    )
    trainer.train()
    assert len(widths) == 4 and any(w != max(widths) for w in widths)  # micro-batches cut to their own widths


def test_generation_from_a_prefilled_cache_raises_no_deprecation_warning(tiny_model_dir, monkeypatch):
    """transformers 5.24 renamed generate's cache argument: lanpo passes the name the installed version reads
    (make demo printed a FutureWarning raised by lanpo's own call at every step)."""
    import warnings

    from transformers import AutoModelForCausalLM, GenerationConfig

    import lanpo.engine.generation as generation

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    ids, mask = left_pad([[5] * n for n in (3, 5, 40, 45)], 0)
    assert generation.prefill_in_buckets(model, ids, mask) is not None  # the path that passes a cache
    config = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=[2])
    import transformers.utils.generic

    logged = []
    monkeypatch.setattr(transformers.utils.generic.logger, "warning_once", lambda message, *a: logged.append(message))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generation.sample_with_logprobs(model, ids, mask, config, [2])
    assert not [w for w in caught if issubclass(w.category, FutureWarning | DeprecationWarning)], caught
    assert not [m for m in logged if "deprecated" in m], logged  # the cache read back under its current name


def test_prefill_in_buckets_continues_exactly_as_one_padded_prefill(tiny_model_dir):
    """Greedy completions and their log-probabilities are the same whether generate prefills the padded batch
    itself or continues from the two-bucket cache."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    import lanpo.engine.generation as generation

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


# -- feedback rows in the loss: every context_in_loss choice against a hand-written formula --------------------------

CHOICES = ["strip", "strip-sequence", "shaped", "unweighted", "keep"]
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)  # fp32 on CPU: the same forward, summed in another order


def _feedback_batch(trainer, mode, seed=0, stale=False):
    """A hand-made micro-batch with feedback rows (2 of every 4) and, for the strip family, a sampler π(y|x,c)
    that differs from π(y|x) by up to ±2 nats a token."""
    batch = _generation_batch(trainer, rows=8, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    lanpo.loss.with_plan(batch, trainer.args.step_plan(0), 8)  # a step that planned feedback
    batch["lanpo_has_feedback"] = torch.tensor([False, False, True, True] * 2)
    plain = _forward_logps(trainer, batch)
    if mode != "keep":
        noise = 4 * torch.rand(plain.shape, generator=g) - 2
        context = torch.where(batch["lanpo_has_feedback"][:, None], plain + noise, torch.full_like(plain, float("nan")))
        batch["lanpo_context_logps"] = context
    if stale:  # a later iteration over the same generation: π_old differs from π_θ, so TRL's clip can bind
        batch["old_per_token_logps"] = plain + 0.3 * torch.randn(plain.shape, generator=g)
    return batch


def _forward_logps(trainer, batch, grad=False):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.set_grad_enabled(grad):
        logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -batch["completion_ids"].size(1) - 1 : -1]
    logps = torch.log_softmax(logits.float() / trainer.args.temperature, -1)
    return logps.gather(-1, batch["completion_ids"][..., None]).squeeze(-1)


def _reference_loss(trainer, batch, mode):
    """The objective written out by hand (TRL's dapo normalization, one process): PPO-clipped surrogate with the
    choice's weight on feedback rows (or −A·π/(π+γ) for shaped), plus β times k3·ratio on rows sampled under
    their own prompt and w·½r² on feedback rows sampled under a context."""
    args = trainer.args
    logp = _forward_logps(trainer, batch, grad=True)
    old = batch.get("old_per_token_logps", logp.detach())
    mask, ref = batch["completion_mask"].float(), batch["ref_per_token_logps"]
    feedback = batch["lanpo_has_feedback"][:, None] & mask.bool()
    advantages = batch["advantages"][:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    if mode != "keep":
        log_w = torch.where(feedback, old - batch["lanpo_context_logps"], torch.zeros_like(old))
        token_w = torch.exp(log_w).clamp(max=args.strip_ratio_clip)
        if mode == "strip":
            advantages = advantages * token_w
        elif mode == "strip-sequence":
            seq = torch.exp(log_w.sum(1, keepdim=True) / feedback.sum(1, keepdim=True).clamp(min=1))
            advantages = torch.where(feedback, advantages * seq.clamp(max=args.strip_ratio_clip), advantages)
    clipped = ratio.clamp(1 - args.epsilon, 1 + (args.epsilon_high or args.epsilon))
    policy = -torch.min(ratio * advantages, clipped * advantages)
    if mode == "shaped":
        pi = torch.exp(logp)
        policy = torch.where(feedback, -advantages * pi / (pi + args.shaping_gamma), policy)
    r = ref - logp
    if mode == "keep":
        kl = (torch.exp(r) - r - 1) * ratio
    else:  # k3 only where it applies: an exp(100) poisons the gradient even where torch.where discards it
        r_k3 = torch.where(feedback, 0.0, r)
        kl = torch.where(feedback, token_w * 0.5 * r * r, (torch.exp(r_k3) - r_k3 - 1) * ratio)
    per_token = policy + args.beta * kl
    normalizer = (
        float(batch["num_items_in_batch"]) * trainer.current_gradient_accumulation_steps / args.steps_per_generation
    )
    return (per_token * mask).sum() / normalizer


def _lanpo_loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def _reference_loss_and_grads(trainer, batch, mode):
    trainer.model.zero_grad()
    loss = _reference_loss(trainer, batch, mode)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def _loss_trainer(tiny_model_dir, tmp_path, mode, **overrides):
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss=mode, beta=0.1, **overrides)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


@pytest.mark.parametrize("stale", [False, True], ids=["fresh", "stale-old-logps"])
@pytest.mark.parametrize("mode", CHOICES)
def test_every_context_in_loss_choice_gives_the_loss_and_gradients_of_its_formula(
    tiny_model_dir, tmp_path, mode, stale
):
    trainer = _loss_trainer(tiny_model_dir, tmp_path, mode, strip_ratio_clip=1.5)
    batch = _feedback_batch(trainer, mode, stale=stale)
    loss, grads = _lanpo_loss_and_grads(trainer, batch)
    expected, expected_grads = _reference_loss_and_grads(trainer, batch, mode)
    assert float(loss) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)
    assert any(float(g.abs().max()) > 0 for g in grads)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, **GRAD_TOL)


@pytest.mark.parametrize("r", [30.0, 100.0])
@pytest.mark.parametrize("mode", [m for m in CHOICES if m != "keep"])
def test_a_feedback_token_far_from_the_reference_gives_a_finite_loss_and_gradient(tiny_model_dir, tmp_path, mode, r):
    """r = log π_ref − log π_θ of 30 and 100 on one feedback token: TRL's bias-corrected k3 has gradient 0 at the
    first and NaN at the second; the feedback KL's is −w·r, and the whole loss follows the formula."""
    trainer = _loss_trainer(tiny_model_dir, tmp_path, mode)
    batch = _feedback_batch(trainer, mode)
    plain = _forward_logps(trainer, batch)
    row, token = 2, 0  # a feedback row's first completion token
    assert batch["lanpo_has_feedback"][row] and batch["completion_mask"][row, token]
    batch["ref_per_token_logps"][row, token] = plain[row, token] + r
    loss, grads = _lanpo_loss_and_grads(trainer, batch)
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    expected, expected_grads = _reference_loss_and_grads(trainer, batch, mode)
    assert float(loss) == pytest.approx(float(expected), rel=1e-4)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
def test_lanpo_kl_on_rows_sampled_under_their_own_prompt_is_trl_s(tiny_model_dir, tmp_path, loss_type):
    """A micro-batch whose rows are all scratch rows, through LANPO's path (TRL's loss at β = 0 plus LANPO's KL
    term), equals TRL's own loss with its KL, for every loss normalization."""
    trainer = _loss_trainer(
        tiny_model_dir,
        tmp_path,
        "strip",
        loss_type=loss_type,
        num_generations=4,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=4,
    )
    trainer.current_gradient_accumulation_steps = 2
    batch = _generation_batch(trainer, rows=8)
    batch["old_per_token_logps"] = batch["ref_per_token_logps"] + 0.05  # ratio ≠ 1: bias correction matters
    expected, expected_grads = _lanpo_loss_and_grads(trainer, batch)  # no feedback flag: TRL's loss untouched
    flagged = dict(
        batch,
        lanpo_plan=[trainer.args.step_plan(0)] * 8,  # a step that planned feedback: LANPO's path
        lanpo_has_feedback=torch.zeros(8, dtype=torch.bool),
        lanpo_context_logps=torch.full(batch["completion_mask"].shape, float("nan")),
    )
    loss, grads = _lanpo_loss_and_grads(trainer, flagged)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    for got, want in zip(grads, expected_grads):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", CHOICES)
def test_a_short_high_learning_rate_run_logs_finite_loss_grad_norm_and_kl_split_at_every_step(
    tiny_model_dir, tmp_path, mode
):
    trainer = make_trainer(  # phased: every step has feedback rows (one: the first step's all go plain)
        tiny_model_dir,
        tmp_path,
        context_in_loss=mode,
        max_steps=4,
        learning_rate=0.05,
        beta=0.1,
        generation_rounds="phased",
    )
    stub_summaries(trainer)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    assert len(logged) == 4
    for key in ("loss", "grad_norm", "kl", "kl/scratch", "kl/feedback"):
        values = [h.get(key) for h in logged]
        assert all(v is not None and math.isfinite(v) for v in values), (key, values)
    assert max(h["kl"] for h in logged) > 0  # the policy left the reference


def test_sampler_log_probabilities_are_logits_over_temperature_before_any_processor(tiny_model_dir):
    """Repetition penalty and a forced minimum length change the sampler's scores, not π(y|·): the recorded
    log-probabilities equal log_softmax(logits / T) of a plain forward, TRL's definition."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    import lanpo.engine.generation as generation

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    torch.manual_seed(0)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [20, 21]]
    ids, mask = left_pad(prompts, 0)
    config = GenerationConfig(
        max_new_tokens=10,
        min_new_tokens=10,
        do_sample=True,
        temperature=0.7,
        repetition_penalty=1.8,
        pad_token_id=0,
        eos_token_id=[2],
    )
    completions, logprobs = generation.sample_with_logprobs(model, ids, mask, config, [2])
    for prompt, completion, recorded in zip(prompts, completions, logprobs):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(recorded), expected, atol=LOGP_TOL)
