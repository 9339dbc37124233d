"""What the commands share to read a command line: TRL's parser over dataclasses with a YAML config underneath,
the value types of argparse flags, and the checks that name a bad value before anything loads."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path
from types import UnionType as _UnionType

# -- argument types: a bad value is refused while parsing, naming the flag and the value, before any model loads --


def finite_number(text: str, kind=float):
    """``text`` as a finite ``kind`` (int or float): nan, inf and words are refused, naming the value."""
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def at_least(minimum: float, kind=int):
    def parse(text: str):
        value = finite_number(text, kind)
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
    value = finite_number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def port(text: str) -> int:
    """A TCP port, or 0 for any free one."""
    value = at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, got {text}")
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
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"a mode is named twice in {text!r}")
    return modes


def skill_mix(text: str) -> list[float]:
    try:
        mix = [finite_number(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected three finite numbers like 1,1,1, got {text!r}") from None
    if len(mix) != 3 or any(m < 0 for m in mix) or not sum(mix):
        raise argparse.ArgumentTypeError(f"needs three non-negative shares (summarize,reflect,feedback), got {text!r}")
    return mix


# -- flags several commands share ---------------------------------------------------------------------------


def data_field_args(p) -> None:
    p.add_argument("--data-dir", help="read presets and benchmarks from local files here (e.g. ../shared/data)")
    p.add_argument("--split", help="dataset split (default: eval the preset's own, sft-data its train split)")
    p.add_argument("--problem-field", help="field holding the problem text (default: problem/question/prompt)")
    p.add_argument("--answer-field", help="field holding the answer (default: answer/final_answer/solution)")
    p.add_argument("--id-field", help="field holding a problem id (default: id/unique_id/idx; else the row number)")
    p.add_argument(
        "--solution-field",
        help="field holding a worked solution, for the privileged feedback sources and probe modes (default: "
        "solution/rationale/explanation; GSM8K's rationale before ####)",
    )
    p.add_argument(
        "--problem-template",
        help='build the problem from several fields, e.g. "{Body} {Question}" (field names match case-insensitively)',
    )
    p.add_argument(
        "--answer-format",
        choices=["plain", "gsm8k", "boxed"],
        help="how answers are written: plain, gsm8k ('#### N'), boxed (last \\boxed{} of a solution)",
    )


def backend_arg(p) -> None:
    p.add_argument(
        "--backend",
        choices=["auto", "hf", "vllm"],
        default="auto",
        help="generation engine: hf (transformers generate), vllm, or auto (default: vllm when installed)",
    )


def extraction_arg(p) -> None:
    p.add_argument(
        "--extraction",
        choices=["strict", "lenient"],
        help="answer extraction: strict (the final \\boxed{} only) or lenient (else 'the answer is X', else "
        "the last number not copied from the problem); default: lenient for the embedded "
        "smollm2-135m, which rarely boxes, strict for every other model",
    )


def extraction(choice: str | None, model: str) -> str:
    from lanpo.engine.models import default_extraction

    return choice or default_extraction(model)


def field_kwargs(args) -> dict:
    return {
        "data_dir": args.data_dir,
        "problem_field": args.problem_field,
        "answer_field": args.answer_field,
        "id_field": args.id_field,
        "answer_format": args.answer_format,
        "problem_template": args.problem_template,
        "solution_field": args.solution_field,
    }


def model_path(name: str) -> str:
    """A run directory evaluates its final model (``RUN/final``) when given instead of a model."""
    path = Path(name)
    if (path / "final" / "config.json").is_file():
        return str(path / "final")
    return name


def model_alias(argv: list[str]) -> list[str]:
    """``--model M`` is accepted for TRL's ``--model_name_or_path M``."""
    return [
        "--model_name_or_path"
        if a == "--model"
        else a.replace("--model=", "--model_name_or_path=", 1)
        if a.startswith("--model=")
        else a
        for a in argv
    ]


# -- TRL's parser, for train and sft --------------------------------------------------------------------------


def flag_value(argv: list[str], name: str) -> str | None:
    """The value a command line gives field ``name`` (``--name V``, ``--name=V``, dashes or underscores)."""
    for i, arg in enumerate(argv):
        flag, _, inline = arg.partition("=")
        if not flag.startswith("--") or flag[2:].replace("-", "_") != name:
            continue
        if "=" in arg:
            return inline
        return argv[i + 1] if i + 1 < len(argv) else None
    return None


def check_value_types(values: dict, dataclass_types: tuple, where: str) -> None:
    """A YAML value of the wrong kind for its field (a list, a mapping or null where a number, a flag or a word
    goes) fails here, naming the field, instead of as a bare TypeError deep in a dataclass."""
    import typing

    hints: dict = {}
    for cls in dataclass_types:
        try:
            hints.update(typing.get_type_hints(cls))
        except Exception:  # noqa: BLE001 - a hint that does not resolve is not checked
            continue
    for name, value in values.items():
        hint = hints.get(name)
        if hint is None:
            continue
        allowed = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, _UnionType) else {hint}
        origins = {typing.get_origin(a) or a for a in allowed}
        literal = typing.Literal in origins
        scalar = origins <= {int, float, bool, str, type(None), typing.Literal}
        if not scalar:
            continue
        if value is None and type(None) not in origins:
            raise ValueError(f"{where}: {name} is empty (null); it needs a value.")
        if isinstance(value, list | dict) and not literal:
            kind = "a list" if isinstance(value, list) else "a mapping"
            wanted = " or ".join(sorted(t.__name__ for t in origins if t is not type(None)))
            raise ValueError(f"{where}: {name} is {kind} ({value!r}); it takes one {wanted}.")
        if isinstance(value, list | dict) and literal:
            raise ValueError(
                f"{where}: {name} is {'a list' if isinstance(value, list) else 'a mapping'} "
                f"({value!r}); it takes one of its choices."
            )


NEGATIVE_VALUE = re.compile(r"-(?:inf|nan|\d|\.\d)", re.IGNORECASE)  # -inf, -Infinity, -nan, -1e300, -.5


def joined_negative_values(argv: list[str]) -> list[str]:
    """``--flag -inf`` as ``--flag=-inf``: argparse takes a value that starts with a dash for the next option
    unless it reads as a plain negative number, and would answer ``-inf`` or ``-1e300`` with "expected one
    argument" instead of the field's own check."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_VALUE.match(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def parse_command_line(dataclass_types: tuple, defaults: dict, argv: list[str]):
    """TRL's parser over ``dataclass_types`` (``--config FILE.yaml`` plus flags), with ``defaults`` underneath.

    On a machine without a GPU the run defaults to the CPU in fp32; with one, to bf16 and gradient
    checkpointing. ``train`` and ``sft`` both parse their command lines here.
    """
    import torch
    import yaml
    from trl import TrlParser

    path = flag_value(argv, "config")  # a config that is missing or not YAML fails with a message, not a traceback
    if path is not None:
        from pathlib import Path

        if not Path(path).is_file():
            raise FileNotFoundError(f"--config {path}: no such file.")
        from lanpo.data.loaders import read_text

        try:
            loaded = yaml.safe_load(read_text(path, f"--config {path}"))
        except yaml.YAMLError as error:
            raise ValueError(f"--config {path} is not valid YAML: {error}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {path} must hold a mapping of field: value, not {type(loaded).__name__}.")
        check_value_types(loaded, dataclass_types, f"--config {path}")
    argv = joined_negative_values(argv)
    parser = TrlParser(dataclass_types)
    defaults = dict(defaults)
    if torch.cuda.is_available():
        defaults.update(bf16=True, gradient_checkpointing=True)
    else:
        defaults.update(use_cpu=True, bf16=False)
    unknown = parser.set_defaults_with_config(**defaults)
    if unknown:
        raise RuntimeError(f"lanpo's defaults name unknown fields: {unknown}")
    parsed = parser.parse_args_and_config(argv)
    from lanpo.config import check_finite, check_float_ranges

    for settings in parsed:
        if dataclasses.is_dataclass(settings):
            check_finite(settings)
            check_float_ranges(settings)
    return parsed
