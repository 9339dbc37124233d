"""Step-time overhead: LANPO vs our GRPO (p_t = 0) vs stock TRL GRPOTrainer, in one run.

Same model (the embedded default, CPU), config and seed for every arm; the median of TRL's per-step
`step_time` over steps 2..N (step 1 warms up). Arms:

* `trl`        — trl.GRPOTrainer, no rollout_func;
* `grpo`       — LanpoTrainer with feedback_ratio=0 and no summaries (the GRPO baseline of this library);
* `lanpo`      — LanpoTrainer defaults: p_t = 0.75, reflection on this step's scratch rollouts, summaries on;
* `lanpo-pool` — the same, reflecting on attempts stored in earlier steps (no second generation phase);
* `lanpo-strip` — LANPO defaults with context_in_loss=strip (the loss sees the plain prompt).

The training set has 4 problems, one per step, so a run of 4 steps sees each problem once: `lanpo-pool` starts
from a pool holding one earlier attempt per problem (sampled from the base model before the clock starts), the
steady state of a run in its second epoch. Each arm also reports its feedback and fallback shares, so a cheap
arm that merely fell back to scratch rollouts shows as such.

Prints lanpo / grpo (goal <= 1.3 on CPU) and grpo / trl (goal <= 1.05), with each arm's time split.

    python benchmarks/step_overhead.py [--steps 4] [--repeats 2] [--arms trl,grpo,lanpo,lanpo-pool,lanpo-strip]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time

import torch

from lanpo.data import builtin_arith, to_prompt_dataset
from lanpo.generation import generate
from lanpo.models import load_model, load_tokenizer, resolve_model_path
from lanpo.pool import Attempt, ExperiencePool
from lanpo.prompts import solve_messages
from lanpo.rewards import MathVerifier, make_accuracy_reward
from lanpo.train import parse

SHARES = ("lanpo/feedback_share", "lanpo/fallback_share", "lanpo/feedback_tokens_per_prompt")
SPLIT = ("time/generate", "time/summarize", "time/retrieve", "time/score", "time/update")


def seed_attempts(model_path: str, problems) -> list[Attempt]:
    """One attempt per problem from the base model (T=0.7, 96 new tokens): what a pool holds after an epoch."""
    model, tokenizer = load_model(model_path)
    torch.manual_seed(0)
    samples = generate(model, tokenizer, [solve_messages(p.problem) for p in problems], n=1, temperature=0.7,
                       max_new_tokens=96)
    return [Attempt(p.id, p.problem, s[0].text) for p, s in zip(problems, samples)]


def run_arm(arm: str, steps: int, model_path: str, dataset, out: str, attempts: list[Attempt]) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from lanpo.trainer import LanpoTrainer

    cli = ["--output_dir", out, "--max_steps", str(steps), "--save_strategy", "no", "--disable_tqdm", "true"]
    if arm == "grpo":
        cli += ["--feedback_ratio", "0", "--summaries_per_group", "0"]
    if arm == "lanpo-pool":
        cli += ["--reflection_source", "pool"]
    if arm == "lanpo-strip":
        cli += ["--context_in_loss", "strip"]
    _, _, config = parse(cli)
    tokenizer = load_tokenizer(model_path)
    start = time.perf_counter()
    if arm == "trl":
        lanpo_only = {f for f in config.__dataclass_fields__ if f not in GRPOConfig.__dataclass_fields__}
        kwargs = {k: getattr(config, k) for k in config.__dataclass_fields__
                  if k not in lanpo_only and config.__dataclass_fields__[k].init}
        kwargs["lr_scheduler_type"] = config.lr_scheduler_type.value
        kwargs.update(generation_batch_size=None, steps_per_generation=None)  # re-derived from the batch sizes
        verifier = MathVerifier(extraction=config.answer_extraction)  # as LanpoTrainer builds its own
        trainer = GRPOTrainer(model=model_path, reward_funcs=[make_accuracy_reward(verifier)],
                              args=GRPOConfig(**kwargs), train_dataset=dataset, processing_class=tokenizer)
    else:
        pool = None
        if arm == "lanpo-pool":
            pool = ExperiencePool(os.path.join(out, "pool.sqlite"), cap_per_problem=config.pool_cap,
                                  attempts_per_problem=config.pool_attempts_cap)  # as the trainer builds it
            pool.add_attempts(attempts)
        trainer = LanpoTrainer(model=model_path, args=config, train_dataset=dataset, processing_class=tokenizer,
                               pool=pool)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    step_times = [h["step_time"] for h in logs][1:]
    split = {key: round(statistics.median(h[key] for h in logs[1:]), 2) for key in SPLIT if key in logs[-1]}
    return {"step_times": [round(x, 1) for x in step_times], "split_median_s": split,
            "wall_s": round(time.perf_counter() - start, 1),
            "mean_completion_tokens": round(statistics.mean(h["completions/mean_length"] for h in logs), 1),
            **{key: round(statistics.mean(h.get(key, 0.0) for h in logs[1:]), 3) for key in SHARES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--arms", default="trl,grpo,lanpo,lanpo-pool,lanpo-strip")
    parser.add_argument("--repeats", type=int, default=2,
                        help="run the arms this many times, in reversed order every other time (order effects)")
    args = parser.parse_args()
    model_path = resolve_model_path("smollm2-135m")
    problems = builtin_arith("1", n=4, seed=0)
    dataset = to_prompt_dataset(problems)
    runs: dict[str, list[dict]] = {}
    arms = args.arms.split(",")
    attempts = seed_attempts(model_path, problems) if "lanpo-pool" in arms else []
    for repeat in range(args.repeats):
        for arm in (arms if repeat % 2 == 0 else arms[::-1]):
            out = tempfile.mkdtemp(prefix=f"overhead-{arm}-")
            try:
                runs.setdefault(arm, []).append(run_arm(arm, args.steps, model_path, dataset, out, attempts))
            finally:
                shutil.rmtree(out, ignore_errors=True)
            print(arm, repeat, json.dumps(runs[arm][-1]), flush=True)
    results = {}
    for arm, parts in runs.items():
        steps = [t for p in parts for t in p["step_times"]]
        split = {k: round(statistics.median(p["split_median_s"][k] for p in parts), 2)
                 for k in parts[0]["split_median_s"]}
        results[arm] = {"median_step_s": round(statistics.median(steps), 2), "step_times": steps,
                        "split_median_s": split, "runs": len(parts),
                        **{key: round(statistics.mean(p[key] for p in parts), 3) for key in SHARES}}
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "settings": "embedded default: SmolLM2-135M fp32, G=8, 1 problem/step, 96 new tokens, beta 0.04, "
                    f"{args.steps} steps per run (median of steps 2..{args.steps} over {args.repeats} runs per arm, "
                    "alternating arm order)",
        "arms": results,
    }
    if "lanpo" in results and "grpo" in results:
        report["lanpo_over_grpo"] = round(results["lanpo"]["median_step_s"] / results["grpo"]["median_step_s"], 3)
    for arm in ("lanpo-pool", "lanpo-strip"):
        if arm in results and "grpo" in results:
            report[f"{arm.replace('-', '_')}_over_grpo"] = round(
                results[arm]["median_step_s"] / results["grpo"]["median_step_s"], 3)
    if "grpo" in results and "trl" in results:
        report["grpo_over_trl"] = round(results["grpo"]["median_step_s"] / results["trl"]["median_step_s"], 3)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
