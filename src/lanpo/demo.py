"""``make demo``: LANPO on the embedded default, with held-out accuracy before and after.

1. evaluate SmolLM2-135M-Instruct zero-shot on held-out ``builtin:arith`` problems (never trained on);
2. train it with LANPO (p_t = 0.75, reflection + abstraction, GRPO + KL) for a few steps on CPU;
3. evaluate the trained model on the same held-out problems with the same settings, and print both.

Everything lands in ``runs/demo`` (the run directory of ``lanpo train``, plus ``eval-before``/``eval-after``); the demo
ends by printing one pool entry and one feedback rollout, and writes ``runs/demo/report.html``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from lanpo.cli import main as lanpo
from lanpo.report.page import write_report

DEMO_STEPS = 12
EVAL = [
    "--data",
    "builtin:arith?split=test",
    "--limit",
    "48",
    "--k",
    "4",
    "--temperature",
    "0.7",
    "--max-new-tokens",
    "96",
    "--extraction",
    "lenient",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEMO_STEPS, help=f"training steps (default {DEMO_STEPS})")
    parser.add_argument("--out", default="runs/demo", help="run directory (default runs/demo; replaced)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    out = Path(args.out)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    start = time.time()
    print(f"[1/3] held-out accuracy of the embedded default before training ({' '.join(EVAL)})", flush=True)
    if lanpo(["eval", "--model", "smollm2-135m", *EVAL, "--out", str(out / "eval-before")]):
        return 1
    print(f"[2/3] LANPO training for {args.steps} steps (p_t = 0.75, G = 8, CPU)", flush=True)
    if lanpo(["train", "--output_dir", str(out), "--max_steps", str(args.steps), "--save_steps", str(args.steps)]):
        return 1
    print("[3/3] held-out accuracy after training", flush=True)
    if lanpo(["eval", "--model", str(out / "final"), *EVAL, "--out", str(out / "eval-after")]):
        return 1
    before = json.loads((out / "eval-before" / "results.json").read_text())["modes"]["zero-shot"]["metrics"]
    after = json.loads((out / "eval-after" / "results.json").read_text())["modes"]["zero-shot"]["metrics"]
    lines = [
        "| held-out builtin:arith (48 problems, k=4, T=0.7) | mean@4 | ± s.e. | pass@4 | mean length |",
        "|---|---|---|---|---|",
    ]
    for name, m in (("before training", before), (f"after {args.steps} LANPO steps", after)):
        lines.append(
            f"| {name} | {m['mean@4']:.3f} | {m['mean@4_stderr']:.3f} | {m['pass@4']:.3f} | {m['mean_length']:.1f} |"
        )
    table = "\n".join(lines)
    (out / "demo_results.md").write_text(table + f"\n\nTotal time: {(time.time() - start) / 60:.1f} min\n")
    print("\n" + table)
    print(show_method(out))
    report = write_report([out])
    print(
        f"\nRun directory: {out} (config.yaml, metrics.jsonl, samples.jsonl, pool.sqlite, training_curves.png, "
        f"final/); total {(time.time() - start) / 60:.1f} min"
    )
    print(f"Report: {report} (open it in a browser: curves, pool browser, rollouts, evaluations)")
    return 0


def show_method(run: Path, width: int = 600) -> str:
    """One pool entry the policy wrote and one feedback prompt with its completion, as text."""
    from lanpo.pool.store import ExperiencePool
    from lanpo.prompts import clip
    from lanpo.run.files import read_jsonl

    lines = ["", "== What the policy wrote into its experience pool =="]
    pool = ExperiencePool(run / "pool.sqlite", readonly=True)
    entries = pool.entries()
    stats = pool.stats()
    pool.close()
    if entries:
        e = entries[-1]
        lines += [
            f"entry #{e.id} (step {e.step}) on: {e.problem}",
            f"flow of thought: {e.flow_of_thought[:width]}",
            "principles:",
            *[f"  - {x}" for x in e.principles],
            "pitfalls:",
            *[f"  - {x}" for x in e.pitfalls],
            f"({stats['entries']} entries, {stats['attempts']} stored attempts in the pool)",
        ]
    else:
        lines.append(f"no summary parsed into an entry yet ({stats['attempts']} stored attempts for reflection)")
    shown = next((s for s in reversed(read_jsonl(run / "samples.jsonl")) if s.get("feedback")), None)
    lines.append("\n== One rollout generated with language feedback ==")
    if shown:
        lines += [
            f"step {shown['step']}, {shown['kind']}, reward {shown['reward']} (gold {shown['gold']})",
            "--- prompt ---",
            clip(shown["prompt"], width * 2),
            "--- completion ---",
            clip(shown["completion"], width),
        ]
    else:
        lines.append("none logged (every planned feedback row fell back to its plain prompt)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
