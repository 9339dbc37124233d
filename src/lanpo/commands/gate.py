"""``lanpo gate``: before a scoring-route grid, does each context tell right plain rollouts from wrong ones when it
only scores them (:mod:`lanpo.eval.gate`)?"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from lanpo import __version__
from lanpo.commands.args import (
    at_least,
    data_field_args,
    extraction,
    extraction_arg,
    field_kwargs,
    model_path,
    new_path,
)
from lanpo.plan import SCORE_SOURCES as SOURCES  # the scoring contexts the route knows


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Sample k plain rollouts a problem, verify them, and read each under every context (gold "
        "answer, the first part of the worked solution, a right rollout of its group) and under a control (the "
        "same template showing another problem's): per context, the AUROC of each rollout's mean log-ratio "
        "against its reward (pooled and within groups), the mean log-ratio on right and wrong rollouts, and the "
        "share of it on the answer's own tokens. Run it before a feedback_route score grid.",
    )
    p.add_argument("--model", default="smollm2-135m", help="hub id, local dir, run dir, smollm2-135m (default)")
    p.add_argument("--data", default="builtin:arith?levels=1,2,3", help="data spec (default builtin:arith levels 1-3)")
    data_field_args(p)
    p.add_argument("--rollouts", type=at_least(2), default=512, help="plain rollouts in all (default 512)")
    p.add_argument("--k", type=at_least(2), default=8, help="rollouts a problem: a group (default 8)")
    p.add_argument(
        "--contexts",
        default=",".join(SOURCES),
        help="comma-separated, from gold, reference, sibling (default: all three)",
    )
    p.add_argument("--hint-level", type=at_least(1), default=2, help="reference: the hint level shown (default 2)")
    p.add_argument("--temperature", type=at_least(0.01, float), default=0.7)
    p.add_argument("--max-new-tokens", type=at_least(1), default=96)
    p.add_argument("--batch-size", type=at_least(1), default=32)
    extraction_arg(p)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=new_path("dir"), help="output directory (default: runs/gate-<time>)")
    p.set_defaults(func=command)


def command(args) -> int:
    import torch

    from lanpo.data.loaders import default_split, load_problems
    from lanpo.engine.generation import generate
    from lanpo.engine.models import check_model_name, load_model, size_cpu_threads
    from lanpo.eval.gate import GateSettings, markdown, run_gate
    from lanpo.plan import HINT_TOP
    from lanpo.run.files import check_writable, write_text_atomic
    from lanpo.verify.rewards import get_verifier

    sources = [s.strip() for s in args.contexts.split(",") if s.strip()]
    if not sources or any(s not in SOURCES for s in sources):
        raise ValueError(f"--contexts lists {', '.join(SOURCES)}; got {args.contexts!r}.")
    if args.hint_level > HINT_TOP:
        raise ValueError(f"--hint-level must be 1 to {HINT_TOP}, got {args.hint_level}.")
    problems_wanted = -(-args.rollouts // args.k)
    problems = load_problems(args.data, split=args.split or default_split(args.data), **field_kwargs(args))
    if "reference" in sources:
        problems = [p for p in problems if p.solution]
        if not problems:
            raise ValueError(f"{args.data}: --contexts reference shows worked solutions, and no problem has one.")
    problems = problems[:problems_wanted]
    out = Path(args.out or f"runs/gate-{time.strftime('%Y%m%d-%H%M%S')}")
    check_writable(out, "--out")
    check_model_name(model_path(args.model))
    size_cpu_threads()
    torch.manual_seed(args.seed)
    model, tokenizer = load_model(model_path(args.model), dtype=args.dtype, device=args.device)
    settings = GateSettings(
        k=args.k,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        extraction=extraction(args.extraction, args.model),
        level=args.hint_level,
    )
    verifier = get_verifier(extraction=settings.extraction)
    rollouts, results, seconds = run_gate(model, tokenizer, problems, verifier, sources, settings, generate)
    table = markdown(results, rollouts)
    out.mkdir(parents=True, exist_ok=True)
    header = {
        "model": args.model,
        "data": args.data,
        "problems": len(problems),
        "settings": asdict(settings),
        "seed": args.seed,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "lanpo_version": __version__,
    }
    write_text_atomic(
        out / "gate.json", json.dumps({**header, "results": [asdict(r) for r in results]}, indent=2) + "\n"
    )
    write_text_atomic(
        out / "rollouts.jsonl",
        "".join(json.dumps({"problem_id": r.problem_id, "right": r.right, "text": r.text}) + "\n" for r in rollouts),
    )
    write_text_atomic(out / "gate.md", f"# Scoring gate: {args.model} on {args.data}\n\n{table}\n")
    print(table)
    print(
        f"Sampling took {seconds['sampling']:.0f} s, the plain scoring pass {seconds['plain_scoring']:.0f} s. Results: {out}"
    )
    return 0
