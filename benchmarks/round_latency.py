"""What a generation round costs against its rows, on this machine, and what that predicts for a step on a GPU.

A training step's generation is a sequence of dependent rounds (calls into the engine), each decoding until its
longest row ends. The **latency model**: a round of ``R`` rows whose longest completion is ``L`` tokens costs

    t(R, L) = prefill(R) + L * (a + b * R)

``a`` is what a decode step costs whatever its rows (the engine's per-step overhead: Python, kernel launches, the
weights read once), ``b`` what each row adds. Where ``b * R`` is small beside ``a`` (a GPU at these sizes), a round
costs about its decode steps whatever its rows, and a step's generation time is set by its rounds; where it is not (a
CPU), by its tokens.

Measured here: each engine (transformers' ``generate`` on the embedded model, or a tiny random one with ``--tiny``;
vLLM where it is installed) generates ``L`` new tokens for ``R`` copies of a prompt (every row forced to ``L`` with
``min_new_tokens`` / ``ignore_eos``), ``R`` in 1, 4, 8, 16, 32, 64; ``a`` and ``b`` are fitted by least squares to
the per-token times. Then, from the figures recorded on one H200 (docs/log.md, 2026-11-26: verdict settings,
transformers' generation, 4 problems x 8 rows, 96 new tokens):

* GRPO, 4.24 s a step, 3.59 s of it generation: one round of 32 rows;
* LANPO's defaults as they were (``generation_rounds phased``), 11.66 s a step, 7.98 s generation and 2.46 s of
  summaries riding in it: on a problem's first visit two rounds (scratch, abstraction and the summaries; then the
  reflection rows on this step's attempts).

the model predicts LANPO's step under ``generation_rounds one`` on that GPU: its non-generation time as measured,
plus one round of all its rows (the step's 32, the summaries, the next step's attempts ahead), costed as the
measured phased rounds cost on average, scaled by the row count through this machine's ``b / a`` where a GPU's own
``b / a`` is unknown (an upper bound: a GPU's decode is flatter in rows than a CPU's). With a flat decode the one
call costs what one of the phased rounds cost on average: the second round goes, but not what makes each LANPO round
dearer than GRPO's (5.2 s against 3.6 s on the H200: longer prompts, the summaries riding, more rows to their limit).

    python benchmarks/round_latency.py [--tiny] [--tokens 32]
    .venv-vllm/bin/python benchmarks/round_latency.py --tiny      # vLLM's curve too
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

ROWS = (1, 4, 8, 16, 32, 64)
PROMPT = "What is 37 + 45? Please reason step by step, and put your final answer within \\boxed{}."

# Recorded on one NVIDIA H200 (docs/log.md, 2026-11-26), verdict settings, transformers' generation.
H200 = {
    "grpo_step_s": 4.24,
    "grpo_generation_s": 3.59,  # one round of 32 rows
    "phased_step_s": 11.66,
    "phased_generation_s": 7.98 + 2.46,  # rollout rows and the summaries riding in them, over its rounds
    "phased_rounds": 2,  # a first visit: phase A, then the reflection rows on this step's attempts
    "phased_rows": (32 - 12 + 4, 12),  # (phase A: scratch + abstraction + 4 summaries, phase B: reflection rows)
    "one_rows": 32 + 4 + 8,  # one call: the step's rows, 4 summaries, 2 attempts ahead at each of 4 next problems
}


def fit(rows: list[int], per_token: list[float]) -> tuple[float, float]:
    """Least squares of ``per_token = a + b * rows``."""
    n = len(rows)
    mean_r, mean_t = sum(rows) / n, sum(per_token) / n
    var = sum((r - mean_r) ** 2 for r in rows)
    b = sum((r - mean_r) * (t - mean_t) for r, t in zip(rows, per_token)) / var if var else 0.0
    return mean_t - b * mean_r, b


def model_dir(tiny: bool) -> str:
    if not tiny:
        from lanpo.engine.models import resolve_model_path

        return resolve_model_path("smollm2-135m")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import build_tiny_model

    return str(build_tiny_model(Path(tempfile.mkdtemp(prefix="round-latency-")) / "tiny", hidden=64))


def transformers_curve(path: str, tokens: int, repeats: int) -> dict[int, float]:
    """Seconds a call takes, by rows (the fastest of ``repeats``), every row forced to ``tokens`` new tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    seconds = {}
    for rows in ROWS:
        batch = torch.tensor([ids] * rows)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    batch,
                    attention_mask=torch.ones_like(batch),
                    max_new_tokens=tokens,
                    min_new_tokens=tokens,
                    do_sample=True,
                    temperature=1.0,
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                )
            best = min(best, time.perf_counter() - start)
        seconds[rows] = best
    return seconds


def vllm_curve(path: str, tokens: int, repeats: int) -> dict[int, float]:
    from vllm import LLM, SamplingParams

    llm = LLM(model=path, dtype="float32", max_model_len=512, enforce_eager=True)
    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=1.0)
    seconds = {}
    for rows in ROWS:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            llm.generate([PROMPT] * rows, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        seconds[rows] = best
    return seconds


def describe(seconds: dict[int, float], tokens: int) -> dict:
    rows = sorted(seconds)
    a, b = fit(rows, [seconds[r] / tokens for r in rows])
    return {
        "seconds_by_rows": {r: round(seconds[r], 3) for r in rows},
        "per_token_step_a_s": round(a, 5),
        "per_row_b_s": round(b, 6),
        "b_over_a": round(b / a, 4) if a > 0 else None,
        "rows_at_which_rows_cost_as_much_as_the_step": round(a / b, 1) if b > 0 else None,
        "a_round_of_64_rows_over_a_round_of_8": round(seconds[64] / seconds[8], 2),
    }


def predict_gpu(b_over_a: float) -> dict:
    """LANPO's step on the H200 under generation_rounds one, from the recorded phased step (see the docstring):
    the phased rounds' mean cost per round is split by the model into a + b * rows; the one call is one round of
    ``one_rows`` rows. ``b_over_a`` 0 is a perfectly flat GPU decode; this machine's is an upper bound."""
    h = H200
    rest = h["phased_step_s"] - h["phased_generation_s"]
    # phased: sum over rounds of L * (a + b R) = generation; solve for L * a
    units = sum(1 + b_over_a * r for r in h["phased_rows"])
    per_round_a = h["phased_generation_s"] / units  # L * a of a LANPO round (its longer prompts and rows included)
    one = per_round_a * (1 + b_over_a * h["one_rows"])
    step = rest + one
    return {
        "b_over_a": b_over_a,
        "one_call_generation_s": round(one, 2),
        "non_generation_s": round(rest, 2),
        "predicted_step_s": round(step, 2),
        "predicted_ratio_to_grpo": round(step / h["grpo_step_s"], 3),
        "phased_ratio_to_grpo_measured": round(h["phased_step_s"] / h["grpo_step_s"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny random model instead of the embedded one")
    parser.add_argument("--tokens", type=int, default=32, help="new tokens every row is forced to (default 32)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    path = model_dir(args.tiny)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "model": "tiny random (hidden 64)" if args.tiny else "SmolLM2-135M (fp32)",
        "tokens": args.tokens,
        "transformers": describe(transformers_curve(path, args.tokens, args.repeats), args.tokens),
    }
    if importlib.util.find_spec("vllm"):
        report["vllm"] = describe(vllm_curve(path, args.tokens, args.repeats), args.tokens)
    measured = [report[k]["b_over_a"] for k in ("transformers", "vllm") if k in report and report[k]["b_over_a"]]
    report["h200_prediction"] = {
        # a GPU's decode at these sizes: the H200's own GRPO round (32 rows, about 96 decode steps in 3.6 s)
        "flat decode (b = 0), the GPU's regime": predict_gpu(0.0),
        "this machine's flattest engine, a CPU's (a loose upper bound)": predict_gpu(
            min(measured) if measured else 0.0
        ),
        "assumptions": "the phased step's rounds run to the same longest row; its non-generation time stays; "
        "one call holds the step's 32 rows, 4 summaries and 8 attempts ahead",
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
