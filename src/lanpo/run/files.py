"""The files a run writes for people to read and reads back: ``metrics.jsonl``, ``samples.jsonl``,
``retrievals.jsonl``, and the write check made before any work."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from transformers import TrainerCallback

from lanpo.prompts import solve_messages
from lanpo.rollout import Row


class MetricsFileCallback(TrainerCallback):
    """Append every log line to ``metrics.jsonl`` in the run directory (main process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")


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
                        "gold": r.gold,
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


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path``'s text all at once: written to a temporary file beside it, then renamed over it, so a
    kill mid-write leaves the old file whole (and at most a stray ``.tmp`` file), never a half or empty one."""
    path = Path(path)
    handle = tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            os.chmod(handle.name, path.stat().st_mode & 0o7777)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


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
