"""Generation throughput of `lanpo eval`'s generate path vs a bare `model.generate` loop, and verifier speed.

Both generation paths get the same batch (same rows, same order, same padding) and the same seed, so they
produce the same tokens; the ratio of their tokens/s is the overhead of lanpo's path. Runs alternate
(A, B, A, B, ...) and the median of each is reported. Usage:

    python benchmarks/eval_throughput.py [--batch 32] [--max-new-tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from lanpo.data.loaders import builtin_arith
from lanpo.engine.generation import chat_ids, generate, stop_token_ids
from lanpo.engine.models import load_model
from lanpo.prompts import solve_messages
from lanpo.verify.rewards import MathVerifier


def bare_generate(model, tokenizer, prompts, max_new_tokens, temperature):
    """The reference: one padded batch straight into model.generate, nothing else."""
    ids = [chat_ids(tokenizer, p) for p in prompts]
    ids.sort(key=len, reverse=True)  # the order lanpo's path uses, so both runs see identical tensors
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in ids])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in ids])
    stops = stop_token_ids(model, tokenizer)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            eos_token_id=stops,
            pad_token_id=pad,
        )
    new = out[:, width:].tolist()
    return sum(next((k for k, t in enumerate(row) if t in stops), len(row)) for row in new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answers", type=int, default=4000, help="answers for the verifier benchmark")
    args = parser.parse_args()

    model, tokenizer = load_model("smollm2-135m", device="cpu")
    prompts = [solve_messages(p.problem) for p in builtin_arith("1,2", n=args.batch, seed=11, split="test")]
    lanpo_rates, bare_rates = [], []
    for _ in range(args.repeats):
        torch.manual_seed(0)
        start = time.perf_counter()
        samples = generate(
            model,
            tokenizer,
            prompts,
            n=1,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch,
        )
        lanpo_tokens = sum(s[0].num_tokens for s in samples)
        lanpo_rates.append(lanpo_tokens / (time.perf_counter() - start))
        torch.manual_seed(0)
        start = time.perf_counter()
        bare_tokens = bare_generate(model, tokenizer, prompts, args.max_new_tokens, args.temperature)
        bare_rates.append(bare_tokens / (time.perf_counter() - start))
    lanpo_rate, bare_rate = statistics.median(lanpo_rates), statistics.median(bare_rates)

    # Verifier: GSM8K-style integer answers, half right (exact-match fast path), half off by one (math-verify).
    golds = [str(17 * i + 3) for i in range(args.answers)]
    right = [f"so the total is \\boxed{{{g}}}" for g in golds]
    wrong = [f"so the total is \\boxed{{{int(g) + 1}}}" for g in golds]
    with MathVerifier() as verifier:
        verifier.score_texts(golds[:50], wrong[:50])  # start the workers outside the timing
        start = time.perf_counter()
        verifier.score_texts(golds, [r if i % 2 else w for i, (r, w) in enumerate(zip(right, wrong))])
        mixed = args.answers / (time.perf_counter() - start)
        start = time.perf_counter()
        verifier.score_texts(golds, wrong)
        all_verify = args.answers / (time.perf_counter() - start)

    report = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "settings": vars(args),
        "same_tokens_generated": lanpo_tokens == bare_tokens,
        "lanpo_eval_tokens_per_s": round(lanpo_rate, 1),
        "bare_generate_tokens_per_s": round(bare_rate, 1),
        "ratio_lanpo_over_bare": round(lanpo_rate / bare_rate, 3),
        "verifier_answers_per_s_half_right": round(mixed, 1),
        "verifier_answers_per_s_all_through_math_verify": round(all_verify, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
