"""Cost model of one LANPO step vs one GRPO step at the paper's scale, from counted tokens.

Setting (the paper's): Qwen2.5-7B, G = 16, p_t = 0.75 (12 feedback rows: 6 reflection, 6 abstraction; 4 scratch),
one summary per group, reflection on stored attempts (``reflection_source auto`` after the first epoch), β > 0
(a reference forward), vLLM generation with TRL's importance-sampling correction (an old-log-prob forward).

Counted (with the SmolLM2 tokenizer as a stand-in for Qwen's; both are BPE over similar vocabularies): the plain
prompt of MATH500 problems; the reflection prompt with an attempt (MATH500 reference solutions run together)
clipped as lanpo clips it (2,000 characters); the abstraction prompt with ``retrieval_top_k`` = 3 entries of 3 principles and 3 pitfalls built from MATH500
solution sentences; the summary prompt of a clipped trial; the LLM judge's relevance prompt (16 candidates per group
with abstraction rows). Assumed, not counted: the mean completion length L (``--completion``), the summary reply
length (``--summary``).

Cost weights per token (``--decode-weight``): a forward token 1, a trained token 3 (forward + backward), a decoded
token 1 (FLOP-equal) or more (decode is memory-bound on GPUs); the ratio is printed for both.

    python benchmarks/cost_model.py [--completion 3000] [--summary 400] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lanpo.data.loaders import load_problems
from lanpo.engine.generation import chat_ids
from lanpo.engine.models import load_tokenizer, resolve_model_path
from lanpo.pool.store import PoolEntry
from lanpo.prompts import abstraction_text, clip, reflection_text, relevance_messages, solve_messages, summary_messages


def tokens(tok, messages) -> int:
    return len(chat_ids(tok, messages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--completion",
        type=int,
        nargs="+",
        default=[1000, 3000, 8000],
        help="mean completion lengths L to project (tokens)",
    )
    parser.add_argument("--summary", type=int, default=400, help="summary reply length (tokens)")
    parser.add_argument("--decode-weight", type=float, default=4.0, help="a decoded token's cost vs a forward token")
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--problems", type=int, default=100)
    args = parser.parse_args()
    tok = load_tokenizer(resolve_model_path("smollm2-135m"))
    problems = load_problems("math500", data_dir=args.data_dir, limit=args.problems)
    lines = (Path(args.data_dir) / "math500" / "test.jsonl").read_text().splitlines()
    solutions = [json.loads(line)["solution"] for line in lines]  # reference solutions stand in for attempts
    sentences = [s.strip() for sol in solutions for s in sol.split(". ") if 40 < len(s) < 200]
    long_attempt = " ".join(solutions)  # clipped below to what lanpo stores

    plain, reflection, abstraction, summary_in, judge = [], [], [], [], []
    for i, p in enumerate(problems):
        base = tokens(tok, solve_messages(p.problem))
        plain.append(base)
        attempt = clip(long_attempt[i * 500 :])
        reflection.append(tokens(tok, [{"role": "user", "content": reflection_text(p.problem, [attempt])}]) - base)
        lessons = [
            (sentences[(i * 9 + j * 3) % len(sentences) :][:3], sentences[(i * 9 + j * 3 + 1) % len(sentences) :][:3])
            for j in range(3)
        ]
        abstraction.append(tokens(tok, [{"role": "user", "content": abstraction_text(p.problem, lessons)}]) - base)
        summary_in.append(tokens(tok, summary_messages(p.problem, attempt, True)))
        entry = PoolEntry("x", "y", "", *lessons[0])
        judge.append(tokens(tok, relevance_messages(p.problem, entry.principles, entry.pitfalls)))
    P, C_r, C_a = statistics.mean(plain), statistics.mean(reflection), statistics.mean(abstraction)
    S_in, J = statistics.mean(summary_in), statistics.mean(judge)
    g, n_ref, n_abs, candidates = 16, 6, 6, 16  # 4 scratch rows
    counted = {
        "plain_prompt": round(P),
        "reflection_context": round(C_r),
        "abstraction_context": round(C_a),
        "summary_prompt": round(S_in),
        "judge_prompt": round(J),
    }
    print("counted tokens (mean over", len(problems), "MATH500 problems):", json.dumps(counted))
    rows = []
    for L in args.completion:
        grpo = {"prefill": g * P, "decode": g * L, "trained": g * (P + L), "forward": 2 * g * (P + L)}
        contexts = n_ref * C_r + n_abs * C_a
        strip = {
            "prefill": g * P + contexts + S_in + candidates * J,
            "decode": g * L + args.summary + candidates,
            "trained": g * (P + L),
            "forward": 2 * g * (P + L),
        }
        keep = {**strip, "trained": g * (P + L) + contexts, "forward": 2 * (g * (P + L) + contexts)}
        embed = {**strip, "prefill": g * P + contexts + S_in, "decode": g * L + args.summary}

        def cost(c, w):
            return c["prefill"] + c["forward"] + 3 * c["trained"] + w * c["decode"]

        for name, c in (
            ("GRPO", grpo),
            ("LANPO strip, LLM judge", strip),
            ("LANPO strip, embedding scorer", embed),
            ("LANPO keep, LLM judge", keep),
        ):
            rows.append(
                {
                    "L": L,
                    "arm": name,
                    **{k: round(v) for k, v in c.items()},
                    "ratio_decode_w1": round(cost(c, 1) / cost(grpo, 1), 3),
                    f"ratio_decode_w{args.decode_weight:g}": round(
                        cost(c, args.decode_weight) / cost(grpo, args.decode_weight), 3
                    ),
                }
            )
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
