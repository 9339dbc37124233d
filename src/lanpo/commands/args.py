"""What the commands share to read a command line: TRL's parser over dataclasses with a YAML config underneath,
the value types of argparse flags, and the checks that name a bad value before anything loads."""

from __future__ import annotations

from types import UnionType as _UnionType


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
    parser = TrlParser(dataclass_types)
    defaults = dict(defaults)
    if torch.cuda.is_available():
        defaults.update(bf16=True, gradient_checkpointing=True)
    else:
        defaults.update(use_cpu=True, bf16=False)
    unknown = parser.set_defaults_with_config(**defaults)
    if unknown:
        raise RuntimeError(f"lanpo's defaults name unknown fields: {unknown}")
    return parser.parse_args_and_config(argv)
