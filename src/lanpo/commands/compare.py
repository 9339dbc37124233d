"""``lanpo compare``: runs side by side, a markdown table and PNG plots (:mod:`lanpo.report.compare`)."""

from __future__ import annotations

import time

from lanpo.commands.args import new_path


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Tables and plots (accuracy per step, feedback vs scratch reward, pool growth) of "
        "several run directories, plus any evaluations stored in them.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (each with metrics.jsonl)")
    p.add_argument("--names", help="comma-separated display names (default: directory names)")
    p.add_argument("--out", type=new_path("dir"), help="output directory (default: runs/compare-<time>)")
    p.set_defaults(func=command)


def command(args) -> int:
    from lanpo.report.compare import compare

    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names and len(names) != len(args.runs):
        raise ValueError(f"--names gives {len(names)} names for {len(args.runs)} runs.")
    md = compare(args.runs, args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}", names)
    print(md.read_text())
    print(f"Written: {md} and {md.parent / 'compare.png'}")
    return 0
