"""The ``lanpo`` command: a dispatcher. Each command's flags and body live in its own module of
:mod:`lanpo.commands` (``add_parser(sub, name, help)`` and ``command(args)``), imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings

from lanpo import __version__

# Every command: its module and its line in `lanpo --help`.
COMMANDS = {
    "train": (
        "lanpo.commands.train",
        "train with LANPO (GRPO + language feedback); `lanpo train --help` lists LANPO's fields, --help-all every "
        "field",
    ),
    "sft-data": ("lanpo.commands.sft_data", "build the SFT seeding examples (summarize, reflect, use feedback)"),
    "sft": (
        "lanpo.commands.sft",
        "supervised fine-tuning on sft-data examples (TRL SFTTrainer); `lanpo sft --help` lists every field",
    ),
    "eval": ("lanpo.commands.eval", "evaluate a model: mean@k / pass@k in zero-shot, retrieval and self-correct modes"),
    "gate": (
        "lanpo.commands.gate",
        "before a feedback_route score grid: does a context tell right rollouts from wrong when it only scores them",
    ),
    "pool": ("lanpo.commands.pool", "inspect, audit and move experience pools: stats, show, audit, export, import"),
    "compare": ("lanpo.commands.compare", "compare runs (e.g. LANPO vs GRPO): markdown table and PNG plots"),
    "report": (
        "lanpo.commands.report",
        "one self-contained HTML report of runs: curves, pool browser, rollouts, evals",
    ),
    "experiment": (
        "lanpo.experiments.command",
        "a grid of arms x seeds from one base config, resumable; one results table",
    ),
}


# Commands that may load a model and run it in bf16: they check LANPO_BF16_MATMUL when they start, on every CPU.
MODEL_COMMANDS = ("train", "sft-data", "sft", "eval", "gate", "experiment")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lanpo", description="LANPO: language-and-numerical policy optimization for LLM reasoning, on top of TRL."
    )
    parser.add_argument("--version", action="version", version=f"lanpo {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    if chosen in MODEL_COMMANDS:  # before its flags are read, on every CPU
        from lanpo.engine.bf16_env import setting

        try:
            setting()
        except ValueError as error:
            print(f"lanpo {chosen}: error: {error}", file=sys.stderr)
            return 2
    for name, (module, line) in COMMANDS.items():
        if name == chosen:  # only the command at hand is imported: `lanpo pool stats` loads no torch
            importlib.import_module(module).add_parser(sub, name, line)
        else:
            sub.add_parser(name, help=line, add_help=False)
    args, rest = parser.parse_known_args(argv)
    # Deprecations inside transformers and TRL (renamed fields and methods they still use themselves): nothing a
    # user of the command line can act on, so they do not go between the progress bar and the step lines.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|trl)(\.|$)")
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
