"""The code reward's speed: sandboxed executions per second by workers, and its share of a training step.

1. **Throughput.** ``--jobs`` completions of ``builtin:code`` (levels 1-5, both splits): the reference solutions
   (pass) and the same with the last line replaced by ``return None`` (fail), each run in its own bubblewrap
   sandbox against its hidden tests, with 1, 2 and 4 workers; beside it, math's verifier on as many GSM8K-style
   answers (``\\boxed{N}``), in the same run.
2. **Share of a step** (goal: under 10%). ``lanpo train`` at the embedded default (SmolLM2-135M, a group of 8, 96
   tokens, on this CPU) for ``--steps`` steps on ``builtin:code`` and on ``builtin:arith``, one after the other,
   alone on the machine: ``time/reward`` over ``step_time`` from each run's metrics (the first step, which loads
   the engine and starts the sandbox and verifier workers, left out).

    python benchmarks/code_reward.py [--jobs 192] [--steps 4] [--skip-training]
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
from pathlib import Path

from lanpo.data.loaders import load_problems
from lanpo.verify.code import CodeSettings, CodeVerifier
from lanpo.verify.rewards import MathVerifier


def fence(code: str) -> str:
    return f"```python\n{code}```"


def throughput(jobs: int) -> list[dict]:
    spec = "builtin:code?levels=1,2,3,4,5&n=500"
    problems = load_problems(spec) + load_problems(spec + "&split=test")
    problems = (problems * (1 + jobs // (2 * len(problems))))[: jobs // 2]
    golds = [p.answer for p in problems] * 2
    texts = [fence(p.solution) for p in problems] + [
        fence(p.solution.rsplit("\n    ", 1)[0] + "\n    return None\n") for p in problems
    ]
    rows = []
    for workers in (1, 2, 4):
        verifier = CodeVerifier(CodeSettings(workers=workers))
        verifier.score_texts(golds[:workers], texts[:workers])  # warm: the first sandboxes
        start = time.perf_counter()
        scores = verifier.score_texts(golds, texts)
        seconds = time.perf_counter() - start
        verifier.close()
        rows.append(
            {
                "checker": f"code, {workers} worker(s)",
                "answers": len(texts),
                "seconds": round(seconds, 2),
                "per_second": round(len(texts) / seconds, 1),
                "credited": sum(scores),
            }
        )
    with MathVerifier() as math:
        answers = [str(n) for n in range(len(texts))]
        math.score_texts(answers[:8], [f"\\boxed{{{a}}}" for a in answers[:8]])
        start = time.perf_counter()
        scores = math.score_texts(answers, [f"So the answer is \\boxed{{{a}}}." for a in answers])
        seconds = time.perf_counter() - start
    rows.append(
        {
            "checker": "math (GSM8K-style)",
            "answers": len(texts),
            "seconds": round(seconds, 3),
            "per_second": round(len(texts) / seconds, 1),
            "credited": sum(scores),
        }
    )
    return rows


def step_share(data: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lanpo-code-bench-") as out:
        command = [
            sys.executable,
            "-m",
            "lanpo.cli",
            "train",
            "--data",
            data,
            "--max_steps",
            str(steps),
            "--save_strategy",
            "no",
            "--output_dir",
            out,
            "--disable_tqdm",
            "true",
        ]
        subprocess.run(command, check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step_time" in r][1:]
    reward = [r.get("time/reward", 0.0) for r in rows]
    step = [r["step_time"] for r in rows]
    return {
        "data": data,
        "steps": len(rows),
        "step_time": round(statistics.mean(step), 2),
        "reward_time": round(statistics.mean(reward), 3),
        "reward_share": round(sum(reward) / sum(step), 4),
        "accuracy": round(statistics.mean(r.get("reward", 0.0) for r in rows), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=192, help="completions per throughput measurement")
    parser.add_argument("--steps", type=int, default=4, help="training steps per data set (the first is left out)")
    parser.add_argument("--skip-training", action="store_true", help="throughput only")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}\n")
    rows = throughput(args.jobs)
    print("| checker | answers | seconds | per second | credited |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['checker']} | {r['answers']} | {r['seconds']} | {r['per_second']} | {r['credited']:.0f} |")
    report = {"throughput": rows}
    if not args.skip_training:
        shares = [step_share(data, args.steps) for data in ("builtin:code", "builtin:arith")]
        print("\n| data | steps | step s | reward s | reward share | reward |\n|---|---|---|---|---|---|")
        for r in shares:
            print(
                f"| {r['data']} | {r['steps']} | {r['step_time']} | {r['reward_time']} | "
                f"{100 * r['reward_share']:.1f}% | {r['accuracy']} |"
            )
        ratio = shares[0]["reward_share"]
        print(f"\ncode reward share of a step at the embedded default: {100 * ratio:.1f}% (goal: under 10%)")
        report["step_share"] = shares
    print("\n" + json.dumps(report))


if __name__ == "__main__":
    main()
