"""Step-time overhead: LANPO vs our GRPO (p_t = 0) vs stock TRL GRPOTrainer, side by side in one run.

Same model (the embedded default, SmolLM2-135M on CPU), config and seed for every arm; the median of TRL's per-step
``step_time`` over steps 2..N of each run (step 1 warms up). Arms:

* ``trl``         — trl.GRPOTrainer, no rollout_func;
* ``grpo``        — LanpoTrainer with feedback_ratio=0 and no summaries (the GRPO baseline of this library);
* ``lanpo``       — LanpoTrainer defaults after one warm epoch (the steady state of a run: every problem has
  stored attempts, so ``reflection_source auto`` reflects on them in one generation phase, and the pool holds
  entries for abstraction);
* ``lanpo-keep`` / ``lanpo-strip`` — the same with ``context_in_loss`` keep / strip (the one equal to the default is
  not run twice);
* ``lanpo-cold``  — LanpoTrainer defaults in the first epoch: no stored attempts, so reflection waits for this
  step's scratch rollouts (a second generation phase for every group);
* ``unsolved``    — ``feedback_trigger unsolved`` from the warm pool: GRPO's rollout, then a second phase for the
  groups whose rows all failed only (its ``triggered_share`` says how many did).

The training set has 4 problems, one per step. The warm epoch runs once, before the clock, as a LanpoTrainer run
of the defaults over the 4 problems; each warm arm starts from a copy of its pool (attempts and entries) and the
base model. Each arm reports its feedback and fallback shares, so a cheap arm that merely fell back to plain
prompts shows as such.

``--min-new-tokens 512`` forces every completion to 512 tokens (``max_completion_length`` 512 and
``generation_kwargs.min_new_tokens``): the regime of real runs, where contexts are small against completions.
Every arm runs in a process of its own (the same memory start, nothing kept between arms). Ratios ÷ our GRPO are
printed last.

    python benchmarks/step_overhead.py [--steps 4] [--repeats 1] [--min-new-tokens 512] [--arms trl,grpo,lanpo,...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from lanpo.commands.train import parse
from lanpo.data.loaders import builtin_arith, to_prompt_dataset
from lanpo.engine.models import load_tokenizer, resolve_model_path
from lanpo.pool.store import ExperiencePool
from lanpo.verify.rewards import MathVerifier, make_accuracy_reward

ARMS = ("trl", "grpo", "lanpo", "lanpo-keep", "lanpo-strip", "lanpo-cold", "unsolved")
SHARES = (
    "lanpo/feedback_share",
    "lanpo/fallback_share",
    "lanpo/feedback_tokens_per_prompt",
    "lanpo/triggered_share",
    "lanpo/feedback_lift",
)
SPLIT = ("time/generate", "time/summarize", "time/retrieve", "time/reward", "time/score", "time/update")


def settings(out: str, steps: int, forced: int | None) -> list[str]:
    cli = ["--output_dir", out, "--max_steps", str(steps), "--save_strategy", "no", "--disable_tqdm", "true"]
    cli += ["--logprob_head", "trl"]  # TRL's own head in every arm: this compares lanpo's additions with TRL's step
    if forced:
        cli += ["--max_completion_length", str(forced), "--generation_kwargs", json.dumps({"min_new_tokens": forced})]
    return cli


def warm_pool(model_path: str, dataset, forced: int | None, workdir: str) -> str:
    """One epoch of LANPO defaults over the training set; returns a copy of its pool."""
    from lanpo.trainer import LanpoTrainer

    out = os.path.join(workdir, "warm-run")
    _, _, config = parse(settings(out, len(dataset), forced))
    trainer = LanpoTrainer(
        model=model_path, args=config, train_dataset=dataset, processing_class=load_tokenizer(model_path)
    )
    trainer.train()
    path = os.path.join(workdir, "warm-pool.sqlite")
    trainer.pool.backup(path)
    stats = trainer.pool.stats()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    print("warm epoch:", json.dumps({"steps": len(dataset), "pool": stats, "peak_gpu_gib": peak}), flush=True)
    del trainer  # the arms run in processes of their own: give them this process's GPU memory
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return path


def _mean(values: list[float]) -> float | None:
    """The mean of the values a run logged (None where it logged none: not a silent zero)."""
    return round(statistics.mean(values), 3) if values else None


def run_arm(arm: str, steps: int, model_path: str, dataset, out: str, forced: int | None, warm: str | None) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from lanpo.trainer import LanpoTrainer

    cli = settings(out, steps, forced)
    if arm == "grpo":
        cli += ["--feedback_ratio", "0", "--summaries_per_group", "0"]
    if arm in ("lanpo-keep", "lanpo-strip"):
        cli += ["--context_in_loss", arm.split("-")[1]]
    if arm == "unsolved":
        cli += ["--feedback_trigger", "unsolved"]
    _, _, config = parse(cli)
    tokenizer = load_tokenizer(model_path)
    start = time.perf_counter()
    if arm == "trl":
        lanpo_only = {f for f in config.__dataclass_fields__ if f not in GRPOConfig.__dataclass_fields__}
        kwargs = {
            k: getattr(config, k)
            for k in config.__dataclass_fields__
            if k not in lanpo_only and config.__dataclass_fields__[k].init
        }
        kwargs["lr_scheduler_type"] = config.lr_scheduler_type.value
        kwargs.update(generation_batch_size=None, steps_per_generation=None)  # re-derived from the batch sizes
        verifier = MathVerifier(extraction=config.answer_extraction)  # as LanpoTrainer builds its own
        trainer = GRPOTrainer(
            model=model_path,
            reward_funcs=[make_accuracy_reward(verifier)],
            args=GRPOConfig(**kwargs),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    else:
        pool = None
        if arm in ("lanpo", "lanpo-keep", "lanpo-strip", "unsolved"):
            os.makedirs(out, exist_ok=True)
            shutil.copy(warm, os.path.join(out, "pool.sqlite"))
            pool = ExperiencePool(
                os.path.join(out, "pool.sqlite"),
                cap_per_problem=config.pool_cap,
                attempts_per_problem=config.pool_attempts_cap,
            )  # as the trainer builds it
        trainer = LanpoTrainer(
            model=model_path, args=config, train_dataset=dataset, processing_class=tokenizer, pool=pool
        )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    step_times = [h["step_time"] for h in logs][1:]
    split = {key: round(statistics.median(h[key] for h in logs[1:]), 2) for key in SPLIT if key in logs[-1]}
    return {
        "step_times": [round(x, 1) for x in step_times],
        "split_median_s": split,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "mean_completion_tokens": round(statistics.mean(h["completions/mean_length"] for h in logs), 1),
        **{key: _mean([h[key] for h in logs[1:] if key in h]) for key in SHARES},  # None: never logged
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the arms this many times, in reversed order every other time (order effects)",
    )
    parser.add_argument(
        "--min-new-tokens",
        type=int,
        default=None,
        help="force every completion to this many tokens (also max_completion_length)",
    )
    parser.add_argument("--_one", nargs=3, metavar=("ARM", "OUT", "WARM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:  # one arm in a process of its own: the same memory start for every arm, none kept between arms
        arm, out, warm = args._one
        dataset = to_prompt_dataset(builtin_arith("1", n=4, seed=0))
        result = run_arm(
            arm, args.steps, resolve_model_path("smollm2-135m"), dataset, out, args.min_new_tokens, warm or None
        )
        print("RESULT " + json.dumps(result), flush=True)
        return
    from lanpo.config import LanpoConfig

    default_mode = LanpoConfig.__dataclass_fields__["context_in_loss"].default
    arms = [a for a in args.arms.split(",") if a != f"lanpo-{default_mode}"]  # that one is `lanpo`
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    model_path = resolve_model_path("smollm2-135m")
    problems = builtin_arith("1", n=4, seed=0)
    dataset = to_prompt_dataset(problems)
    workdir = tempfile.mkdtemp(prefix="overhead-")
    runs: dict[str, list[dict]] = {}
    try:
        warm = (
            warm_pool(model_path, dataset, args.min_new_tokens, workdir)
            if {"lanpo", "lanpo-keep", "lanpo-strip", "unsolved"} & set(arms)
            else None
        )
        for repeat in range(args.repeats):
            for arm in arms if repeat % 2 == 0 else arms[::-1]:
                out = os.path.join(workdir, f"{arm}-{repeat}")
                command = [sys.executable, __file__, "--steps", str(args.steps), "--_one", arm, out, warm or ""]
                if args.min_new_tokens:
                    command += ["--min-new-tokens", str(args.min_new_tokens)]
                done = subprocess.run(command, capture_output=True, text=True)
                shutil.rmtree(out, ignore_errors=True)
                found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
                if done.returncode or not found:
                    raise RuntimeError(f"arm {arm} failed (exit {done.returncode}): {done.stderr[-2000:]}")
                runs.setdefault(arm, []).append(json.loads(found[-1][len("RESULT ") :]))
                print(arm, repeat, json.dumps(runs[arm][-1]), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = {}
    for arm, parts in runs.items():
        steps = [t for p in parts for t in p["step_times"]]
        split = {
            k: round(statistics.median(p["split_median_s"][k] for p in parts), 2) for k in parts[0]["split_median_s"]
        }
        results[arm] = {
            "median_step_s": round(statistics.median(steps), 2),
            "step_times": steps,
            "split_median_s": split,
            "runs": len(parts),
            "mean_completion_tokens": round(statistics.mean(p["mean_completion_tokens"] for p in parts), 1),
            **{key: _mean([p[key] for p in parts if p[key] is not None]) for key in SHARES},
        }
    tokens = f"{args.min_new_tokens} forced new tokens" if args.min_new_tokens else "96 new tokens"
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "settings": f"embedded default: SmolLM2-135M fp32, G=8, 1 problem/step, {tokens}, beta 0.04; defaults: "
        f"context_in_loss {default_mode}, reflection_source auto; {args.steps} steps per run (median of "
        f"steps 2..{args.steps} over {args.repeats} run(s) per arm, alternating arm order)",
        "arms": results,
    }
    if "grpo" in results:
        base = results["grpo"]["median_step_s"]
        report["over_grpo"] = {arm: round(r["median_step_s"] / base, 3) for arm, r in results.items()}
    if "grpo" in results and "trl" in results:
        report["grpo_over_trl"] = round(results["grpo"]["median_step_s"] / results["trl"]["median_step_s"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
