"""The pool loses nothing and mixes nothing up (issue 12): concurrent writers, kills of a writer and of creation,
read-only opens that leave nothing behind, integrity, import and export."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lanpo.pool import APPLICATION_ID, ExperiencePool, PoolEntry, PoolError
from lanpo.pool_io import export_jsonl, import_jsonl

WRITER = """
import json, sys
from lanpo.pool import ExperiencePool, PoolEntry
path, name, batches, size, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
pool = ExperiencePool(path)
record = open(out, "w") if out != "-" else None
for b in range(batches):
    entries = [PoolEntry(f"{name}-{b}-{i}", "q", "f", [f"{name}:{b}:{i}"], []) for i in range(size)]
    ids = pool.add(entries)
    if record:
        record.write(json.dumps([[e.principles[0], i] for e, i in zip(entries, ids)]) + "\\n")
        record.flush()
"""


def _writer(tmp_path: Path, path: Path, name: str, batches: int, size: int, record: bool) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    if not script.exists():  # written once: rewriting it while a started writer reads it ran an empty script
        script.write_text(WRITER)
    out = str(tmp_path / f"{name}.jsonl") if record else "-"
    return subprocess.Popen([sys.executable, str(script), str(path), name, str(batches), str(size), out],
                            stderr=subprocess.PIPE, text=True)


def test_concurrent_writers_lose_nothing_and_every_id_is_their_own(tmp_path):
    path = tmp_path / "pool.sqlite"
    ExperiencePool(path).close()
    writers = [_writer(tmp_path, path, f"w{k}", 200, 3, True) for k in range(4)]
    errors = [w.communicate(timeout=300)[1] for w in writers]
    assert all(w.returncode == 0 for w in writers), [e[-2000:] for e in errors if e]
    for k in range(4):  # every writer wrote every batch (an empty script would also exit 0)
        assert len((tmp_path / f"w{k}.jsonl").read_text().splitlines()) == 200
    with ExperiencePool(path, readonly=True) as pool:
        by_id = {e.id: e.principles[0] for e in pool.entries()}
    assert len(by_id) == 4 * 200 * 3
    for k in range(4):
        for line in (tmp_path / f"w{k}.jsonl").read_text().splitlines():
            for text, entry_id in json.loads(line):
                assert by_id[entry_id] == text  # the id add() returned is the entry this writer inserted


def test_random_kills_of_a_writer_never_leave_half_a_batch(tmp_path):
    path = tmp_path / "pool.sqlite"
    rng = random.Random(0)
    for kill in range(8):
        writer = _writer(tmp_path, path, f"k{kill}", 10_000, 5, False)
        time.sleep(rng.uniform(1.0, 2.5))  # start-up, then a random moment in the middle of writing
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        with ExperiencePool(path, readonly=True) as pool:
            sizes: dict[str, int] = {}
            for entry in pool.entries():
                batch = entry.problem_id.rsplit("-", 1)[0]
                sizes[batch] = sizes.get(batch, 0) + 1
        assert sizes and set(sizes.values()) == {5}, "a batch was half-written"


KILL_AT_STATEMENT = """
import os, signal, sqlite3, sys
limit, count, original = int(sys.argv[2]), [0], sqlite3.connect
def connect(*args, **kwargs):
    conn = original(*args, **kwargs)
    def trace(statement):
        count[0] += 1
        if count[0] >= limit:
            os.kill(os.getpid(), signal.SIGKILL)
    conn.set_trace_callback(trace)
    return conn
sqlite3.connect = connect
from lanpo.pool import ExperiencePool
ExperiencePool(sys.argv[1]).close()
print("completed")
"""


def test_a_kill_at_every_statement_of_creation_leaves_a_pool_that_opens(tmp_path):
    script = tmp_path / "create.py"
    script.write_text(KILL_AT_STATEMENT)
    for limit in range(1, 60):
        path = tmp_path / f"pool{limit}.sqlite"
        done = subprocess.run([sys.executable, str(script), str(path), str(limit)], capture_output=True, text=True)
        with ExperiencePool(path) as pool:  # opens, or is cleanly created now
            assert len(pool) == 0 and pool.stats()["schema_version"] == 1
        if "completed" in done.stdout:
            break
    else:
        pytest.fail("creation never completed within 60 statements")
    assert limit > 3  # the kills did land inside creation


@pytest.mark.parametrize("statements", [1, 2, 3])
def test_a_pool_an_older_lanpo_half_created_is_created_again(tmp_path, statements):
    path = tmp_path / "pool.sqlite"
    conn = sqlite3.connect(path)
    steps = [f"PRAGMA application_id = {APPLICATION_ID}",
             "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
             "CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, problem_id TEXT)"]
    for statement in steps[:statements]:
        conn.execute(statement)
    conn.commit()
    conn.close()
    with ExperiencePool(path) as pool:
        pool.add([PoolEntry("p", "q", "f", ["a"], [])])
        assert len(pool) == 1


def test_read_only_opens_and_checkpoint_copies_leave_no_wal_files(tmp_path):
    path = tmp_path / "pool.sqlite"
    with ExperiencePool(path) as pool:
        pool.add([PoolEntry("p", "q", "f", ["a"], [])])
        pool.backup(tmp_path / "checkpoint" / "pool.sqlite")
    with ExperiencePool(path, readonly=True) as pool:
        assert len(pool) == 1
    with ExperiencePool(tmp_path / "checkpoint", readonly=True) as pool:
        assert len(pool) == 1
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["pool.sqlite", "pool.sqlite"]


def test_a_pool_that_fails_the_integrity_check_is_refused(tmp_path):
    path = tmp_path / "pool.sqlite"
    with ExperiencePool(path) as pool:
        pool.add([PoolEntry(f"p{i}", "q" * 500, "f", ["a" * 500], []) for i in range(200)])
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = os.urandom(4096)  # a page in the middle
    path.write_bytes(bytes(data))
    with pytest.raises(PoolError):
        with ExperiencePool(path, readonly=True) as pool:
            pool.entries()


def test_export_never_overwrites_its_pool_and_import_names_bad_lines(tmp_path):
    path = tmp_path / "pool.sqlite"
    with ExperiencePool(path) as pool:
        pool.add([PoolEntry("p", "q", "f", ["a"], [])])
        with pytest.raises(PoolError, match="onto itself"):
            export_jsonl(pool, path)
        assert len(pool) == 1
        export = tmp_path / "export.jsonl"
        assert export_jsonl(pool, export) == 2
    good = json.loads(export.read_text().splitlines()[1])
    export.write_text("\n".join([export.read_text().strip(), "42", json.dumps({**good, "step": "seven"}),
                                 "{broken", json.dumps({"type": "attempt", "problem_id": "p"})]) + "\n")
    with ExperiencePool(tmp_path / "other.sqlite") as target:
        counts = import_jsonl(target, export)
    assert counts["entries"] == 1 and counts["skipped"] == 4
    assert counts["bad_lines"][0].startswith("line 3: a JSON int") and "'step'" in counts["bad_lines"][1]
    assert "line 6" in counts["bad_lines"][3] and "missing" in counts["bad_lines"][3]


def test_the_summary_parser_is_linear_on_unclosed_json():
    from lanpo.prompts import parse_summary

    start = time.perf_counter()
    assert parse_summary("{" * 200_000) is None and parse_summary("PRINCIPLES " + "{ " * 100_000) is None
    assert time.perf_counter() - start < 2.0
