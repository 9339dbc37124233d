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

A grid may extend another (``extends: other.yaml``, relative to this file): it takes that grid's base, settings,
seeds, reference and arms, merges its own settings over them and replaces the rest it gives, so the same grid on
another device or from another model is a few lines (``configs/experiments/embedded-gpu.yaml``).

``pinned:`` (a mapping of training fields, never inherited) keeps a grid's cells as they were when a default of
lanpo's moves after some have run: each cell runs with the pinned values over its config, and its hash (what
``cell.json`` records, and what a recorded cell is checked against) is taken without them, as it was taken under
the old default. A grid whose cells all run after the change needs no pin.

Each cell (arm, seed) is a ``lanpo train`` run in ``OUT/ARM/seed-S``, in a process of its own, from the merged
config (base < settings < arm < seed) written beside it as ``seed-S.yaml``. A finished cell (``cell.json``) is
skipped, an interrupted one resumes from its newest checkpoint, and a cell whose merged config changed since it
ran is refused; so a grid can be filled over several sittings, and re-running a finished one only rewrites the
table. Every cell's config is validated before any cell runs. The table (``OUT/results.md``, optionally also a
marked section of another file) compares the held-out ``eval/...mean@k`` that training logs every ``eval_every``
steps, over seeds, at equal steps and at equal wall-clock (statistics: :mod:`lanpo.experiments.stats`);
``OUT/results.png`` plots both. ``OUT/verdict.md`` (optionally also a marked section of another file) is the
one-screen summary: each arm against the reference at the last eval step and at equal wall-clock, then any
``windows:`` the grid names (a training metric's mean over a window of steps per cell, over seeds, paired with an
arm: the mechanism a decision rule reads, :class:`Window`).

``OUT`` is scratch space: checkpoints, models and pools, gigabytes a grid, on one machine. A grid that takes more
sittings than one machine lasts names a ``record`` folder (``record: results/NAME``, kept under version control):
each finished cell's evidence (``cell.json``, ``metrics.jsonl`` and the run's resolved ``config.yaml``, a few
hundred KB) is copied there as the cell finishes, and every run of the grid, ``--table-only`` too, copies any
finished cell the record lacks. A cell recorded with the config the grid gives it now is complete wherever ``OUT``
is, and the tables read it from the record when ``OUT`` lacks it; recorded with another config, it is refused
like a changed cell in ``OUT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lanpo.experiments.stats import (
    COMPLETE,
    collect,
    find_section,
    plot_results,
    results_table,
    verdict_table,
    window_table,
    write_section,
)

GRID_KEYS = {
    "name",
    "extends",
    "base",
    "settings",
    "pinned",
    "seeds",
    "reference",
    "arms",
    "out",
    "record",
    "reuse",
    "windows",
}
RECORDED = (COMPLETE, "metrics.jsonl", "config.yaml")  # a finished cell's evidence, copied to the grid's record


class GridError(ValueError):
    """A grid file that cannot run as written."""


@dataclass(frozen=True)
class Window:
    """A training metric's mean over a window of steps, per cell, then over seeds (``windows:`` in a grid file):
    the mechanism a decision rule reads beside the held-out verdict (``lanpo/feedback_lift/abstraction`` over steps
    49-72), each arm paired by seed with ``against`` where it names an arm."""

    metric: str
    first: int
    last: int
    against: str | None = None


@dataclass
class Grid:
    name: str
    arms: dict[str, dict]
    seeds: list[int]
    out: Path
    reference: str
    base: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    record: Path | None = None
    reuse: dict[str, Grid] = field(default_factory=dict)  # arm -> the grid whose finished cells of it count here
    windows: list[Window] = field(default_factory=list)  # training metrics a rule reads over a window of steps
    pinned: dict = field(default_factory=dict)  # what the recorded cells ran with, where lanpo's defaults moved since

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out / arm / f"seed-{seed}"

    def reused_dir(self, arm: str, seed: int) -> Path | None:
        """A finished cell of ``arm`` in the grid named by ``reuse``, where its config is this cell's but for the
        output folder (and it is complete there under that config); None otherwise."""
        other = self.reuse.get(arm)
        if other is None or arm not in other.arms or seed not in other.seeds:
            return None
        mine = {k: v for k, v in self.config(arm, seed).items() if k != "output_dir"}
        theirs = {k: v for k, v in other.config(arm, seed).items() if k != "output_dir"}
        done = other.result_dir(arm, seed) / COMPLETE
        if mine != theirs or not done.is_file() or _recorded_hash(done) != config_hash(other.hashed_config(arm, seed)):
            return None
        return done.parent

    def record_dir(self, arm: str, seed: int) -> Path | None:
        return self.record / arm / f"seed-{seed}" if self.record is not None else None

    def result_dir(self, arm: str, seed: int) -> Path:
        """Where the cell's results are read: its run in OUT, or its record when OUT holds no finished run."""
        run, kept = self.run_dir(arm, seed), self.record_dir(arm, seed)
        if (run / COMPLETE).is_file():
            return run
        if kept is not None and (kept / COMPLETE).is_file():
            return kept
        return self.reused_dir(arm, seed) or run

    def config(self, arm: str, seed: int) -> dict:
        """The cell's config as it runs: base < settings < arm < seed, then ``pinned`` over all."""
        return {**self.hashed_config(arm, seed), **self.pinned}

    def hashed_config(self, arm: str, seed: int) -> dict:
        """The cell's config as its hash names it (``cell.json``): without ``pinned``, which keeps a cell's behaviour
        where a default changed after the grid's first cells ran (their hashes were taken under the old default,
        which the pin now states), so recorded and later cells share one hash per cell."""
        return {
            **self.base,
            **self.settings,
            **self.arms[arm],
            "seed": seed,
            "output_dir": str(self.run_dir(arm, seed)),
        }

    def cells(self, arms: list[str] | None = None, seeds: list[int] | None = None) -> list[tuple[str, int]]:
        return [(a, s) for a in (arms or list(self.arms)) for s in (seeds if seeds is not None else self.seeds)]


def _read_spec(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """The grid file's mapping, with ``base`` made absolute and ``extends`` resolved: the extended grid's base,
    settings, seeds, reference and arms, this file's settings merged over its settings and its other keys over the
    rest (name, out and record are never inherited: two grids must not share run directories or records)."""
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise GridError(f"{path}: cannot read the grid ({error}).") from error
    if not isinstance(spec, dict):
        raise GridError(f"{path}: a grid is a YAML mapping with {', '.join(sorted(GRID_KEYS))}.")
    unknown = set(spec) - GRID_KEYS
    if unknown:
        raise GridError(
            f"{path}: unknown keys {sorted(unknown)} (a grid has {', '.join(sorted(GRID_KEYS))}; "
            "training fields go under settings or an arm)."
        )
    if spec.get("base"):
        spec["base"] = str((path.parent / str(spec["base"])).resolve())
    if not spec.get("extends"):
        return spec
    parent, seen = (path.parent / str(spec.pop("extends"))).resolve(), (*seen, path.resolve())
    if parent in seen:
        raise GridError(f"{path}: extends {parent}, which extends it back.")
    if not parent.is_file():
        raise GridError(f"{path}: the grid it extends, {parent}, does not exist.")
    # never inherited: two grids must not share run directories or records, and a pin is its own grid's history
    not_inherited = {"name", "out", "record", "reuse", "pinned"}
    inherited = {k: v for k, v in _read_spec(parent, seen).items() if k not in not_inherited}
    settings = {**(inherited.get("settings") or {}), **(spec.get("settings") or {})}
    return {**inherited, **spec, "settings": settings}


def load_grid(path: str | Path, reference: str | None = None) -> Grid:
    path = Path(path)
    spec = _read_spec(path)
    arms = spec.get("arms")
    if not isinstance(arms, dict) or not arms:
        raise GridError(f"{path}: arms must map each arm's name to its overrides (an empty mapping: the base).")
    arms = {str(k): dict(v or {}) for k, v in arms.items()}
    for name, overrides in arms.items():
        if not isinstance(overrides, dict) or not name or "/" in name:
            raise GridError(f"{path}: arm {name!r} must be a plain name mapped to overrides.")
        if {"seed", "output_dir"} & set(overrides):
            raise GridError(f"{path}: arm {name!r} sets seed or output_dir; the grid sets them per cell.")
    pinned = spec.get("pinned") or {}
    if not isinstance(pinned, dict) or {"seed", "output_dir"} & set(pinned):
        raise GridError(f"{path}: pinned maps training fields to the values the recorded cells ran with.")
    for name, overrides in arms.items():
        if set(overrides) & set(pinned):
            raise GridError(
                f"{path}: arm {name!r} sets {sorted(set(overrides) & set(pinned))}, which pinned sets for every cell."
            )
    seeds = spec.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise GridError(f"{path}: seeds must be a list of distinct integers, got {seeds!r}.")
    base = {}
    if spec.get("base"):
        base_path = Path(spec["base"])  # absolute: relative to the file that named it
        if not base_path.is_file():
            raise GridError(f"{path}: base config {base_path} does not exist.")
        base = yaml.safe_load(base_path.read_text()) or {}
    reference = str(reference or spec.get("reference") or next(iter(arms)))  # the argument: --reference
    if reference not in arms:
        raise GridError(f"{path}: reference {reference!r} is not one of the arms ({', '.join(arms)}).")
    name = str(spec.get("name") or path.stem)
    reuse = {}
    for arm, other_path in (spec.get("reuse") or {}).items():
        if arm not in arms:
            raise GridError(f"{path}: reuse names {arm!r}, which is not one of the arms ({', '.join(arms)}).")
        other_path = (path.parent / str(other_path)).resolve()
        if not other_path.is_file() or other_path == path.resolve():
            raise GridError(f"{path}: reuse: {arm}: {other_path} is not another grid file.")
        reuse[str(arm)] = load_grid(other_path)
    return Grid(
        name,
        arms,
        seeds,
        Path(spec.get("out") or f"runs/experiments/{name}"),
        reference,
        base,
        dict(spec.get("settings") or {}),
        Path(spec["record"]) if spec.get("record") else None,
        reuse,
        _windows(path, spec.get("windows"), arms),
        dict(pinned),
    )


def _windows(path: Path, spec, arms: dict) -> list[Window]:
    """``windows:``: a list of ``{metric: NAME, steps: [FIRST, LAST], against: ARM}`` (``against`` optional)."""
    if spec is None:
        return []
    if not isinstance(spec, list):
        raise GridError(f"{path}: windows must be a list of {{metric, steps: [first, last], against}}, got {spec!r}.")
    windows = []
    for item in spec:
        if not isinstance(item, dict) or set(item) - {"metric", "steps", "against"}:
            raise GridError(f"{path}: a window holds metric, steps: [first, last] and optionally against: {item!r}.")
        metric, steps, against = item.get("metric"), item.get("steps"), item.get("against")
        if not isinstance(metric, str) or not metric:
            raise GridError(f"{path}: a window's metric must name a logged metric, got {metric!r}.")
        if (
            not isinstance(steps, list)
            or len(steps) != 2
            or not all(type(s) is int for s in steps)
            or not 1 <= steps[0] <= steps[1]
        ):
            raise GridError(f"{path}: window {metric}: steps must be [first, last], 1 <= first <= last, got {steps!r}.")
        if against is not None and str(against) not in arms:
            raise GridError(f"{path}: window {metric}: against {against!r} is not one of the arms ({', '.join(arms)}).")
        windows.append(Window(metric, steps[0], steps[1], None if against is None else str(against)))
    return windows


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _recorded_hash(done: Path) -> str:
    try:
        record = json.loads(done.read_text(encoding="utf-8"))
        config = record.get("config") if isinstance(record, dict) else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        config = None
    if not isinstance(config, str):
        raise GridError(f"{done} is not a cell record (it holds no config hash): delete it to run the cell again.")
    return config


def cell_state(grid: Grid, arm: str, seed: int) -> str:
    """complete | changed (done with another config) | resume (a checkpoint to continue) | new. A cell is done
    when its run in OUT or, where OUT holds no finished run, the grid's record says so."""
    from lanpo.commands.train import resume_target

    run = grid.run_dir(arm, seed)
    done = grid.result_dir(arm, seed) / COMPLETE
    if done.parent == grid.reused_dir(arm, seed):  # finished by another grid under this very config
        return "complete"
    if done.is_file():
        return "complete" if _recorded_hash(done) == config_hash(grid.hashed_config(arm, seed)) else "changed"
    try:
        resume_target("latest", str(run))
        return "resume"
    except FileNotFoundError:
        return "new"


def validate(grid: Grid, cells: list[tuple[str, int]]) -> None:
    """Every cell's config through ``lanpo train``'s own parsing (no model loads): errors name the arm."""
    from lanpo.commands.train import parse

    written: list[Path] = []  # what this validation created, removed again when a cell is refused
    try:
        for arm, seed in cells:
            spec = grid.run_dir(arm, seed).with_suffix(".yaml")
            written += [p for p in (*reversed(spec.parents), spec) if not p.exists()]
            spec.parent.mkdir(parents=True, exist_ok=True)
            spec.write_text(yaml.safe_dump(grid.config(arm, seed), sort_keys=False))
            try:
                parse(["--config", str(spec)])
            except (ValueError, TypeError) as error:
                raise GridError(f"arm {arm!r} (seed {seed}): {error}") from error
            except SystemExit as error:  # argparse printed why
                raise GridError(f"arm {arm!r} (seed {seed}): its config does not parse (see above).") from error
    except GridError:
        for path in reversed(written):  # files, then their folders, deepest first
            try:
                path.unlink() if path.is_file() else path.rmdir()
            except OSError:
                pass
        raise


def cell_env(jobs: int, environ: dict[str, str] | None = None, cpus: int | None = None) -> dict[str, str]:
    """The environment of a cell's process: with ``jobs`` cells at once, each gets its share of the CPU cores as
    torch threads (unless the user set ``OMP_NUM_THREADS``); by default torch takes every core in every process,
    and cells oversubscribing the cores slow each other far more than sharing them does."""
    env = dict(os.environ if environ is None else environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cpus or os.cpu_count() or 1) // jobs))
    return env


@contextmanager
def cell_lock(grid: Grid, arm: str, seed: int) -> Iterator[bool]:
    """Hold the cell's lock (``OUT/ARM/seed-S.lock``) for the block: yields False, holding nothing, when another
    runner holds it. The operating system drops the lock of a runner that dies, so none goes stale."""
    import fcntl

    path = grid.run_dir(arm, seed).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_cell(grid: Grid, arm: str, seed: int, state: str, log: Path | None = None, jobs: int = 1) -> bool:
    """One ``lanpo train`` process (its output to ``log`` when given); ``cell.json`` marks the cell complete when it
    exits 0. ``jobs``: cells running at once (see :func:`cell_env`)."""
    run = grid.run_dir(arm, seed)
    if state == "resume":
        argv = ["--resume", "latest", "--output_dir", str(run)]
    else:
        argv = ["--config", str(run.with_suffix(".yaml")), "--overwrite"]
    command = [sys.executable, "-m", "lanpo.cli", "train", *argv]
    from lanpo.run.files import PARENT_ENV

    env = {**cell_env(jobs), PARENT_ENV: str(os.getpid())}  # the cell ends with this runner (die_with_parent)
    if log is None:
        code = subprocess.run(command, env=env).returncode
    else:
        with log.open("a") as handle:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    if code == 0:
        record = {"arm": arm, "seed": seed, "config": config_hash(grid.hashed_config(arm, seed)), "machine": machine()}
        (run / COMPLETE).write_text(json.dumps(record) + "\n")
        drop_checkpoints(run)
        record_cell(grid, arm, seed)
    return code == 0


def record_cell(grid: Grid, arm: str, seed: int) -> bool:
    """Copy a finished cell's evidence (``RECORDED``) from OUT into the grid's record, each file replaced at once;
    True when something was copied. Nothing to do without a record, for a cell not finished in OUT, or one whose
    record already holds the same files. Bytes are copied as they are (a temporary file renamed over the old)."""
    run, kept = grid.run_dir(arm, seed), grid.record_dir(arm, seed)
    if kept is None or not (run / COMPLETE).is_file():
        return False
    sources = [run / name for name in RECORDED if (run / name).is_file()]
    if all((kept / s.name).is_file() and (kept / s.name).read_bytes() == s.read_bytes() for s in sources):
        return False
    kept.mkdir(parents=True, exist_ok=True)
    for source in sorted(sources, key=lambda s: s.name == COMPLETE):  # cell.json last: it marks the rest whole
        partial = kept / f".{source.name}.tmp"
        shutil.copyfile(source, partial)
        os.replace(partial, kept / source.name)
    return True


def machine() -> dict:
    """What ran a cell, kept in its ``cell.json``: a grid filled over several machines pairs its wall-clock
    figures fairly only between cells of one machine, and a reader of the record should be able to tell."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    from lanpo.engine import bf16_matmul
    from lanpo.engine.models import cpu_bf16_native

    native = cpu_bf16_native()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": os.environ.get("OMP_NUM_THREADS"),
        "bf16_native": native,  # without it, a bf16 matmul is emulated: lanpo's float32-accumulate kernels or torch's
        "bf16_matmul": bf16_matmul.mode(native),
    }


def drop_checkpoints(run: Path) -> None:
    """A complete cell never resumes again: its checkpoints go (1-2 GB each with the optimizer state; a grid's
    filled the disk), its ``final`` model, pool and metrics stay. One that cannot go is named, not skipped."""
    from lanpo.run import checkpoints  # here, as cell_state's import: loading the grid stays free of torch

    checkpoints.discard_staging(run)
    for checkpoint in checkpoints.checkpoints(run):
        try:
            shutil.rmtree(checkpoint)
        except OSError as error:
            print(f"warning: {checkpoint} (no longer needed) could not be removed: {error}", file=sys.stderr)


def run_grid(
    grid: Grid,
    arms: list[str] | None = None,
    seeds: list[int] | None = None,
    results_md: str | Path | None = None,
    table_only: bool = False,
    jobs: int = 1,
    unfinished: bool = False,
    verdict_md: str | Path | None = None,
) -> int:
    """Fill the grid (or the ``arms`` × ``seeds`` part of it), then write the table (with ``unfinished``, cells
    that did not finish too, marked) and the one-screen verdict (OUT/verdict.md, and into ``verdict_md``
    between the grid's verdict markers). Returns an exit code.

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
        raise GridError(
            f"--seeds {', '.join(map(str, outside))}: not seeds of {grid.name} {grid.seeds}; add them to "
            "the grid's seeds."
        )
    from lanpo.run.files import read_user_text

    for path, kind in ((results_md, "experiment"), (verdict_md, "verdict")):  # before any cell runs
        if path and Path(path).is_file():
            find_section(Path(path), read_user_text(path), grid.name, kind)
    cells = grid.cells(arms, seeds)
    failed: list[str] = []
    busy: list[str] = []  # cells another runner held: left to it
    if not table_only:
        states = {cell: cell_state(grid, *cell) for cell in cells}
        changed = [f"{a}/seed-{s}" for (a, s), st in states.items() if st == "changed"]
        if changed:
            raise GridError(
                f"These cells ran with another config than the grid now gives them: {', '.join(changed)}. "
                f"Restore the grid, or delete those cells (or choose another out) to run them anew."
            )
        todo = [cell for cell in cells if states[cell] != "complete"]
        validate(grid, todo)
        print(f"{grid.name}: {len(cells) - len(todo)} of {len(cells)} cells complete, {len(todo)} to run", flush=True)

        def one(k: int, cell: tuple[str, int]) -> None:
            arm, seed = cell
            with cell_lock(grid, arm, seed) as held:
                # one write per line: cells' threads print at once, and print() writes the newline apart
                if not held:
                    lock = grid.run_dir(arm, seed).with_suffix(".lock")
                    print(
                        f"[{k}/{len(todo)}] {arm} seed {seed}: skipped, another runner is training it ({lock})\n",
                        end="",
                        flush=True,
                    )
                    busy.append(f"{arm}/seed-{seed}")
                    return
                state = cell_state(grid, arm, seed)  # again, under the lock: another runner may have finished it
                if state == "complete":
                    print(f"[{k}/{len(todo)}] {arm} seed {seed}: complete (another runner finished it)\n", end="")
                    return
                print(f"[{k}/{len(todo)}] {arm} seed {seed}: {state}\n", end="", flush=True)
                log = grid.run_dir(arm, seed).with_suffix(".log") if jobs > 1 else None
                if not run_cell(grid, arm, seed, state, log, jobs):
                    failed.append(f"{arm}/seed-{seed}")
                elif log is not None:
                    print(f"{arm} seed {seed}: done\n", end="", flush=True)

        if jobs == 1:
            for k, cell in enumerate(todo, 1):
                one(k, cell)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(jobs) as pool:  # each cell is a process of its own; threads only wait
                list(pool.map(one, range(1, len(todo) + 1), todo))
    from lanpo.run.files import write_text_atomic  # here: loading the grid stays free of torch

    recorded = [f"{arm}/seed-{seed}" for arm, seed in grid.cells() if record_cell(grid, arm, seed)]
    if recorded:
        print(f"recorded in {grid.record}: {', '.join(recorded)}", flush=True)
    results = collect(grid, unfinished)
    table = results_table(grid, results)
    grid.out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(grid.out / "results.md", table)
    plot_results(grid, results, grid.out / "results.png")
    if results_md:
        write_section(Path(results_md), grid.name, table)
    verdict = "\n".join(part for part in (verdict_table(grid, results), window_table(grid, results)) if part)
    write_text_atomic(grid.out / "verdict.md", verdict)
    if verdict_md:
        write_section(Path(verdict_md), grid.name, verdict, kind="verdict")
    if busy:
        print(f"left to the runner that holds them: {', '.join(busy)}", file=sys.stderr)
    if failed:
        print(
            f"failed cells (the table {'marks them unfinished' if unfinished else 'leaves them out'}): "
            f"{', '.join(failed)}",
            file=sys.stderr,
        )
    return 1 if failed else 0


# -- command line ------------------------------------------------------------------------------------------
