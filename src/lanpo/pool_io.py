"""Moving experience pools between runs and versions: JSONL export and import (``lanpo pool export|import``).

An export is one header line, then one line per entry and per attempt. It is written under a temporary name and
renamed when complete, and never over the pool it reads. An import adds every usable line and reports the others
by line number and reason; nothing is half-imported (entries and attempts go in with the pool's transactions).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .pool import SCHEMA_VERSION, Attempt, ExperiencePool, PoolEntry, PoolError, is_sqlite_file

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
        for entry in pool.iter_entries():
            data = entry.to_dict()
            data.pop("id")
            handle.write(json.dumps({"type": "entry", **data}, ensure_ascii=False) + "\n")
            lines += 1
        for row in pool.conn.execute("SELECT problem_id, problem, text, step, created FROM attempts ORDER BY id"):
            handle.write(json.dumps({"type": "attempt", **dict(zip(
                ("problem_id", "problem", "text", "step", "created"), row))}, ensure_ascii=False) + "\n")
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
    return Attempt(problem_id=str(data["problem_id"]), problem=str(data["problem"]), text=str(data["text"]),
                   step=int(step), created=float(created))


def check_export(path: str | Path) -> Path:
    """``path`` as an export to import: it exists and is not a pool (two arguments swapped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No export to import at {path}.")
    if is_sqlite_file(path):
        raise PoolError(f"{path} is a pool, not a JSONL export (were the two arguments swapped?).")
    return path


def import_jsonl(pool: ExperiencePool, path: str | Path, batch: int = 5000) -> dict:
    """Add the entries and attempts of an export to ``pool``. Returns counts and the bad lines with reasons."""
    path = check_export(path)
    counts: dict = {"entries": 0, "attempts": 0, "skipped": 0, "bad_lines": []}
    entries: list[PoolEntry] = []
    attempts: list[Attempt] = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                kind = data.pop("type", "entry")
                if kind == "header":
                    version = data.get("schema_version", SCHEMA_VERSION)
                    if isinstance(version, int) and version > SCHEMA_VERSION:
                        raise PoolError(f"{path} was exported by a newer pool schema ({version}); upgrade lanpo.")
                    continue
                if kind == "attempt":
                    attempts.append(_attempt(data))
                elif kind == "entry":
                    data.pop("id", None)
                    entries.append(PoolEntry.from_dict(data))
                else:
                    raise ValueError(f"unknown type {kind!r}")
            except (ValueError, TypeError, json.JSONDecodeError) as error:
                counts["skipped"] += 1
                if len(counts["bad_lines"]) < MAX_REPORTED:
                    counts["bad_lines"].append(f"line {number}: {error}")
                continue
            if len(entries) >= batch:
                counts["entries"] += len(pool.add(entries))
                entries = []
    counts["entries"] += len(pool.add(entries))
    pool.add_attempts(attempts)
    counts["attempts"] = len(attempts)
    return counts
