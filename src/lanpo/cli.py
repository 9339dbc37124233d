"""The ``lanpo`` command: ``lanpo train | sft-data | sft | eval | pool | compare | report``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from lanpo import __version__
from lanpo.experiments.grid import add_parser as add_experiment_parser

# -- argument types: a bad value is refused while parsing, naming the flag and the value, before any model loads --


def at_least(minimum: float, kind=int):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value

    return parse


def unit_interval(text: str) -> float:
    value = at_least(0.0, float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def probability(text: str) -> float:
    """A probability mass to keep, in (0, 1] (``--top-p 0`` would keep nothing)."""
    value = float(text) if text.replace(".", "", 1).replace("e-", "", 1).isdigit() else None
    if value is None or not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def new_path(kind: str):
    """An output path that is not already a thing of the other kind (a file where a folder goes, or the reverse)."""

    def parse(text: str) -> str:
        path = Path(text)
        if kind == "dir" and path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a file; name a directory")
        if kind == "file" and path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory; name a file")
        if kind == "file" and path.parent.exists() and not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"{path.parent} is a file, so {text} cannot be created")
        return text

    return parse


def eval_modes(text: str) -> list[str]:
    from lanpo.eval.evaluate import MODES

    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"unknown mode(s) {unknown or text!r}; choose from {', '.join(MODES)}")
    return modes


def skill_mix(text: str) -> list[float]:
    try:
        mix = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 1,1,1, got {text!r}") from None
    if len(mix) != 3 or any(m < 0 for m in mix) or not sum(mix):
        raise argparse.ArgumentTypeError(f"needs three non-negative shares (summarize,reflect,feedback), got {text!r}")
    return mix


def _eval_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a model: mean@k / pass@k in zero-shot, retrieval and self-correct modes",
        description="Sample k completions per problem and report accuracy mean@k (± standard error), "
        "pass@k, mean length and truncation rate; every completion is saved.",
    )
    p.add_argument("--model", default="smollm2-135m", help="hub id, local dir, .gguf, run dir, smollm2-135m (default)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--data",
        help="data spec: builtin:arith?split=test, a preset, a .jsonl/.json/.parquet file, or "
        "a hub name (default: builtin:arith?split=test)",
    )
    src.add_argument("--benchmarks", help="comma-separated benchmark names: " + ", ".join(_benchmarks()))
    _data_field_args(p)
    p.add_argument("--limit", type=at_least(1), help="evaluate only the first N problems of each data set")
    p.add_argument(
        "--modes",
        default=["zero-shot"],
        type=eval_modes,
        help="comma-separated: zero-shot, retrieval, self-correct (default: zero-shot)",
    )
    p.add_argument("--pool", help="retrieval mode: a run dir or pool file (opened read-only)")
    p.add_argument(
        "--rounds",
        type=at_least(1),
        default=1,
        help="self-correct: reflection rounds after the first attempt (default 1)",
    )
    p.add_argument("--k", type=at_least(1), default=4, help="samples per problem (default 4)")
    p.add_argument(
        "--temperature", type=at_least(0.0, float), default=0.7, help="sampling temperature; 0 = greedy (default 0.7)"
    )
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--max-new-tokens", type=at_least(1), default=512)
    p.add_argument("--batch-size", type=at_least(1), default=32, help="rows per generate call (default 32)")
    _extraction_arg(p)
    p.add_argument("--scorer", default=None, help="retrieval mode: relevance scorer (default: the pool run's)")
    p.add_argument("--gamma", type=unit_interval, default=None, help="retrieval mode: relevance threshold γ")
    p.add_argument("--top-k", type=at_least(1), default=None, help="retrieval mode: entries per prompt")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
        help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: GPU when present)")
    _backend_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=new_path("dir"), help="output directory (default: runs/eval-<time>)")
    p.set_defaults(func=cmd_eval)


def _data_field_args(p) -> None:
    p.add_argument("--data-dir", help="read presets and benchmarks from local files here (e.g. ../shared/data)")
    p.add_argument("--split", help="dataset split (default: eval the preset's own, sft-data its train split)")
    p.add_argument("--problem-field", help="field holding the problem text (default: problem/question/prompt)")
    p.add_argument("--answer-field", help="field holding the answer (default: answer/final_answer/solution)")
    p.add_argument("--id-field", help="field holding a problem id (default: id/unique_id/idx; else the row number)")
    p.add_argument(
        "--problem-template",
        help='build the problem from several fields, e.g. "{Body} {Question}" (field names match case-insensitively)',
    )
    p.add_argument(
        "--answer-format",
        choices=["plain", "gsm8k", "boxed"],
        help="how answers are written: plain, gsm8k ('#### N'), boxed (last \\boxed{} of a solution)",
    )


def _backend_arg(p) -> None:
    p.add_argument(
        "--backend",
        choices=["auto", "hf", "vllm"],
        default="auto",
        help="generation engine: hf (transformers generate), vllm, or auto (default: vllm when installed)",
    )


def load_for_generation(name: str, backend: str, dtype: str = "auto", device: str | None = None, seed: int = 0):
    """``(model, tokenizer)`` for generation: a transformers model, or a vLLM ``LLM`` (``--backend``)."""
    from lanpo.engine.generation import load_vllm, vllm_available
    from lanpo.engine.models import load_model, load_tokenizer, resolve_model_path

    if backend == "vllm" or (backend == "auto" and vllm_available()):
        path = resolve_model_path(name)
        return load_vllm(path, dtype=dtype, seed=seed), load_tokenizer(path)
    return load_model(name, dtype=dtype, device=device)


def _extraction_arg(p) -> None:
    p.add_argument(
        "--extraction",
        choices=["strict", "lenient"],
        help="answer extraction: strict (the final \\boxed{} only) or lenient (else 'the answer is X', else "
        "the last number not copied from the problem); default: lenient for the embedded "
        "smollm2-135m, which rarely boxes, strict for every other model",
    )


def _extraction(choice: str | None, model: str) -> str:
    from lanpo.engine.models import default_extraction

    return choice or default_extraction(model)


def _field_kwargs(args) -> dict:
    return {
        "data_dir": args.data_dir,
        "problem_field": args.problem_field,
        "answer_field": args.answer_field,
        "id_field": args.id_field,
        "answer_format": args.answer_format,
        "problem_template": args.problem_template,
    }


def _benchmarks() -> list[str]:
    from lanpo.data.presets import BENCHMARKS

    return list(BENCHMARKS) + ["builtin:arith"]


def cmd_eval(args) -> int:
    from lanpo.data.loaders import default_split, load_problems, split_specs
    from lanpo.engine.generation import is_vllm
    from lanpo.engine.models import check_model_name, size_cpu_threads
    from lanpo.eval.evaluate import EvalSettings, evaluate, settings_dict, write_results
    from lanpo.pool.store import ExperiencePool
    from lanpo.run.files import check_writable

    modes = args.modes
    if "retrieval" in modes and not args.pool:
        raise ValueError("--modes retrieval needs --pool RUN_OR_FILE (the experience pool to retrieve from).")
    if args.pool:  # a missing, corrupt or future-schema pool fails before the model loads
        ExperiencePool(args.pool, readonly=True).close()
    check_model_name(_model_path(args.model))
    if args.backend == "vllm" and "retrieval" in modes and (args.scorer or "") == "llm":
        raise ValueError("--scorer llm judges with a transformers model: use --backend hf for it.")
    specs = split_specs(args.benchmarks) if args.benchmarks else [args.data or "builtin:arith?split=test"]
    settings = EvalSettings(
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        extraction=_extraction(args.extraction, args.model),
        rounds=args.rounds,
        seed=args.seed,
    )
    out_root = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    check_writable(out_root, "--out")  # before the model loads and the evaluation runs
    size_cpu_threads()
    datasets = {}
    for spec in specs:  # load every data set first: a typo fails before the model loads
        datasets[spec] = load_problems(
            spec, split=args.split or default_split(spec), limit=args.limit, **_field_kwargs(args)
        )
    model, tokenizer = load_for_generation(_model_path(args.model), args.backend, args.dtype, args.device, args.seed)
    mode_kwargs = {}
    if "retrieval" in modes:
        from lanpo.eval.evaluate import retrieval_setup

        mode_kwargs = retrieval_setup(
            args.pool, scorer=args.scorer, gamma=args.gamma, top_k=args.top_k, model=model, tokenizer=tokenizer
        )
    for spec, problems in datasets.items():
        results = evaluate(model, tokenizer, problems, settings, modes, **mode_kwargs)
        out = out_root if len(datasets) == 1 else out_root / _slug(spec)
        header = {
            "model": args.model,
            "backend": "vllm" if is_vllm(model) else "hf",
            "data": spec,
            "data_dir": args.data_dir,
            "limit": args.limit,
            "settings": settings_dict(settings),
            "lanpo_version": __version__,
        }
        if "retrieval" in modes:
            header["retrieval"] = mode_kwargs["describe"]
        write_results(results, out, header)
        print((out / "results.md").read_text())
        print(f"Results and every completion: {out}")
    return 0


def _pool_parser(sub) -> None:
    p = sub.add_parser(
        "pool",
        help="inspect and move experience pools: stats, show, export, import",
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
    p.set_defaults(func=cmd_pool)


def cmd_pool(args) -> int:
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


def _compare_parser(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="compare runs (e.g. LANPO vs GRPO): markdown table and PNG plots",
        description="Tables and plots (accuracy per step, feedback vs scratch reward, pool growth) of "
        "several run directories, plus any evaluations stored in them.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (each with metrics.jsonl)")
    p.add_argument("--names", help="comma-separated display names (default: directory names)")
    p.add_argument("--out", type=new_path("dir"), help="output directory (default: runs/compare-<time>)")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    from lanpo.report.compare import compare

    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names and len(names) != len(args.runs):
        raise ValueError(f"--names gives {len(names)} names for {len(args.runs)} runs.")
    md = compare(args.runs, args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}", names)
    print(md.read_text())
    print(f"Written: {md} and {md.parent / 'compare.png'}")
    return 0


def _report_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="one self-contained HTML report of runs: curves, pool browser, rollouts, evals",
        description="Write RUN/report.html (or --out): training curves (runs overlaid), a pool browser "
        "with search, rollouts with their real prompts, and evaluation tables. The file "
        "works offline, opened from disk.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", type=new_path("file"), help="output file (default: the first RUN/report.html)")
    p.add_argument("--serve", action="store_true", help="then serve it on http://127.0.0.1:PORT (Ctrl-C stops)")
    p.add_argument("--port", type=at_least(0), default=8000, help="port for --serve (default 8000; 0: any free one)")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from lanpo.report.page import serve, write_report

    out = write_report(args.runs, args.out)
    print(f"Report: {out} ({out.stat().st_size / 1e6:.1f} MB; open it in a browser, no server needed)")
    if args.serve:
        serve(out, args.port)
    return 0


def _model_alias(argv: list[str]) -> list[str]:
    """``--model M`` is accepted for TRL's ``--model_name_or_path M``."""
    return [
        "--model_name_or_path"
        if a == "--model"
        else a.replace("--model=", "--model_name_or_path=", 1)
        if a.startswith("--model=")
        else a
        for a in argv
    ]


def cmd_train(args) -> int:
    from lanpo.commands.train import help_parser, run, train_help

    rest = getattr(args, "rest", [])
    if "--help-all" in rest:
        help_parser().print_help()
    elif "-h" in rest or "--help" in rest:
        print(train_help())
    else:
        run(_model_alias(rest))
        end_distributed()
    return 0


def cmd_sft(args) -> int:
    from lanpo.commands.sft import run_sft

    run_sft(_model_alias(getattr(args, "rest", [])))
    end_distributed()
    return 0


def end_distributed() -> None:
    """After a run that went well (never after an error: its barrier could wait forever), destroy the process
    group: a gloo process that exits with it alive can abort in shutdown (SIGABRT) and fail a finished run.

    A colocated vLLM engine holds groups of its own on that process group: they go first, through vLLM, or its
    exit hook would destroy them after the group is gone and print a traceback at the end of a finished run."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        vllm_state = sys.modules.get("vllm.distributed.parallel_state")
        if vllm_state is not None:
            vllm_state.destroy_model_parallel()
            vllm_state.destroy_distributed_environment()
        if dist.is_initialized():
            dist.destroy_process_group()


def _sft_data_parser(sub) -> None:
    p = sub.add_parser(
        "sft-data",
        help="build the SFT seeding examples (summarize, reflect, use feedback)",
        description="Build chat-format examples of LANPO's three skills from problems in --data, "
        "with a teacher model; answers are kept only when they verify (rejection "
        "sampling), summaries only when they parse. Resumable.",
    )
    p.add_argument(
        "--teacher",
        default="smollm2-135m",
        help="teacher model: hub id, local dir, .gguf, smollm2-135m (the policy itself), or the model "
        "name served at --teacher-url",
    )
    p.add_argument("--teacher-url", help="OpenAI-compatible endpoint (e.g. http://localhost:8000/v1 of a vLLM server)")
    p.add_argument("--api-key", help="bearer token for --teacher-url")
    p.add_argument("--data", default="builtin:arith", help="problems to build examples from (any data spec)")
    _data_field_args(p)
    p.add_argument("--limit", type=at_least(1), help="use only the first N problems")
    p.add_argument("--out", required=True, type=new_path("file"), help="output JSONL (appended to; resumable)")
    p.add_argument("--n", type=at_least(1), default=3000, help="examples to build in all (default 3000)")
    p.add_argument(
        "--mix", type=skill_mix, default=[1.0, 1.0, 1.0], help="shares of summarize,reflect,feedback (default 1,1,1)"
    )
    p.add_argument("--tries", type=at_least(1), default=4, help="teacher tries, then the example drops (default 4)")
    p.add_argument("--batch-size", type=at_least(1), default=16, help="problems per round (default 16)")
    p.add_argument("--temperature", type=at_least(0.0, float), default=0.7)
    p.add_argument("--max-new-tokens", type=at_least(1), default=384)
    _extraction_arg(p)
    _backend_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_sft_data)


def cmd_sft_data(args) -> int:
    from lanpo.commands.sft_data import EndpointTeacher, build_sft_data
    from lanpo.data.loaders import load_problems
    from lanpo.data.presets import training_split
    from lanpo.run.files import check_writable
    from lanpo.verify.rewards import MathVerifier

    mix = args.mix
    problems = load_problems(
        args.data, split=training_split(args.data, args.split), limit=args.limit, **_field_kwargs(args)
    )
    check_writable(Path(args.out).parent, "--out's folder")  # before the teacher loads
    if args.teacher_url:
        teacher = EndpointTeacher(
            args.teacher_url,
            args.teacher,
            temperature=args.temperature,
            max_tokens=args.max_new_tokens,
            api_key=args.api_key,
        )
    else:
        import torch

        from lanpo.engine.generation import HFGenerator

        torch.manual_seed(args.seed)
        model, tokenizer = load_for_generation(_model_path(args.teacher), args.backend, seed=args.seed)
        teacher = HFGenerator(
            model, tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=32
        )
    with MathVerifier(extraction=_extraction(args.extraction, args.teacher)) as verifier:
        report = build_sft_data(
            problems,
            teacher,
            args.out,
            n=args.n,
            mix=mix,
            tries=args.tries,
            batch_size=args.batch_size,
            verifier=verifier,
            teacher_name=args.teacher,
            seed=args.seed,
        )
    summary = report.as_dict()
    Path(args.out + ".report.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"Examples: {args.out} (report: {args.out}.report.json)")
    return 0


def _slug(spec: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)


def _model_path(name: str) -> str:
    """A run directory evaluates its final model (``RUN/final``) when given instead of a model."""
    path = Path(name)
    if (path / "final" / "config.json").is_file():
        return str(path / "final")
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lanpo", description="LANPO: language-and-numerical policy optimization for LLM reasoning, on top of TRL."
    )
    parser.add_argument("--version", action="version", version=f"lanpo {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "train",
        add_help=False,
        help="train with LANPO (GRPO + language feedback); "
        "`lanpo train --help` lists LANPO's fields, --help-all every field",
    ).set_defaults(func=cmd_train, accepts_rest=True)
    _sft_data_parser(sub)
    sub.add_parser(
        "sft",
        add_help=False,
        help="supervised fine-tuning on sft-data examples (TRL SFTTrainer); `lanpo sft --help` lists every field",
    ).set_defaults(func=cmd_sft, accepts_rest=True)
    _eval_parser(sub)
    _pool_parser(sub)
    _compare_parser(sub)
    _report_parser(sub)
    add_experiment_parser(sub, new_path)
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if rest and not getattr(args, "accepts_rest", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        args.rest = rest
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `lanpo ... | head`
        return 0
    except KeyboardInterrupt as interrupt:  # Ctrl-C: one line, where things stand (a run says how to go on)
        if args.verbose:
            raise
        print(f"lanpo {args.command}: interrupted{f': {interrupt}' if str(interrupt) else ''}", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - a command line shows a message, -v the traceback
        if args.verbose:
            raise
        known = isinstance(error, ValueError | OSError | RuntimeError | KeyError | ImportError)
        detail = str(error) if known else f"{type(error).__name__}: {error} (an unexpected error: -v shows where)"
        print(f"lanpo {args.command}: error: {detail}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
