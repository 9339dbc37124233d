"""``lanpo experiment GRID``: arms × seeds from one base config, every cell resumable, one results table.

A grid file (YAML)::

    name: grpo-vs-lanpo
    base: ../embedded.yaml          # a `lanpo train` config, relative to this file (optional)
    settings: {max_steps: 30, eval_every: 10, eval_benchmarks: "builtin:arith?split=test", eval_k: 4}
    seeds: [0, 1, 2]
    reference: grpo                 # differences are taken against this arm (default: the first)
    arms:
      grpo: {feedback_ratio: 0}
      lanpo: {}
    out: runs/experiments/grpo-vs-lanpo

Each cell (arm, seed) is a ``lanpo train`` run in ``OUT/ARM/seed-S``, in a process of its own, from the merged
config (base < settings < arm < seed) written beside it as ``seed-S.yaml``. A finished cell (``cell.json``) is
skipped, an interrupted one resumes from its newest checkpoint, and a cell whose merged config changed since it
ran is refused; so a grid can be filled over several sittings, and re-running a finished one only rewrites the
table. Every cell's config is validated before any cell runs. The table (``OUT/results.md``, optionally also a
marked section of another file) compares the held-out ``eval/...mean@k`` that training logs every ``eval_every``
steps: per arm the mean over seeds with its 95% confidence interval (Student t, n − 1 degrees of freedom) and
standard error, and each arm's difference from the reference paired by seed, at equal steps and at equal
wall-clock (training seconds, evaluation excluded, interpolated). ``OUT/results.png`` plots both.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
MEAN_AT_K = re.compile(r"^eval/.+/mean@\d+$")  # not the _stderr beside it: the table's error bars are over seeds
GRID_KEYS = {"name", "base", "settings", "seeds", "reference", "arms", "out"}
COMPLETE = "cell.json"


class GridError(ValueError):
    """A grid file that cannot run as written."""


@dataclass
class Grid:
    name: str
    arms: dict[str, dict]
    seeds: list[int]
    out: Path
    reference: str
    base: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out / arm / f"seed-{seed}"

    def config(self, arm: str, seed: int) -> dict:
        return {**self.base, **self.settings, **self.arms[arm], "seed": seed,
                "output_dir": str(self.run_dir(arm, seed))}

    def cells(self, arms: list[str] | None = None, seeds: list[int] | None = None) -> list[tuple[str, int]]:
        return [(a, s) for a in (arms or list(self.arms)) for s in (seeds if seeds is not None else self.seeds)]


def load_grid(path: str | Path) -> Grid:
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise GridError(f"{path}: cannot read the grid ({error}).") from error
    if not isinstance(spec, dict):
        raise GridError(f"{path}: a grid is a YAML mapping with {', '.join(sorted(GRID_KEYS))}.")
    unknown = set(spec) - GRID_KEYS
    if unknown:
        raise GridError(f"{path}: unknown keys {sorted(unknown)} (a grid has {', '.join(sorted(GRID_KEYS))}; "
                        "training fields go under settings or an arm).")
    arms = spec.get("arms")
    if not isinstance(arms, dict) or not arms:
        raise GridError(f"{path}: arms must map each arm's name to its overrides (an empty mapping: the base).")
    arms = {str(k): dict(v or {}) for k, v in arms.items()}
    for name, overrides in arms.items():
        if not isinstance(overrides, dict) or not name or "/" in name:
            raise GridError(f"{path}: arm {name!r} must be a plain name mapped to overrides.")
        if {"seed", "output_dir"} & set(overrides):
            raise GridError(f"{path}: arm {name!r} sets seed or output_dir; the grid sets them per cell.")
    seeds = spec.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise GridError(f"{path}: seeds must be a list of distinct integers, got {seeds!r}.")
    base = {}
    if spec.get("base"):
        base_path = (path.parent / str(spec["base"])).resolve()
        if not base_path.is_file():
            raise GridError(f"{path}: base config {base_path} does not exist.")
        base = yaml.safe_load(base_path.read_text()) or {}
    reference = str(spec.get("reference") or next(iter(arms)))
    if reference not in arms:
        raise GridError(f"{path}: reference {reference!r} is not one of the arms ({', '.join(arms)}).")
    name = str(spec.get("name") or path.stem)
    return Grid(name, arms, seeds, Path(spec.get("out") or f"runs/experiments/{name}"), reference, base,
                dict(spec.get("settings") or {}))


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_state(grid: Grid, arm: str, seed: int) -> str:
    """complete | changed (done with another config) | resume (a checkpoint to continue) | new."""
    from .train import resume_target

    run = grid.run_dir(arm, seed)
    done = run / COMPLETE
    if done.is_file():
        return "complete" if json.loads(done.read_text()).get("config") == config_hash(grid.config(arm, seed)) \
            else "changed"
    try:
        resume_target("latest", str(run))
        return "resume"
    except FileNotFoundError:
        return "new"


def validate(grid: Grid, cells: list[tuple[str, int]]) -> None:
    """Every cell's config through ``lanpo train``'s own parsing (no model loads): errors name the arm."""
    from .train import parse

    for arm, seed in cells:
        spec = grid.run_dir(arm, seed).with_suffix(".yaml")
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(yaml.safe_dump(grid.config(arm, seed), sort_keys=False))
        try:
            parse(["--config", str(spec)])
        except (ValueError, TypeError) as error:
            raise GridError(f"arm {arm!r} (seed {seed}): {error}") from error
        except SystemExit as error:  # argparse printed why
            raise GridError(f"arm {arm!r} (seed {seed}): its config does not parse (see above).") from error


def cell_env(jobs: int, environ: dict[str, str] | None = None, cpus: int | None = None) -> dict[str, str]:
    """The environment of a cell's process: with ``jobs`` cells at once, each gets its share of the CPU cores as
    torch threads (unless the user set ``OMP_NUM_THREADS``); by default torch takes every core in every process,
    and cells oversubscribing the cores slow each other far more than sharing them does."""
    env = dict(os.environ if environ is None else environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cpus or os.cpu_count() or 1) // jobs))
    return env


def run_cell(grid: Grid, arm: str, seed: int, state: str, log: Path | None = None, jobs: int = 1) -> bool:
    """One ``lanpo train`` process (its output to ``log`` when given); ``cell.json`` marks the cell complete when it
    exits 0. ``jobs``: cells running at once (see :func:`cell_env`)."""
    run = grid.run_dir(arm, seed)
    if state == "resume":
        argv = ["--resume", "latest", "--output_dir", str(run)]
    else:
        argv = ["--config", str(run.with_suffix(".yaml")), "--overwrite"]
    command = [sys.executable, "-m", "lanpo.cli", "train", *argv]
    env = cell_env(jobs)
    if log is None:
        code = subprocess.run(command, env=env).returncode
    else:
        with log.open("a") as handle:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    if code == 0:
        (run / COMPLETE).write_text(json.dumps({"arm": arm, "seed": seed,
                                                "config": config_hash(grid.config(arm, seed))}) + "\n")
    return code == 0


def run_grid(grid: Grid, arms: list[str] | None = None, seeds: list[int] | None = None,
             results_md: str | Path | None = None, table_only: bool = False, jobs: int = 1) -> int:
    """Fill the grid (or the ``arms`` × ``seeds`` part of it), then write the table. Returns an exit code.

    ``jobs`` > 1 runs that many cells at once (each its output in ``OUT/ARM/seed-S.log``), for machines where one
    run leaves the accelerator idle; cells sharing a machine slow each other, so their wall-clock is not a
    clean measure of an arm's cost."""
    if jobs < 1:
        raise GridError(f"--jobs must be 1 or more, got {jobs}.")
    unknown = sorted(set(arms or []) - set(grid.arms))
    if unknown:
        raise GridError(f"--only {', '.join(unknown)}: not arms of {grid.name} ({', '.join(grid.arms)}).")
    outside = sorted(set(seeds or []) - set(grid.seeds))
    if outside:  # their cells would run and never reach the table
        raise GridError(f"--seeds {', '.join(map(str, outside))}: not seeds of {grid.name} {grid.seeds}; add them to "
                        "the grid's seeds.")
    cells = grid.cells(arms, seeds)
    failed = []
    if not table_only:
        states = {cell: cell_state(grid, *cell) for cell in cells}
        changed = [f"{a}/seed-{s}" for (a, s), st in states.items() if st == "changed"]
        if changed:
            raise GridError(f"These cells ran with another config than the grid now gives them: {', '.join(changed)}. "
                            f"Restore the grid, or delete those cells (or choose another out) to run them anew.")
        todo = [cell for cell in cells if states[cell] != "complete"]
        validate(grid, todo)
        print(f"{grid.name}: {len(cells) - len(todo)} of {len(cells)} cells complete, {len(todo)} to run",
              flush=True)
        def one(k: int, cell: tuple[str, int]) -> None:
            arm, seed = cell
            print(f"[{k}/{len(todo)}] {arm} seed {seed}: {states[cell]}", flush=True)
            log = grid.run_dir(arm, seed).with_suffix(".log") if jobs > 1 else None
            if not run_cell(grid, arm, seed, states[cell], log, jobs):
                failed.append(f"{arm}/seed-{seed}")
            elif log is not None:
                print(f"{arm} seed {seed}: done", flush=True)

        if jobs == 1:
            for k, cell in enumerate(todo, 1):
                one(k, cell)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(jobs) as pool:  # each cell is a process of its own; threads only wait
                list(pool.map(one, range(1, len(todo) + 1), todo))
    results = collect(grid)
    table = results_table(grid, results)
    grid.out.mkdir(parents=True, exist_ok=True)
    (grid.out / "results.md").write_text(table)
    plot_results(grid, results, grid.out / "results.png")
    if results_md:
        write_section(Path(results_md), grid.name, table)
    if failed:
        print(f"failed cells (the table leaves them out): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


# -- command line ------------------------------------------------------------------------------------------


def add_parser(sub, new_path) -> None:
    """``lanpo experiment`` on the command line's subparsers (``new_path``: the CLI's output-path check)."""
    p = sub.add_parser("experiment", help="a grid of arms x seeds from one base config, resumable; one results table",
                       description="Fill a grid (YAML: name, base, settings, seeds, reference, arms, out): each "
                                   "(arm, seed) cell is a `lanpo train` run of its own; finished cells are skipped, "
                                   "interrupted ones resume from their newest checkpoint. Then OUT/results.md (held-"
                                   "out mean@k by step and at equal wall-clock, mean over seeds with 95% CIs, "
                                   "differences paired by seed) and OUT/results.png. See configs/experiments/.")
    p.add_argument("grid", help="the grid file (YAML)")
    p.add_argument("--only", help="comma-separated arms to run (default: every arm)")
    p.add_argument("--seeds", help="comma-separated seeds to run (default: the grid's)")
    p.add_argument("--table-only", action="store_true", help="run nothing: rewrite the table from finished cells")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells to run at once (default 1; on a GPU that one small run leaves idle, more; each cell's "
                        "output then goes to OUT/ARM/seed-S.log, and each gets cores/N torch threads unless "
                        "OMP_NUM_THREADS is set). Cells sharing a machine slow each other, so the wall-clock "
                        "columns then measure contention too")
    p.add_argument("--results-md", type=new_path("file"),
                   help="also put the table into this markdown file, between the grid's markers")
    p.set_defaults(func=command)


def command(args) -> int:
    grid = load_grid(args.grid)
    arms = [a.strip() for a in args.only.split(",")] if args.only else None
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError as error:
        raise ValueError(f"--seeds takes comma-separated integers, got {args.seeds!r}.") from error
    code = run_grid(grid, arms, seeds, args.results_md, args.table_only, args.jobs)
    print(f"Written: {grid.out / 'results.md'} and {grid.out / 'results.png'}")
    return code


# -- statistics ----------------------------------------------------------------------------------------------


def t975(df: int) -> float:
    if df in T975:
        return T975[df]
    known = [d for d in sorted(T975) if d <= df]
    return T975[known[-1]] if df <= 30 else 1.96


def mean_ci(values: list[float]) -> tuple[float, float | None, float | None]:
    """``(mean, 95% CI half-width, standard error)``; no interval from one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, t975(n - 1) * se, se


def interpolate(xs: list[float], ys: list[float], x: float) -> float | None:
    """``y`` at ``x`` on the polyline through ``(xs, ys)`` (sorted xs); ``None`` outside it (by more than 1e-9)."""
    if not xs or x > xs[-1] + 1e-9 or x < xs[0] - 1e-9:
        return None
    x = min(max(x, xs[0]), xs[-1])  # within 1e-9 of an end: the end
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


# -- results -------------------------------------------------------------------------------------------------


def cell_results(run: Path) -> dict:
    """One finished cell: eval series by step, training seconds by step, mean step time and summary parse rate."""
    from .runlog import read_metrics

    rows = read_metrics(run)
    evals: dict[str, dict[int, float]] = {}
    seconds, clock = {0: 0.0}, 0.0
    parse = [r["summaries/parse_rate"] for r in rows if r.get("summaries/parse_rate") is not None]
    steps = []
    for row in rows:
        if row.get("step_time") is not None:
            clock += float(row["step_time"])
            seconds[int(row["step"])] = clock
            steps.append(float(row["step_time"]))
        for key, value in row.items():
            if MEAN_AT_K.match(key) and value is not None:
                evals.setdefault(key, {})[int(row["step"])] = float(value)  # a resumed run's repeat: the last
    return {"evals": evals, "seconds": seconds, "step_time": sum(steps) / len(steps) if steps else None,
            "parse_rate": sum(parse) / len(parse) if parse else None}


def collect(grid: Grid) -> dict[str, dict[int, dict]]:
    """``{arm: {seed: cell_results}}`` of the complete cells."""
    found: dict[str, dict[int, dict]] = {}
    for arm, seed in grid.cells():
        run = grid.run_dir(arm, seed)
        if (run / COMPLETE).is_file():
            found.setdefault(arm, {})[seed] = cell_results(run)
    return found


def _fmt(mean: float, half: float | None, se: float | None, signed: bool = False, digits: int = 3) -> str:
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    return text + (f" ± {half:.{digits}f} ({se:.{digits}f})" if half is not None else "")


def _at_seconds(cell: dict, metric: str, t: float) -> float | None:
    points = sorted(cell["evals"].get(metric, {}).items())
    xs = [cell["seconds"].get(step) for step, _ in points]
    if any(x is None for x in xs):
        return None
    return interpolate(xs, [v for _, v in points], t)


def _row(arms: list[str], ref: str, values: dict[str, dict[int, float]]) -> list[str]:
    """Cells of one table row: each arm's mean ± CI (s.e.) [n], then each arm − reference paired by seed."""
    out = []
    for arm in arms:
        v = list(values.get(arm, {}).values())
        out.append(f"{_fmt(*mean_ci(v))} [{len(v)}]" if v else "—")
    for arm in arms:
        if arm == ref:
            continue
        common = sorted(set(values.get(arm, {})) & set(values.get(ref, {})))
        d = [values[arm][s] - values[ref][s] for s in common]
        out.append(f"{_fmt(*mean_ci(d), signed=True)} [{len(d)}]" if d else "—")
    return out


def results_table(grid: Grid, results: dict[str, dict[int, dict]]) -> str:
    arms, ref = list(grid.arms), grid.reference
    head = arms + [f"{a} − {ref}" for a in arms if a != ref]
    lines = [f"## Experiment `{grid.name}`", "",
             f"Arms × seeds {grid.seeds}; held-out mean@k logged during training. Each cell: mean over seeds ± 95% CI "
             "half-width (Student t, n − 1 df) (standard error) [seeds]; differences are paired by seed. A "
             "difference whose interval contains 0 is inside the noise.", "",
             "| arm | overrides | cells | s/step | summary parse rate |", "|---|---|---|---|---|"]
    for arm in arms:
        cells = results.get(arm, {})
        times = [c["step_time"] for c in cells.values() if c["step_time"] is not None]
        parse = [c["parse_rate"] for c in cells.values() if c["parse_rate"] is not None]
        overrides = ", ".join(f"{k}={v}" for k, v in grid.arms[arm].items()) or "(base)"
        lines.append(f"| {arm} | {overrides} | {len(cells)}/{len(grid.seeds)} | "
                     f"{_fmt(*mean_ci(times), digits=1) if times else '—'} | {_fmt(*mean_ci(parse)) if parse else '—'} |")
    metrics = sorted({m for cells in results.values() for c in cells.values() for m in c["evals"]})
    for metric in metrics:
        steps = sorted({s for cells in results.values() for c in cells.values() for s in c["evals"].get(metric, {})})
        lines += ["", f"### {metric}, by step", "", "| step | " + " | ".join(head) + " |",
                  "|---|" + "---|" * len(head)]
        for step in steps:
            values = {a: {s: c["evals"][metric][step] for s, c in results.get(a, {}).items()
                          if step in c["evals"].get(metric, {})} for a in arms}
            lines.append(f"| {step} | " + " | ".join(_row(arms, ref, values)) + " |")
        ref_cells = results.get(ref, {})
        marks = [s for s in steps if s > 0 and ref_cells and all(s in c["seconds"] for c in ref_cells.values())]
        if not marks:
            continue
        lines += ["", f"### {metric}, at equal wall-clock (the reference's training time at its eval steps)", "",
                  "| minutes | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        for step in marks:
            t = sum(c["seconds"][step] for c in ref_cells.values()) / len(ref_cells)
            values = {a: {s: v for s, c in results.get(a, {}).items()
                          if (v := _at_seconds(c, metric, t)) is not None} for a in arms}
            lines.append(f"| {t / 60:.1f} | " + " | ".join(_row(arms, ref, values)) + " |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, name: str, table: str) -> None:
    """Put ``table`` between this grid's markers in ``path`` (appended the first time); the rest is kept."""
    start, end = f"<!-- lanpo-experiment:{name} -->", f"<!-- /lanpo-experiment:{name} -->"
    text = path.read_text() if path.is_file() else ""
    block = f"{start}\n{table}{end}"
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    path.write_text(text)


def plot_results(grid: Grid, results: dict[str, dict[int, dict]], out: Path) -> Path | None:
    """Per metric: mean ± 95% CI over seeds by step and by training minutes, one line per arm."""
    metrics = sorted({m for cells in results.values() for c in cells.values() for m in c["evals"]})
    if not metrics:
        return None
    from .runlog import _plt

    plt = _plt()
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.6 * len(metrics)), squeeze=False)
    for (ax_step, ax_time), metric in zip(axes, metrics):
        for arm, cells in results.items():
            steps = sorted({s for c in cells.values() for s in c["evals"].get(metric, {})})
            stats = [(s, mean_ci([c["evals"][metric][s] for c in cells.values() if s in c["evals"].get(metric, {})]),
                      [c["seconds"].get(s) for c in cells.values()]) for s in steps]
            x = [s for s, _, _ in stats]
            y = [m for _, (m, _, _), _ in stats]
            half = [h or 0.0 for _, (_, h, _), _ in stats]
            minutes = [sum(t for t in ts if t is not None) / max(1, sum(t is not None for t in ts)) / 60
                       for _, _, ts in stats]
            for ax, xs in ((ax_step, x), (ax_time, minutes)):
                ax.plot(xs, y, "-o", markersize=3, label=arm)
                ax.fill_between(xs, [a - b for a, b in zip(y, half)], [a + b for a, b in zip(y, half)], alpha=0.2)
        ax_step.set(title=f"{metric} by step", xlabel="step")
        ax_time.set(title=f"{metric} by training time", xlabel="minutes (mean over seeds)")
        ax_step.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
