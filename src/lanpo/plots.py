"""Plots of training runs (matplotlib, written as PNG): one run's curves, or several runs side by side."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The per-step log lines of a run (``metrics.jsonl``); lines that do not parse are skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: is it a lanpo run directory?")
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Reward and accuracy per step, feedback vs scratch rollouts, and pool growth, for one run."""
    plt = _plt()
    rows = read_metrics(run_dir)
    out = Path(out or Path(run_dir) / "training_curves.png")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric in zip(axes[:2], ("reward", "accuracy")):
        for kind, style in (("scratch", "-o"), ("feedback", "-s"), ("reflection", ":"), ("abstraction", "--")):
            x, y = series(rows, f"{metric}/{kind}/mean")
            if x:
                ax.plot(x, y, style, label=kind, markersize=3)
        ax.set_title(f"{metric} per step")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
    x, y = series(rows, "lanpo/pool_size")
    axes[2].plot(x, y, "-", color="tab:green")
    axes[2].set_title("experience pool entries")
    axes[2].set_xlabel("step")
    axes[2].grid(alpha=0.3)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_compare(runs: dict[str, list[dict]], out: str | Path,
                 keys=("reward/scratch/mean", "reward/feedback/mean", "lanpo/pool_size")) -> Path:
    """One panel per metric, one line per run."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4))
    axes = axes if len(keys) > 1 else [axes]
    for ax, key in zip(axes, keys):
        for name, rows in runs.items():
            x, y = series(rows, key)
            if x:
                ax.plot(x, y, "-o", markersize=3, label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
