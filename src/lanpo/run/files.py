"""The files a run writes for people to read and reads back: ``metrics.jsonl``, ``samples.jsonl``,
``retrievals.jsonl``, and the write check made before any work."""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from lanpo.prompts import solve_messages
from lanpo.verify.sandbox import logged_gold

if TYPE_CHECKING:  # lanpo.rollout imports torch: reading a run, holding its lock or writing a file needs none
    from lanpo.rollout import Row


def write_samples(
    path: Path,
    rows: list[Row],
    rewards: Sequence[float],
    step: int,
    limit: int,
    g: int,
    correct: Sequence[bool] | None = None,
) -> None:
    """Append whole groups to ``samples.jsonl`` (``limit`` rows, at least one group): each row's real prompt
    (its feedback context, else the plain prompt), completion, kind, reward, fallback reason and, for abstraction
    rows, the pool entries retrieved with their relevance."""
    if limit <= 0:
        return
    groups = max(1, limit // g)
    with path.open("a") as handle:
        for i in range(min(len(rows), groups * g)):
            r = rows[i]
            handle.write(
                json.dumps(
                    {
                        "step": step,
                        "group": i // g,
                        "problem_id": r.problem_id,
                        "problem": r.problem,
                        "kind": r.kind,
                        "feedback": r.has_feedback,
                        "fallback": r.fallback,
                        "prompt": (r.context or solve_messages(r.problem))[-1]["content"],
                        "completion": r.text,
                        "reward": float(rewards[i]),
                        "correct": bool(correct[i]) if correct is not None else None,
                        "gold": logged_gold(r.gold, r.gold_kind),
                        "retrieved": r.retrieved,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )


def write_retrievals(path: Path, rows: list[Row], step: int, g: int) -> None:
    """Append, per group that retrieved pool entries this step, which entries passed γ with what relevance."""
    with path.open("a") as handle:
        for s in range(0, len(rows), g):
            hits = next((r.retrieved for r in rows[s : s + g] if r.retrieved), None)
            if hits:
                handle.write(json.dumps({"step": step, "problem_id": rows[s].problem_id, "retrieved": hits}) + "\n")


def read_jsonl(path: str | Path) -> list[dict]:
    """The objects of a run's JSONL log (none when it is missing); lines that do not parse are skipped (a run
    killed mid-write leaves a half line)."""
    path, rows = Path(path), []
    if path.is_file():
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The per-step log lines of a run (``metrics.jsonl``)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: is it a lanpo run directory?")
    return [row for row in read_jsonl(path) if "step" in row]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def reward_is_accuracy(rows: list[dict]) -> bool:
    """True when every logged reward/<kind>/mean equals accuracy/<kind>/mean (the reward is the verifier's 0/1):
    then one plot shows both."""
    pairs = [
        (v, r.get("accuracy/" + k[len("reward/") :]))
        for r in rows
        for k, v in r.items()
        if k.startswith("reward/") and k.endswith("/mean")
    ]
    return all(a is not None and abs(float(v) - float(a)) < 1e-9 for v, a in pairs)


STALE_SECONDS = 600  # a temporary file of a rewrite this old was left by a writer that was killed


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path``'s text all at once: written to a temporary file beside it, then renamed over it, so a
    kill mid-write leaves the old file whole, never a half or empty one. Through a symlink the link's target is
    rewritten (the link stays); a new file gets the user's umask, an old one keeps its mode; temporary files that
    killed rewrites left are swept; an error names ``path`` as given."""
    given = Path(path)
    path = Path(os.path.realpath(given))
    _sweep_stale(path)
    try:
        handle = tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        )
    except OSError as error:
        raise OSError(error.errno, f"{given} cannot be written: {error.strerror or error}") from None
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~current_umask())
        os.replace(handle.name, path)
    except OSError as error:
        Path(handle.name).unlink(missing_ok=True)
        raise OSError(error.errno, f"{given} cannot be written: {error.strerror or error}") from None
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sweep_stale(path: Path) -> None:
    """Remove the temporary files of rewrites of ``path`` that were killed (older than :data:`STALE_SECONDS`)."""
    now = time.time()
    for stray in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            if now - stray.stat().st_mtime > STALE_SECONDS:
                stray.unlink()
        except OSError:
            pass


def read_user_text(path: str | Path) -> str:
    """A text file the user named, as UTF-8; bytes that are not raise ``ValueError`` naming the file and line."""
    from lanpo.data.loaders import read_text

    return read_text(path, str(path))


PARENT_ENV = "LANPO_DIE_WITH_PARENT"  # a runner's pid: the process it starts ends when that runner ends


def die_with_parent() -> None:
    """When started by a runner that set :data:`PARENT_ENV` (``lanpo experiment``'s cells), end with it: the kernel
    sends SIGTERM when the runner dies, however it died, so no cell trains on as an orphan beside its successor."""
    import ctypes
    import signal

    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if str(os.getppid()) != parent:  # the runner died before the line above: end now
        os.kill(os.getpid(), signal.SIGTERM)


class RunFolderBusy(RuntimeError):
    """Another live process trains this run folder."""


def lock_path(run_dir: str | Path) -> Path:
    """The training lock of a run folder: ``.NAME.lock`` beside it."""
    run_dir = Path(run_dir).resolve()
    return run_dir.parent / f".{run_dir.name}.lock"


def missing_folders(folder: str | Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, deepest first: what making it would create."""
    folder = Path(folder).resolve()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_made(folders: list[Path], lock: Path | None) -> None:
    """Undo what a refused run made: its lock file (when it made it) and the folders that did not exist before it
    (deepest first; the run folder with whatever the refused start wrote into it)."""
    if lock is not None:
        lock.unlink(missing_ok=True)
    for index, folder in enumerate(folders):
        if index == 0:
            shutil.rmtree(folder, ignore_errors=True)
        else:
            try:
                folder.rmdir()
            except OSError:
                pass  # something else was put there meanwhile: it stays


def hold_run_lock(run_dir: str | Path):
    """Take the run folder's training lock (``.NAME.lock`` beside it) for the life of this process, or raise
    :class:`RunFolderBusy` naming the process that holds it. The kernel drops the lock of a process that dies, so
    none goes stale; the open file is returned and must be kept. None where no lock file can be made there (the
    path is a file, or its folder cannot be written): the checks that follow refuse such a folder by name."""
    import fcntl

    run_dir = Path(run_dir).resolve()
    if run_dir.exists() and not run_dir.is_dir():
        return None  # not a folder: the run's own checks refuse it, naming it
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        handle = lock_path(run_dir).open("a+")
    except OSError:
        return None  # a folder nothing can be written to: the run's own checks refuse it, naming it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunFolderBusy(
            f"{run_dir} is being trained by a live process ({holder}): two trainers in one folder would log every "
            "step twice and overwrite each other's checkpoints. Wait for it, stop it, or name another --output_dir."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle


def check_writable(folder: str | Path, what: str, keep: bool = False) -> None:
    """Fail before any work when ``folder`` (created if missing) cannot take files: a write probe. A failed check
    removes every folder it created; a passed one too, unless ``keep`` (the caller writes there next, and other
    processes may be probing the same folder at once)."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".lanpo-write-check-"):
            pass
    except OSError as error:
        _remove(missing)
        raise OSError(
            f"{what} {folder} cannot be written ({error.strerror or error}): nothing was run; name a folder you can "
            "write to."
        ) from None
    if not keep:
        _remove(missing)


def _remove(folders: list[Path]) -> None:
    for created in folders:  # deepest first
        try:
            created.rmdir()
        except OSError:
            pass
