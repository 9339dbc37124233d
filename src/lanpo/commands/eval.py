"""``lanpo eval``: mean@k / pass@k of a model on data sets, in the zero-shot, retrieval, self-correct and
execution modes (the evaluation itself is :mod:`lanpo.eval.evaluate`)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from lanpo import __version__
from lanpo.commands.args import (
    at_least,
    backend_arg,
    data_field_args,
    eval_modes,
    extraction,
    extraction_arg,
    field_kwargs,
    model_path,
    new_path,
    probability,
    unit_interval,
)
from lanpo.commands.common import slug


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Sample k completions per problem and report accuracy mean@k (± standard error), "
        "pass@k, mean length and truncation rate; every completion is saved.",
    )
    p.add_argument("--model", default="smollm2-135m", help="hub id, local dir, .gguf, run dir, smollm2-135m (default)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--data",
        help="data spec: builtin:arith?split=test, builtin:code?split=test, humaneval, a preset, a "
        ".jsonl/.json/.parquet file (rows with tests are code), or a hub name (default: builtin:arith?split=test)",
    )
    src.add_argument("--benchmarks", help="comma-separated benchmark names: " + ", ".join(_benchmarks()))
    data_field_args(p)
    p.add_argument("--limit", type=at_least(1), help="evaluate only the first N problems of each data set")
    p.add_argument(
        "--modes",
        default=["zero-shot"],
        type=eval_modes,
        help="comma-separated: zero-shot, retrieval, self-correct, execution (code: self-correct shown what the last "
        "attempt did on the examples the problem shows); and the privileged lift probe, reference, gold, "
        "self-hint (training-only contexts from worked solutions and gold answers, labelled, never a test score; "
        "every mode then runs on the problems that have a worked solution) (default: zero-shot)",
    )
    p.add_argument(
        "--hint-level",
        type=at_least(1),
        default=1,
        help="reference, self-hint: the hint level shown, 1 to 3 (1/4, 1/2, 3/4 of the solution's steps; default 1)",
    )
    p.add_argument("--pool", help="retrieval mode: a run dir or pool file (opened read-only)")
    p.add_argument(
        "--rounds",
        type=at_least(1),
        default=1,
        help="self-correct, execution: rounds of feedback after the first attempt (default 1)",
    )
    p.add_argument("--k", type=at_least(1), default=4, help="samples per problem (default 4)")
    p.add_argument(
        "--temperature", type=at_least(0.0, float), default=0.7, help="sampling temperature; 0 = greedy (default 0.7)"
    )
    p.add_argument("--top-p", type=probability, default=1.0)
    p.add_argument("--max-new-tokens", type=at_least(1), default=512)
    p.add_argument("--batch-size", type=at_least(1), default=32, help="rows per generate call (default 32)")
    extraction_arg(p)
    p.add_argument(
        "--code-timeout",
        type=at_least(0.1, float),
        default=5.0,
        help="code problems: wall-clock seconds one sandboxed run of a completion against its tests may take",
    )
    p.add_argument("--code-workers", type=at_least(1), default=2, help="code problems: sandboxes run at once")
    p.add_argument(
        "--allow-unsandboxed-code",
        action="store_true",
        help="run model-written code WITHOUT bubblewrap when it is missing: NO security boundary (it can read and "
        "write your files and reach the network)",
    )
    p.add_argument("--scorer", default=None, help="retrieval mode: relevance scorer (default: the pool run's)")
    p.add_argument("--gamma", type=unit_interval, default=None, help="retrieval mode: relevance threshold γ")
    p.add_argument("--top-k", type=at_least(1), default=None, help="retrieval mode: entries per prompt")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"],
        help="auto (HF: fp32 on CPU, bf16 on GPU; vLLM: its own choice, bf16 on CPU), float32, bfloat16, float16",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: GPU when present)")
    backend_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=new_path("dir"), help="output directory (default: runs/eval-<time>)")
    p.set_defaults(func=command)


def _benchmarks() -> list[str]:
    from lanpo.data.presets import BENCHMARKS

    return list(BENCHMARKS) + ["builtin:arith", "builtin:code", "humaneval"]


def command(args) -> int:
    from lanpo.data.loaders import default_split, load_problems, split_specs
    from lanpo.engine.generation import is_vllm, load_for_generation
    from lanpo.engine.models import check_model_name, size_cpu_threads, weights_on_disk
    from lanpo.eval.evaluate import PRIVILEGED_MODES, EvalSettings, evaluate, settings_dict, write_results
    from lanpo.plan import HINT_TOP
    from lanpo.pool.store import ExperiencePool
    from lanpo.run.files import check_writable
    from lanpo.verify.code import CodeVerifier, code_settings, fit_code_workers

    modes = args.modes
    probe = [m for m in modes if m in PRIVILEGED_MODES]
    if args.hint_level > HINT_TOP:
        raise ValueError(f"--hint-level must be 1 to {HINT_TOP}, got {args.hint_level}.")
    if "retrieval" in modes and not args.pool:
        raise ValueError("--modes retrieval needs --pool RUN_OR_FILE (the experience pool to retrieve from).")
    if args.pool:  # a missing, corrupt or future-schema pool fails before the model loads
        ExperiencePool(args.pool, readonly=True).close()
    check_model_name(model_path(args.model))
    if args.backend == "vllm" and "retrieval" in modes and (args.scorer or "") == "llm":
        raise ValueError("--scorer llm judges with a transformers model: use --backend hf for it.")
    specs = split_specs(args.benchmarks) if args.benchmarks else [args.data or "builtin:arith?split=test"]
    settings = EvalSettings(
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        extraction=extraction(args.extraction, args.model),
        rounds=args.rounds,
        seed=args.seed,
        hint_level=args.hint_level,
        code=code_settings(args),
    )
    out_root = Path(args.out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}")
    check_writable(out_root, "--out")  # before the model loads and the evaluation runs
    size_cpu_threads()
    datasets = {}
    for spec in specs:  # load every data set first: a typo fails before the model loads
        problems = load_problems(spec, split=args.split or default_split(spec), limit=args.limit, **field_kwargs(args))
        if set(probe) - {"gold"}:  # every mode on the same problems: those a worked solution can be shown for
            problems = [p for p in problems if p.solution]
            if not problems:
                raise ValueError(
                    f"{spec}: --modes {','.join(probe)} shows worked solutions, and no problem has one "
                    "(--solution-field NAME names the field)."
                )
        datasets[spec] = problems
    if any(p.gold_kind == "code" for problems in datasets.values() for p in problems):
        CodeVerifier(settings.code).close()  # no sandbox, no evaluation: said here, before the model loads
        workers = fit_code_workers(settings.code.workers, weights_on_disk(model_path(args.model)), 1)
        settings = replace(settings, code=replace(settings.code, workers=workers))
    model, tokenizer = load_for_generation(model_path(args.model), args.backend, args.dtype, args.device, args.seed)
    mode_kwargs = {}
    if "retrieval" in modes:
        from lanpo.eval.evaluate import retrieval_setup

        mode_kwargs = retrieval_setup(
            args.pool, scorer=args.scorer, gamma=args.gamma, top_k=args.top_k, model=model, tokenizer=tokenizer
        )
    for spec, problems in datasets.items():
        results = evaluate(model, tokenizer, problems, settings, modes, **mode_kwargs)
        out = out_root if len(datasets) == 1 else out_root / slug(spec)
        header = {
            "model": args.model,
            "backend": "vllm" if is_vllm(model) else "hf",
            "data": spec,
            "data_dir": args.data_dir,
            "limit": args.limit,
            "settings": settings_dict(settings),
            "privileged_modes": probe,
            "lanpo_version": __version__,
        }
        if "retrieval" in modes:
            header["retrieval"] = mode_kwargs["describe"]
        write_results(results, out, header)
        print((out / "results.md").read_text())
        print(f"Results and every completion: {out}")
    return 0
