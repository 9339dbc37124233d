"""Moving experience pools between runs and versions: JSONL export and import (``lanpo pool export|import``).

An export is one header line, then one line per entry (with its worth record, when it was ever shown:
:mod:`lanpo.pool.worth`), per attempt and per problem's reflection worth. It is written under a temporary name and
renamed when complete, and never over the pool it reads. An import adds every usable line and reports the others
by line number and reason; nothing is half-imported (entries and attempts go in with the pool's transactions).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import NamedTuple

from lanpo.pool.store import SCHEMA_VERSION, Attempt, ExperiencePool, PoolEntry, PoolError, is_sqlite_file
from lanpo.pool.worth import Worth

MAX_REPORTED = 20  # bad lines listed by number in an import report; the rest are only counted


def export_jsonl(pool: ExperiencePool, path: str | Path) -> int:
    """Write ``pool`` to ``path`` as JSONL; returns the number of lines."""
    path = Path(path)
    if pool.path is not None and path.exists() and path.resolve() == pool.path.resolve():
        raise PoolError(f"Refusing to export {pool.path} onto itself: name another file for the export.")
    if path.is_dir():
        raise PoolError(f"{path} is a directory: name a .jsonl file for the export.")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    lines = 0
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps({"type": "header", "schema_version": SCHEMA_VERSION, "format": "lanpo-pool"}) + "\n")
        lines += 1
        records = pool.entry_worth()
        for entry in pool.iter_entries():
            data = entry.to_dict()
            if entry.id in records:
                data["worth"] = asdict(records[entry.id])
            data.pop("id")
            handle.write(json.dumps({"type": "entry", **data}, ensure_ascii=False) + "\n")
            lines += 1
        for problem_id, record in pool.reflection_worth().items():
            handle.write(json.dumps({"type": "reflection_worth", "problem_id": problem_id, **asdict(record)}) + "\n")
            lines += 1
        for row in pool.conn.execute("SELECT problem_id, problem, text, step, created FROM attempts ORDER BY id"):
            handle.write(
                json.dumps(
                    {"type": "attempt", **dict(zip(("problem_id", "problem", "text", "step", "created"), row))},
                    ensure_ascii=False,
                )
                + "\n"
            )
            lines += 1
    os.replace(tmp, path)
    return lines


def _attempt(data: dict) -> Attempt:
    missing = {"problem_id", "problem", "text"} - set(data)
    if missing:
        raise ValueError(f"missing field(s) {sorted(missing)}")
    step, created = data.get("step", 0), data.get("created", time.time())
    for name, value in (("step", step), ("created", created)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"field {name!r} must be a number, got {value!r}")
    return Attempt(
        problem_id=str(data["problem_id"]),
        problem=str(data["problem"]),
        text=str(data["text"]),
        step=int(step),
        created=float(created),
    )


def check_export(path: str | Path) -> Path:
    """``path`` as an export to import: it exists and is not a pool (two arguments swapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No export to import at {path}.")
    if is_sqlite_file(path):
        raise PoolError(f"{path} is a pool, not a JSONL export (were the two arguments swapped?).")
    return path


def _worth(data: dict) -> Worth:
    """A worth record of an export line: every field a finite number of its kind."""
    if not isinstance(data, dict):
        raise ValueError("worth must be an object")
    values = {}
    for f in fields(Worth):
        value = data.get(f.name, f.default)
        whole = f.name in ("uses", "credited", "last_step")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"worth field {f.name!r} must be a finite number, got {value!r}")
        if whole and value != int(value):
            raise ValueError(f"worth field {f.name!r} must be a whole number, got {value!r}")
        values[f.name] = int(value) if whole else float(value)
    return Worth(**values)


class Export(NamedTuple):
    """An export's content, every line checked (:func:`read_export`)."""

    entries: list[PoolEntry]
    attempts: list[Attempt]
    worth: list[Worth | None]  # one per entry: its worth record, None where it was never shown
    reflection_worth: dict[str, Worth]  # problem id -> the reflection rows' record

    def counts(self) -> dict[str, int]:
        """What an import of it adds, by kind (``lanpo pool import`` prints this)."""
        return {
            "entries": len(self.entries),
            "attempts": len(self.attempts),
            "entry_worth": sum(w is not None for w in self.worth),
            "reflection_worth": len(self.reflection_worth),
        }


def read_export(path: str | Path) -> Export:
    """Every entry, attempt and worth record of an export, checked: a bad line (not JSON, not UTF-8, a missing or
    mistyped field, an unknown type, a newer schema) raises :class:`PoolError` naming the lines, so an import is all
    or nothing. An export with none of them is refused (nothing to import)."""
    path = check_export(path)
    entries: list[PoolEntry] = []
    attempts: list[Attempt] = []
    records: list[Worth | None] = []
    reflections: dict[str, Worth] = {}
    bad: list[str] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                kind = data.pop("type", "entry")
                if kind == "header":
                    version = data.get("schema_version", SCHEMA_VERSION)
                    if isinstance(version, int) and version > SCHEMA_VERSION:
                        raise PoolError(
                            f"{path} line {number}: exported by a newer pool schema ({version}); "
                            "upgrade lanpo to import it. Nothing was imported."
                        )
                    continue
                if kind == "attempt":
                    attempts.append(_attempt(data))
                elif kind == "entry":
                    data.pop("id", None)
                    record = _worth(data.pop("worth")) if "worth" in data else None
                    entries.append(PoolEntry.from_dict(data))
                    records.append(record)
                elif kind == "reflection_worth":
                    problem_id = data.pop("problem_id", None)
                    if not isinstance(problem_id, str):
                        raise ValueError("a reflection_worth line needs its problem_id")
                    reflections[problem_id] = _worth(data)
                else:
                    raise ValueError(f"unknown type {kind!r}")
            except UnicodeDecodeError as error:
                bad.append(f"line {number}: not UTF-8 (byte {error.start})")
            except (ValueError, TypeError) as error:
                bad.append(f"line {number}: {error}")
    if bad:
        shown = "; ".join(bad[:MAX_REPORTED]) + (
            f"; and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
        )
        raise PoolError(f"{path}: {len(bad)} bad line(s), nothing imported (an import is all or nothing): {shown}")
    if not entries and not attempts and not reflections:
        raise PoolError(f"{path} holds no entry, no attempt and no worth record: nothing to import.")
    return Export(entries, attempts, records, reflections)


def import_export(pool: ExperiencePool, export: Export) -> dict[str, int]:
    """Add everything ``export`` holds (entries with their worth records, attempts, reflection records) to ``pool``
    in one transaction, or nothing. Returns :meth:`Export.counts`. The one way in: ``lanpo pool import`` and
    :func:`import_jsonl` both come here."""
    pool.add(export.entries, attempts=export.attempts, worth=export.worth, reflection_worth=export.reflection_worth)
    return export.counts()


def import_jsonl(pool: ExperiencePool, path: str | Path) -> dict[str, int]:
    """Read the export at ``path`` (:func:`read_export`) and import it into ``pool`` (:func:`import_export`)."""
    return import_export(pool, read_export(path))
