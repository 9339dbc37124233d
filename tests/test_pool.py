"""The experience pool: entries, caps and eviction, attempts, files, concurrency, export/import."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from lanpo.pool.io import export_jsonl, import_jsonl
from lanpo.pool.store import Attempt, ExperiencePool, PoolEntry, PoolError


def entry(pid: str, i: int = 0, **kw) -> PoolEntry:
    return PoolEntry(
        problem_id=pid,
        problem=f"problem {pid}",
        flow_of_thought=f"plan {i}",
        principles=[f"principle {i}"],
        pitfalls=[f"pitfall {i}"],
        step=i,
        **kw,
    )


def test_round_trip_keeps_every_field(tmp_path):
    with ExperiencePool(tmp_path / "pool.sqlite") as pool:
        e = entry("a", 3, rollout_ids=["r1", "r2"], correct=True, reward=1.0, model_step=3)
        (new_id,) = pool.add([e])
        got = pool.entries(ids=[new_id])[0]
    assert got == e and got.id == new_id


def test_cap_evicts_the_oldest_entries_of_that_problem_only():
    pool = ExperiencePool(cap_per_problem=3)
    pool.add([entry("a", i) for i in range(2)] + [entry("b", 0)])
    pool.add([entry("a", i) for i in range(2, 6)])
    assert [e.step for e in pool.entries("a")] == [3, 4, 5]
    assert len(pool.entries("b")) == 1
    assert len(pool) == 4


def test_attempts_are_bounded_and_newest_first():
    pool = ExperiencePool(attempts_per_problem=2)
    pool.add_attempts([Attempt("a", "p", f"try {i}", step=i) for i in range(5)])
    assert [a.text for a in pool.attempts("a")] == ["try 4", "try 3"]
    assert not hasattr(pool.attempts("a")[0], "reward")


def test_listeners_see_inserts_and_evictions():
    pool = ExperiencePool(cap_per_problem=2)
    added, removed = [], []
    pool.subscribe(lambda es: added.extend(e.id for e in es), removed.extend)
    first = pool.add([entry("a", 0), entry("a", 1)])
    pool.add([entry("a", 2)])
    assert removed == [first[0]]
    assert added == first + [first[1] + 1]


def test_a_batch_larger_than_the_cap_keeps_only_the_newest():
    pool = ExperiencePool(cap_per_problem=2)
    added = []
    pool.subscribe(lambda es: added.extend(e.step for e in es), lambda ids: None)
    pool.add([entry("a", i) for i in range(5)])
    assert [e.step for e in pool.entries("a")] == [3, 4] and added == [3, 4]


def test_reopening_keeps_content(tmp_path):
    path = tmp_path / "pool.sqlite"
    with ExperiencePool(path) as pool:
        pool.add([entry("a"), entry("b")])
        digest = pool.digest()
    with ExperiencePool(path, readonly=True) as pool:
        assert len(pool) == 2 and pool.digest() == digest
        with pytest.raises(PoolError, match="read-only"):
            pool.add([entry("c")])


def test_run_directory_means_its_pool_file(tmp_path):
    with ExperiencePool(tmp_path) as pool:
        pool.add([entry("a")])
    assert (tmp_path / "pool.sqlite").is_file()


def test_corrupted_file_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "pool.sqlite"
    path.write_bytes(b"this is not a database at all" * 10)
    before = path.read_bytes()
    with pytest.raises(PoolError, match="not an SQLite database"):
        ExperiencePool(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = path.read_bytes()
    with pytest.raises(PoolError, match="not a lanpo experience pool"):
        ExperiencePool(path)
    assert path.read_bytes() == before


def test_unknown_schema_version_fails_clearly_and_never_overwrites(tmp_path):
    path = tmp_path / "pool.sqlite"
    with ExperiencePool(path) as pool:
        pool.add([entry("a")])
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(PoolError, match="schema version 99"):
        ExperiencePool(path)
    assert path.read_bytes() == before


def test_export_import_round_trip_and_an_export_with_a_bad_line_imports_nothing(tmp_path):
    source = ExperiencePool()
    source.add([entry("a", 1, correct=False), entry("b", 2)])
    source.add_attempts([Attempt("a", "problem a", "my try")])
    exported = tmp_path / "pool.jsonl"
    assert export_jsonl(source, exported) == 4  # header, 2 entries, 1 attempt
    target = ExperiencePool()
    assert import_jsonl(target, exported) == {"entries": 2, "attempts": 1, "entry_worth": 0, "reflection_worth": 0}
    assert target.digest() == source.digest()
    with exported.open("a") as handle:
        handle.write("{broken\n")
        handle.write('{"type": "entry", "problem_id": "x"}\n')
    fresh = ExperiencePool()
    with pytest.raises(PoolError, match="2 bad line\\(s\\), nothing imported") as error:
        import_jsonl(fresh, exported)
    assert "line 5" in str(error.value) and "line 6" in str(error.value) and "missing" in str(error.value)
    assert len(fresh) == 0 and fresh.stats()["attempts"] == 0


def test_import_of_a_newer_export_is_refused(tmp_path):
    path = tmp_path / "new.jsonl"
    path.write_text('{"type": "header", "schema_version": 99}\n')
    with pytest.raises(PoolError, match="newer"):
        import_jsonl(ExperiencePool(), path)


def test_backup_and_restore(tmp_path):
    pool = ExperiencePool(tmp_path / "run" / "pool.sqlite")
    pool.add([entry("a", i) for i in range(3)])
    pool.backup(tmp_path / "ckpt" / "pool.sqlite")
    pool.add([entry("b")])
    pool.restore_from(tmp_path / "ckpt" / "pool.sqlite")
    assert [e.problem_id for e in pool.entries()] == ["a", "a", "a"]


def test_concurrent_readers_see_consistent_snapshots_while_writing(tmp_path):
    path = tmp_path / "pool.sqlite"
    writer = ExperiencePool(path)
    batch, batches = 50, 40
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        reader = ExperiencePool(path, readonly=True)
        try:
            while not done.is_set():
                n = len(reader)
                if n % batch:  # a batch is one transaction: never seen half-written
                    errors.append(f"saw {n} entries")
                reader.stats()
        finally:
            reader.close()

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for b in range(batches):
        writer.add([entry(f"p{b}-{i}") for i in range(batch)])
    done.set()
    for t in threads:
        t.join()
    assert not errors
    assert len(writer) == batch * batches


def test_stats_describe_the_pool():
    pool = ExperiencePool(cap_per_problem=5)
    pool.add([entry("a", 1, correct=True), entry("a", 2, correct=False), entry("b", 3, correct=True)])
    stats = pool.stats()
    assert stats["entries"] == 3 and stats["problems"] == 2 and stats["entries_per_problem_max"] == 2
    assert stats["share_from_correct_trials"] == pytest.approx(0.667) and stats["steps"] == [1, 3]


def test_entries_need_their_summary_fields():
    with pytest.raises(ValueError, match="missing"):
        PoolEntry.from_dict({"problem_id": "a", "problem": "p"})


def test_pool_cli_stats_show_export_import(tmp_path, capsys):
    import json

    from lanpo.cli import main

    run = tmp_path / "run"
    with ExperiencePool(run) as pool:
        pool.add([entry("a", 1, correct=True), entry("b", 2, correct=False)])
        pool.add_attempts([Attempt("a", "problem a", "my first try")])
    assert main(["pool", "stats", str(run)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2
    assert main(["pool", "show", str(run), "--problem", "a", "--attempts"]) == 0
    shown = capsys.readouterr().out
    assert "principle 1" in shown and "my first try" in shown and "right trial" in shown
    assert main(["pool", "export", str(run), str(tmp_path / "p.jsonl")]) == 0
    assert main(["pool", "import", str(tmp_path / "copy.sqlite"), str(tmp_path / "p.jsonl")]) == 0
    capsys.readouterr()
    with ExperiencePool(tmp_path / "copy.sqlite", readonly=True) as copy, ExperiencePool(run, readonly=True) as orig:
        assert copy.digest() == orig.digest()


def test_pool_cli_reports_a_bad_file_without_a_traceback(tmp_path, capsys):
    from lanpo.cli import main

    bad = tmp_path / "bad.sqlite"
    bad.write_text("garbage" * 20)
    assert main(["pool", "stats", str(bad)]) == 2
    assert "not an SQLite database" in capsys.readouterr().err


def test_a_new_path_without_suffix_is_a_run_directory(tmp_path):
    with ExperiencePool(tmp_path / "new-run") as pool:
        pool.add([entry("a")])
    assert (tmp_path / "new-run" / "pool.sqlite").is_file()
    with ExperiencePool(tmp_path / "plain.db") as pool:
        pool.add([entry("a")])
    assert (tmp_path / "plain.db").is_file()
