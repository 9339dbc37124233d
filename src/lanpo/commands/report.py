"""``lanpo report``: one self-contained HTML report of runs (:mod:`lanpo.report.page`)."""

from __future__ import annotations

from lanpo.commands.args import new_path, port


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Write RUN/report.html (or --out): training curves (runs overlaid), a pool browser "
        "with search, rollouts with their real prompts, and evaluation tables. The file "
        "works offline, opened from disk.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", type=new_path("file"), help="output file (default: the first RUN/report.html)")
    p.add_argument("--serve", action="store_true", help="then serve it on http://127.0.0.1:PORT (Ctrl-C stops)")
    p.add_argument("--port", type=port, default=8000, help="port for --serve (default 8000; 0: any free one)")
    p.set_defaults(func=command)


def command(args) -> int:
    from lanpo.report.page import serve, write_report

    out = write_report(args.runs, args.out)
    print(f"Report: {out} ({out.stat().st_size / 1e6:.1f} MB; open it in a browser, no server needed)")
    if args.serve:
        serve(out, args.port)
    return 0
