"""Learning efficiency: GRPO (p_t = 0) vs LANPO (p_t = 0.75) from the same start, seed and budget.

Both arms train the embedded default (SmolLM2-135M-Instruct, CPU) with the same config except `feedback_ratio`.
Both build an experience pool (GRPO's summaries run apart under a forked RNG, so its training stays exactly
GRPO), so both can be evaluated zero-shot and retrieval-augmented (on their own pool) on held-out problems
every N steps. Evaluations run under a forked RNG too, so they never change the training streams.

    python benchmarks/learning_efficiency.py [--steps 40] [--eval-every 10] [--eval-problems 32] [--k 2]
    python benchmarks/learning_efficiency.py --data gsm8k --data-dir ../shared/data --data-limit 500 \\
        --eval-data gsm8k --eval-split test     # the GSM8K option

Writes OUT/{grpo,lanpo}/ (run directories with evals.jsonl), OUT/results.md and OUT/learning_efficiency.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from lanpo.commands.train import parse
from lanpo.data.loaders import load_problems, to_prompt_dataset
from lanpo.data.presets import training_split
from lanpo.engine.models import load_tokenizer, resolve_model_path
from lanpo.eval.evaluate import EvalSettings, run_retrieval, run_zero_shot
from lanpo.pool.retrieval import Retriever
from lanpo.trainer import LanpoTrainer
from lanpo.verify.rewards import MathVerifier


class PeriodicEval(TrainerCallback):
    """Zero-shot and retrieval-augmented evaluation of the current policy every `every` steps (and at 0)."""

    def __init__(self, trainer: LanpoTrainer, problems, settings: EvalSettings, every: int, out: Path):
        self.trainer, self.problems, self.settings, self.every, self.out = trainer, problems, settings, every, out

    def run(self, step: int) -> None:
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        retriever = Retriever(
            trainer.pool,
            trainer.retriever.scorer,
            gamma=trainer.args.relevance_threshold,
            top_k=trainer.args.retrieval_top_k,
            candidates=trainer.args.retrieval_candidates,
        )
        start = time.perf_counter()
        with torch.random.fork_rng(), MathVerifier(extraction=self.settings.extraction) as verifier:
            torch.manual_seed(self.settings.seed)
            results = [
                run_zero_shot(model, trainer.processing_class, self.problems, self.settings, verifier),
                run_retrieval(
                    model, trainer.processing_class, self.problems, self.settings, verifier, retriever=retriever
                ),
            ]
        with self.out.open("a") as handle:
            for r in results:
                handle.write(
                    json.dumps(
                        {
                            "step": step,
                            "mode": r.mode,
                            "metrics": r.metrics,
                            "pool_entries": len(trainer.pool),
                            "seconds": round(time.perf_counter() - start, 1),
                        }
                    )
                    + "\n"
                )

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.run(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.run(state.global_step)


def train_arm(name: str, feedback_ratio: float, args, train_problems, eval_problems, out: Path) -> list[dict]:
    run_dir = out / name
    cli = [
        "--output_dir",
        str(run_dir),
        "--max_steps",
        str(args.steps),
        "--save_strategy",
        "no",
        "--feedback_ratio",
        str(feedback_ratio),
        "--seed",
        str(args.seed),
        "--disable_tqdm",
        "true",
    ]
    _, model_args, config = parse(cli)
    model_path = resolve_model_path(model_args.model_name_or_path)
    trainer = LanpoTrainer(
        model=model_path,
        args=config,
        train_dataset=to_prompt_dataset(train_problems),
        processing_class=load_tokenizer(model_path),
    )
    settings = EvalSettings(
        k=args.k, temperature=0.7, max_new_tokens=config.max_completion_length, batch_size=32, seed=args.seed
    )
    evals = run_dir / "evals.jsonl"
    evals.unlink(missing_ok=True)
    trainer.add_callback(PeriodicEval(trainer, eval_problems, settings, args.eval_every, evals))
    start = time.perf_counter()
    trainer.train()
    trainer.verifier.close()
    print(f"{name}: {args.steps} steps in {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    return [json.loads(line) for line in evals.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-problems", type=int, default=32)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default="builtin:arith")
    parser.add_argument("--data-dir")
    parser.add_argument("--data-limit", type=int)
    parser.add_argument("--eval-data", default="builtin:arith")
    parser.add_argument("--eval-split", default="test")
    parser.add_argument("--arms", default="grpo,lanpo", help="which arms to run (grpo, lanpo)")
    parser.add_argument("--out", default="runs/learning-efficiency")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train_problems = load_problems(
        args.data, split=training_split(args.data), data_dir=args.data_dir, limit=args.data_limit
    )
    eval_problems = load_problems(
        args.eval_data, split=args.eval_split, data_dir=args.data_dir, limit=args.eval_problems
    )
    results = {}
    for arm in args.arms.split(","):
        results[arm] = train_arm(arm, {"grpo": 0.0, "lanpo": 0.75}[arm], args, train_problems, eval_problems, out)
    write_report(results, args, out)


def write_report(results: dict[str, list[dict]], args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = args.k
    steps = sorted({r["step"] for rows in results.values() for r in rows})
    table = {(arm, r["step"], r["mode"]): r["metrics"] for arm, rows in results.items() for r in rows}
    header = "| step | " + " | ".join(f"{arm} {mode}" for arm in results for mode in ("zero-shot", "retrieval")) + " |"
    lines = [
        f"Held-out {args.eval_data} ({args.eval_problems} problems), mean@{k} ± standard error "
        f"(retrieval: share of problems that got context).",
        "",
        header,
        "|---" * (1 + 2 * len(results)) + "|",
    ]
    for step in steps:
        cells = []
        for arm in results:
            for mode in ("zero-shot", "retrieval"):
                m = table.get((arm, step, mode))
                if m is None:
                    cells.append("–")
                    continue
                cell = f"{m[f'mean@{k}']:.3f} ± {m[f'mean@{k}_stderr']:.3f}"
                if mode == "retrieval":
                    cell += f" ({m['context_rate']:.0%})"
                cells.append(cell)
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    settings = (
        f"Settings: embedded default (SmolLM2-135M-Instruct, {args.data}, G=8, one problem per step, 96 new "
        f"tokens, T=0.7, lr 1e-5, beta 0.04), {args.steps} steps, seed {args.seed}; eval k={k}, T=0.7. "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}."
    )
    report = "\n".join(lines + ["", settings, ""])
    (out / "results.md").write_text(report)
    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, color in zip(results, ("tab:blue", "tab:orange")):
        for mode, style in (("zero-shot", "-o"), ("retrieval", "--s")):
            xs = [s for s in steps if (arm, s, mode) in table]
            ys = [table[(arm, s, mode)][f"mean@{k}"] for s in xs]
            errs = [table[(arm, s, mode)][f"mean@{k}_stderr"] for s in xs]
            ax.errorbar(xs, ys, yerr=errs, fmt=style, color=color, capsize=3, label=f"{arm} {mode}")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out mean@{k}")
    ax.set_title("GRPO vs LANPO, same start, seed and budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning_efficiency.png", dpi=100)
    print(report)


if __name__ == "__main__":
    main()
