"""Draw docs/verdicts.png: every recorded grid's arms against GRPO, held-out mean@4 minus GRPO's by step, paired
by seed, mean and 95% band (the first figure of results.md).

    python docs/verdicts.py   # reads results/ (the grids' records); about 10 s
"""

from __future__ import annotations

from pathlib import Path

from lanpo.experiments.grid import load_grid
from lanpo.experiments.stats import collect, mean_ci

ROOT = Path(__file__).resolve().parents[1]
# the grids whose cells are recorded in results/ (verdict and verdict-sft ran before cells were recorded)
GRIDS = sorted(path.name for path in (ROOT / "results").iterdir() if path.is_dir())
MATH = "eval/arith/zero-shot/mean@4"
REFERENCE = "grpo"


def held_out_metric(results: dict) -> str:
    """The grid's held-out zero-shot mean@4 (``eval/arith/...`` for the math grids, ``eval/code/...`` for code)."""
    keys = {key for cells in results.values() for cell in cells.values() for key in cell["evals"]}
    found = sorted(key for key in keys if key.startswith("eval/") and key.endswith("/zero-shot/mean@4"))
    return MATH if MATH in found or not found else found[0]


def paired_curves(results: dict, metric: str = MATH) -> dict[str, list[tuple[int, float, float]]]:
    """Per arm other than GRPO: (step, mean, 95% half-width) of the arm minus GRPO, paired by seed."""
    reference = results.get(REFERENCE, {})
    curves = {}
    for arm, cells in results.items():
        if arm == REFERENCE:
            continue
        points = []
        steps = sorted({s for c in cells.values() for s in c["evals"].get(metric, {})})
        for step in steps:
            diffs = [
                cell["evals"][metric][step] - reference[seed]["evals"][metric][step]
                for seed, cell in cells.items()
                if seed in reference
                and step in cell["evals"].get(metric, {})
                and step in reference[seed]["evals"].get(metric, {})
            ]
            if diffs:
                mean, half, _ = mean_ci(diffs)
                points.append((step, mean, half or 0.0))
        curves[arm] = points
    return curves


def main() -> None:
    from lanpo.run.plots import _plt

    plt = _plt()
    rows = -(-len(GRIDS) // 2)  # two panels a row, as many rows as the grids need
    fig, axes = plt.subplots(rows, 2, figsize=(10.4, 4.2 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(GRIDS) :]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, GRIDS):
        grid = load_grid(ROOT / "configs" / "experiments" / f"{name}.yaml", reference=REFERENCE)
        results = collect(grid)
        metric = held_out_metric(results)
        for arm, points in paired_curves(results, metric).items():
            if arm == "lanpo" and name != "verdict-sources" and metric == MATH:
                continue  # drawn once among the math grids, in its own grid
            x = [p[0] for p in points]
            y = [p[1] for p in points]
            ax.plot(x, y, "-o", markersize=3, label=arm)
            ax.fill_between(x, [m - h for _, m, h in points], [m + h for _, m, h in points], alpha=0.15)
        ax.axhline(0.0, color="black", linewidth=1, label="grpo")
        ax.set(title=name if metric == MATH else f"{name} ({metric.split('/')[1]})", xlabel="step")
        ax.legend(fontsize=8, loc="lower left")
    for ax in axes[:, 0]:
        ax.set_ylabel("held-out mean@4 − GRPO (paired, 95% band)")
    fig.suptitle("Every recorded arm against GRPO, SmolLM2-135M, held out (builtin:arith unless named), 5 seeds")
    fig.tight_layout()
    out = ROOT / "docs" / "verdicts.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
