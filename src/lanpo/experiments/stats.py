"""The results of a ``lanpo experiment`` grid: per-cell series, statistics over seeds, the table and the plot.

Statistics: per arm the mean over seeds with its 95% confidence interval (Student t, n − 1 degrees of freedom)
and standard error, and the 95% prediction interval for one more seed's run (what a re-run of one cell is
expected to land in: the confidence interval is for the mean, and is √(n + 1) times narrower); each arm's
difference from the reference paired by seed, at equal steps and at equal wall-clock (training seconds,
evaluation excluded, interpolated; at each eval step, the training time of the reference's fastest seed, so that
every reference seed has a value there). ``grid`` is a :class:`lanpo.experiments.grid.Grid`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from lanpo.student_t import t975

MEAN_AT_K = re.compile(r"^eval/.+/mean@\d+$")  # not the _stderr beside it: the table's error bars are over seeds
COMPLETE = "cell.json"


class Grid(Protocol):
    """What the results need of :class:`lanpo.experiments.grid.Grid` (defined there: it is a later stage)."""

    name: str
    arms: dict[str, dict]
    seeds: list[int]
    reference: str
    windows: list  # of lanpo.experiments.grid.Window: metric, first, last, against

    def run_dir(self, arm: str, seed: int) -> Path: ...
    def result_dir(self, arm: str, seed: int) -> Path: ...
    def cells(self) -> list[tuple[str, int]]: ...


# -- statistics ----------------------------------------------------------------------------------------------


def mean_ci(values: list[float]) -> tuple[float, float | None, float | None]:
    """``(mean, 95% CI half-width, standard error)``; no interval from one value."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None, None
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, t975(n - 1) * se, se


def prediction_interval(values: list[float]) -> tuple[float, float] | None:
    """``(low, high)``: where one more draw from the distribution of ``values`` lands with 95% probability
    (Student t, n − 1 df: mean ± t · s · √(1 + 1/n), the CI's half-width times √(n + 1)); ``None`` from fewer
    than two values (none from none: an arm with no seed at a step)."""
    if len(values) < 2:
        return None
    mean, half, _ = mean_ci(values)
    half *= math.sqrt(len(values) + 1)
    return mean - half, mean + half


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


# training diagnostics in the arms' table: column -> metric averaged over a cell's training steps
# (the realized p_t: rows that found no attempt or no relevant entry fall back to the plain prompt)
TRAINING = {
    "feedback share (realized p_t)": "lanpo/feedback_share",
    "summary parse rate": "summaries/parse_rate",
    "all-fail groups": "lanpo/all_fail_share",
    "train reward, scratch rows": "reward/scratch/mean",
    "train reward, feedback rows": "reward/feedback/mean",
    "truncated": "completions/clipped_ratio",
}


def _number(value) -> float | None:
    """``value`` as a finite float, else None (a metric written as "abc", null, NaN or infinity measures nothing)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _step(value) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) and number >= 0 else None


def cell_results(run: Path, series: Sequence[str] = ()) -> dict:
    """One finished cell: eval series by step, training seconds by step, mean step time, the means over its
    training steps of the ``TRAINING`` metrics, and the step-by-step values of the metrics named in ``series``.

    ``step_time`` is logged at TRL's logging steps as the mean over the steps since the last one, so the clock
    advances by it times that many steps; an eval step between two logged ones gets its time by interpolation.
    Lines whose step or values are not finite numbers are left out and counted (a warning names the file)."""
    from lanpo.run.files import read_metrics

    rows = read_metrics(run)
    evals: dict[str, dict[int, float]] = {}
    kept: dict[str, dict[int, float]] = {key: {} for key in series}
    timed = {0: 0.0}  # step -> training seconds, at the steps whose step_time was logged
    clock = 0.0
    dropped = 0
    for row in rows:
        step = _step(row.get("step"))
        if step is None:
            dropped += 1
            continue
        step_time = _number(row.get("step_time"))
        last = max(timed)
        if step_time is not None and step > last:
            clock += step_time * (step - last)
            timed[step] = clock
        elif row.get("step_time") is not None and step_time is None:
            dropped += 1
        for key, value in row.items():
            if MEAN_AT_K.match(key) and value is not None:
                number = _number(value)
                if number is None:
                    dropped += 1
                    continue
                evals.setdefault(key, {})[step] = number  # a resumed run's repeat: the last
        for key, values in kept.items():
            if (value := _number(row.get(key))) is not None:
                values[step] = value
    if dropped:
        print(
            f"warning: {run / 'metrics.jsonl'}: left out {dropped} values that are not finite numbers", file=sys.stderr
        )
    steps = sorted(timed)
    seconds = dict(timed)
    for series_ in evals.values():  # eval steps inside the timed range: interpolated training time
        for step in series_:
            if step not in seconds and (t := interpolate(steps, [timed[x] for x in steps], step)) is not None:
                seconds[step] = t
    training = {}
    for column, key in TRAINING.items():
        values = [v for row in rows if (v := _number(row.get(key))) is not None]
        training[column] = sum(values) / len(values) if values else None
    last = max(timed)
    return {
        "evals": evals,
        "seconds": seconds,
        "step_time": clock / last if last else None,
        "training": training,
        "series": kept,
    }


def collect(grid: Grid, unfinished: bool = False) -> dict[str, dict[int, dict]]:
    """``{arm: {seed: cell_results}}`` of the complete cells (in OUT, or in the grid's record); with
    ``unfinished``, also of the cells in OUT that logged steps but did not finish (stopped, failed or still
    running), marked ``"unfinished": True``."""
    found: dict[str, dict[int, dict]] = {}
    series = sorted({w.metric for w in grid.windows})
    for arm, seed in grid.cells():
        run, done = grid.run_dir(arm, seed), grid.result_dir(arm, seed)
        if (done / COMPLETE).is_file():
            found.setdefault(arm, {})[seed] = cell_results(done, series)
        elif unfinished and (run / "metrics.jsonl").is_file():
            found.setdefault(arm, {})[seed] = {**cell_results(run, series), "unfinished": True}
    return found


def _fmt(mean: float, half: float | None, se: float | None, signed: bool = False, digits: int = 3) -> str:
    """``mean ± half (se)``; without ``se``, ``mean ± half``; without ``half``, the mean alone."""
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if half is not None:
        text += f" ± {half:.{digits}f}" + (f" ({se:.{digits}f})" if se is not None else "")
    return text


def _paired(values: dict[str, dict[int, float]], arm: str, ref: str) -> list[float]:
    """``arm − ref`` for each seed both have, in seed order."""
    return [values[arm][s] - values[ref][s] for s in sorted(set(values.get(arm, {})) & set(values.get(ref, {})))]


def _at_seconds(cell: dict, metric: str, t: float) -> float | None:
    points = sorted(cell["evals"].get(metric, {}).items())
    xs = [cell["seconds"].get(step) for step, _ in points]
    if any(x is None for x in xs):
        return None
    return interpolate(xs, [v for _, v in points], t)


def _values_at_step(results: dict, arms: list[str], metric: str, step: int) -> dict[str, dict[int, float]]:
    """``{arm: {seed: value}}`` of ``metric`` at ``step``, for the seeds that logged it."""
    return {
        a: {s: c["evals"][metric][step] for s, c in results.get(a, {}).items() if step in c["evals"].get(metric, {})}
        for a in arms
    }


def _wall_clock_marks(ref_cells: dict[int, dict], steps: list[int]) -> dict[int, float]:
    """``{step: seconds}``: at each eval step after 0 that every reference seed reached, the training time of
    the reference's fastest seed there (so every reference seed has a value at that time)."""
    if not ref_cells:
        return {}
    return {
        step: min(c["seconds"][step] for c in ref_cells.values())
        for step in steps
        if step > 0 and all(step in c["seconds"] for c in ref_cells.values())
    }


def _values_at_seconds(results: dict, arms: list[str], metric: str, t: float) -> dict[str, dict[int, float]]:
    """``{arm: {seed: value}}`` of ``metric`` after ``t`` seconds of training (interpolated), for the seeds that
    trained that long."""
    return {
        a: {s: v for s, c in results.get(a, {}).items() if (v := _at_seconds(c, metric, t)) is not None} for a in arms
    }


def _row(arms: list[str], ref: str, values: dict[str, dict[int, float]]) -> list[str]:
    """Cells of one table row: each arm's mean ± CI (s.e.) [n], then each arm − reference paired by seed."""
    out = []
    for arm in arms:
        v = list(values.get(arm, {}).values())
        out.append(f"{_fmt(*mean_ci(v))} [{len(v)}]" if v else "—")
    for arm in arms:
        if arm == ref:
            continue
        d = _paired(values, arm, ref)
        out.append(f"{_fmt(*mean_ci(d), signed=True)} [{len(d)}]" if d else "—")
    return out


def _landing(values: list[float]) -> str:
    """The 95% prediction interval as ``low – high``, within [0, 1] (mean@k is a share); ``—`` from one value."""
    pi = prediction_interval(values)
    return f"{max(pi[0], 0.0):.3f} – {min(pi[1], 1.0):.3f}" if pi else "—"


def _pi_cell(values: list[float]) -> str:
    return f"{_landing(values)} [{len(values)}]" if len(values) >= 2 else "—"


def _prediction_section(metric: str, arms: list[str], by_step: dict[int, dict[str, dict[int, float]]]) -> list[str]:
    """Lines of the table of where one more seed's run should land, for the arms with two seeds or more."""
    spread = [a for a in arms if any(len(values[a]) >= 2 for values in by_step.values())]
    if not spread:
        return []
    lines = [
        "",
        f"### {metric}, by step: where one more seed's run should land (95% prediction interval, "
        "mean ± t · s · √(1 + 1/n), within [0, 1]; this, not the CI of the mean, is the range for a re-run of "
        "one cell)",
        "",
        "| step | " + " | ".join(spread) + " |",
        "|---|" + "---|" * len(spread),
    ]
    for step, values in by_step.items():
        lines.append(f"| {step} | " + " | ".join(_pi_cell(list(values[a].values())) for a in spread) + " |")
    return lines


def results_table(grid: Grid, results: dict[str, dict[int, dict]]) -> str:
    arms = list(grid.arms)
    ref = grid.reference
    late = {a: n for a, cells in results.items() if (n := sum(1 for c in cells.values() if c.get("unfinished")))}
    head = arms + [f"{a} − {ref}" for a in arms if a != ref]
    lines = [
        f"## Experiment `{grid.name}`",
        "",
        f"Arms × seeds {grid.seeds}; held-out mean@k logged during training. Each cell: mean over seeds ± 95% CI "
        "half-width (Student t, n − 1 df) (standard error) [seeds]; differences are paired by seed. A "
        "difference whose interval contains 0 is inside the noise.",
        "",
        *(
            [
                "Unfinished cells (stopped, failed or still running: no cell.json) are included: their series end "
                "at their last logged step, and each point counts the seeds that reached it.",
                "",
            ]
            if late
            else []
        ),
        "Per arm, means over its training steps (then over seeds): s/step, and what its rollouts did.",
        "",
        "| arm | overrides | cells | s/step | " + " | ".join(TRAINING) + " |",
        "|---|---|---|---|" + "---|" * len(TRAINING),
    ]
    for arm in arms:
        cells = results.get(arm, {})
        times = [c["step_time"] for c in cells.values() if c["step_time"] is not None]
        columns = [_fmt(*mean_ci(times), digits=1) if times else "—"]
        for column in TRAINING:
            values = [c["training"][column] for c in cells.values() if c["training"][column] is not None]
            columns.append(_fmt(*mean_ci(values)) if values else "—")
        overrides = ", ".join(f"{k}={v}" for k, v in grid.arms[arm].items()) or "(base)"
        count = f"{len(cells)}/{len(grid.seeds)}" + (f" ({late[arm]} unfinished)" if arm in late else "")
        lines.append(f"| {arm} | {overrides} | {count} | " + " | ".join(columns) + " |")
    metrics = sorted({m for cells in results.values() for c in cells.values() for m in c["evals"]})
    for metric in metrics:
        steps = sorted({s for cells in results.values() for c in cells.values() for s in c["evals"].get(metric, {})})
        lines += ["", f"### {metric}, by step", "", "| step | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
        by_step = {step: _values_at_step(results, arms, metric, step) for step in steps}
        for step in steps:
            lines.append(f"| {step} | " + " | ".join(_row(arms, ref, by_step[step])) + " |")
        lines += _prediction_section(metric, arms, by_step)
        marks = _wall_clock_marks(results.get(ref, {}), steps)
        if not marks:
            continue
        lines += [
            "",
            f"### {metric}, at equal wall-clock (at each eval step, the training time of the reference's "
            "fastest seed: every reference seed has a value there)",
            "",
            "| minutes | " + " | ".join(head) + " |",
            "|---|" + "---|" * len(head),
        ]
        for t in marks.values():
            values = _values_at_seconds(results, arms, metric, t)
            lines.append(f"| {t / 60:.1f} | " + " | ".join(_row(arms, ref, values)) + " |")
    return "\n".join(lines) + "\n"


def _short(values: list[float], signed: bool = False) -> str:
    """``mean ± 95% CI half-width`` (the mean alone from one value; a dash from none)."""
    if not values:
        return "—"
    mean, half, _ = mean_ci(values)
    return _fmt(mean, half, None, signed=signed)


def _reading(diffs: list[float]) -> str:
    """What a paired difference says: ahead or behind when its 95% CI excludes 0, else inside the noise."""
    if len(diffs) < 2:
        return "one seed, no interval" if diffs else "no seed"
    mean, half, _ = mean_ci(diffs)
    if mean - half > 0:
        return "ahead"
    if mean + half < 0:
        return "behind"
    return "inside the noise"


def verdict_table(grid: Grid, results: dict[str, dict[int, dict]]) -> str:
    """One screen: per arm, its difference from the reference at the reference's last eval step and at equal
    wall-clock there (95% CI, paired by seed), the seeds, a reading, and where one more seed's run of the arm
    should land at that step (95% prediction interval). Empty when the reference has no finished seed."""
    arms = list(grid.arms)
    ref = grid.reference
    ref_cells = results.get(ref, {})
    metrics = sorted({m for c in ref_cells.values() for m in c["evals"]})
    lines = []
    for metric in metrics:
        common = set.intersection(*(set(c["evals"].get(metric, {})) for c in ref_cells.values()))
        if not common:
            continue
        step = max(common)
        at_step = _values_at_step(results, arms, metric, step)
        t = _wall_clock_marks(ref_cells, [step]).get(step)
        at_time = _values_at_seconds(results, arms, metric, t) if t is not None else None
        when = f"{t / 60:.1f} min of training" if t is not None else "equal wall-clock (no step time logged)"

        def ref_mean(values: dict[str, dict[int, float]]) -> str:
            v = list(values[ref].values())
            return f"{_short(v)} [{len(v)}]"

        lines += [
            f"### Grid `{grid.name}`, {metric}: each arm against `{ref}`",
            "",
            f"`{ref}` at step {step}: {ref_mean(at_step)}"
            + (f"; at {when}: {ref_mean(at_time)}" if at_time is not None else "")
            + ". Differences are paired by seed, mean ± 95% CI half-width (Student t); a difference whose "
            f"interval contains 0 is inside the noise. The last column is where one more seed's run of the arm "
            f"should land at step {step} (95% prediction interval): the range to check a re-run of one cell "
            "against.",
            "",
            f"| arm | overrides | − {ref} at step {step} | − {ref} at {when} | seeds | reading | one more seed at "
            f"step {step} |",
            "|---|---|---|---|---|---|---|",
        ]
        for arm in arms:
            overrides = ", ".join(f"{k}={v}" for k, v in grid.arms[arm].items()) or "(base)"
            own = list(at_step[arm].values())
            landing = _landing(own)
            if arm == ref:
                lines.append(f"| {arm} | {overrides} | reference | reference | {len(own)} | — | {landing} |")
                continue
            cells, seeds, readings = [], [], []
            for values in (at_step, at_time):
                if values is None:
                    cells.append("—")
                    continue
                diffs = _paired(values, arm, ref)
                cells.append(_short(diffs, signed=True) if diffs else "—")
                seeds.append(len(diffs))
                readings.append(_reading(diffs))
            count = str(seeds[0]) if len(set(seeds)) == 1 else " / ".join(map(str, seeds))
            if len(set(readings)) == 1:
                reading = readings[0] + (" at both" if len(readings) == 2 else "")
            else:
                reading = f"{readings[0]} at equal steps, {readings[1]} at equal wall-clock"
            lines.append(f"| {arm} | {overrides} | {cells[0]} | {cells[1]} | {count} | {reading} | {landing} |")
        lines.append("")
    return "\n".join(lines)


def window_table(grid: Grid, results: dict[str, dict[int, dict]]) -> str:
    """Per window of the grid (``windows:``): each cell's mean of the metric over the window's steps, then per arm
    the mean over seeds (95% CI), and, against the window's ``against`` arm, the difference paired by seed with
    its reading. A cell that logged the metric at no step of the window counts for nothing (``—``)."""
    lines = []
    for window in grid.windows:
        means: dict[str, dict[int, float]] = {}
        for arm, cells in results.items():
            for seed, cell in cells.items():
                values = [
                    v
                    for step, v in cell.get("series", {}).get(window.metric, {}).items()
                    if window.first <= step <= window.last
                ]
                if values:
                    means.setdefault(arm, {})[seed] = sum(values) / len(values)
        against = window.against
        span = (
            f"at step {window.first}: each cell's value"
            if window.first == window.last
            else f"over steps {window.first}-{window.last}: each cell's mean"
        )
        lines += [
            f"### Grid `{grid.name}`, `{window.metric}` {span}, then over seeds",
            "",
            "Mean over seeds ± 95% CI half-width (Student t)"
            + (f"; against `{against}`, paired by seed" if against else "")
            + ". A cell that logged the metric at no step of the window is left out.",
            "",
            "| arm | mean over seeds | seeds | per seed |" + (f" − {against} (paired) | reading |" if against else ""),
            "|---|---|---|---|" + ("---|---|" if against else ""),
        ]
        for arm in grid.arms:
            own = means.get(arm, {})
            per_seed = ", ".join(f"{own[s]:+.3f}" for s in sorted(own)) or "—"
            row = f"| {arm} | {_short(list(own.values()), signed=True)} | {len(own)} | {per_seed} |"
            if against:
                if arm == against:
                    row += " reference | — |"
                else:
                    diffs = _paired(means, arm, against)
                    row += f" {_short(diffs, signed=True)} | {_reading(diffs) if own else 'not logged'} |"
            lines.append(row)
        lines.append("")
    return "\n".join(lines)


def section_markers(name: str, kind: str = "experiment") -> tuple[str, str]:
    """The start and end markers of a grid's block of ``kind`` in a markdown file."""
    return f"<!-- lanpo-{kind}:{name} -->", f"<!-- /lanpo-{kind}:{name} -->"


def find_section(path: Path, text: str, name: str, kind: str = "experiment") -> tuple[int, int] | None:
    """Where the grid's block lies in ``text`` (start of its start marker, end of its end marker), or None when
    the file has neither marker. Markers that do not make one block (one without the other, the end before the
    start, a marker twice) are refused, naming their lines: rewriting around them would lose the user's text."""
    start, end = section_markers(name, kind)

    def lines_of(marker: str) -> list[int]:
        return [text.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(marker), text)]

    starts, ends = lines_of(start), lines_of(end)
    if not starts and not ends:
        return None
    where = f"{path}: the markers of grid {name!r} ({start} ... {end})"
    if len(starts) != 1 or len(ends) != 1:
        raise ValueError(
            f"{where} must appear once each; found the start at line(s) {starts or 'none'} and the end at "
            f"line(s) {ends or 'none'}. Fix or remove them; the file was not changed."
        )
    if ends[0] < starts[0] or text.index(end) < text.index(start):
        raise ValueError(
            f"{where} are in reverse order (end at line {ends[0]}, start at line {starts[0]}). Fix them; the file "
            "was not changed."
        )
    return text.index(start), text.index(end) + len(end)


def write_section(path: Path, name: str, table: str, kind: str = "experiment") -> None:
    """Put ``table`` between this grid's markers of ``kind`` in ``path`` (appended the first time); the rest is
    kept. The file is replaced at once (a kill mid-write leaves it whole); malformed markers are refused."""
    from lanpo.run.files import read_user_text, write_text_atomic

    start, end = section_markers(name, kind)
    text = read_user_text(path) if path.is_file() else ""
    block = f"{start}\n{table}{end}"
    bounds = find_section(path, text, name, kind)
    if bounds is not None:
        text = text[: bounds[0]] + block + text[bounds[1] :]
    else:
        text = (text.rstrip("\n") + "\n\n" if text else "") + block + "\n"
    write_text_atomic(path, text)


def plot_results(grid: Grid, results: dict[str, dict[int, dict]], out: Path) -> Path | None:
    """Per metric: mean ± 95% CI over seeds by step and by training minutes, one line per arm."""
    metrics = sorted({m for cells in results.values() for c in cells.values() for m in c["evals"]})
    if not metrics:
        return None
    from lanpo.run.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(len(metrics), 2, figsize=(11, 3.6 * len(metrics)), squeeze=False)
    for (ax_step, ax_time), metric in zip(axes, metrics):
        for arm, cells in results.items():
            steps = sorted({s for c in cells.values() for s in c["evals"].get(metric, {})})
            stats = [
                (
                    s,
                    mean_ci([c["evals"][metric][s] for c in cells.values() if s in c["evals"].get(metric, {})]),
                    [c["seconds"].get(s) for c in cells.values()],
                )
                for s in steps
            ]
            x = [s for s, _, _ in stats]
            y = [m for _, (m, _, _), _ in stats]
            half = [h or 0.0 for _, (_, h, _), _ in stats]
            minutes = [
                sum(t for t in ts if t is not None) / max(1, sum(t is not None for t in ts)) / 60 for _, _, ts in stats
            ]
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
