"""``lanpo compare RUN_A RUN_B ...``: several runs side by side, as a markdown table and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path

from lanpo.run.files import read_metrics, series
from lanpo.run.plots import plot_compare

PLOT_KEYS = ("accuracy/scratch/mean", "reward/feedback/mean", "reward/scratch/mean", "lanpo/pool_size")


def _mean_last(rows: list[dict], key: str, n: int = 5) -> float | None:
    _, values = series(rows, key)
    return sum(values[-n:]) / len(values[-n:]) if values else None


def _evals(run: Path) -> dict[str, dict]:
    """Evaluation results stored under the run (``eval*/results.json``), privileged probe modes left out: they show a
    training-only context and are no test score."""
    found = {}
    for path in sorted(run.glob("eval*/results.json")):
        data = json.loads(path.read_text())
        for mode, result in data.get("modes", {}).items():
            if not result.get("privileged"):
                found[f"{path.parent.name}/{mode}"] = result["metrics"]
    return found


def compare(runs: list[str], out: str | Path, names: list[str] | None = None) -> Path:
    """Write ``compare.md`` and ``compare.png`` into ``out``; returns the markdown path."""
    out = Path(out)
    names = names or [Path(r).name for r in runs]
    if len(set(names)) != len(names):
        names = [f"{n} ({i})" for i, n in enumerate(names, 1)]
    metrics = {name: read_metrics(run) for name, run in zip(names, runs)}
    empty = [run for name, run in zip(names, runs) if not metrics[name]]
    if empty:
        raise ValueError(
            f"No usable metrics lines in {', '.join(str(Path(r) / 'metrics.jsonl') for r in empty)}: "
            "is it a lanpo run that logged at least one step?"
        )
    lines = [
        "# Run comparison",
        "",
        "Last-5-step means from each run's metrics.jsonl.",
        "",
        "| run | steps | p_t | accuracy scratch | accuracy feedback | reward scratch | reward feedback | "
        "pool entries | summary parse rate |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    for name, run in zip(names, runs):
        rows = metrics[name]
        config = json.loads((Path(run) / "config.json").read_text()) if (Path(run) / "config.json").is_file() else {}
        steps = max((r["step"] for r in rows), default=0)
        pool = series(rows, "lanpo/pool_size")[1]
        lines.append(
            f"| {name} | {steps} | {config.get('feedback_ratio', '?')} | "
            f"{fmt(_mean_last(rows, 'accuracy/scratch/mean'))} | {fmt(_mean_last(rows, 'accuracy/feedback/mean'))} | "
            f"{fmt(_mean_last(rows, 'reward/scratch/mean'))} | {fmt(_mean_last(rows, 'reward/feedback/mean'))} | "
            f"{int(pool[-1]) if pool else 0} | {fmt(_mean_last(rows, 'summaries/parse_rate'))} |"
        )
    evals = {name: _evals(Path(run)) for name, run in zip(names, runs)}
    keys = sorted({k for e in evals.values() for k in e})
    if keys:
        lines += ["", "## Evaluations", "", "| run | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for name in names:
            cells = []
            for key in keys:
                m = evals[name].get(key)
                mean = next((v for k, v in (m or {}).items() if k.startswith("mean@") and "_" not in k), None)
                cells.append(fmt(mean))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    out.mkdir(parents=True, exist_ok=True)
    png = plot_compare(metrics, out / "compare.png", keys=PLOT_KEYS)
    lines += ["", f"![comparison]({png.name})", ""]
    md = out / "compare.md"
    md.write_text("\n".join(lines))
    return md
