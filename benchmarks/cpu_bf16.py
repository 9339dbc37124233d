"""bf16 against float32 on this CPU, side by side in one run: what ``bf16: true`` costs where the CPU has no native
bf16 (no AVX512-BF16 or AMX) and what it saves where it has. Without native bf16, each bf16 case runs twice: with
torch's own bf16 kernels and with lanpo's (``lanpo.engine.bf16_matmul``: float32
GEMMs of the bf16 operands, what `lanpo train` installs there).

1. **Training pass.** A forward and backward pass of SmolLM2-135M (the embedded default) on ``--batch`` rows of
   ``--tokens`` tokens, float32 weights, once plain and once under ``torch.autocast("cpu", torch.bfloat16)`` (what
   TRL's ``bf16: true`` does on CPU); one warm-up pass each, then ``--repeats`` timed.
2. **Sampler** (with ``--vllm``, in ``.venv-vllm``). vLLM on CPU generating ``--prompts`` x ``--max-tokens``
   tokens in bfloat16 (vLLM's "auto" on CPU, even for a float32 checkpoint; TRL's colocate engine passes no dtype)
   and in float32, each engine in a process of its own.

    python benchmarks/cpu_bf16.py [--batch 4] [--tokens 128] [--repeats 2]
    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python benchmarks/cpu_bf16.py --vllm
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from lanpo.engine import bf16_matmul
from lanpo.engine.models import cpu_bf16_native, resolve_model_path


def training_pass(path: str, batch: int, tokens: int, repeats: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    seconds = {}
    modes = ["float32", "bf16 autocast"] + ([] if cpu_bf16_native() else ["bf16 autocast, lanpo's matmuls"])
    for mode in modes:
        if mode.endswith("lanpo's matmuls"):
            bf16_matmul.install()
        times = []
        for _ in range(1 + repeats):
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode != "float32"):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        bf16_matmul.uninstall()
        seconds[mode] = statistics.median(times[1:])
        print(f"  {mode:30s} forward+backward {batch}x{tokens}: {seconds[mode]:.2f} s (median of {repeats})")
    return seconds


def sampler_rate(path: str, dtype: str, prompts: int, max_tokens: int) -> float:
    """One engine's sampling rate (tokens/s); one engine a process (two in one process clash over thread binding).
    ``dtype`` "bfloat16+lanpo" is bfloat16 with lanpo's matmuls."""
    if dtype.endswith("+lanpo"):
        dtype = dtype.removesuffix("+lanpo")
        bf16_matmul.install()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    texts = [f"Write a Python function that returns the sum of the first {i} squares." for i in range(prompts)]
    params = SamplingParams(temperature=0.7, max_tokens=max_tokens, ignore_eos=True)  # a per-request seed is slower
    llm = LLM(path, dtype=dtype, max_model_len=2048, seed=0)  # as TRL's colocate engine builds it (prefix cache on)
    llm.generate(texts[:4], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(texts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)


def sampler(args) -> dict[str, float]:
    rates = {}
    for dtype in ("bfloat16", "float32") + (() if cpu_bf16_native() else ("bfloat16+lanpo",)):
        command = [sys.executable, __file__, "--model", args.model, "--prompts", str(args.prompts)]
        command += ["--max-tokens", str(args.max_tokens), "--vllm-one", dtype]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        rates[dtype] = float(done.stdout.strip().splitlines()[-1])
        print(f"  vLLM {dtype:14s} {args.prompts} x {args.max_tokens} tokens: {rates[dtype]:.0f} tokens/s")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--vllm", action="store_true", help="time vLLM's sampler instead (run in .venv-vllm)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--vllm-one", help=argparse.SUPPRESS)  # one engine's rate, in a process of its own
    args = parser.parse_args()

    path = resolve_model_path(args.model)
    if args.vllm_one:
        print(sampler_rate(path, args.vllm_one, args.prompts, args.max_tokens))
        return
    print(
        f"CPU: torch capability {torch.backends.cpu.get_cpu_capability()}, native bf16 {cpu_bf16_native()}, "
        f"{torch.get_num_threads()} threads"
    )
    if args.vllm:
        rates = sampler(args)
        print(f"float32 / bfloat16 sampling rate: {rates['float32'] / rates['bfloat16']:.2f}x")
        if "bfloat16+lanpo" in rates:
            print(f"float32 / bfloat16 with lanpo's matmuls: {rates['float32'] / rates['bfloat16+lanpo']:.2f}x")
    else:
        seconds = training_pass(path, args.batch, args.tokens, args.repeats)
        print(f"bf16 autocast / float32 time: {seconds['bf16 autocast'] / seconds['float32']:.2f}x")
        lanpos = seconds.get("bf16 autocast, lanpo's matmuls")
        if lanpos:
            print(f"bf16 autocast with lanpo's matmuls / float32 time: {lanpos / seconds['float32']:.2f}x")


if __name__ == "__main__":
    main()
