"""torch threads on a CPU shared with other work: lanpo's old choice (every core this process may use) against the
new one (the cores other work leaves idle, sampled at start and re-checked between steps), side by side in one run.

Workloads: a training step's two parts on a Llama-shaped model (hidden 512, 4 layers, 32k vocabulary): `update`,
the forward and backward of 8 rows x 128 tokens (a few large operations), and `generate`, sampling 48 new tokens
for 8 rows (many small operations, each ending at a barrier of every thread), timed over a few steps in each
condition: alone, beside one and beside two busy
processes (each a `while True: pass` loop, started as another program: not a child of this one). Prints seconds a
step and the ratio old/new per condition, with the machine's core count.

    .venv/bin/python benchmarks/shared_cpu.py [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch


def busy_processes(n: int) -> list[int]:
    """Start ``n`` CPU-bound processes that are not children of this one (their shell exits at once)."""
    pids = []
    for _ in range(n):
        out = subprocess.run(
            ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            text=True,
            check=True,
        )
        pids.append(int(out.stdout.strip()))
    time.sleep(0.5)
    return pids


def stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def model_and_batch():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 32000, (8, 128))
    return model, ids


def step(model, ids, workload: str = "update") -> None:
    if workload == "generate":
        with torch.no_grad():
            model.generate(ids[:, :16], max_new_tokens=48, min_new_tokens=48, do_sample=True, pad_token_id=0)
        return
    model.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()


def timed(model, ids, steps: int, adaptive: bool, cores: int, workload: str) -> float:
    from lanpo.engine.models import CpuShare, follow_other_work, size_cpu_threads

    if adaptive:
        size_cpu_threads(processes=1)
        share = CpuShare()
    else:
        torch.set_num_threads(cores)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(model, ids, workload)
        times.append(time.perf_counter() - start)
        if adaptive:  # as lanpo.trainer.ThreadSizer does between steps
            follow_other_work(share)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--workloads", default="update,generate")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS"):
        sys.exit("unset OMP_NUM_THREADS: it would override both choices")
    cores = len(os.sched_getaffinity(0))
    model, ids = model_and_batch()
    step(model, ids)  # warm-up
    print(f"{cores} cores, torch {torch.__version__}; median seconds a step over {args.steps} steps")
    print("| workload | condition | old: every core | new: idle cores | old / new | threads (new) |")
    print("|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        step(model, ids, workload)  # warm-up
        for busy in (0, 1, 2):
            pids = busy_processes(busy)
            try:
                old = timed(model, ids, args.steps, adaptive=False, cores=cores, workload=workload)
                new = timed(model, ids, args.steps, adaptive=True, cores=cores, workload=workload)
                threads = torch.get_num_threads()
            finally:
                stop(pids)
            name = "alone" if not busy else f"beside {busy} busy process{'es' if busy > 1 else ''}"
            print(f"| {workload} | {name} | {old:.2f} | {new:.2f} | {old / new:.2f}x | {threads} |", flush=True)


if __name__ == "__main__":
    main()
