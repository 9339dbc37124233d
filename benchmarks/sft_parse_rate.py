"""Parse rate of pool summaries written by a model before and after the SFT stage, on the same trials.

The trials (held-out problems, one attempt each by the base model, graded) are made once with a fixed seed and
reused for every model, so the only difference is the summarizer. For each model: the share of summaries that
parse (`lanpo.prompts.parse_summary`), and the share that also keep a lesson after answers are scrubbed (what
actually enters the pool).

    python benchmarks/sft_parse_rate.py --sft runs/sft-embedded/final [--base smollm2-135m] [--problems 48]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections import Counter

import torch

from lanpo.data.loaders import load_problems
from lanpo.engine.generation import HFGenerator, generate
from lanpo.engine.models import default_extraction, load_model
from lanpo.prompts import solve_messages
from lanpo.summarize import Trial, summarize_trials
from lanpo.verify.rewards import MathVerifier


def make_trials(model, tokenizer, problems, seed: int, extraction: str) -> list[Trial]:
    torch.manual_seed(seed)
    samples = generate(
        model, tokenizer, [solve_messages(p.problem) for p in problems], n=1, temperature=0.7, max_new_tokens=96
    )
    with MathVerifier(extraction=extraction) as verifier:
        scores = verifier.score_texts([p.answer for p in problems], [s[0].text for s in samples])
    return [Trial(p.id, p.problem, s[0].text, bool(sc), gold=p.answer) for p, s, sc in zip(problems, samples, scores)]


def parse_rate(model, tokenizer, trials: list[Trial], samples: int, seed: int) -> dict:
    torch.manual_seed(seed)
    stats = Counter()
    generator = HFGenerator(model, tokenizer, temperature=0.7, max_new_tokens=128, batch_size=48)
    summarize_trials([t for t in trials for _ in range(samples)], generator, stats)
    n = stats["requested"]
    return {
        "summaries": n,
        "parse_rate": round((n - stats["parse_failed"]) / n, 3),
        "usable_rate": round(stats["parsed"] / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m")
    parser.add_argument("--sft", required=True, help="the model after SFT (e.g. RUN/final)")
    parser.add_argument("--data", default="builtin:arith?levels=1,2")
    parser.add_argument("--problems", type=int, default=48)
    parser.add_argument("--samples", type=int, default=2, help="summaries per trial")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--extraction",
        choices=["strict", "lenient"],
        help="how the trials are graded (default: lenient for the embedded model, as lanpo train)",
    )
    args = parser.parse_args()
    args.extraction = args.extraction or default_extraction(args.base)
    problems = load_problems(args.data, split="test", limit=args.problems)
    base, tokenizer = load_model(args.base)
    trials = make_trials(base, tokenizer, problems, args.seed, args.extraction)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": vars(args),
        "trials": len(trials),
        "trials_judged_correct": sum(t.correct for t in trials),
        "before_sft": parse_rate(base, tokenizer, trials, args.samples, args.seed),
    }
    del base
    tuned, tuned_tokenizer = load_model(args.sft)
    report["after_sft"] = parse_rate(tuned, tuned_tokenizer, trials, args.samples, args.seed)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
