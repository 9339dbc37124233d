"""HF `generate` vs vLLM, side by side in one run: eval-style generation and a LANPO training step.

* eval-style generation: SmolLM2-135M-Instruct, 32 held-out `builtin:arith` prompts x k=4, up to 128 new tokens,
  T=0.7, through `lanpo.engine.generation.generate` (the path `lanpo eval` uses on either backend); generated tokens per
  second (each backend's own samples, stop tokens ending rows), load time excluded;
* a LANPO training step: the embedded default (G=8, 96 new tokens, p_t 0.75) with `use_vllm` false vs colocate;
  median `step_time` of steps 2..N.

Each arm runs in a process of its own (two vLLM engines cannot share one). Run it in the vLLM environment:

    .venv-vllm/bin/python benchmarks/generation_backends.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def eval_arm(backend: str) -> dict:
    import torch

    from lanpo.data.loaders import builtin_arith
    from lanpo.engine.generation import generate, load_for_generation
    from lanpo.prompts import solve_messages

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    start = time.perf_counter()
    model, tokenizer = load_for_generation("smollm2-135m", backend)
    load = time.perf_counter() - start
    prompts = [solve_messages(p.problem) for p in builtin_arith("1", n=32, split="test")]
    torch.manual_seed(0)
    generate(model, tokenizer, prompts[:2], n=1, temperature=0.7, max_new_tokens=8)  # warm-up
    start = time.perf_counter()
    samples = generate(model, tokenizer, prompts, n=4, temperature=0.7, max_new_tokens=128, batch_size=32)
    tokens = sum(s.num_tokens for row in samples for s in row)
    seconds = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "load_s": round(load, 1),
    }


def train_arm(use_vllm: bool, steps: int) -> dict:
    from lanpo.commands.train import parse
    from lanpo.data.loaders import builtin_arith, to_prompt_dataset
    from lanpo.engine.models import load_tokenizer, resolve_model_path
    from lanpo.trainer import LanpoTrainer

    out = tempfile.mkdtemp(prefix="backend-step-")
    cli = ["--output_dir", out, "--max_steps", str(steps), "--save_strategy", "no", "--disable_tqdm", "true"]
    if use_vllm:
        cli += ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_max_model_length", "1024"]
    _, model_args, config = parse(cli)
    path = resolve_model_path(model_args.model_name_or_path)
    trainer = LanpoTrainer(
        model=path,
        args=config,
        train_dataset=to_prompt_dataset(builtin_arith("1", n=16)),
        processing_class=load_tokenizer(path),
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    return {
        "step_times": [round(h["step_time"], 1) for h in logs],
        "median_step_s": round(statistics.median(h["step_time"] for h in logs[1:]), 2),
        "generate_s": round(statistics.median(h["time/generate"] for h in logs[1:]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        kind, name = args.arm.split(":")
        result = eval_arm(name) if kind == "eval" else train_arm(name == "vllm", args.steps)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = {}
    for arm in ("eval:hf", "eval:vllm", "train:hf", "train:vllm"):
        done = subprocess.run(
            [sys.executable, __file__, "--arm", arm, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{arm} failed:\n{done.stderr[-3000:]}")
        results[arm] = json.loads(line[7:])
        print(arm, results[arm], flush=True)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": "SmolLM2-135M fp32; eval: 32 prompts x k=4, up to 128 new tokens, T=0.7; train: embedded "
        f"default, {args.steps} steps, median of steps 2..{args.steps}",
        "arms": results,
        "eval_vllm_over_hf_tokens_per_s": round(
            results["eval:vllm"]["tokens_per_s"] / results["eval:hf"]["tokens_per_s"], 2
        ),
        "train_step_vllm_over_hf": round(
            results["train:vllm"]["median_step_s"] / results["train:hf"]["median_step_s"], 2
        ),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
