"""Where a training step's time goes, against the step's floor, measured side by side in one run.

The **floor** of a GRPO step is what no implementation can skip: one forward and backward of the batch for the
update, one forward for the reference model (β > 0) and the generation. It is measured in the same run as the
steps, on the last step's own batch (prompt + completion ids), with the model's plain forward (transformers'
cross-entropy head over every position) under the run's autocast; "the generation alone" is the GRPO arm's
rollout generation, timed inside the step.

Each arm is a real training run in a process of its own (the same memory start; its peak resident memory is the
process's), instrumented at TRL's own calls: the rollout generation, summaries, retrieval, reward (lanpo's step
timers); the reference pass, the old log-probability pass and the loss forward (each call of
``_get_per_token_logps_and_entropies``, told apart by model and grad mode); the backward; the optimizer step (the
Trainer's optimizer callbacks); checkpoint writes (``_save_checkpoint``, one at the last step) and metric writes
(``metrics.jsonl``). "other" is the step's time that none of these account for. Medians over steps 2..N.

**Each arm with its generation in one call.** After every step of every arm, the rows the step generated (rollout
rows, feedback phases, the summaries riding in them, hint rounds) are generated again in a single call, each to
exactly the number of tokens it reached in the step (TRL's sampling parameters; the run's random state untouched).
An arm's step less its in-step generation plus that one call is the least its step could cost however its phases
were arranged: what remains of its cost over GRPO's is the method's own work (more rows, longer prompts to attend
to, summaries), not how the step is run.

Arms (``--arms``): ``grpo-trl`` (p_t = 0 as TRL runs it: its fused LM head, its old log-probability pass under
vLLM: before); ``grpo-compact`` (``logprob_head compact``); ``grpo`` (compact and ``old_logps_from_loss``: after);
``lanpo`` (the paper's defaults, with both: ``generation_rounds one``, every row, summary and next-step attempt in
one call); ``lanpo-phased`` (the same under ``generation_rounds phased``, the arrangement before: a problem's first
visit reflects on the step's own scratch rows in a second call); ``lanpo-ahead`` (phased with ``reflection_source
ahead``: the next step's problems attempted in this step's batch, so reflection needs no second phase after step 1); ``lanpo-lift`` and
``lanpo-simutil`` (``retrieval_rank lift`` / ``simutil``, verdict-worth.yaml's arms: each entry's worth, its
bookkeeping and ranking, is also timed apart, as a share of each step, in every arm that does it) and ``unsolved``
(``feedback_trigger unsolved``, with both; its ratio is also given over the steps where no group triggered) and
``unsolved-phased`` (the same, phased: GRPO's rollout, then the failed groups' feedback rows in a second call);
``score-additive`` and ``score-contrastive`` (``feedback_route score``: GRPO's rows, each read by the start model
under its gold answer, with 2 wrong answers too under the contrastive form: the teacher pass is timed apart; the
bound, every row scored) and ``score-reference`` (the arm ``verdict-score.yaml`` runs: half a worked solution,
additive, the default ``score_rows failed``, so only the rows that failed are read); ``execution``
(verdict-code.yaml's arm, read from it: a failed attempt shown with what it did on the problem's public examples;
those sandboxed runs and their reports are timed apart, as a share of each step).

Settings (``--setting``):

* ``embedded``: the embedded default (SmolLM2-135M fp32, 1 problem × 8 rollouts a step, 96 new tokens,
  transformers' generation);
* ``verdict``: ``configs/experiments/verdict.yaml``'s step (4 problems × 8 rollouts of builtin:arith levels 1-3,
  fp32 weights with bf16 autocast, vLLM colocate when vLLM is installed: run it with ``.venv-vllm/bin/python``);
* ``code``: ``configs/experiments/verdict-code.yaml``'s step (4 problems × 8 rollouts of builtin:code levels 2-5,
  160 new tokens, unit tests in the sandbox, otherwise as ``verdict``).

On a CUDA machine the arms train on the GPU (``--device cuda``, the default where one is visible; fp32 weights and
bf16 autocast as on the CPU, no gradient checkpointing), every timer synchronizes the device before it reads the
clock, and each arm also reports its peak GPU memory (``torch.cuda.max_memory_allocated``).

    python benchmarks/step_floor.py --setting embedded [--steps 5] [--arms grpo-trl,grpo,lanpo,unsolved]
    .venv-vllm/bin/python benchmarks/step_floor.py --setting verdict --steps 4
    .venv-vllm/bin/python benchmarks/step_floor.py --setting code --steps 6 --arms grpo,lanpo,execution
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import torch

ARMS = (
    "grpo-trl",
    "grpo-compact",
    "grpo",
    "lanpo",
    "lanpo-phased",
    "lanpo-ahead",
    "lanpo-lift",
    "lanpo-simutil",
    "unsolved",
    "unsolved-phased",
    "score-additive",
    "score-contrastive",
    "score-reference",
    "execution",
)
PARTS = (
    "generate",
    "summarize",
    "retrieve",
    "reward",
    "teacher pass",
    "reference pass",
    "old log-prob pass",
    "update forward",
    "backward",
    "optimizer",
    "metric writes",
)


def sync() -> None:
    """Wait for the GPU's queued work, so a clock read after it counts that work (a no-op on a CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


GRIDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "experiments")
SCORE_GRID = os.path.join(GRIDS, "verdict-score.yaml")
CODE_GRID = os.path.join(GRIDS, "verdict-code.yaml")


def grid_arm(path: str, arm: str) -> list[str]:
    """An arm's overrides in a grid file as ``lanpo train`` flags, so the benchmark times the arm the grid runs."""
    from lanpo.experiments.grid import load_grid

    flags = []
    for key, value in load_grid(path).arms[arm].items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def settings(
    setting: str, out: str, steps: int, arm: str, device: str = "cpu", fp32: bool = False, extra: str = ""
) -> list[str]:
    cli = ["--output_dir", out, "--max_steps", str(steps), "--disable_tqdm", "true", "--logging_steps", "1"]
    if device == "cuda":
        cli += ["--use_cpu", "false", "--gradient_checkpointing", "false"]
    cli += ["--save_strategy", "steps", "--save_steps", str(steps), "--eval_every", "0"]  # one checkpoint, timed
    if setting == "verdict":
        cli += ["--data", "builtin:arith?levels=1,2,3", "--per_device_train_batch_size", "32"]
    if setting == "code":  # verdict-code.yaml's step: its data, batch and completion length, read from it
        from lanpo.experiments.grid import load_grid

        config = load_grid(CODE_GRID).config("grpo", 0)
        cli += ["--data", config["data"], "--max_completion_length", str(config["max_completion_length"])]
        cli += ["--per_device_train_batch_size", str(config["per_device_train_batch_size"])]
    if setting in ("verdict", "code"):  # fp32 weights, bf16 autocast (--fp32: none), vLLM colocate where installed
        cli += ["--dtype", "float32", "--bf16", "false" if fp32 else "true"]
        if importlib.util.find_spec("vllm"):
            cli += ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_max_model_length", "2048"]
    if arm.startswith("grpo"):
        cli += ["--feedback_ratio", "0", "--summaries_per_group", "0"]
    if arm in ("score-additive", "score-contrastive"):  # GRPO's rows, every one scored under its gold answer
        cli += ["--feedback_route", "score", "--feedback_source", "gold", "--summaries_per_group", "0"]
        cli += ["--score_rows", "all", "--score_form", arm.removeprefix("score-")]
    if arm == "score-reference":  # verdict-score.yaml's arm, read from it: half a solution, the failed rows only
        cli += grid_arm(SCORE_GRID, arm)
    if arm == "unsolved":
        cli += ["--feedback_trigger", "unsolved"]
    if arm == "lanpo-ahead":
        cli += ["--reflection_source", "ahead", "--generation_rounds", "phased"]
    if arm in ("lanpo-phased", "unsolved-phased"):
        cli += ["--generation_rounds", "phased"]
    if arm == "unsolved-phased":
        cli += ["--feedback_trigger", "unsolved"]
    if arm == "execution":  # verdict-code.yaml's arm: a failed attempt and its run on the public examples
        cli += grid_arm(CODE_GRID, arm)
    if arm in ("lanpo-lift", "lanpo-simutil"):  # verdict-worth.yaml's arms
        cli += ["--retrieval_rank", arm.removeprefix("lanpo-")]
    cli += ["--logprob_head", "trl" if arm == "grpo-trl" else "compact"]
    cli += ["--old_logps_from_loss", str(arm not in ("grpo-trl", "grpo-compact")).lower()]
    return cli + shlex.split(extra)  # --train-args: the same for every arm


class Clock:
    """Seconds per part of the step at hand, wrapped around the trainer's own calls."""

    def __init__(self, trainer) -> None:
        from transformers import TrainerCallback

        self.parts: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []
        self.floors: list[dict[str, float]] = []  # each step's floor, on that step's batch, after the step
        self.saves: list[float] = []
        self.worth = 0.0  # seconds of the step at hand in each entry's worth (lanpo.pool.worth)
        self.worth_steps: list[float] = []
        self.public = 0.0  # seconds of the step at hand running attempts on public examples (execution feedback)
        self.public_steps: list[float] = []
        self.batch: dict | None = None
        self.generated: list[tuple[list[int], int]] = []  # this step's generated rows: (prompt ids, new tokens)
        self.one_call: list[float] = []  # each step's rows generated again in one call (its own floor's generation)
        clock = self

        def timed(name_of, function):
            def wrapper(*args, **kwargs):
                sync()
                start = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    sync()
                    name = name_of(*args, **kwargs)
                    if name:
                        clock.parts[name] += time.perf_counter() - start

            return wrapper

        in_teacher = [False]

        def pass_name(model, *args, **kwargs):
            if in_teacher[0]:
                return None  # counted whole as the teacher pass
            if torch.is_grad_enabled():
                return "update forward"
            return "reference pass" if model is trainer.ref_model else "old log-prob pass"

        trainer._get_per_token_logps_and_entropies = timed(pass_name, trainer._get_per_token_logps_and_entropies)
        teacher_logps = trainer.teacher.logps if trainer.teacher is not None else None

        def timed_teacher(*args, **kwargs):
            in_teacher[0] = True
            try:
                return teacher_logps(*args, **kwargs)
            finally:
                in_teacher[0] = False

        if trainer.teacher is not None:
            trainer.teacher.logps = timed(lambda *a, **k: "teacher pass", timed_teacher)
        depth = [0]

        def recorded(function):
            """Keep every row a step generates (rollout rows, feedback phases, riding summaries, hint rounds),
            counted once where lanpo's generation calls TRL's."""

            def wrapper(prompt_ids, *args, **kwargs):
                depth[0] += 1
                try:
                    completions, logprobs = function(prompt_ids, *args, **kwargs)
                finally:
                    depth[0] -= 1
                if depth[0] == 0:
                    clock.generated += [(list(p), len(c)) for p, c in zip(prompt_ids, completions)]
                return completions, logprobs

            return wrapper

        # each entry's worth (lanpo.pool.worth): the step's observations, their pool write, the step's metrics, and
        # the ranking's reads of the records and its order; counted once where one call holds another
        import lanpo.pool.retrieval
        import lanpo.pool.worth
        from lanpo.pool.store import ExperiencePool

        inside = [0]

        def worth_part(function):
            def wrapper(*args, **kwargs):
                inside[0] += 1
                start = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    inside[0] -= 1
                    if not inside[0]:  # apart from the parts: it lies inside retrieval and "other"
                        clock.worth += time.perf_counter() - start

            return wrapper

        for owner, name in (
            (lanpo.pool.worth, "observations"),
            (lanpo.pool.worth, "shown_metrics"),
            (lanpo.pool.retrieval, "rank"),
            (lanpo.pool.retrieval, "expected_to_help"),
            (ExperiencePool, "_record_worth"),
            (ExperiencePool, "entry_worth"),
            (ExperiencePool, "judged_worth"),
            (ExperiencePool, "total_counts"),
        ):
            setattr(owner, name, worth_part(getattr(owner, name)))
        import lanpo.feedback.execution

        try_attempts = lanpo.feedback.execution.try_attempts

        def public_tests(*args, **kwargs):  # the sandboxed runs of attempts on public examples, and their reports
            start = time.perf_counter()
            try:
                return try_attempts(*args, **kwargs)
            finally:  # apart from the parts: it lies inside the feedback phase's generation or the teacher pass
                clock.public += time.perf_counter() - start

        lanpo.feedback.execution.try_attempts = public_tests
        trainer._generate_ids = recorded(trainer._generate_ids)
        trainer._generate_single_turn = recorded(trainer._generate_single_turn)
        trainer.accelerator.backward = timed(lambda *a, **k: "backward", trainer.accelerator.backward)
        compute_loss = trainer._compute_loss

        def keep_batch(model, inputs):
            self.batch = {k: inputs[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
            return compute_loss(model, inputs)

        trainer._compute_loss = keep_batch
        save = trainer._save_checkpoint

        def timed_save(*args, **kwargs):
            start = time.perf_counter()
            save(*args, **kwargs)
            self.saves.append(time.perf_counter() - start)

        trainer._save_checkpoint = timed_save
        for callback in trainer.callback_handler.callbacks:
            if type(callback).__name__ == "MetricsFileCallback":
                callback.on_log = timed(lambda *a, **k: "metric writes", callback.on_log)

        class Steps(TrainerCallback):
            def on_pre_optimizer_step(self, *args, **kwargs):
                sync()
                clock.parts["_optimizer_start"] = time.perf_counter()

            def on_optimizer_step(self, *args, **kwargs):
                sync()
                clock.parts["optimizer"] += time.perf_counter() - clock.parts.pop("_optimizer_start")

            def on_step_end(self, *args, **kwargs):
                clock.steps.append(dict(clock.parts))
                clock.worth_steps.append(clock.worth)
                clock.worth = 0.0
                clock.public_steps.append(clock.public)
                clock.public = 0.0
                clock.parts.clear()
                clock.floors.append(floor(trainer, clock.batch))
                # the bound is transformers' padded generate or vLLM's: none for the continuous-batching engine
                bound = not trainer.use_transformers_continuous_batching
                clock.one_call.append(generate_in_one_call(trainer, clock.generated) if bound else float("nan"))
                clock.generated = []

        trainer.add_callback(Steps())


def floor(trainer, batch: dict, repeats: int = 1) -> dict[str, float]:
    """A bare forward and backward, and a bare forward, of a step's batch: the model's plain forward (its own
    cross-entropy head) under the run's autocast, with the step's threads; the fastest of ``repeats``."""
    model = trainer.model
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, : batch["prompt_ids"].size(1)] = -100

    def forward_backward():
        with trainer.accelerator.autocast():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad(), trainer.accelerator.autocast():
            model(input_ids=ids, attention_mask=mask, labels=labels)

    def fastest(function):
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            function()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    return {
        "forward+backward": fastest(forward_backward),
        "forward": fastest(forward),
        "tokens": list(ids.shape),
        "threads": torch.get_num_threads(),
    }


def generate_in_one_call(trainer, generated: list[tuple[list[int], int]]) -> float:
    """Seconds to generate a step's rows again, every one in a single call, each to exactly the number of tokens it
    generated in the step (sampled at the run's temperature; the run's random state untouched): the generation a
    step of these rows cannot go below, however its phases are arranged. vLLM takes a length per row and starts from
    a cold prefix cache, as every step does after its weight sync; transformers'
    ``generate`` (through lanpo's :func:`~lanpo.engine.generation.sample_with_logprobs`, its prefill in buckets)
    runs the batch to its longest row, as one call of the step does."""
    rows = [(prompt, n) for prompt, n in generated if n > 0]
    if not rows:
        return 0.0
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    if trainer.use_vllm:  # TRL's colocate sampling parameters, a length per row
        from vllm import SamplingParams

        vllm = trainer.vllm_generation
        args = trainer.args
        kwargs = {  # as TRL's colocate generate builds its SamplingParams (not exposed), with a length per row
            "n": 1,
            "repetition_penalty": args.repetition_penalty,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "top_k": args.top_k,
            "min_p": 0.0 if args.min_p is None else args.min_p,
            "logprobs": vllm.logprobs,
            **(vllm.generation_kwargs or {}),
            "ignore_eos": True,
        }
        params = [SamplingParams(**kwargs, max_tokens=n) for _, n in rows]
        # The step generated on a cold prefix cache (TRL resets it after each weight sync); the step's own prompts
        # are in it now, so a bound run on it would skip their prefill (long for feedback contexts and summaries).
        vllm.llm.reset_prefix_cache()
        sync()
        start = time.perf_counter()
        with torch.random.fork_rng(devices=devices):
            outputs = vllm.llm.generate([{"prompt_token_ids": p} for p, _ in rows], params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [n for _, n in rows]
    else:  # lanpo's own transformers generation (its bucketed prefill), every row run to the longest row's length
        import copy

        from lanpo.engine.generation import left_pad, sample_with_logprobs

        sync()
        start = time.perf_counter()
        ids, mask = left_pad([p for p, _ in rows], trainer._tokenizer.pad_token_id, trainer.accelerator.device)
        config = copy.deepcopy(trainer.generation_config)
        config.max_new_tokens = config.min_new_tokens = max(n for _, n in rows)
        model = trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            completions, _ = sample_with_logprobs(model, ids, mask, config, [])
        assert all(len(c) == config.max_new_tokens for c in completions)
    sync()
    return time.perf_counter() - start


def run_arm(
    setting: str, arm: str, steps: int, out: str, device: str = "cpu", fp32: bool = False, extra: str = ""
) -> dict:
    from lanpo.commands.train import parse, set_model_dtype
    from lanpo.data.loaders import load_problems, to_prompt_dataset
    from lanpo.engine.models import load_tokenizer, resolve_model_path, size_cpu_threads
    from lanpo.trainer import LanpoTrainer

    train_args, model_args, config = parse(settings(setting, out, steps, arm, device, fp32, extra))
    size_cpu_threads()  # as `lanpo train` does
    set_model_dtype(config, model_args)
    model_path = resolve_model_path(model_args.model_name_or_path)
    per_step = config.per_device_train_batch_size // config.num_generations
    problems = load_problems(train_args.data, seed=config.seed)[: per_step * steps]
    trainer = LanpoTrainer(
        model=model_path,
        args=config,
        train_dataset=to_prompt_dataset(problems),
        processing_class=load_tokenizer(model_path),
    )
    clock = Clock(trainer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    result = {
        "step_time": [h["step_time"] for h in logs],
        "parts": [
            {
                **{p: s.get(p, 0.0) for p in PARTS if p not in ("generate", "summarize", "retrieve", "reward")},
                **{p: h.get(f"time/{p}", 0.0) for p in ("generate", "summarize", "retrieve", "reward")},
            }
            for s, h in zip(clock.steps, logs)
        ],
        "triggered_share": [h.get("lanpo/triggered_share") for h in logs],
        "generation_rounds": [h.get("lanpo/generation_rounds") for h in logs],
        "round_rows": [
            [h.get(f"lanpo/round{k}/rows") for k in range(1, 1 + int(h.get("lanpo/generation_rounds") or 0))]
            for h in logs
        ],
        "feedback_share": [h.get("lanpo/feedback_share") for h in logs],
        "completion_tokens": [h.get("completions/mean_length") for h in logs],
        "checkpoint_s": clock.saves,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "use_vllm": bool(config.use_vllm),
        "one_call_generation": clock.one_call,
        "worth_s": clock.worth_steps,
        "public_tests_s": clock.public_steps,
    }
    if device == "cuda":
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if clock.floors:
        result["floor"] = clock.floors
    return result


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def spread(values: list[float], digits: int = 3) -> dict:
    """A ratio over steps: its median, its range and how many steps it holds."""
    if not values:
        return {"steps": 0}
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "steps": len(values),
    }


def summarize(runs: dict[str, dict]) -> dict:
    later = slice(1, None)  # step 1 warms up
    report = {}
    for arm, run in runs.items():
        parts = {p: median([s[p] for s in run["parts"][later]]) for p in PARTS}
        step = median(run["step_time"][later])
        parts["other"] = round(step - sum(parts.values()), 2)
        report[arm] = {
            "median_step_s": step,
            "step_times": [round(t, 1) for t in run["step_time"]],
            "parts_median_s": parts,
            "checkpoint_s": [round(t, 2) for t in run["checkpoint_s"]],
            "peak_rss_gib": round(run["peak_rss_gib"], 2),
            **({"peak_gpu_gib": round(run["peak_gpu_gib"], 2)} if "peak_gpu_gib" in run else {}),
            "feedback_share": run["feedback_share"],
            "triggered_share": run["triggered_share"],
            "generation_rounds": run["generation_rounds"],  # calls into the engine, step by step
            "rows_per_round": run["round_rows"],
            "mean_completion_tokens": median([t for t in run["completion_tokens"][later] if t is not None]),
        }
        if "floor" in run:
            report[arm]["floor_s"] = [
                {k: round(v, 2) if isinstance(v, float) else v for k, v in f.items()} for f in run["floor"]
            ]
    apart = {}  # work timed apart, as a share of each step (needs no grpo arm): each entry's worth against its
    # ≤ 1% target, execution feedback's runs of attempts on the public examples against their ≤ 5%
    for arm, run in runs.items():
        for key, what in (
            ("worth_s", "each entry's worth (bookkeeping + ranking)"),
            ("public_tests_s", "public-example runs and their reports (execution feedback)"),
        ):
            if any(run.get(key, [])):
                apart[f"{arm}: {what}, % of the step, steps 2..N"] = spread(
                    [100 * w / t for w, t in zip(run[key][later], run["step_time"][later])], digits=4
                )
    base = "grpo" if "grpo" in runs else "grpo-trl" if "grpo-trl" in runs else None
    if base is None:
        if apart:
            report["ratios"] = apart
        return report
    # the floor of each GRPO step, on its own batch: a bare forward and backward, a bare forward, its generation
    grpo = runs[base]
    floors = [f["forward+backward"] + f["forward"] + s["generate"] for f, s in zip(grpo["floor"], grpo["parts"])]
    bare = {key: median([f[key] for f in grpo["floor"][later]]) for key in ("forward+backward", "forward")}
    generation = median([s["generate"] for s in grpo["parts"][later]])
    step_floor = median(floors[later])
    ratios = {"floor_s": step_floor, "floor_parts_s": {**bare, "generation alone": generation}, **apart}
    for arm in ("grpo-trl", "grpo-compact", "grpo"):
        if arm in runs:
            own = [
                f["forward+backward"] + f["forward"] + s["generate"]
                for f, s in zip(runs[arm]["floor"], runs[arm]["parts"])
            ]
            ratios[f"{arm} / its floor, step by step"] = [round(t / f, 3) for t, f in zip(runs[arm]["step_time"], own)][
                later
            ]
            ratios[f"{arm} / its floor (median, steps 2..N)"] = median(
                [t / f for t, f in zip(runs[arm]["step_time"][later], own[later])]
            )
    for arm in runs:
        parts = report[arm]["parts_median_s"]
        gap = report[arm]["median_step_s"] - step_floor
        excess = {
            "update over the bare forward+backward": parts["update forward"]
            + parts["backward"]
            + parts["optimizer"]
            - bare["forward+backward"],
            "reference pass over the bare forward": parts["reference pass"] - bare["forward"],
            "teacher pass (scoring route)": parts["teacher pass"],
            "old log-prob pass": parts["old log-prob pass"],
            "generation over GRPO's": parts["generate"] - generation,
            "summaries + retrieval": parts["summarize"] + parts["retrieve"],
            "reward": parts["reward"],
            "metric writes + other": parts["metric writes"] + parts["other"],
        }
        ratios[f"{arm}: gap to the floor"] = {
            "seconds": round(gap, 2),
            "shares": {k: round(v / gap, 3) for k, v in excess.items()} if gap > 0 else "none: at or below the floor",
        }
    # every arm with its generation in one call: the step's time less the seconds its rows took to generate in the
    # step (rollout, feedback phases, riding summaries), plus the seconds the same rows take in one call, each to its
    # own length. What is left of an arm's cost over GRPO's then is the method's own work (more rows and tokens to
    # generate, longer rows to train on), which no arrangement of the generation takes back.
    merged = {}
    for arm, run in runs.items():
        generated = [s["generate"] + s["summarize"] for s in run["parts"]]
        merged[arm] = [t - g + one for t, g, one in zip(run["step_time"], generated, run["one_call_generation"])]
        ratios[f"{arm}: its generation in one call"] = {
            "in the step (generate + summarize)": median(generated[later]),
            "the same rows in one call": median(run["one_call_generation"][later]),
            "step with it": median(merged[arm][later]),
        }
    for arm, run in runs.items():  # what the arrangement of its generation costs it, step by step
        ratios[f"{arm} / its own rows generated in one call, over steps 2..N"] = spread(
            [t / m for t, m in zip(run["step_time"][later], merged[arm][later])]
        )
    ratios["generation rounds a step, steps 2..N"] = {
        arm: median([r for r in run["generation_rounds"][later] if r is not None]) for arm, run in runs.items()
    }
    if "grpo" in runs:
        for arm in runs:
            ratios[f"{arm} / grpo, step k over grpo's step k (same problems), steps 2..N"] = spread(
                [t / b for t, b in zip(runs[arm]["step_time"][later], runs["grpo"]["step_time"][later])]
            )
            ratios[f"{arm} / grpo"] = round(report[arm]["median_step_s"] / report["grpo"]["median_step_s"], 3)
            ratios[f"{arm} / grpo, each with its generation in one call"] = round(
                median(merged[arm][later]) / median(merged["grpo"][later]), 3
            )
        if "unsolved" in runs:
            run = runs["unsolved"]
            quiet = [t for t, share in zip(run["step_time"][later], run["triggered_share"][later]) if not share]
            ratios["unsolved / grpo on steps where no group triggered"] = (
                round(median(quiet) / report["grpo"]["median_step_s"], 3)
                if quiet
                else f"no such step in {len(run['step_time']) - 1}"
            )
    if "grpo-trl" in runs and "grpo" in runs:
        for arm in ("grpo-compact", "grpo"):
            if arm in runs:
                ratios[f"{arm} / grpo-trl"] = round(
                    report[arm]["median_step_s"] / report["grpo-trl"]["median_step_s"], 3
                )
        for memory in ("peak_rss_gib", "peak_gpu_gib"):
            if memory in report["grpo"]:
                ratios[f"{memory}, grpo-trl -> grpo"] = [report["grpo-trl"][memory], report["grpo"][memory]]
    report["ratios"] = ratios
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=("embedded", "verdict", "code"), default="embedded")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the arms train (default: cuda where a GPU is visible)",
    )
    parser.add_argument(
        "--fp32",
        action="store_true",
        help="verdict and code settings without bf16 autocast (a CPU without native bf16 runs it at float32's speed "
        "at best); the arms' ratios compare like with like",
    )
    parser.add_argument(
        "--train-args",
        default="",
        help="more `lanpo train` flags for every arm, e.g. --train-args='--use_transformers_continuous_batching true' (its "
        "steps then have no one-call bound: NaN)",
    )
    parser.add_argument("--_one", nargs=2, metavar=("ARM", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        arm, out = args._one
        result = run_arm(args.setting, arm, args.steps, out, args.device, args.fp32, args.train_args)
        print("RESULT " + json.dumps(result), flush=True)
        return
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    workdir = tempfile.mkdtemp(prefix="step-floor-")
    runs = {}
    try:
        for arm in arms:
            out = os.path.join(workdir, arm)
            command = [
                sys.executable,
                __file__,
                "--setting",
                args.setting,
                "--steps",
                str(args.steps),
                "--device",
                args.device,
                *(["--fp32"] if args.fp32 else []),
                f"--train-args={args.train_args}",  # "=": its value starts with "--"
                "--_one",
                arm,
                out,
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not found:
                raise RuntimeError(f"arm {arm} failed (exit {done.returncode}): {done.stderr[-3000:]}")
            runs[arm] = json.loads(found[-1][len("RESULT ") :])
            print(arm, json.dumps(runs[arm]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    vllm = next(iter(runs.values()))["use_vllm"]
    gpu = f", {torch.cuda.get_device_name(0)}" if args.device == "cuda" else ""
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}",
        "setting": args.setting
        + (" (fp32, no bf16 autocast)" if args.fp32 else "")
        + (f" {args.train_args}" if args.train_args else ""),
        "generation": "vLLM colocate" if vllm else "transformers",
        "steps": f"{args.steps} per arm, medians over steps 2..{args.steps}, arms one after another",
        **summarize(runs),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
