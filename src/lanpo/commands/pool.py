"""``lanpo pool``: inspect, audit and move experience pools (stats, show, audit, export, import)."""

from __future__ import annotations

import json
from pathlib import Path

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
    audit = actions.add_parser(
        "audit",
        help="are the lessons transferable, repeated, answer-free; which helped (writes pool-audit.md and .png)",
        description="Per entry: specificity (lessons repeating its problem's numbers or names), answers stated, "
        "lessons repeated across problems, length and parse state, uses and in-group lift with a 95% interval; "
        "how concentrated retrieval is; and 50 entries drawn at random for a person to rate (the paper's check). "
        "Golds for the answers check come from the run's data (config.yaml) or --data.",
    )
    audit.add_argument("pool", metavar="RUN_OR_FILE")
    audit.add_argument("--data", help="data spec holding the pool's problems (default: the run's own data)")
    audit.add_argument("--out", help="folder for pool-audit.md and pool-audit.png (default: beside the pool)")
    audit.add_argument("--sample", type=at_least(0), default=50, help="entries drawn for rating (default 50)")
    audit.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    export = actions.add_parser("export", help="write the pool as JSONL")
    export.add_argument("pool", metavar="RUN_OR_FILE")
    export.add_argument("out", metavar="FILE.jsonl", type=new_path("file"))
    imp = actions.add_parser("import", help="add the entries of a JSONL export (creates the pool if needed)")
    imp.add_argument("pool", metavar="RUN_OR_FILE")
    imp.add_argument("source", metavar="FILE.jsonl")
    imp.add_argument("--cap", type=at_least(1), default=32, help="entries kept per problem (default 32)")
    p.set_defaults(func=command)


def command(args) -> int:
    from lanpo.pool.io import export_jsonl, import_export, read_export
    from lanpo.pool.store import ExperiencePool, resolve_pool_path

    if args.action == "import":
        export = read_export(args.source)  # all checked before the pool is opened: a bad export creates nothing
        with ExperiencePool(args.pool, cap_per_problem=args.cap) as pool:
            counts = import_export(pool, export)
        print(json.dumps({"pool": str(resolve_pool_path(args.pool)), **counts}, indent=2))
        return 0
    if args.action == "audit":
        return audit_command(args)
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


def golds_of_run(run_dir: Path | None, data: str | None) -> tuple[dict, str]:
    """(problem id → :class:`lanpo.report.audit.Gold`, where they came from): from ``data`` when named, else from the
    data the run trained on (its ``config.yaml``); empty, with the reason, when they cannot be loaded."""
    from lanpo.data.loaders import DataError, load_problems
    from lanpo.data.presets import training_split
    from lanpo.report.audit import Gold

    fields: dict = {}
    if data is None:
        config = run_dir / "config.yaml" if run_dir else None
        if config is None or not config.is_file():
            return {}, "unknown (no run config.yaml beside the pool; name the data with --data)"
        import yaml

        settings = yaml.safe_load(config.read_text()) or {}
        data = settings.get("data")
        if not isinstance(data, str):
            return {}, f"unknown ({config} names no data)"
        fields = {
            key: settings.get(key)
            for key in ("data_dir", "problem_field", "answer_field", "id_field", "problem_template", "answer_format")
        }
        fields["split"] = training_split(data, settings.get("data_split"))
    try:
        problems = load_problems(data, **fields)
    except (DataError, OSError, ValueError, RuntimeError) as exc:
        return {}, f"unknown ({data} could not be loaded: {exc})"
    return {p.id: Gold(p.answer, p.gold_kind) for p in problems}, data


def audit_command(args) -> int:
    from lanpo.pool.store import POOL_FILENAME, ExperiencePool, resolve_pool_path
    from lanpo.report.audit import audit_pool, markdown, plot
    from lanpo.run.files import read_jsonl, write_text_atomic

    path = resolve_pool_path(args.pool)
    run_dir = path.parent if (path.parent / "config.yaml").is_file() else None
    with ExperiencePool(path, readonly=True) as pool:
        entries = list(pool.iter_entries())
        worth = pool.entry_worth()
    golds, source = golds_of_run(run_dir, args.data)
    beside = path.parent if path.name == POOL_FILENAME else None  # a run's logs, beside its pool.sqlite
    retrievals = read_jsonl(beside / "retrievals.jsonl") if beside else []
    metrics = read_jsonl(beside / "metrics.jsonl") if beside else []
    audit = audit_pool(
        entries, worth, golds, retrievals, name=str(args.pool), sample=args.sample, seed=args.seed, metrics=metrics
    )
    text = markdown(audit) + f"\nGolds for the answers check: {source}.\n"
    out = Path(args.out) if args.out else path.parent
    taken = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if taken is not None:
        raise ValueError(
            f"--out {out}: {taken} is a file, and --out names a folder (pool-audit.md and pool-audit.png are written "
            "into it): name a folder, new or existing."
        )
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "pool-audit.md", text)
    plot(audit, out / "pool-audit.png")
    print(text)
    print(f"Wrote {out / 'pool-audit.md'} and {out / 'pool-audit.png'}")
    return 0
