"""``lanpo experiment``: a grid of arms x seeds from one base config, each cell a ``lanpo train`` run; one results
table and a verdict (:mod:`lanpo.experiments`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from lanpo.commands.args import new_path
from lanpo.experiments.grid import load_grid, run_grid


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Fill a grid (YAML: name, base, settings, seeds, reference, arms, out): each "
        "(arm, seed) cell is a `lanpo train` run of its own; finished cells are skipped, "
        "interrupted ones resume from their newest checkpoint. Then OUT/results.md (held-"
        "out mean@k by step and at equal wall-clock, mean over seeds with 95% CIs, "
        "differences paired by seed) and OUT/results.png. See configs/experiments/.",
    )
    p.add_argument("grid", help="the grid file (YAML)")
    p.add_argument("--only", help="comma-separated arms to run (default: every arm)")
    p.add_argument("--seeds", help="comma-separated seeds to run (default: the grid's)")
    p.add_argument("--table-only", action="store_true", help="run nothing: rewrite the table from finished cells")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="cells to run at once (default 1; on a GPU that one small run leaves idle, more; each cell's "
        "output then goes to OUT/ARM/seed-S.log, and each gets cores/N torch threads unless "
        "OMP_NUM_THREADS is set). Cells sharing a machine slow each other, so the wall-clock "
        "columns then measure contention too",
    )
    p.add_argument(
        "--unfinished",
        action="store_true",
        help="also put cells that did not finish (stopped, failed or still running) in the table, marked "
        "as such: their series end at their last logged step (default: finished cells only)",
    )
    p.add_argument(
        "--reference",
        metavar="ARM",
        help="take the table's differences against this arm (default: the "
        "grid's reference); only the table changes, no cell",
    )
    p.add_argument(
        "--results-md",
        type=new_path("file"),
        help="also put the table into this markdown file, between the grid's markers",
    )
    p.add_argument(
        "--verdict-md",
        type=new_path("file"),
        help="also put the one-screen verdict (each arm against the reference at the last eval step and at "
        "equal wall-clock, 95%% CIs, seeds, where one more seed should land) into this markdown file, between "
        "the grid's verdict markers (appended the first time: move the markers where the verdict belongs)",
    )
    p.add_argument(
        "--plot",
        type=new_path("file"),
        help="also write OUT/results.png here (the docs keep the recorded grids' plots: docs/<grid>.png)",
    )
    p.set_defaults(func=command)


def command(args) -> int:
    grid = load_grid(args.grid, args.reference)
    arms = [a.strip() for a in args.only.split(",")] if args.only else None
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError as error:
        raise ValueError(f"--seeds takes comma-separated integers, got {args.seeds!r}.") from error
    code = run_grid(grid, arms, seeds, args.results_md, args.table_only, args.jobs, args.unfinished, args.verdict_md)
    print(f"Written: {grid.out / 'results.md'}, {grid.out / 'verdict.md'} and {grid.out / 'results.png'}")
    if args.plot and (grid.out / "results.png").is_file():
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(grid.out / "results.png", args.plot)
        print(f"and {args.plot}")
    return code
