"""Write the references that are generated from the code: ``python docs/generate.py`` (``make docs``).

* ``docs/reference/config.md``: every field of ``LanpoConfig`` (LANPO's own first, then those inherited from TRL's
  ``GRPOConfig``) and of ``lanpo train``'s ``TrainArguments``, with its default and help;
* ``docs/reference/metrics.md``: every metric lanpo logs beside TRL's (``lanpo.run.metrics.METRICS``).

``tests/test_docs.py`` fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "reference"


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    value = getattr(value, "value", value)  # enums
    return f"`{value!r}`" if value not in ("", None) else f"`{value!r}`"


def _help(f: dataclasses.Field) -> str:
    return " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")


def _table(fields: list[dataclasses.Field]) -> list[str]:
    rows = ["| field | default | meaning |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {_default(f)} | {_help(f)} |" for f in fields]
    return rows


def config_reference() -> str:
    import trl
    from trl import GRPOConfig

    from lanpo.commands.train import TrainArguments
    from lanpo.config import LanpoConfig

    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    own = [f for f in dataclasses.fields(LanpoConfig) if f.name not in inherited and f.init]
    trl_fields = [
        f for f in dataclasses.fields(LanpoConfig) if f.name in inherited and f.init and not f.name.startswith("_")
    ]
    lines = [
        "# Configuration reference",
        "",
        "Generated from the code by `python docs/generate.py` (`make docs`); `tests/test_docs.py` keeps it in step.",
        "Every field is a flag of `lanpo train` (`--name value`) and a key of its YAML config. The embedded",
        "default (`lanpo train` with no config and no model) overrides some of them:",
        "`lanpo.commands.train.EMBEDDED_DEFAULTS`.",
        "",
        "## LANPO's fields (`lanpo.config.LanpoConfig`)",
        "",
        *_table(own),
        "",
        "## `lanpo train`'s data and run fields (`lanpo.commands.train.TrainArguments`)",
        "",
        *_table(list(dataclasses.fields(TrainArguments))),
        "",
        f"## Inherited from TRL's `GRPOConfig` ({len(trl_fields)} fields, TRL {trl.__version__})",
        "",
        *_table(trl_fields),
        "",
    ]
    return "\n".join(lines)


def metrics_reference() -> str:
    from lanpo.run.metrics import METRICS

    lines = [
        "# Metrics reference",
        "",
        "Generated from `lanpo.run.metrics.METRICS` by `python docs/generate.py`; `tests/test_docs.py` checks that a",
        "run logs no lanpo metric missing here. TRL's own (`loss`, `reward`, `kl`, `entropy`, `grad_norm`,",
        "`completions/*`, `clip_ratio/*`, `sampling/*`) are logged as TRL documents them; `kl` is the mean over every",
        "token of the KL term applied. `<x>` stands for a part that varies. Every step's values are in the run's",
        "`metrics.jsonl`.",
        "",
        "| metric | meaning |",
        "|---|---|",
        *[f"| `{name}` | {meaning} |" for name, meaning in METRICS.items()],
        "",
    ]
    return "\n".join(lines)


PAGES = {"config.md": config_reference, "metrics.md": metrics_reference}


def main() -> None:
    REFERENCE.mkdir(exist_ok=True)
    for name, render in PAGES.items():
        (REFERENCE / name).write_text(render())
        print(f"wrote {REFERENCE / name}")


if __name__ == "__main__":
    main()
