"""``lanpo pool``: inspect and move experience pools (stats, show, export, import)."""

from __future__ import annotations

import json

from lanpo.commands.args import at_least, new_path


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="RUN_OR_FILE is a run directory (its pool.sqlite) or a pool file.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    stats = actions.add_parser("stats", help="counts, entries per problem, steps covered, file size")
    stats.add_argument("pool", metavar="RUN_OR_FILE")
    show = actions.add_parser("show", help="print entries (newest last)")
    show.add_argument("pool", metavar="RUN_OR_FILE")
    show.add_argument("--problem", help="only entries of this problem id")
    show.add_argument("--limit", type=at_least(0), default=10, help="entries to print (default 10; 0 = all)")
    show.add_argument("--attempts", action="store_true", help="also print the stored raw attempts of --problem")
    export = actions.add_parser("export", help="write the pool as JSONL")
    export.add_argument("pool", metavar="RUN_OR_FILE")
    export.add_argument("out", metavar="FILE.jsonl", type=new_path("file"))
    imp = actions.add_parser("import", help="add the entries of a JSONL export (creates the pool if needed)")
    imp.add_argument("pool", metavar="RUN_OR_FILE")
    imp.add_argument("source", metavar="FILE.jsonl")
    imp.add_argument("--cap", type=at_least(1), default=32, help="entries kept per problem (default 32)")
    p.set_defaults(func=command)


def command(args) -> int:
    from lanpo.pool.io import export_jsonl, read_export
    from lanpo.pool.store import ExperiencePool, resolve_pool_path

    if args.action == "import":
        entries, attempts = read_export(args.source)  # all checked before the pool is opened: a bad export
        with ExperiencePool(args.pool, cap_per_problem=args.cap) as pool:  # creates nothing
            pool.add(entries, attempts=attempts)
        print(
            json.dumps(
                {"pool": str(resolve_pool_path(args.pool)), "entries": len(entries), "attempts": len(attempts)},
                indent=2,
            )
        )
        return 0
    with ExperiencePool(args.pool, readonly=True) as pool:
        if args.action == "stats":
            print(json.dumps(pool.stats(), indent=2))
        elif args.action == "export":
            lines = export_jsonl(pool, args.out)
            print(f"Wrote {lines} lines to {args.out}")
        else:
            entries = pool.entries(problem_id=args.problem)
            for entry in entries[-args.limit :] if args.limit else entries:
                print(
                    f"[{entry.id}] {entry.problem_id} (step {entry.step}, from a "
                    f"{'right' if entry.correct else 'wrong' if entry.correct is False else 'ungraded'} trial)"
                )
                print(f"  problem: {entry.problem[:200]}")
                if entry.flow_of_thought:
                    print(f"  flow of thought: {entry.flow_of_thought}")
                for item in entry.principles:
                    print(f"  + {item}")
                for item in entry.pitfalls:
                    print(f"  - {item}")
            if args.attempts and args.problem:
                for attempt in pool.attempts(args.problem):
                    print(f"  attempt (step {attempt.step}): {attempt.text[:500]}")
            print(f"{len(entries)} entries" + (f" of {args.problem}" if args.problem else ""))
    return 0
