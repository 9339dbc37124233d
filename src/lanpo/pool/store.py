"""The experience pool: what the policy has distilled from its own trials, on SQLite.

Two tables. ``entries`` holds pool entries (a trial's summary: flow of thought, principles, pitfalls, plus
metadata), capped per problem with the oldest evicted. ``attempts`` holds raw attempts per problem (bounded)
for reward-agnostic reflection; attempts store text only, so no grading can travel with them.

The file is a normal SQLite database in WAL mode: readers in other processes see consistent snapshots while
training writes, each batch insert is one transaction (taken with the write lock, so concurrent writers never
mix up ids), and a crash never leaves half a batch. A new pool is built under a temporary name and renamed into
place, so a kill during creation leaves no half-made pool. A file this version does not understand (another
schema version, another application, not SQLite at all, failing SQLite's integrity check) is refused with a
message and never modified. Read-only opens and checkpoint copies leave no ``-wal``/``-shm`` files behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, astuple, dataclass, field, fields
from pathlib import Path

SCHEMA_VERSION = 1
APPLICATION_ID = 0x4C414E50  # "LANP": marks a SQLite file as a lanpo pool
POOL_FILENAME = "pool.sqlite"
DEFAULT_CAP = 32  # entries per problem, as in the paper
DEFAULT_ATTEMPTS_CAP = 4


SQLITE_HEADER = b"SQLite format 3\x00"


def is_sqlite_file(path: Path) -> bool:
    """Whether ``path`` is an SQLite database file (by its 16-byte header)."""
    with Path(path).open("rb") as handle:
        return handle.read(16) == SQLITE_HEADER


class PoolError(RuntimeError):
    """A pool file that cannot be opened as a lanpo pool (wrong schema, not a pool, corrupted)."""


@dataclass
class PoolEntry:
    """One distilled trial. Only the summary fields are ever shown to a model (and only for other problems)."""

    problem_id: str
    problem: str
    flow_of_thought: str
    principles: list[str]
    pitfalls: list[str]
    # metadata: for analysis and eviction, never for prompts
    step: int = 0
    rollout_ids: list[str] = field(default_factory=list)
    correct: bool | None = None
    reward: float | None = None
    model_step: int | None = None
    created: float = field(default_factory=time.time)
    id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PoolEntry:
        """An entry from a dict (an export line); a ``ValueError`` naming the field when one is unusable."""
        known = {f.name for f in fields(cls)}
        missing = {"problem_id", "problem", "flow_of_thought", "principles", "pitfalls"} - set(data)
        if missing:
            raise ValueError(f"missing field(s) {sorted(missing)}")
        entry = cls(**{k: v for k, v in data.items() if k in known})
        if not isinstance(entry.principles, list) or not isinstance(entry.pitfalls, list):
            raise ValueError("principles and pitfalls must be lists of strings")
        entry.principles = [str(p) for p in entry.principles]
        entry.pitfalls = [str(p) for p in entry.pitfalls]
        for name, kind in (("step", int), ("reward", float), ("model_step", int), ("created", float)):
            value = getattr(entry, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"field {name!r} must be a number, got {value!r}")
            if value is not None:
                setattr(entry, name, kind(value))
        if not isinstance(entry.rollout_ids, list) or not isinstance(entry.correct, bool | None):
            raise ValueError("field 'rollout_ids' must be a list and 'correct' true, false or null")
        return entry


@dataclass
class StepWorth:
    """What one step's rows taught (:func:`lanpo.pool.worth.observations`): entry and reflection observations."""

    step: int
    entries: list = field(default_factory=list)
    reflections: list = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.entries and not self.reflections


@dataclass
class Attempt:
    """A raw attempt at a problem, kept for reflection. Deliberately without reward or correctness."""

    problem_id: str
    problem: str
    text: str
    step: int = 0
    created: float = field(default_factory=time.time)
    id: int | None = None


WORTH_SCHEMA = """
CREATE TABLE IF NOT EXISTS entry_worth (
    entry_id INTEGER PRIMARY KEY, uses INTEGER NOT NULL, credited INTEGER NOT NULL, lift_sum REAL NOT NULL,
    lift_sq REAL NOT NULL, reward_sum REAL NOT NULL, success_ema REAL NOT NULL, last_step INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS reflection_worth (
    problem_id TEXT PRIMARY KEY, uses INTEGER NOT NULL, credited INTEGER NOT NULL, lift_sum REAL NOT NULL,
    lift_sq REAL NOT NULL, reward_sum REAL NOT NULL, success_ema REAL NOT NULL, last_step INTEGER NOT NULL);
"""

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem_id TEXT NOT NULL, problem TEXT NOT NULL,
    flow_of_thought TEXT NOT NULL, principles TEXT NOT NULL, pitfalls TEXT NOT NULL,
    step INTEGER NOT NULL, rollout_ids TEXT NOT NULL, correct INTEGER, reward REAL, model_step INTEGER,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS entries_problem ON entries (problem_id, id);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    problem_id TEXT NOT NULL, problem TEXT NOT NULL, text TEXT NOT NULL, step INTEGER NOT NULL,
    created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS attempts_problem ON attempts (problem_id, id);
"""
    + WORTH_SCHEMA
)

# Each entry's worth and each problem's reflection worth (lanpo.pool.worth): numbers and ids only. Pools made before
# these tables get them, empty, the first time they are opened for writing; read-only, they read as empty.
WORTH_COLUMNS = "uses, credited, lift_sum, lift_sq, reward_sum, success_ema, last_step"
WORTH_TABLES = ("entry_worth", "reflection_worth")

_ENTRY_COLUMNS = (
    "id",
    "problem_id",
    "problem",
    "flow_of_thought",
    "principles",
    "pitfalls",
    "step",
    "rollout_ids",
    "correct",
    "reward",
    "model_step",
    "created",
)


def _row_to_entry(row: tuple) -> PoolEntry:
    d = dict(zip(_ENTRY_COLUMNS, row))
    return PoolEntry(
        problem_id=d["problem_id"],
        problem=d["problem"],
        flow_of_thought=d["flow_of_thought"],
        principles=json.loads(d["principles"]),
        pitfalls=json.loads(d["pitfalls"]),
        step=d["step"],
        rollout_ids=json.loads(d["rollout_ids"]),
        correct=None if d["correct"] is None else bool(d["correct"]),
        reward=d["reward"],
        model_step=d["model_step"],
        created=d["created"],
        id=d["id"],
    )


def resolve_pool_path(run_or_file: str | Path) -> Path:
    """A run directory (existing, or a new path without a file suffix) means its ``pool.sqlite``; anything else
    is the pool file itself."""
    path = Path(run_or_file).expanduser()
    if path.is_dir() or (not path.exists() and not path.suffix):
        return path / POOL_FILENAME
    return path


class ExperiencePool:
    """SQLite-backed experience pool.

    Args:
        path: database file, a run directory, or ``":memory:"``.
        cap_per_problem: entries kept per problem; inserting more evicts by ``eviction``.
        attempts_per_problem: raw attempts kept per problem for reflection.
        readonly: open without the right to write (evaluation, inspection); the file must exist.
        eviction: ``oldest``, or ``worth``: first the entries judged not to help (lowest mean lift first), then the
            oldest of those too young to judge (:data:`lanpo.pool.worth.MIN_USES`), an entry judged to help last.
        total_cap: entries kept in the whole pool (0: none beyond the per-problem cap).
    """

    def __init__(
        self,
        path: str | Path = ":memory:",
        cap_per_problem: int = DEFAULT_CAP,
        attempts_per_problem: int = DEFAULT_ATTEMPTS_CAP,
        readonly: bool = False,
        eviction: str = "oldest",
        total_cap: int = 0,
    ) -> None:
        if cap_per_problem < 1 or attempts_per_problem < 1:
            raise ValueError("cap_per_problem and attempts_per_problem must be >= 1")
        if eviction not in ("oldest", "worth") or total_cap < 0:
            raise ValueError(f"eviction must be oldest or worth and total_cap >= 0, got {eviction!r}, {total_cap}.")
        self.eviction, self.total_cap = eviction, total_cap
        self.cap_per_problem = cap_per_problem
        self.attempts_per_problem = attempts_per_problem
        self.readonly = readonly
        self._listeners: list[tuple[Callable, Callable]] = []
        memory = str(path) == ":memory:"
        self.path = None if memory else resolve_pool_path(path)
        if memory:
            if readonly:
                raise ValueError("An in-memory pool cannot be read-only.")
            self.conn = sqlite3.connect(":memory:", check_same_thread=False)
            self._create()
            return
        if self.path.is_dir():
            raise PoolError(f"{self.path} is a directory, not a pool file.")
        exists = self.path.exists()
        if exists and self.path.stat().st_size == 0:  # lanpo renames a complete pool into place: not one of ours
            raise PoolError(
                f"{self.path} is an empty file that lanpo did not create; lanpo will not replace it "
                "(delete it, or name another pool)."
            )
        if exists and not readonly and self._unfinished():  # an older lanpo was killed while creating it
            self.path.unlink()
            exists = False
        if exists:
            self._check_header()
        elif readonly:
            raise FileNotFoundError(f"No experience pool at {self.path}.")
        else:
            if self.path.suffix.lower() in (".jsonl", ".json", ".yaml", ".yml", ".txt", ".csv", ".parquet"):
                raise PoolError(
                    f"{self.path} names a {self.path.suffix} file, not a pool: a pool is a run "
                    "directory or a .sqlite file (were two arguments swapped?)."
                )
            self._create_file()
        # No writer active (no -wal file): read the file as immutable, which leaves no -wal/-shm behind.
        idle = not self.path.with_name(self.path.name + "-wal").exists()
        uri = f"file:{self.path}?mode=ro" + ("&immutable=1" if idle else "") if readonly else f"file:{self.path}"
        try:
            self.conn = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)
            self._check_schema()
            if not readonly:  # switching the mode takes a lock the busy timeout does not wait for: only if needed
                if self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                if not self._has_worth():  # a pool made before the worth tables: they start empty
                    with self.conn:
                        self.conn.executescript(WORTH_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise PoolError(f"{self.path} could not be opened as an experience pool: {error}") from error

    # -- opening -----------------------------------------------------------------------------------------------

    def _check_header(self) -> None:
        if not is_sqlite_file(self.path):
            raise PoolError(
                f"{self.path} is not an SQLite database (corrupted or another kind of file); lanpo will not touch it."
            )

    def _unfinished(self) -> bool:
        """A lanpo pool whose creation never finished: our application id, no schema version, no data."""
        in_use = any(self.path.with_name(self.path.name + suffix).exists() for suffix in ("-wal", "-shm", "-journal"))
        if in_use or not is_sqlite_file(self.path):
            return False  # another connection may have it open: never a file to delete
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                return False  # another application's database, empty or not: never ours to delete
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables <= {"meta", "entries", "attempts", "sqlite_sequence", *WORTH_TABLES}:
                return False
            if "meta" in tables and conn.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone():
                return False
            return all(
                not conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone() for t in tables & {"entries", "attempts"}
            )
        except sqlite3.DatabaseError:
            return False
        finally:
            conn.close()

    def _create_file(self) -> None:
        """Build the empty pool under a temporary name, then put it in place only if no pool is there yet (a kill
        leaves no pool; of processes creating one pool at once, the first wins and the others open it)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for stale in self.path.parent.glob(f".{self.path.name}.*.creating*"):  # a kill during creation left it
                try:  # (with its -journal); another process may rename or remove its own at any moment
                    if time.time() - stale.stat().st_mtime > 60:
                        stale.unlink(missing_ok=True)
                except FileNotFoundError:
                    pass
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.creating")
            conn = sqlite3.connect(tmp)
            try:
                # WAL is set here, while no other connection exists: switching a shared file to it takes a lock
                # that the busy timeout does not wait for ("database is locked" when processes open it at once)
                conn.execute("PRAGMA journal_mode=WAL")
                self.conn = conn
                self._create()
            finally:
                conn.close()
        except (OSError, sqlite3.OperationalError) as error:
            raise PoolError(
                f"{self.path} cannot be created: its folder {self.path.parent} cannot be written "
                f"({getattr(error, 'strerror', None) or error}). Name a pool in a folder you can write to."
            ) from None
        try:
            # link, not rename: it fails when a pool appeared meanwhile, where a rename would move a new file
            # under the connections other processes have already opened to it (their writes then fail with
            # "attempt to write a readonly database")
            os.link(tmp, self.path)
        except FileExistsError:
            pass  # another process created it first: use theirs
        except OSError:  # a file system without hard links
            if not (self.path.exists() and self.path.stat().st_size > 0):
                os.replace(tmp, self.path)
        tmp.unlink(missing_ok=True)

    def _check_schema(self) -> None:
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        has_meta = self.conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
        if app_id != APPLICATION_ID or not has_meta:
            raise PoolError(
                f"{self.path} is an SQLite database but not a lanpo experience pool; lanpo will not touch it."
            )
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        version = int(row[0]) if row else None
        if version != SCHEMA_VERSION:
            raise PoolError(
                f"{self.path} was written with pool schema version {version}; this lanpo reads version "
                f"{SCHEMA_VERSION}. Open it with a matching lanpo version (and `lanpo pool export` it to JSONL to "
                "move it across versions). The file was not modified."
            )
        check = self.conn.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise PoolError(
                f"{self.path} fails SQLite's integrity check ({check[0] if check else 'no answer'}); "
                "lanpo will not use it. Restore it from a checkpoint's pool.sqlite."
            )

    def _create(self) -> None:
        with self.conn:
            self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self.conn.executescript(_SCHEMA)
            self.conn.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("created", str(time.time())),
                ],
            )

    # -- listeners (the retrieval index follows the pool) --------------------------------------------------------

    def subscribe(self, on_add: Callable[[list[PoolEntry]], None], on_remove: Callable[[list[int]], None]) -> None:
        """Call ``on_add(entries)`` after each insert and ``on_remove(ids)`` after each eviction."""
        self._listeners.append((on_add, on_remove))

    # -- writing -----------------------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.readonly:
            raise PoolError(f"The pool {self.path} was opened read-only.")

    @classmethod
    def for_run(cls, args, path: str | Path) -> ExperiencePool:
        """A training run's pool at ``path`` (``:memory:`` on processes other than the main one), with its caps and
        eviction from the run's config."""
        return cls(
            path,
            cap_per_problem=args.pool_cap,
            attempts_per_problem=args.pool_attempts_cap,
            eviction=args.pool_eviction,
            total_cap=args.pool_total_cap,
        )

    def add(
        self,
        entries: Iterable[PoolEntry],
        _notify: bool = True,
        attempts: Iterable[Attempt] = (),
        worth: Sequence | None = None,
        reflection_worth: dict | None = None,
    ) -> list[int]:
        """Insert entries (and ``attempts``) in one transaction, all or none; evict the oldest beyond the
        per-problem caps. Returns the entries' new ids. ``worth`` (one :class:`lanpo.pool.worth.Worth` or None per
        entry) and ``reflection_worth`` (problem id -> Worth) carry records an import brings along."""
        self._writable()
        entries, attempts = list(entries), list(attempts)
        if not entries and not attempts and not reflection_worth:
            return []
        rows = [
            (
                e.problem_id,
                e.problem,
                e.flow_of_thought,
                json.dumps(e.principles),
                json.dumps(e.pitfalls),
                int(e.step),
                json.dumps(e.rollout_ids),
                None if e.correct is None else int(bool(e.correct)),
                e.reward,
                e.model_step,
                float(e.created),
            )
            for e in entries
        ]
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")  # the write lock first: no other writer between MAX(id) and insert
            start = self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM entries").fetchone()[0]
            self.conn.executemany(  # (no rows: nothing)
                "INSERT INTO entries (problem_id, problem, flow_of_thought, principles, pitfalls, step, rollout_ids, "
                "correct, reward, model_step, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            ids = [r[0] for r in self.conn.execute("SELECT id FROM entries WHERE id > ? ORDER BY id", (start,))]
            if worth is not None:
                self.conn.executemany(
                    f"INSERT OR REPLACE INTO entry_worth (entry_id, {WORTH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(i, *astuple(w)) for i, w in zip(ids, worth) if w is not None],
                )
            if reflection_worth:
                self.conn.executemany(
                    f"INSERT OR REPLACE INTO reflection_worth (problem_id, {WORTH_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(k, *astuple(w)) for k, w in reflection_worth.items()],
                )
            evicted = self._evict("entries", {e.problem_id for e in entries}, self.cap_per_problem)
            if attempts:
                self._insert_attempts(attempts)
        for entry, new_id in zip(entries, ids):
            entry.id = new_id
        if _notify:
            kept = [e for e in entries if e.id not in set(evicted)]
            for on_add, on_remove in self._listeners:
                on_add(kept)
                gone = [i for i in evicted if i <= start]  # entries of this batch never reached the index
                if gone:
                    on_remove(gone)
        return ids

    def _evict(self, table: str, problem_ids: set[str], cap: int) -> list[int]:
        evicted: list[int] = []
        by_worth = table == "entries" and self.eviction == "worth"
        scopes = [("WHERE problem_id = ?", (pid,), cap) for pid in problem_ids]  # (filter, its values, the cap)
        if table == "entries" and self.total_cap:
            scopes.append(("", (), self.total_cap))  # the whole pool, after each problem's share
        for where, params, limit in scopes:
            if by_worth:
                ids = self._least_worth(where, params, limit)
            else:
                ids = [
                    r[0]
                    for r in self.conn.execute(
                        f"SELECT id FROM {table} {where} ORDER BY id DESC LIMIT -1 OFFSET ?", (*params, limit)
                    )
                ]
            if ids:
                self.conn.executemany(f"DELETE FROM {table} WHERE id = ?", [(i,) for i in ids])
                if table == "entries" and self._has_worth():  # an entry's record goes with it
                    self.conn.executemany("DELETE FROM entry_worth WHERE entry_id = ?", [(i,) for i in ids])
                evicted += ids
        return evicted

    def _least_worth(self, where: str, params: tuple, cap: int) -> list[int]:
        """The entries past ``cap`` (of a problem, or of the whole pool) to evict by worth: first those judged
        (:data:`lanpo.pool.worth.MIN_USES` credited rows) not to help, lowest mean lift first; then the oldest of
        those too young to judge; an entry judged to help goes last."""
        from lanpo.pool.worth import MIN_USES

        ids = [r[0] for r in self.conn.execute(f"SELECT id FROM entries {where} ORDER BY id", params)]
        excess = len(ids) - cap
        if excess <= 0:
            return []
        records = self._worth("entry_worth", "entry_id", ids) if self._has_worth() else {}
        judged = {i: records[i].mean_lift for i in ids if i in records and records[i].credited >= MIN_USES}
        order = sorted((i for i in judged if judged[i] <= 0), key=lambda i: (judged[i], i))
        order += [i for i in ids if i not in judged]  # oldest first
        order += sorted((i for i in judged if judged[i] > 0), key=lambda i: (judged[i], i))
        return order[:excess]

    def add_attempts(self, attempts: Iterable[Attempt], worth: StepWorth | None = None) -> None:
        """Store raw attempts (text only) for reflection, keeping the newest per problem; with ``worth``, what the
        step's rows taught about the entries and reflections they were shown, in the same transaction."""
        self._writable()
        attempts = list(attempts)
        if not attempts and (worth is None or worth.empty):
            return
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            if attempts:
                self._insert_attempts(attempts)
            if worth is not None and not worth.empty:
                self._record_worth(worth)

    # -- worth (lanpo.pool.worth) ------------------------------------------------------------------------------

    def _has_worth(self) -> bool:
        found = self.conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name IN ('entry_worth', 'reflection_worth')"
        ).fetchone()[0]
        return found == 2

    def _record_worth(self, worth: StepWorth) -> None:
        from lanpo.pool.worth import fold

        live = {r[0] for r in self._in("SELECT id FROM entries WHERE id IN", [o.key for o in worth.entries])}
        for table, key, found in (
            ("entry_worth", "entry_id", [o for o in worth.entries if o.key in live]),  # an evicted entry: no record
            ("reflection_worth", "problem_id", worth.reflections),
        ):
            if not found:
                continue
            before = self._worth(table, key, list({o.key for o in found}))
            after = fold(before, found, worth.step)
            self.conn.executemany(
                f"INSERT OR REPLACE INTO {table} ({key}, {WORTH_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(k, *astuple(w)) for k, w in after.items()],
            )

    def _in(self, query: str, keys: list) -> list[tuple]:
        rows = []
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            rows += self.conn.execute(f"{query} ({','.join('?' * len(chunk))})", chunk).fetchall()
        return rows

    def _worth(self, table: str, key: str, keys: list | None) -> dict:
        from lanpo.pool.worth import Worth

        if not self._has_worth():
            return {}
        query = f"SELECT {key}, {WORTH_COLUMNS} FROM {table}"
        rows = self.conn.execute(query).fetchall() if keys is None else self._in(query + f" WHERE {key} IN", keys)
        return {r[0]: Worth(*r[1:]) for r in rows}

    def entry_worth(self, ids: Iterable[int] | None = None) -> dict:
        """Entry id -> :class:`lanpo.pool.worth.Worth` of the entries that were ever shown (all, or ``ids``)."""
        return self._worth("entry_worth", "entry_id", None if ids is None else list(ids))

    def judged_worth(self, min_credited: int) -> dict:
        """Entry id -> :class:`lanpo.pool.worth.Worth` of the entries credited at least ``min_credited`` times (their
        number is bounded by the rows ever shown, not by the pool's size)."""
        from lanpo.pool.worth import Worth

        if not self._has_worth():
            return {}
        query = f"SELECT entry_id, {WORTH_COLUMNS} FROM entry_worth WHERE credited >= ?"
        return {r[0]: Worth(*r[1:]) for r in self.conn.execute(query, (min_credited,))}

    def reflection_worth(self, problem_ids: Iterable[str] | None = None) -> dict:
        """Problem id -> :class:`lanpo.pool.worth.Worth` of its reflection rows."""
        return self._worth("reflection_worth", "problem_id", None if problem_ids is None else list(problem_ids))

    def total_counts(self) -> float:
        """RetroAgent's N: the sum over entries of their counts (uses, plus the 1 an entry is made with). Kept until
        the pool changes (a commit by this connection or, by SQLite's ``data_version``, by any other): retrieval asks
        for it every step, and at a million entries the two scans cost as much as the retrieval itself."""
        key = (self.conn.execute("PRAGMA data_version").fetchone()[0], self.conn.total_changes)
        cached = getattr(self, "_total_counts", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        shown = (
            self.conn.execute("SELECT COALESCE(SUM(uses), 0) FROM entry_worth").fetchone()[0]
            if (self._has_worth())
            else 0
        )
        total = float(shown + len(self))
        self._total_counts = (key, total)
        return total

    def _insert_attempts(self, attempts: list[Attempt]) -> None:
        self.conn.executemany(
            "INSERT INTO attempts (problem_id, problem, text, step, created) VALUES (?, ?, ?, ?, ?)",
            [(a.problem_id, a.problem, a.text, int(a.step), float(a.created)) for a in attempts],
        )
        self._evict("attempts", {a.problem_id for a in attempts}, self.attempts_per_problem)

    # -- reading -----------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def entries(
        self,
        problem_id: str | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
        newest: bool = False,
    ) -> list[PoolEntry]:
        """Entries, oldest first; filtered by problem or by ids; ``newest``: the last ``limit`` of them."""
        query = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries"
        params = []
        if ids is not None:
            ids = list(ids)
            if not ids:
                return []
            found = {}
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                for row in self.conn.execute(f"{query} WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                    found[row[0]] = _row_to_entry(row)
            return [found[i] for i in ids if i in found]
        if problem_id is not None:
            query += " WHERE problem_id = ?"
            params.append(problem_id)
        query += " ORDER BY id DESC" if newest else " ORDER BY id"
        if limit is not None:
            query += " LIMIT ?"
            params.append(int(limit))
        found = [_row_to_entry(r) for r in self.conn.execute(query, params)]
        return found[::-1] if newest else found

    def iter_entries(self, batch: int = 10_000) -> Iterator[PoolEntry]:
        last = 0
        while True:
            rows = self.conn.execute(
                f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM entries WHERE id > ? ORDER BY id LIMIT ?", (last, batch)
            ).fetchall()
            if not rows:
                return
            for row in rows:
                yield _row_to_entry(row)
            last = rows[-1][0]

    def attempts(self, problem_id: str | None, limit: int | None = None) -> list[Attempt]:
        """Stored raw attempts at a problem (``None``: at every problem), newest first."""
        where = "WHERE problem_id = ?" if problem_id is not None else "WHERE ? IS NULL"
        rows = self.conn.execute(
            f"SELECT id, problem_id, problem, text, step, created FROM attempts {where} ORDER BY id DESC LIMIT ?",
            (problem_id, -1 if limit is None else int(limit)),
        ).fetchall()
        return [Attempt(problem_id=r[1], problem=r[2], text=r[3], step=r[4], created=r[5], id=r[0]) for r in rows]

    def stats(self) -> dict:
        c = self.conn
        entries, problems = c.execute("SELECT COUNT(*), COUNT(DISTINCT problem_id) FROM entries").fetchone()
        correct = c.execute("SELECT AVG(correct) FROM entries WHERE correct IS NOT NULL").fetchone()[0]
        per_problem = c.execute(
            "SELECT MAX(n), AVG(n) FROM (SELECT COUNT(*) AS n FROM entries GROUP BY problem_id)"
        ).fetchone()
        steps = c.execute("SELECT MIN(step), MAX(step) FROM entries").fetchone()
        attempts, attempt_problems = c.execute("SELECT COUNT(*), COUNT(DISTINCT problem_id) FROM attempts").fetchone()
        return {
            "path": str(self.path) if self.path else ":memory:",
            "schema_version": SCHEMA_VERSION,
            "entries": entries,
            "problems": problems,
            "attempts": attempts,
            "attempt_problems": attempt_problems,
            "entries_per_problem_max": per_problem[0] or 0,
            "entries_per_problem_mean": round(per_problem[1] or 0, 2),
            "share_from_correct_trials": None if correct is None else round(correct, 3),
            "steps": None if steps[0] is None else [steps[0], steps[1]],
            "cap_per_problem": self.cap_per_problem,
            "file_bytes": self.path.stat().st_size if self.path and self.path.exists() else None,
        }

    def digest(self) -> str:
        """A hash of the pool's content (entries and attempts, in order): equal pools have equal digests."""
        h = hashlib.sha256()
        for row in self.conn.execute(
            "SELECT problem_id, problem, flow_of_thought, principles, pitfalls, step, correct FROM entries ORDER BY id"
        ):
            h.update(json.dumps(row).encode())
        for row in self.conn.execute("SELECT problem_id, text, step FROM attempts ORDER BY id"):
            h.update(json.dumps(row).encode())
        for table in WORTH_TABLES if self._has_worth() else ():  # the worth records, numbers as stored
            for row in self.conn.execute(f"SELECT * FROM {table} ORDER BY 1"):
                h.update(json.dumps(row).encode())
        return h.hexdigest()

    # -- moving pools around ----------------------------------------------------------------------------------

    def backup(self, path: str | Path) -> Path:
        """A consistent copy of the pool (SQLite online backup), e.g. into a checkpoint."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        target = sqlite3.connect(tmp)
        try:
            self.conn.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # a copy needs no WAL: opening it leaves no -wal/-shm
        finally:
            target.close()
        tmp.replace(path)
        return path

    def restore_from(self, path: str | Path) -> None:
        """Replace this pool's content by the pool file at ``path`` (used when resuming from a checkpoint)."""
        self._writable()
        source = ExperiencePool(path, readonly=True)
        try:
            source.conn.backup(self.conn)
        finally:
            source.close()

    def close(self) -> None:
        try:
            self.conn.close()
        except sqlite3.Error:
            pass

    def __enter__(self) -> ExperiencePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
