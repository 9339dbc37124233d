"""Curves of a run and of runs side by side (PNG), from their ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path

from lanpo.run.files import read_metrics, reward_is_accuracy, series


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Reward and accuracy per step (one panel when they are equal), feedback vs scratch rollouts, and pool growth."""
    plt = _plt()
    rows = read_metrics(run_dir)
    out = Path(out or Path(run_dir) / "training_curves.png")
    same = reward_is_accuracy(rows)
    metrics = ["reward"] if same else ["reward", "accuracy"]
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(5 * (len(metrics) + 1), 4))
    for ax, metric in zip(axes, metrics):
        for kind, style in (("scratch", "-o"), ("feedback", "-s"), ("reflection", ":"), ("abstraction", "--")):
            x, y = series(rows, f"{metric}/{kind}/mean")
            if x:
                ax.plot(x, y, style, label=kind, markersize=3)
        ax.set_title("reward = accuracy per step (0/1 verifier reward)" if same else f"{metric} per step")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
    x, y = series(rows, "lanpo/pool_size")
    axes[-1].plot(x, y, "-", color="tab:green")
    axes[-1].set_title("experience pool entries")
    axes[-1].set_xlabel("step")
    axes[-1].grid(alpha=0.3)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_compare(
    runs: dict[str, list[dict]],
    out: str | Path,
    keys=("reward/scratch/mean", "reward/feedback/mean", "lanpo/pool_size"),
) -> Path:
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
