"""LanpoTrainer on tiny random models: both loss modes train, p_t = 0 is TRL's GRPO, no leaks, resume."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import lanpo.loss
from helpers.audit import leakage_problems
from helpers.launch import accelerate_launch
from lanpo.config import LanpoConfig
from lanpo.data.loaders import builtin_arith, to_prompt_dataset
from lanpo.engine.models import load_tokenizer
from lanpo.plan import GroupPlan
from lanpo.verify.rewards import completion_text

CANNED_SUMMARY = " add the two numbers.\nPRINCIPLES:\n- add the ones digits first\nPITFALLS:\n- forgetting to carry"


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies between rollouts of a random model, so advantages (and the loss) are not zero."""
    return [float(len(completion_text(c)) % 4) for c in completions]


def common(tmp_path: Path, name: str = "run", **overrides) -> dict:
    settings = dict(
        output_dir=str(tmp_path / name),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        beta=0.04,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        gradient_checkpointing=False,
        temperature=1.0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return settings


def make_trainer(model_dir, tmp_path, name="run", reward_funcs=None, problems=8, **overrides):
    from lanpo.trainer import LanpoTrainer

    lanpo_defaults = dict(relevance_scorer="bm25", relevance_threshold=0.0, summaries_per_group=1)
    args = LanpoConfig(**{**lanpo_defaults, **common(tmp_path, name, **overrides)})
    return LanpoTrainer(
        model=str(model_dir),
        reward_funcs=reward_funcs or [length_reward],
        args=args,
        train_dataset=to_prompt_dataset(builtin_arith("1", n=problems)),
        processing_class=load_tokenizer(str(model_dir)),
    )


def stub_summaries(trainer) -> None:
    """A random tiny model never writes a parseable summary: answer summary prompts with a canned one."""
    tok = trainer.processing_class
    original = trainer._generate_ids
    canned = tok.encode(CANNED_SUMMARY, add_special_tokens=False) + [tok.eos_token_id]

    def generate(prompt_ids):
        completions, logprobs = original(prompt_ids)
        for k, ids in enumerate(prompt_ids):
            if "Distill what this attempt teaches" in tok.decode(ids):
                completions[k] = list(canned)
        return completions, logprobs

    trainer._generate_ids = generate


def history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("mode", ["keep", "strip"])
def test_lanpo_trains_in_both_context_modes(tiny_model_dir, tmp_path, mode):
    # 4 steps, one epoch of the 8 problems: entries of step k's trials arrive after step k+1's retrieval, and the
    # last step's problems share words with the pool's (BM25 needs some)
    trainer = make_trainer(tiny_model_dir, tmp_path, context_in_loss=mode, max_steps=4)
    stub_summaries(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert any(loss != 0 for loss in history(trainer, "loss"))
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert max(history(trainer, "lanpo/feedback_share")) > 0  # 6 of 8 rows planned feedback; reflection always has some
    assert len(trainer.pool) > 0 and history(trainer, "summaries/parse_rate")[-1] == 1.0
    assert history(trainer, "accuracy/abstraction/mean"), "the pool filled up, so abstraction rows got context"
    if mode == "strip":
        assert history(trainer, "lanpo/strip_weight_mean")
    run = Path(trainer.args.output_dir)
    assert (run / "metrics.jsonl").is_file() and (run / "samples.jsonl").is_file() and (run / "config.json").is_file()
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert any(s["feedback"] for s in samples)


@pytest.mark.parametrize("rounds, summaries", [("phased", 2), ("one", 0)])
def test_feedback_ratio_zero_is_exactly_trl_grpo(tiny_model_dir, tmp_path, rounds, summaries):
    """p_t = 0 is TRL's GRPO bit for bit: under generation_rounds phased even while the pool is built (summaries in
    a call of their own under a forked RNG); under one (where summaries ride with the rows) with no summaries."""
    from trl import GRPOConfig, GRPOTrainer

    dataset = to_prompt_dataset(builtin_arith("1", n=8))
    grpo = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[length_reward],
        args=GRPOConfig(**common(tmp_path, "grpo", max_steps=3)),
        train_dataset=dataset,
        processing_class=load_tokenizer(str(tiny_model_dir)),
    )
    grpo.train()
    lanpo = make_trainer(
        tiny_model_dir,
        tmp_path,
        "lanpo",
        feedback_ratio=0.0,
        summaries_per_group=summaries,
        max_steps=3,
        generation_rounds=rounds,
    )
    stub_summaries(lanpo)
    lanpo.train()
    for (name, a), (_, b) in zip(grpo.model.named_parameters(), lanpo.model.named_parameters()):
        assert torch.equal(a, b), name
    assert history(grpo, "loss") == history(lanpo, "loss")
    assert history(grpo, "reward") == history(lanpo, "reward")
    assert (len(lanpo.pool) > 0) is (summaries > 0) and lanpo.pool.stats()["attempts"] > 0
    assert history(lanpo, "lanpo/feedback_share") == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rounds, steps", [("phased", 1), ("one", 2)])
def test_reflection_prompts_in_training_never_show_rewards_and_the_guard_is_live(
    tiny_model_dir, tmp_path, monkeypatch, rounds, steps
):
    """Each reflection shows one of the problem's own attempts (phased: this step's scratch rows; one: the attempt
    stored a step earlier) and nothing of its gold or reward."""
    trainer = make_trainer(
        tiny_model_dir, tmp_path, feedback_ratio=0.5, reflection_share=1.0, max_steps=steps, generation_rounds=rounds
    )
    trainer.train()
    reflected = [r for r in trainer.last_generation.rows if r.kind == "reflection" and r.has_feedback]
    assert reflected
    for row in reflected:
        context = row.context[-1]["content"]
        attempts = [a.text for a in trainer.pool.attempts(row.problem_id) if a.step < steps - 1] + [
            r.text for r in trainer.last_generation.rows if r.problem_id == row.problem_id and r.kind == "scratch"
        ]
        assert any(a.strip() and a.strip() in context for a in attempts)
        assert not leakage_problems(context, row.gold, [row.problem, *attempts])

    import lanpo.prompts

    monkeypatch.setattr(lanpo.prompts, "REFLECTION_TEMPLATE", lanpo.prompts.REFLECTION_TEMPLATE + "\nreward: 1.0")
    leaky = make_trainer(
        tiny_model_dir,
        tmp_path,
        "leaky",
        feedback_ratio=0.5,
        reflection_share=1.0,
        max_steps=steps,
        generation_rounds=rounds,
    )
    leaky.train()  # a context that cannot be built never stops a run: the row falls back, counted with a reason
    assert not any(r.has_feedback for r in leaky.last_generation.rows)
    assert history(leaky, "lanpo/fallback/label_talk_in_template")[-1:] == [1.0]  # (one: step 0 had no attempt)


def test_resume_continues_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    full = make_trainer(tiny_model_dir, tmp_path, "full", max_steps=4, save_strategy="steps", save_steps=2)
    stub_summaries(full)
    full.train()
    checkpoint = Path(full.args.output_dir) / "checkpoint-2"
    assert (checkpoint / "pool.sqlite").is_file() and (checkpoint / "lanpo_state_rank0.json").is_file()
    assert not (Path(full.args.output_dir) / ".staging").exists()  # every checkpoint was moved into place

    resumed_dir = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-2")
    resumed = make_trainer(tiny_model_dir, tmp_path, "resumed", max_steps=4, save_strategy="steps", save_steps=2)
    stub_summaries(resumed)
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-2"))
    for (name, a), (_, b) in zip(full.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
    assert full.pool.digest() == resumed.pool.digest()
    # every entry's and every reflection's worth record as an uninterrupted run has it (lanpo.pool.worth)
    assert full.pool.reflection_worth() and full.pool.entry_worth()
    assert full.pool.entry_worth() == resumed.pool.entry_worth()
    assert full.pool.reflection_worth() == resumed.pool.reflection_worth()
    assert history(full, "loss") == history(resumed, "loss")  # the resumed log carries steps 1-2 over
    assert history(full, "retrieval/hit_rate") == history(resumed, "retrieval/hit_rate")


def test_a_resume_past_the_first_epoch_continues_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """8 problems, 2 a step: a checkpoint at step 5 lies in the second epoch. The resumed run draws that epoch's
    problems in the uninterrupted run's order, so its pool and worth records are the same."""
    settings = dict(max_steps=6, save_strategy="steps", save_steps=5, feedback_ratio=0.5)
    full = make_trainer(tiny_model_dir, tmp_path, "full", **settings)
    stub_summaries(full)
    full.train()
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(Path(full.args.output_dir) / "checkpoint-5", resumed_dir / "checkpoint-5")
    resumed = make_trainer(tiny_model_dir, tmp_path, "resumed", **settings)
    stub_summaries(resumed)
    resumed.train(resume_from_checkpoint=str(resumed_dir / "checkpoint-5"))
    assert [r.problem_id for r in full.last_generation.rows] == [r.problem_id for r in resumed.last_generation.rows]
    assert full.pool.digest() == resumed.pool.digest()
    assert full.pool.entry_worth() == resumed.pool.entry_worth()
    assert full.pool.reflection_worth() == resumed.pool.reflection_worth()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("feedback_ratio", 1.5, "feedback_ratio must be in"),
        ("reflection_share", -0.1, "reflection_share must be in"),
        ("relevance_threshold", 2.0, "relevance_threshold must be in"),
        ("num_generations", 1, "num_generations"),
        ("per_device_train_batch_size", 6, "(divisible by|a multiple of) num_generations"),
        ("relevance_scorer", "vibes", "relevance_scorer must be one of"),
        ("context_in_loss", "drop", "context_in_loss must be one of"),
        ("feedback_schedule", "linear", "feedback_warmup_steps"),
        ("summaries_per_group", 9, "summaries_per_group"),
        ("summary_max_length", 0, "summary_max_length must be >= 1"),
        ("shaping_gamma", 0.0, "shaping_gamma must be > 0"),
        ("advantage_grouping", "vibes", "advantage_grouping must be one of"),
    ],
)
def test_invalid_config_fails_before_any_model_loads(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        LanpoConfig(**{**common(tmp_path), field: value})


@pytest.mark.parametrize(
    "ratio, share, source, rounds, warned",
    [
        (1.0, 0.5, "auto", "phased", True),
        (1.0, 0.5, "step", "phased", True),
        (1.0, 0.5, "pool", "phased", False),  # pool: stored attempts only
        (1.0, 0.0, "auto", "phased", False),  # abstraction only: nothing to reflect on is needed
        (0.75, 0.5, "auto", "phased", False),
        (0.95, 0.5, "auto", "phased", True),  # 0.95 of 8 rounds to 8: no scratch row either
        (1.0, 0.5, "auto", "one", True),  # one: the first step's reflections (later ones: attempted ahead)
        (1.0, 0.5, "pool", "one", False),
        (0.75, 0.5, "auto", "one", False),
    ],
)
def test_warns_when_reflection_rows_have_no_scratch_rows_to_reflect_on(
    tmp_path, caplog, ratio, share, source, rounds, warned
):
    """p_t = 1.0: a new problem's reflection rows fall back to the plain prompt; the user is told before the run
    that the realized p_t stays below the planned one until the pool holds attempts."""
    with caplog.at_level("WARNING", logger="lanpo.config"):
        LanpoConfig(
            **common(tmp_path, num_generations=8, per_device_train_batch_size=8),
            feedback_ratio=ratio,
            reflection_share=share,
            reflection_source=source,
            generation_rounds=rounds,
        )
    assert any("nothing of its own to reflect on" in r.getMessage() for r in caplog.records) is warned


def test_one_round_refuses_reflecting_on_the_steps_own_attempts(tmp_path):
    with pytest.raises(ValueError, match="set generation_rounds phased"):
        LanpoConfig(**common(tmp_path), feedback_ratio=0.5, reflection_source="step", generation_rounds="one")


def test_at_p_t_one_reflection_waits_one_epoch_for_attempts(tiny_model_dir, tmp_path):
    """What the warning says: with no scratch row and no stored attempt, the reflection half of each group gets
    the plain prompt (counted as no_attempt), so the realized p_t is the abstraction half at most; those
    plain-prompt rollouts are stored as attempts, so from the second epoch on the reflection rows have some."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=1.0,
        reflection_share=0.5,
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,
        problems=2,
    )  # one epoch a step
    trainer.train()
    steps = [h for h in trainer.state.log_history if "lanpo/feedback_share" in h]
    assert len(steps) == 2
    # 2 of 4 rows per group had nothing to reflect on, then none (a reason that did not occur is not logged)
    assert [h.get("lanpo/fallback/no_attempt", 0.0) for h in steps] == [0.5, 0.0]
    share = [h["lanpo/feedback_share"] for h in steps]
    assert share[0] <= 0.5 and share[1] >= 0.5


def test_feedback_schedule_and_group_plan(tmp_path):
    config = LanpoConfig(
        **common(tmp_path, num_generations=8, per_device_train_batch_size=8),
        feedback_ratio=0.75,
        feedback_schedule="linear",
        feedback_warmup_steps=4,
        reflection_share=0.5,
    )
    assert config.step_plan(0).group == GroupPlan(8)
    assert config.step_plan(2).group == GroupPlan(5, (("reflection", 2), ("abstraction", 1)))  # p_t 0.375: 3 rows
    assert config.step_plan(10).group == GroupPlan(2, (("reflection", 3), ("abstraction", 3)))  # p_t 0.75: 6 rows


def test_train_cli_writes_a_complete_run_directory(tiny_model_dir, tmp_path):
    from lanpo.cli import main

    run = tmp_path / "cli-run"
    code = main(
        [
            "train",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--data",
            "builtin:arith?n=8",
            "--output_dir",
            str(run),
            "--max_steps",
            "2",
            "--num_generations",
            "4",
            "--per_device_train_batch_size",
            "8",
            "--max_completion_length",
            "8",
            "--save_steps",
            "1",
            "--disable_tqdm",
            "true",
        ]
    )
    assert code == 0
    for name in (
        "config.yaml",
        "config.json",
        "metrics.jsonl",
        "samples.jsonl",
        "pool.sqlite",
        "training_curves.png",
        "final/config.json",
        "checkpoint-2/pool.sqlite",
    ):
        assert (run / name).exists(), name
    resolved = (run / "config.yaml").read_text()
    assert "feedback_ratio: 0.75" in resolved and "num_generations: 4" in resolved

    code = main(
        [
            "train",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--data",
            "builtin:arith?n=8",
            "--resume",
            str(run / "checkpoint-1"),
            "--max_steps",
            "3",
            "--num_generations",
            "4",
            "--per_device_train_batch_size",
            "8",
            "--max_completion_length",
            "8",
            "--disable_tqdm",
            "true",
        ]
    )
    assert code == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 3


def _launch_two_processes(zygote, model_dir, out, *extra, timeout=600) -> Path:
    script = Path(__file__).parent / "helpers" / "multiprocess_run.py"
    cmd = [
        *accelerate_launch(2, zygote=zygote),  # its workers forked from the zygote
        str(script),
        str(model_dir),
        str(out),
        *extra,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    reports = [out / (f"{extra[0]}-rank{r}.json" if extra else f"rank{r}.json") for r in (0, 1)]
    teardown_abort = "terminate called without an active exception" in result.stderr
    # gloo sometimes aborts a process at exit, after the run is over: a launch whose processes all wrote their
    # report is judged on the report; any other failure fails the test
    if result.returncode != 0 and not (teardown_abort and all(p.is_file() for p in reports)):
        raise AssertionError(result.stderr[-4000:])
    return out


@pytest.mark.slow
def test_two_processes_share_a_pool_agree_with_one_process_and_finish_when_only_one_has_feedback(
    tiny_model_dir, tmp_path, zygote
):
    """Five runs on two processes, one after another in one launch (once four tests, five launches: a launch's
    start-up cost more than its run):

    * the pool: both processes hold the same one;
    * separate and scratch-baseline advantages: each process normalizes over the whole gathered batch
      (scale_rewards=batch spans both), so its rows' advantages are those one process computes from the same
      rollouts;
    * only one process with feedback rows: generation calls are collective, so a process whose groups all solved
      their problems (feedback_trigger unsolved) still joins the feedback phase of one whose groups failed (here
      with the privileged reference source), where it used to skip the call and leave the other waiting;
    * only one asks the LLM judge: its forwards are collective (its batches pad to the widest process), so a
      process with no abstraction rows still joins the judge of one whose groups failed, where it used to skip it
      and the other's gather met a different one (a crash)."""
    from lanpo import objective

    out = _launch_two_processes(zygote, tiny_model_dir, tmp_path / "mp", "all")
    digests = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert digests[0]["world_size"] == 2
    assert digests[0]["digest"] == digests[1]["digest"] and digests[0]["entries"] > 0

    for grouping in ("separate", "scratch-baseline"):
        ranks = [json.loads((out / f"{grouping}-rank{r}.json").read_text()) for r in (0, 1)]
        assert len(ranks[0]["steps"]) == 2
        weights = torch.tensor(ranks[0]["weights"])
        for step0, step1 in zip(ranks[0]["steps"], ranks[1]["steps"]):
            assert step0["rewards"] == step1["rewards"] and step0["flags"] == step1["flags"]
            rewards, flags = torch.tensor(step0["rewards"]), step0["flags"]
            assert any(flags) and not all(flags)
            if grouping == "separate":
                one_process = objective.separate_advantages(rewards, weights, flags, 4, "batch")
            else:
                one_process = objective.scratch_baseline_advantages(rewards, weights, flags, 4, "batch")
            both = torch.tensor(step0["advantages"] + step1["advantages"])
            assert torch.allclose(both, one_process, atol=1e-5), grouping

    ranks = [json.loads((out / f"uneven-rank{r}.json").read_text())["feedback_rows"] for r in (0, 1)]
    assert ranks[0] == [0, 0]
    assert len(ranks[1]) == 2 and all(n > 0 for n in ranks[1])

    ranks = [json.loads((out / f"uneven-judge-rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["feedback_rows"] == [0, 0] and ranks[0]["kinds"] == ["scratch"]
    # one call a step: the first step's trigger has no stored attempt to read; the second reads those made ahead
    assert ranks[1]["feedback_rows"][0] == 0 and ranks[1]["feedback_rows"][1] > 0 and "abstraction" in ranks[1]["kinds"]


@pytest.mark.parametrize("mode", ["strip", "strip-sequence", "shaped", "unweighted"])
@pytest.mark.parametrize(
    "setting",
    [
        dict(top_p=0.9),
        dict(top_k=20),
        dict(min_p=0.05),
        dict(repetition_penalty=1.1),
        dict(generation_kwargs={"presence_penalty": 0.5}),
    ],
    ids=str,
)
def test_vllm_settings_that_reshape_its_log_probabilities_are_refused_where_feedback_rows_are_stripped(
    tmp_path, mode, setting
):
    with pytest.raises(ValueError, match="log_softmax\\(logits / temperature\\)"):
        LanpoConfig(**common(tmp_path, context_in_loss=mode, use_vllm=True, **setting))
    LanpoConfig(**common(tmp_path, context_in_loss="keep", use_vllm=True, **setting))  # on-policy: TRL's business
    LanpoConfig(**common(tmp_path, context_in_loss=mode, **setting))  # HF records before every processor


def test_scratch_baseline_refuses_per_function_normalization(tmp_path):
    with pytest.raises(ValueError, match="sum_then_normalize"):
        LanpoConfig(
            **common(tmp_path, advantage_grouping="scratch-baseline", multi_objective_aggregation="normalize_then_sum")
        )


@pytest.mark.parametrize("config", sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_parse_and_validate(config):
    from lanpo.commands.train import parse

    train_args, model_args, lanpo_config = parse(["--config", str(config)])
    assert model_args.model_name_or_path and train_args.data
    assert 0 <= lanpo_config.feedback_ratio <= 1 and lanpo_config.num_generations >= 2


def test_embedded_default_needs_no_config():
    from lanpo.commands.train import parse

    train_args, model_args, config = parse([])
    assert model_args.model_name_or_path == "smollm2-135m" and train_args.data == "builtin:arith"
    assert config.feedback_ratio == 0.75 and config.num_generations == 8 and not config.bf16


def test_pool_reflection_uses_stored_attempts_in_a_single_generation_phase(tiny_model_dir, tmp_path):
    from lanpo.pool.store import Attempt

    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=0.5,
        reflection_share=1.0,
        reflection_source="pool",
        summaries_per_group=0,
        max_steps=1,
    )
    problems = builtin_arith("1", n=8)
    trainer.pool.add_attempts([Attempt(p.id, p.problem, f"STORED ATTEMPT FOR {p.id}") for p in problems])
    calls = []
    original = trainer._generate_ids
    trainer._generate_ids = lambda ids: calls.append(len(ids)) or original(ids)
    trainer.train()
    reflected = [r for r in trainer.last_generation.rows if r.kind == "reflection"]
    assert reflected and all(
        r.has_feedback and f"STORED ATTEMPT FOR {r.problem_id}" in r.context[-1]["content"] for r in reflected
    )
    assert calls == [8]  # every row in one batch: no second phase


@pytest.mark.parametrize("rounds", ["phased", "one"])
def test_ahead_reflection_attempts_the_next_steps_problems_in_the_batch_and_needs_no_second_phase(
    tiny_model_dir, tmp_path, rounds
):
    """reflection_source ahead: each step's batch carries plain attempts at the next step's problems (2 a problem:
    min(reflection, scratch) rows), stored unscored; from the second step on every reflection shows one of them,
    so a step is one generation call (under phased the first step waits for its own attempts; under one its
    reflections go plain); the loss sees the step's own rows only."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        generation_rounds=rounds,
        feedback_ratio=0.5,
        reflection_share=1.0,
        reflection_source="ahead",
        summaries_per_group=0,
        max_steps=3,
    )  # 2 problems (G = 4) a step, 4 steps an epoch
    calls, stored, reflected = [], [], []
    original, add = trainer._generate_ids, trainer.pool.add_attempts
    trainer._generate_ids = lambda ids: calls.append((trainer.state.global_step, len(ids))) or original(ids)
    trainer.pool.add_attempts = lambda attempts, *worth: stored.extend(attempts) or add(attempts, *worth)
    rows_seen = trainer.after_rollouts

    def after(output, generation):
        assert len(output["completion_ids"]) == 8  # attempts ahead never reach TRL's batch
        reflected.extend(
            (trainer.state.global_step, r.problem_id, r.context[-1]["content"])
            for r in generation.rows
            if r.has_feedback
        )
        return rows_seen(output, generation)

    trainer.after_rollouts = after
    trainer.train()
    first = [(0, 4 + 4), (0, 4)] if rounds == "phased" else [(0, 8 + 4)]  # phased: step 0 waits for its attempts
    assert calls == first + [(1, 8 + 4), (2, 8 + 4)]
    assert history(trainer, "lanpo/generation_rounds") == [len(first), 1.0, 1.0]
    assert history(trainer, "lanpo/shown_attempt_age")[-2:] == [1.0, 1.0]  # written by the step before
    assert history(trainer, "lanpo/ahead_attempts") == [4.0, 4.0, 4.0]
    assert all(t > 0 for t in history(trainer, "time/generate"))  # the step's timers and counters are its own
    later = [(step, problem_id, context) for step, problem_id, context in reflected if step > 0]
    assert len(later) == 8
    for step, problem_id, context in later:  # a problem comes once an epoch: its attempts a step early are ahead's
        earlier = [a.text for a in stored if a.problem_id == problem_id and a.step == step - 1]
        assert len(earlier) == 2 and any(text in context for text in earlier)


def test_ahead_attempts_nothing_when_the_generation_is_not_the_steps_first_batch(tiny_model_dir, tmp_path, caplog):
    """What the peek assumes (TRL generates a step from the first batch handed out for it) is checked: a generation
    from another batch attempts nothing ahead and says so once, and the run goes on."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=0.5,
        reflection_share=1.0,
        reflection_source="ahead",
        summaries_per_group=0,
        max_steps=2,
    )
    handed = trainer.get_batch_samples

    def shuffled(epoch_iterator, num_batches, device):
        batches, count = handed(epoch_iterator, num_batches, device)
        trainer.parts.batches.handed = [list(reversed(batches[0]))]  # as if TRL had generated from a reordered batch
        return batches, count

    trainer.get_batch_samples = shuffled
    with caplog.at_level("WARNING", logger="lanpo.trainer"):
        trainer.train()
    assert not any(history(trainer, "lanpo/ahead_attempts"))  # none attempted (a zero count is not logged)
    assert sum("did not come from the step's first batch" in r.message for r in caplog.records) == 1


@given(
    total=st.integers(0, 12),
    asks=st.lists(st.integers(1, 4), min_size=1, max_size=8),
    source=st.sampled_from(["ahead", "auto"]),
)
def test_pulling_batches_a_step_ahead_loses_and_reorders_nothing(ahead_trainer, total, asks, source):
    """Whatever the step sizes, the batches handed out are the iterator's, in order; with ahead the next step's
    batches are held (at least as many as this step took, where there are), and a new iterator starts afresh."""
    trainer = ahead_trainer
    trainer.args.reflection_source = source
    for _ in range(2):  # a second epoch: a fresh iterator, nothing carried over
        batches = iter([{"batch": k} for k in range(total)])
        handed = []
        for n in asks:
            got, _ = trainer.get_batch_samples(batches, n, "cpu")
            handed += got
            if source == "ahead":  # held: the next batches, at least as many as this step took where there are
                rest = [{"batch": k} for k in range(total)][len(handed) :]
                assert trainer.parts.batches.peeked == rest[: len(trainer.parts.batches.peeked)] and len(
                    trainer.parts.batches.peeked
                ) >= min(n, len(rest))
        assert handed == [{"batch": k} for k in range(min(total, sum(asks)))]


@pytest.fixture(scope="module")
def ahead_trainer(tiny_model_dir, tmp_path_factory):
    return make_trainer(tiny_model_dir, tmp_path_factory.mktemp("ahead"), reflection_source="ahead")


def _expected_advantages(rewards: torch.Tensor, flags: list[bool], grouping: str, g: int) -> torch.Tensor:
    """The grouping's advantages written out by hand (one reward function, scale_rewards=group)."""
    expected = torch.zeros(len(flags))
    for start in range(0, len(flags), g):
        r, f = rewards[start : start + g], torch.tensor(flags[start : start + g])
        scratch = r[~f]
        for kind in (False, True):
            sub = r[f == kind]
            if grouping == "separate":
                values = (sub - sub.mean()) / (sub.std() + 1e-4) if len(sub) >= 2 else torch.zeros(len(sub))
            elif kind:  # scratch-baseline, feedback rows: against the scratch mean, over the group's std
                values = (sub - scratch.mean()) / (r.std() + 1e-4)
            else:
                values = (sub - scratch.mean()) / (sub.std() + 1e-4) if len(sub) >= 2 else torch.zeros(len(sub))
            expected[start : start + g][f == kind] = values
    return expected


@pytest.mark.parametrize("grouping", ["separate", "scratch-baseline"])
def test_advantage_grouping_reaches_the_loss_as_its_formula_says(tiny_model_dir, tmp_path, grouping):
    trainer = make_trainer(  # phased: both steps hold feedback rows (one: the first step's fall back)
        tiny_model_dir,
        tmp_path,
        advantage_grouping=grouping,
        feedback_ratio=0.5,
        max_steps=2,
        generation_rounds="phased",
    )
    stub_summaries(trainer)
    seen, after = [], trainer.after_rollouts

    def capture(output, generation):
        shared = output["advantages"].clone()
        after(output, generation)
        seen.append(
            (
                shared,
                output["advantages"].clone(),
                generation.rewards_per_func[:, 0].clone(),
                [r.has_feedback for r in generation.rows],
            )
        )

    trainer.after_rollouts = capture
    trainer.train()
    assert len(seen) == 2
    for _, advantages, rewards, flags in seen:
        assert any(flags) and not all(flags)
        assert torch.allclose(advantages, _expected_advantages(rewards, flags, grouping, 4), atol=1e-4)
    assert any(not torch.allclose(shared, advantages) for shared, advantages, _, _ in seen)  # not TRL's shared


def test_strip_weights_reaching_the_advantages_are_the_ratio_clipped_where_it_exceeds_the_clip(
    tiny_model_dir, tmp_path, monkeypatch
):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, context_in_loss="strip", strip_ratio_clip=1.0, max_steps=2, temperature=0.7
    )
    stub_summaries(trainer)
    applied, reweight = [], lanpo.loss.reweight

    def checked(capture, clip):
        inputs = capture.inputs
        before = inputs["advantages"].clone()
        stats = reweight(capture, clip)
        applied.append(
            (
                before,
                inputs["advantages"].clone(),
                capture.old.clone(),
                capture.context.clone(),
                inputs["completion_mask"].bool(),
            )
        )
        return stats

    monkeypatch.setattr(lanpo.loss, "reweight", checked)
    trainer.train()
    clipped = 0
    for before, after, old, context, mask in applied:
        feedback = torch.isfinite(context) & mask
        ratio = torch.exp(old - context)
        weights = after / before[:, None]
        assert torch.allclose(weights[feedback], ratio[feedback].clamp(max=1.0), rtol=1e-4)
        assert torch.allclose(weights[~feedback & mask], torch.ones_like(weights[~feedback & mask]))
        clipped += int((ratio[feedback] > 1.0).sum())
    assert clipped > 0  # the clip was exercised (a random model's context changes π(y|·) only a little)


def test_training_on_math_problems_with_letter_golds_never_stops_on_feedback(tiny_model_dir, tmp_path, shared_data):
    """7 of MATH train's golds are letters or words ("B", "x", "no") that the old leakage guard found in its own
    template text and raised on; label-free builders have nothing to find."""
    from lanpo.data.loaders import load_problems
    from lanpo.trainer import LanpoTrainer

    problems = [
        p
        for p in load_problems("math", split="train", data_dir=shared_data)
        if p.answer.strip("$() ").isalpha() and len(p.answer.strip("$() ")) <= 3
    ][:8]
    assert len(problems) >= 4
    args = LanpoConfig(
        **common(tmp_path, "letters", max_steps=3, per_device_train_batch_size=8),
        relevance_scorer="bm25",
        relevance_threshold=0.0,
        feedback_ratio=0.75,
    )
    trainer = LanpoTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=to_prompt_dataset(problems),
        processing_class=load_tokenizer(str(tiny_model_dir)),
    )
    stub_summaries(trainer)
    trainer.train()
    assert max(history(trainer, "lanpo/feedback_share")) > 0


def test_auto_reflection_uses_stored_attempts_and_runs_a_second_phase_only_for_groups_without_any(
    tiny_model_dir, tmp_path
):
    from lanpo.pool.store import Attempt

    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=0.5,
        reflection_share=1.0,
        summaries_per_group=0,
        max_steps=1,
        generation_rounds="phased",
    )  # reflection_source: auto (the default)
    assert trainer.args.reflection_source == "auto"
    stored = builtin_arith("1", n=8)[::2]  # half of the problems have an attempt from an earlier step
    trainer.pool.add_attempts([Attempt(p.id, p.problem, f"STORED ATTEMPT FOR {p.id}") for p in stored])
    calls = []
    original = trainer._generate_ids
    trainer._generate_ids = lambda ids: calls.append(len(ids)) or original(ids)
    trainer.train()
    reflected = [r for r in trainer.last_generation.rows if r.kind == "reflection" and r.has_feedback]
    from_store = [r for r in reflected if "STORED ATTEMPT" in r.context[-1]["content"]]
    stored_ids = {p.id for p in stored}
    assert all(r.problem_id in stored_ids for r in from_store)
    assert all(r.problem_id not in stored_ids for r in reflected if r not in from_store)
    groups_without = len({r.problem_id for r in trainer.last_generation.rows} - stored_ids)
    assert calls[0] == 8 - 2 * groups_without and (calls[1:] == [2 * groups_without] if groups_without else True)


def test_summaries_ride_in_rollout_batches_and_go_on_across_steps_up_to_their_own_length(tiny_model_dir, tmp_path):
    """Rollouts are cut at 8 tokens, summaries at 24: a summary that has not ended rides again in the next batch,
    continuing from its tokens, and ends at 24 (a random tiny model almost never writes end-of-sequence)."""
    trainer = make_trainer(tiny_model_dir, tmp_path, max_completion_length=8, summary_max_length=24, max_steps=4)
    original, calls, ended = trainer._generate_ids, [], []
    add = trainer.writer.add

    def generate(prompt_ids):
        calls.append(["Distill what this attempt teaches" in trainer.processing_class.decode(i) for i in prompt_ids])
        return original(prompt_ids)

    def add_summaries(trials, texts):
        ended.extend((trainer.state.global_step, len(t.summary_ids)) for t in trials)
        return add(trials, texts)

    trainer._generate_ids, trainer.writer.add = generate, add_summaries
    trainer.train()
    assert any(any(c) and not all(c) for c in calls), "summary prompts ride in rollout batches"
    assert not any(all(c) for c in calls[:-1]), "no summary batch of its own before the end of training"
    in_training = [n for step, n in ended if step < 4]
    assert in_training and max(in_training) == 24 and all(n <= 24 for _, n in ended)
    assert max(history(trainer, "summaries/carried")) > 0 and history(trainer, "summaries/parse_rate")


def test_summaries_apart_have_their_own_length_limit_and_no_forced_floor(tiny_model_dir, tmp_path):
    """With p_t = 0 summaries run apart (forked RNG): summary_max_length new tokens, without the rollouts'
    min_new_tokens, and the rollouts' settings restored after."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=0.0,
        max_completion_length=8,
        summary_max_length=12,
        max_steps=2,
        generation_kwargs={"min_new_tokens": 8},
        generation_rounds="phased",  # (one: the summaries ride with the rows)
    )
    original, calls = trainer._generate_ids, []

    def generate(prompt_ids):
        summary = ["Distill what this attempt teaches" in trainer.processing_class.decode(i) for i in prompt_ids]
        completions, logprobs = original(prompt_ids)
        config = trainer.generation_config
        calls.append((all(summary), [len(c) for c in completions], config.max_new_tokens, config.min_new_tokens))
        return completions, logprobs

    trainer._generate_ids = generate
    trainer.train()
    summary_calls = [c for c in calls if c[0]]
    assert summary_calls and {(c[2], c[3]) for c in summary_calls} == {(12, None)}
    assert set(history(trainer, "completions/min_length")) == {8}  # rollouts (TRL's own generation) kept the floor
    assert 8 < max(n for c in summary_calls for n in c[1]) <= 12
    assert trainer.generation_config.max_new_tokens == 8 and trainer.generation_config.min_new_tokens == 8


def test_length_limit_swaps_and_restores_both_backends():
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from lanpo.engine.generation import length_limit

    config = GenerationConfig(max_new_tokens=8, min_new_tokens=8)
    hf = SimpleNamespace(generation_config=config, use_vllm=False)
    vllm = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(max_completion_length=8))
    seen = []
    with length_limit(hf, 30):
        seen.append((hf.generation_config.max_new_tokens, hf.generation_config.min_new_tokens))
    with length_limit(vllm, 30):
        seen.append(vllm.vllm_generation.max_completion_length)
    with pytest.raises(RuntimeError), length_limit(vllm, 40):
        raise RuntimeError("generation failed")
    assert seen == [(30, None), 30]
    assert hf.generation_config is config and config.max_new_tokens == 8 and config.min_new_tokens == 8
    assert vllm.vllm_generation.max_completion_length == 8


def test_a_riding_summary_goes_on_until_end_of_sequence_or_its_limit():
    from collections import Counter

    from lanpo import rollout
    from lanpo.config import LanpoConfig
    from lanpo.feedback import AbstractionSource, ReflectionSource
    from lanpo.pool.retrieval import Retriever
    from lanpo.pool.store import ExperiencePool
    from lanpo.summarize import Trial

    words = {i: f"w{i}" for i in range(200)}
    script = iter([list(range(10, 30)), list(range(30, 50)), list(range(50, 70)), [90, 91, 0]])
    seen = []

    def generate_ids(ids):
        seen.append(ids[-1])
        summary = next(script)
        return [list(range(100, 120)) for _ in ids[:-1]] + [summary], None

    model = rollout.RolloutModel(
        tokenize=lambda prompts: [[1, 2, 3] for _ in prompts],
        tokenize_summary=lambda messages: [4, 5, 6],
        generate_ids=generate_ids,
        decode=lambda ids: " ".join(words[i] for i in ids),
        summary_max_length=50,
        max_new_tokens=20,
        stop_ids=frozenset({0}),
    )
    pool = ExperiencePool(":memory:")

    def step(pending):
        rows = rollout.make_rows(
            [{"problem": "1 + 1", "problem_id": "p", "answer": "2", "gold_kind": "math"}] * 4, 4, GroupPlan(4)
        )
        sources = {
            "abstraction": AbstractionSource(Retriever(pool, "bm25", gamma=0.0)),
            "reflection": ReflectionSource(pool),
        }
        plan = LanpoConfig(output_dir="unused", num_generations=4, feedback_ratio=0.0, use_cpu=True).step_plan(0)
        context = rollout.StepContext(plan, sources, pending, Counter(), Counter())
        _, finished, carried = rollout.lanpo_rollout(rows, [[1, 2, 3]] * 4, 4, model, context)
        assert all(len(r.completion_ids) == 20 for r in rows), "rollouts keep their own length"
        return finished, carried

    trial = Trial("q", "2 + 2", "it is 4", True, gold="4")
    assert step([trial]) == ([], [trial])  # 20 tokens, no end: it goes on
    assert step([trial]) == ([], [trial]) and seen[-1] == [4, 5, 6, *range(10, 30)]  # continues from its tokens
    finished, carried = step([trial])  # 60 tokens would pass the limit: cut at 50, finished
    assert not carried and len(trial.summary_ids) == 50 and finished[0][1].endswith("w58 w59")
    other = Trial("r", "3 + 3", "it is 6", False, gold="6")
    finished, carried = step([other])  # an end-of-sequence token ends it
    assert not carried and other.summary_ids == [90, 91, 0] and finished[0][0] is other


# -- feedback where GRPO has no signal (issue 39) ---------------------------------------------------------------


def _scripted_scores(trainer, solved_every: int = 2):
    """The verifier's verdict on phase-A rows, scripted: every ``solved_every``-th group has one right row."""
    calls = []

    def score(rows):
        calls.append([r.kind for r in rows])
        return [(i // 4) % solved_every == 0 and i % 4 == 0 for i in range(len(rows))]

    trainer.policy.rollout.score = score
    return calls


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_unsolved_trigger_gives_feedback_only_to_groups_whose_scratch_rows_all_failed(tiny_model_dir, tmp_path, share):
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_trigger="unsolved",
        feedback_ratio=0.5,
        reflection_share=share,
        max_steps=2,
        problems=8,
        per_device_train_batch_size=16,
        generation_rounds="phased",  # GRPO's rollout first, then the failed groups' rows again
    )
    stub_summaries(trainer)
    calls, seen, after = _scripted_scores(trainer), [], trainer.after_rollouts

    def capture(output, generation):
        seen.append([(r.kind, r.has_feedback, r.triggered, r.text, r.context) for r in generation.rows])
        after(output, generation)

    trainer.after_rollouts = capture
    trainer.train()
    assert calls and all(kinds == ["scratch"] * len(kinds) for kinds in calls)  # phase A is GRPO's rollout
    for rows in seen:
        for start in range(0, len(rows), 4):
            group = rows[start : start + 4]
            solved = (start // 4) % 2 == 0
            assert all(r[2] is (not solved) for r in group)
            planned = [r for r in group if r[0] != "scratch"]
            assert not planned if solved else len(planned) == 2  # round(p_t G) = 2 of the failed rows
            assert all(r[0] == "abstraction" for r in planned) if share == 0 else True
            assert all(r[1] is False for r in group if r[0] == "scratch")  # feedback only where planned
    if share > 0:  # reflection always has the group's own failed attempts (abstraction needs a pool first)
        assert any(r[1] for rows in seen for r in rows)
    for key in ("lanpo/triggered_share", "lanpo/rescued_share", "lanpo/rescue_rate", "completions/truncated/scratch"):
        assert history(trainer, key), key
    assert history(trainer, "lanpo/triggered_share") == [0.5, 0.5]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and (share == 0 or any(s["feedback"] for s in samples))


@given(steps=st.lists(st.tuples(st.booleans(), st.integers(0, 6)), min_size=1, max_size=8))
def test_unsolved_summaries_ride_in_the_feedback_phase_and_a_quiet_step_generates_only_grpos_rows(steps):
    """feedback_trigger unsolved, any sequence of steps (each: whether its groups solved their problems, how many
    new trials it hands on): a step where every group solved makes one call, the rows' plain prompts alone, while
    no more trials wait than the batch has rows; summaries ride in the feedback call; no trial is lost or doubled."""
    from collections import Counter

    from lanpo import rollout
    from lanpo.feedback import AbstractionSource, ReflectionSource
    from lanpo.pool.retrieval import Retriever
    from lanpo.pool.store import ExperiencePool
    from lanpo.summarize import Trial

    summary_prompt, row_count = [4, 5, 6], 8
    calls = []

    def generate_ids(ids):
        calls.append(ids)
        return [[90, 0] if p[:3] == summary_prompt else list(range(10, 30)) for p in ids], None

    solved = [True]
    model = rollout.RolloutModel(
        tokenize=lambda prompts: [[1, 2, 3, 7] for _ in prompts],
        tokenize_summary=lambda messages: list(summary_prompt),
        generate_ids=generate_ids,
        decode=lambda ids: " ".join(f"w{i}" for i in ids),
        summary_max_length=50,
        max_new_tokens=20,
        stop_ids=frozenset({0}),
        score=lambda rows: [solved[0]] * len(rows),
    )
    pool = ExperiencePool(":memory:")
    sources = {
        "abstraction": AbstractionSource(Retriever(pool, "bm25", gamma=0.0)),
        "reflection": ReflectionSource(pool),
    }
    plan = LanpoConfig(
        output_dir="unused", num_generations=4, feedback_ratio=0.5, feedback_trigger="unsolved", use_cpu=True
    ).step_plan(0)
    pending, made = [], 0
    for all_solved, new_trials in steps:
        solved[0] = all_solved
        calls.clear()
        rows = rollout.make_rows(
            [{"problem": "1 + 1", "problem_id": "p", "answer": "2", "gold_kind": "math"}] * row_count, 4
        )
        before = list(pending)
        context = rollout.StepContext(plan, sources, pending, Counter(), Counter())
        _, finished, carried = rollout.unsolved_rollout(rows, [[1, 2, 3]] * row_count, 4, model, context)
        riding = [[p for p in call if p[:3] == summary_prompt] for call in calls]
        if all_solved and len(before) <= row_count:
            assert calls == [[[1, 2, 3]] * row_count], "a quiet step generates GRPO's batch alone"
            assert carried == before and not finished
        elif not all_solved and len(before) <= row_count:
            assert len(calls) == 2 and riding[0] == [] and len(riding[1]) == len(before)
            assert [1, 2, 3, 7] in calls[1] and [1, 2, 3] not in calls[1]  # the feedback rows' call
        else:  # a backlog rides in the plain rollout
            assert len(riding[0]) == len(before)
        assert sorted(id(t) for t in before) == sorted(id(t) for t in [t for t, _ in finished] + carried)
        pending = carried + [Trial("p", "1 + 1", f"try {made + k}", k % 2 == 0, gold="2") for k in range(new_trials)]
        made += new_trials
        assert len(pending) <= row_count + 6


def test_unsolved_trigger_at_p_t_zero_is_exactly_the_plain_rollout(tiny_model_dir, tmp_path):
    runs = []
    for name, trigger in (("a", "always"), ("b", "unsolved")):  # each built then trained: the seed is set at build
        trainer = make_trainer(
            tiny_model_dir, tmp_path, name, feedback_ratio=0.0, max_steps=2, feedback_trigger=trigger
        )
        stub_summaries(trainer)
        trainer.train()
        runs.append(trainer)
    a, b = runs
    assert history(a, "loss") == history(b, "loss") and history(a, "reward") == history(b, "reward")


@pytest.mark.parametrize("rounds", ["phased", "one"])
def test_feedback_rows_get_their_own_completion_budget_and_truncation_is_logged_by_kind(
    tiny_model_dir, tmp_path, rounds
):
    """Feedback rows up to 11 tokens, the rest up to 4: phased, in a call of their own; one, in the step's one call
    (generated to 11, each row cut at its own limit)."""
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_ratio=0.5,
        max_completion_length=4,
        feedback_max_completion_length=11,
        max_steps=2,
        reflection_share=1.0,
        generation_rounds=rounds,
    )
    stub_summaries(trainer)
    limits, original = [], trainer._generate_ids

    def generate(prompt_ids):
        limits.append(trainer.generation_config.max_new_tokens)
        return original(prompt_ids)

    trainer._generate_ids = generate
    widths, after = [], trainer.after_rollouts

    def capture(output, generation):
        widths.append([(r.has_feedback, len(r.completion_ids)) for r in generation.rows])
        after(output, generation)

    trainer.after_rollouts = capture
    trainer.train()
    assert 11 in limits and 4 in limits  # one: a step whose rows all go plain is generated to 4
    if rounds == "one":
        assert history(trainer, "lanpo/generation_rounds") == [1.0, 1.0]
    rows = [row for step in widths for row in step]
    assert any(fb and n > 4 for fb, n in rows) and all(n <= 4 for fb, n in rows if not fb)
    assert history(trainer, "completions/truncated/feedback") and history(trainer, "completions/truncated/scratch")


def test_retrieval_never_shows_the_same_problem_restated_under_another_id():
    from lanpo.data.arith import same_problem
    from lanpo.pool.retrieval import Retriever
    from lanpo.pool.store import ExperiencePool, PoolEntry

    pool = ExperiencePool()
    twins = ["Compute 4 + 3.", "Find the sum of 3 and 4.", "what  is 3 + 4?"]
    pool.add([PoolEntry(f"twin{i}", text, "add", ["add the ones"], []) for i, text in enumerate(twins)])
    pool.add([PoolEntry("other", "What is 3 + 5?", "add", ["add the ones"], [])])
    hits = Retriever(pool, "bm25", gamma=0.0, top_k=5).retrieve("me", "What is 3 + 4?")
    assert [h.entry.problem_id for h in hits] == ["other"]
    assert all(same_problem("What is 3 + 4?", t) for t in twins) and not same_problem("What is 3 + 4?", "3 - 4?")


@given(
    st.lists(
        st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=6),  # (has_feedback, correct) per row
        min_size=1,
        max_size=6,
    )
)
def test_all_fail_share_counts_groups_with_no_right_row(groups):
    from lanpo.run.metrics import RowRecord, feedback_metrics

    records = [
        RowRecord("abstraction" if fb else "scratch", fb, float(ok), ok, 0, None, group=f"g{i}")
        for i, rows in enumerate(groups)
        for fb, ok in rows
    ]
    metrics = feedback_metrics(records, 0.5)
    expected = sum(not any(ok for _, ok in rows) for rows in groups) / len(groups)
    assert metrics["lanpo/all_fail_share"] == pytest.approx(expected)
    mixed = [rows for rows in groups if any(fb for fb, _ in rows) and not all(fb for fb, _ in rows)]
    assert ("lanpo/feedback_lift" in metrics) == bool(mixed)


# -- the console (issue 50): one short line a step, not transformers' dictionary of every metric -------------


def test_the_step_line_names_what_a_person_reads():
    from lanpo.run.console import step_line

    logs = {"step": 3, "reward": 0.375, "accuracy/scratch/mean": 0.25, "accuracy/feedback/mean": 0.5}
    logs.update({"lanpo/feedback_share": 0.69, "step_time": 41.23, "loss": 0.1, "kl": 0.01, "completions/mean": 9})
    assert step_line(logs, 12) == (
        "step 3/12 | reward 0.38 | accuracy scratch 0.25, feedback 0.50 | feedback share 0.69 | 41.2 s/step"
    )
    held_out = {"step": 4, "eval/arith/zero-shot/mean@4": 0.25, "eval/arith/zero-shot/mean@4_stderr": 0.1}
    assert step_line(held_out, 12) == "step 4/12 | arith/zero-shot/mean@4 0.250"
    assert step_line({"step": 12, "train_runtime": 600.0, "train_loss": 0.1}, 12) == "done: step 12/12 in 10.0 min"
    assert step_line({"step": 5, "total_flos": 1.0}) is None


@pytest.mark.parametrize("bars", [True, False], ids=["progress-bar", "disable_tqdm"])
def test_a_run_prints_one_short_line_a_step_and_no_metric_dictionary(tiny_model_dir, tmp_path, capsys, bars):
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=2, logging_steps=1, disable_tqdm=not bars)
    stub_summaries(trainer)
    kinds = {type(c) for c in trainer.callback_handler.callbacks}
    assert ProgressCallback not in kinds and PrinterCallback not in kinds
    trainer.train()
    out = capsys.readouterr()
    text = out.out + out.err
    assert "{'loss'" not in text and "'completions/mean_length'" not in text
    lines = [line for line in text.splitlines() if line.startswith("step ") and "reward" in line]
    assert [line.split(" | ")[0] for line in lines] == ["step 1/2", "step 2/2"]
    assert "done: step 2/2 in" in text
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count('"kl"') == 2  # the full metrics still logged


def test_old_logps_from_loss_says_when_it_cannot_apply(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="lanpo.trainer"):
        trainer = make_trainer(tiny_model_dir, tmp_path, old_logps_from_loss=True)
    assert not trainer._old_logps_from_loss()  # transformers' generation: TRL runs no old-policy pass to skip
    assert "old_logps_from_loss has no effect here" in caplog.text and "without vLLM" in caplog.text
