"""vLLM, the engine real runs generate with, on CPU (`vllm-cpu`): run by `make test-vllm` in `.venv-vllm`.

The plain `make test` environment has no vLLM: these tests skip there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one engine in this process (TRL's colocate mode too)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from conftest import build_tiny_model  # noqa: E402
from lanpo.cli import main  # noqa: E402
from lanpo.config import LanpoConfig  # noqa: E402
from lanpo.data.loaders import builtin_arith, to_prompt_dataset  # noqa: E402
from lanpo.engine.models import cpu_bf16_native, load_tokenizer  # noqa: E402
from test_trainer import history, length_reward, stub_summaries  # noqa: E402

BF16_LOGP_TOL = 0.05  # nats: vLLM's CPU engine computes in bf16, the trainer in fp32


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> Path:
    """The tiny model with a head size vLLM's CPU attention supports (64); greedily it repeats its last token."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), hidden=128, heads=2)


def vllm_trainer(model_dir: Path, out: Path, reward=None, **overrides):
    from lanpo.trainer import LanpoTrainer

    settings = dict(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        temperature=1.0,
        disable_tqdm=True,
        relevance_scorer="bm25",
        relevance_threshold=0.0,
        feedback_ratio=0.75,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        vllm_gpu_memory_utilization=0.3,
    )
    settings.update(overrides)
    return LanpoTrainer(
        model=str(model_dir),
        reward_funcs=[reward or length_reward],
        args=LanpoConfig(**settings),
        train_dataset=to_prompt_dataset(builtin_arith("1", n=8)),
        processing_class=load_tokenizer(str(model_dir)),
    )


def test_every_row_gets_the_completion_of_its_own_prompt(vllm_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    trainer = vllm_trainer(vllm_model_dir, tmp_path / "rows", temperature=1e-6)  # sampling at T -> 0: greedy
    prompts = [[5, 6, 7, 40 + i] for i in range(11)] + [[9, 10]]  # rows that differ, of unequal lengths
    completions, logprobs = trainer._generate_ids(prompts)
    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    expected = [model.generate(torch.tensor([p]), max_new_tokens=1, do_sample=False)[0, -1].item() for p in prompts]
    assert len(set(expected)) >= 6  # the right completions tell the rows apart: a shuffle would show
    assert sum(c[0] == e for c, e in zip(completions, expected)) >= 0.9 * len(prompts)
    assert logprobs is not None and len(logprobs) == len(prompts)


def test_lanpo_trains_with_vllm_colocate_and_the_pool_grows(vllm_model_dir, tmp_path):
    trainer = vllm_trainer(vllm_model_dir, tmp_path / "keep")
    stub_summaries(trainer)
    stubbed, limits = trainer._generate_ids, set()

    def generate(prompt_ids):  # summaries ride in rollout batches (6 tokens a ride), the last ones apart (256)
        summary = any("Distill what this attempt teaches" in trainer.processing_class.decode(p) for p in prompt_ids)
        limits.add((summary, trainer.vllm_generation.max_completion_length))
        return stubbed(prompt_ids)

    trainer._generate_ids = generate
    trainer.train()
    assert limits == {(False, 6), (True, 6), (True, 256)}
    assert trainer.vllm_generation.max_completion_length == 6
    assert len(trainer.pool) > 0 and max(history(trainer, "lanpo/feedback_share")) > 0
    assert all(loss == loss for loss in history(trainer, "loss"))  # no NaN loss
    samples = [json.loads(x) for x in (tmp_path / "keep" / "samples.jsonl").read_text().splitlines()]
    assert any(s["feedback"] for s in samples)


def test_strip_mode_under_vllm_records_trainer_log_probabilities_and_leaves_feedback_rows_unmasked(
    vllm_model_dir, tmp_path
):
    """After an optimizer step (weights synced into vLLM), the sampler's π(y|x,c) of feedback rows equals an HF
    forward of the updated policy under the context; TRL's importance correction is 1 on feedback rows and its
    off-policy mask (a tight threshold, β > 0) keeps every feedback token."""
    import torch

    from test_loss import _forward

    trainer = vllm_trainer(
        vllm_model_dir,
        tmp_path / "strip",
        context_in_loss="strip",
        reflection_share=1.0,
        max_steps=3,
        beta=0.1,
        learning_rate=0.05,
        off_policy_mask_threshold=1e-3,
        generation_rounds="phased",  # every step reflects (one: the first step's reflections go plain)
    )
    stub_summaries(trainer)
    checked, masks, after = [], [], trainer.after_rollouts

    def check(output, generation):
        after(output, generation)
        rows = generation.rows
        feedback = torch.tensor([r.has_feedback for r in rows])[:, None] & output["completion_mask"].bool()
        assert feedback.any()
        reference = _forward(
            trainer, [r.context_ids or r.plain_ids for r in rows], output["completion_ids"], output["completion_mask"]
        )
        gap = (output["lanpo_context_logps"][feedback] - reference[feedback]).abs()
        scratch = ~torch.tensor([r.has_feedback for r in rows])[:, None] & output["completion_mask"].bool()
        scratch_gap = (output["sampling_per_token_logps"] - output["old_per_token_logps"])[scratch].abs()
        checked.append((trainer.state.global_step, float(gap.max()), float(scratch_gap.max())))
        ratio = output["importance_sampling_ratio"]
        assert torch.equal(ratio[feedback.any(1)], torch.ones_like(ratio[feedback.any(1)]))
        assert torch.equal(output["sampling_per_token_logps"][feedback], output["old_per_token_logps"][feedback])

    off_policy_mask = trainer.get_off_policy_mask

    def recorded_mask(**kwargs):
        mask = off_policy_mask(**kwargs)
        masks.append((mask.clone(), trainer.tap.capture.feedback.clone()))
        return mask

    trainer.after_rollouts, trainer.get_off_policy_mask = check, recorded_mask
    trainer.train()
    assert [step for step, _, _ in checked] == [0, 1, 2]
    # vLLM on CPU samples in bf16, the trainer runs fp32: hundredths of a nat (a stale sampler was off by 2-7 nats)
    assert all(gap < BF16_LOGP_TOL and scratch_gap < BF16_LOGP_TOL for _, gap, scratch_gap in checked), checked
    assert masks and all(bool(mask[feedback].all()) for mask, feedback in masks)
    for key in ("loss", "kl", "kl/scratch", "kl/feedback"):
        assert all(v == v and abs(v) != float("inf") for v in history(trainer, key)), key


def test_eval_on_vllm_and_hf_prints_the_same_table_and_greedy_answers_agree(vllm_model_dir, tmp_path):
    common = [
        "eval",
        "--model",
        str(vllm_model_dir),
        "--data",
        "builtin:arith?split=test",
        "--limit",
        "16",
        "--k",
        "2",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
        "--extraction",
        "lenient",
    ]
    assert main([*common, "--backend", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert main([*common, "--backend", "vllm", "--out", str(tmp_path / "vllm")]) == 0
    results = {b: json.loads((tmp_path / b / "results.json").read_text()) for b in ("hf", "vllm")}
    assert results["hf"]["backend"] == "hf" and results["vllm"]["backend"] == "vllm"
    assert (
        results["hf"]["modes"]["zero-shot"]["metrics"].keys() == results["vllm"]["modes"]["zero-shot"]["metrics"].keys()
    )
    tables = {b: (tmp_path / b / "results.md").read_text().splitlines() for b in ("hf", "vllm")}
    assert tables["hf"][4:6] == tables["vllm"][4:6]  # the same table header
    answers = {
        b: [
            [c["text"] for c in json.loads(line)["completions"]]
            for line in (tmp_path / b / "completions-zero-shot.jsonl").read_text().splitlines()
        ]
        for b in ("hf", "vllm")
    }
    same = sum(h == v for h, v in zip(answers["hf"], answers["vllm"]))
    assert same / len(answers["hf"]) >= 0.9


def distinct_characters(completions, **kwargs) -> list[float]:
    """A reward that differs between sampled rows, so a step moves the weights."""
    from lanpo.verify.rewards import completion_text

    return [float(len(set(completion_text(c)))) for c in completions]


def test_evaluation_during_training_samples_from_the_synced_vllm_engine(vllm_model_dir, tmp_path, monkeypatch):
    from lanpo.engine.generation import generate, is_vllm
    from lanpo.eval import during_training
    from lanpo.prompts import solve_messages

    real, seen = during_training.evaluate, []

    def checked(model, tokenizer, problems, settings, modes, **kwargs):
        results = real(model, tokenizer, problems, settings, modes, **kwargs)
        prompts = [solve_messages(p.problem) for p in problems]
        greedy = [  # the engine evaluation sampled from, and the policy of this step through transformers
            [row[0].text for row in generate(m, tokenizer, prompts, temperature=0, max_new_tokens=6)]
            for m in (model, trainer.model)
        ]
        seen.append((trainer.state.global_step, is_vllm(model), trainer._last_loaded_step, *greedy))
        return results

    monkeypatch.setattr(during_training, "evaluate", checked)
    trainer = vllm_trainer(
        vllm_model_dir,
        tmp_path / "eval",
        reward=distinct_characters,
        learning_rate=3e-2,
        feedback_ratio=0.0,
        eval_every=1,
        eval_benchmarks="builtin:arith?split=test",
        eval_limit=12,
        eval_k=1,
    )
    trainer.train()
    assert [(step, on_vllm, loaded) for step, on_vllm, loaded, _, _ in seen] == [
        (0, True, 0),
        (1, True, 1),
        (2, True, 2),
    ]
    # bf16 sampler, fp32 policy: greedy answers agree. Where the CPU only emulates bf16 (AVX2), the trained toy model's
    # near-tied logits round apart (step 2 here: 0 of 12, "XXXXXX" against undecodable bytes, 2026-12-06), so there
    # the untrained step must agree and the engine's answers must move with the policy's (a stale engine would not).
    native = cpu_bf16_native()
    for step, _, _, engine, hf in seen:
        if native or step == 0:
            assert sum(e == h for e, h in zip(engine, hf)) >= 0.9 * len(hf), (step, engine, hf)
    assert seen[0][4] != seen[-1][4]  # training changed the greedy answers: a stale engine would show
    assert seen[0][3] != seen[-1][3]  # and the engine's with them
    logged = history(trainer, "eval/arith/zero-shot/mean@1")
    assert len(logged) == 3


def test_a_finished_colocate_run_exits_cleanly_with_no_shutdown_traceback(vllm_model_dir, tmp_path):
    """`lanpo train` with a colocated engine: exit 0, and vLLM's exit hook finds its groups already gone."""
    import subprocess
    import sys

    from test_runs import tiny_args

    argv = tiny_args(
        vllm_model_dir,
        tmp_path / "run",
        max_steps=1,
        save_steps=1,
        use_cpu="true",
        use_vllm="true",
        vllm_mode="colocate",
        vllm_max_model_length=1024,
        vllm_gpu_memory_utilization=0.3,
    )
    done = subprocess.run(
        [sys.executable, "-m", "lanpo.cli", "train", *argv], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "final").is_dir()
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("feedback_ratio", [0.0, 0.5])
def test_old_log_probabilities_from_the_loss_give_trl_s_ratio_loss_and_gradients(
    vllm_model_dir, tmp_path, feedback_ratio
):
    """old_logps_from_loss on a batch TRL generated with its old-policy pass: the ratio written in the loss equals
    TRL's (with the strip family's 1 on feedback rows), and so do the loss and its gradients (fp32, rtol 1e-5)."""
    import torch

    trainer = vllm_trainer(  # two steps: the first step's reflections go plain (no attempt yet), the second's not
        vllm_model_dir, tmp_path / "old", feedback_ratio=feedback_ratio, max_steps=2, beta=0.04, learning_rate=1e-3
    )
    stub_summaries(trainer)
    compute_loss, compared = trainer._compute_loss, []

    def loss_and_grads(inputs):
        value = compute_loss(trainer.model, inputs)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        return value, torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)

    def compare(model, inputs):
        assert "old_per_token_logps" in inputs and "importance_sampling_ratio" in inputs  # TRL's pass ran
        deferred = {k: v for k, v in inputs.items() if k not in ("old_per_token_logps", "importance_sampling_ratio")}
        want, want_grads = loss_and_grads(dict(inputs))
        seen = {}
        correct = trainer.tap.correct_in_loss
        trainer.tap.correct_in_loss = lambda batch, old: (correct(batch, old), seen.update(batch))
        trainer.args.old_logps_from_loss = True  # the loss now takes pi_old from its own forward
        got, got_grads = loss_and_grads(deferred)
        trainer.args.old_logps_from_loss = False
        trainer.tap.correct_in_loss = correct
        ratio, trl_ratio = seen["importance_sampling_ratio"], inputs["importance_sampling_ratio"]
        assert torch.allclose(ratio, trl_ratio, rtol=1e-5, atol=1e-6)
        assert torch.allclose(seen["old_per_token_logps"], inputs["old_per_token_logps"], rtol=1e-5, atol=1e-6)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
        for a, b in zip(got_grads, want_grads):
            assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        compared.append(bool(inputs["lanpo_has_feedback"].any()) if "lanpo_has_feedback" in inputs else False)
        return compute_loss(model, inputs)

    trainer._compute_loss = compare
    trainer.train()
    assert compared and any(compared) == (feedback_ratio > 0)


def test_old_log_probabilities_from_the_loss_skip_the_old_policy_pass(vllm_model_dir, tmp_path):
    import torch

    trainer = vllm_trainer(vllm_model_dir, tmp_path / "skip", old_logps_from_loss=True, beta=0.04, max_steps=2)
    stub_summaries(trainer)
    calls, original = [], trainer._get_per_token_logps_and_entropies

    def counted(model, *args, **kwargs):
        calls.append("loss" if torch.is_grad_enabled() else "reference" if model is trainer.ref_model else "old")
        return original(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    assert "old" not in calls and calls.count("loss") == 2 and calls.count("reference") == 2, calls
    for key in ("loss", "sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/max"):
        values = history(trainer, key)
        assert len(values) == 2 and all(v == v and abs(v) != float("inf") for v in values), (key, values)


@pytest.mark.parametrize("source", ["reference", "self-hint"])
def test_privileged_sources_train_under_vllm_with_hints_written_by_the_engine(vllm_model_dir, tmp_path, source):
    """Self-hints are written through the same engine at hint_max_length; hinted rows carry the sampler's
    log-probabilities into the strip loss, and reliance is logged from them."""
    trainer = vllm_trainer(
        vllm_model_dir, tmp_path / source, feedback_source=source, summaries_per_group=0, hint_max_length=5
    )
    stubbed, limits = trainer._generate_ids, []

    def generate(prompt_ids):
        hint = any("Write a one-sentence hint" in trainer.processing_class.decode(p) for p in prompt_ids)
        limits.append((hint, trainer.vllm_generation.max_completion_length))
        return stubbed(prompt_ids)

    trainer._generate_ids = generate
    trainer.train()
    assert all(loss == loss for loss in history(trainer, "loss"))
    assert max(history(trainer, "lanpo/feedback_share")) > 0
    assert history(trainer, f"lanpo/feedback_lift/{source}")
    assert trainer.vllm_generation.max_completion_length == 6
    if source == "self-hint":
        assert (True, 5) in limits and history(trainer, "hint/self_hint_written")
    else:
        assert not any(hint for hint, _ in limits)


@pytest.mark.parametrize("form", ["additive", "contrastive"])
def test_the_scoring_route_trains_under_vllm_with_pi_old_from_the_loss(vllm_model_dir, tmp_path, form):
    """feedback_route score at the verdict's switches (vLLM colocate, old_logps_from_loss, β > 0): the start model
    (the reference) reads every row under its gold answer in one extra no-grad pass, and the losses stay finite."""
    import torch

    trainer = vllm_trainer(
        vllm_model_dir,
        tmp_path / form,
        feedback_route="score",
        feedback_source="gold",
        score_form=form,
        score_rows="all",
        summaries_per_group=0,
        old_logps_from_loss=True,
        beta=0.04,
    )
    calls, original = [], trainer._get_per_token_logps_and_entropies

    def counted(model, *args, **kwargs):
        calls.append("loss" if torch.is_grad_enabled() else "reference" if model is trainer.ref_model else "old")
        return original(model, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    assert "old" not in calls and calls.count("loss") == 2 and calls.count("reference") == 4, calls  # + teacher
    # (two problems a batch may share their gold: the contrastive form then contrasts with the answer's neighbours)
    assert all(v == v and abs(v) != float("inf") for v in history(trainer, "loss"))
    assert min(history(trainer, "score/rows")) == 8


@pytest.mark.parametrize("name, dtype", [("fp32", "float32"), ("bf16", "bfloat16")])
def test_load_vllm_takes_lanpos_short_dtype_names(vllm_model_dir, name, dtype):
    """`lanpo eval --dtype fp32` reaches vLLM as torch.float32: vLLM itself refuses the short names."""
    import torch

    from lanpo.engine.generation import load_vllm

    llm = load_vllm(str(vllm_model_dir), dtype=name, max_model_len=256)
    assert llm.llm_engine.model_config.dtype == getattr(torch, dtype)
