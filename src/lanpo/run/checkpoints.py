"""Checkpoints that are complete or absent, and resuming without losing or repeating anything.

A checkpoint is written under ``RUN/.staging/checkpoint-N`` (the model, optimizer, RNG states, trainer state,
then lanpo's pool and each process's pending summaries) and renamed to ``RUN/checkpoint-N`` only when every
process has finished writing: a run killed mid-save leaves no ``checkpoint-N`` that looks resumable, and
``--resume latest`` always means the newest complete one. On resume, ``metrics.jsonl``, ``samples.jsonl`` and
``retrievals.jsonl`` are cut back to the checkpoint's step, so the steps re-run after it are not logged twice. Each
checkpoint keeps a copy of the run's ``config.yaml``, so a resume can tell when that file was edited since.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import sqlite3
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from lanpo.pool.store import POOL_FILENAME as POOL_FILE
from lanpo.summarize import Trial
from lanpo.verify.sandbox import gold_kind_of

logger = logging.getLogger(__name__)

STAGING = ".staging"
FEEDBACK_STATE = "feedback_state.json"  # a checkpoint's hint ladder and transfer record
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def state_file(rank: int) -> str:
    return f"lanpo_state_rank{rank}.json"


def is_checkpoint(path: Path) -> bool:
    return path.is_dir() and bool(_CHECKPOINT.match(path.name))


def checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    run_dir = Path(run_dir)
    found = [
        (int(m.group(1)), p) for p in run_dir.glob("checkpoint-*") if p.is_dir() and (m := _CHECKPOINT.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest(run_dir: str | Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def discard_staging(run_dir: str | Path) -> None:
    """Remove what a run killed while saving left half-written."""
    shutil.rmtree(Path(run_dir) / STAGING, ignore_errors=True)


def write_state(folder: Path, rank: int, world_size: int, step: int, pending: list[Trial]) -> None:
    """This process's part of lanpo's checkpoint state: its pending summaries (each process has its own), each
    naming its problem but never holding its gold answer (a code problem's is its hidden test suite): a resume reads
    the golds back from the run's data (:func:`with_golds`)."""
    saved = [{k: v for k, v in asdict(t).items() if k != "gold"} for t in pending]
    state = {"rank": rank, "world_size": world_size, "step": step, "pending": saved}
    tmp = folder / (state_file(rank) + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, folder / state_file(rank))


def write_json(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path``, written under a temporary name and renamed (a kill leaves the old file or none)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; empty where the file is absent (checkpoints of older runs lack newer files)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def commit(staged: Path, final: Path, save_total_limit: int | None = None, best: str | None = None) -> None:
    """Move a fully written checkpoint into place (the main process, after every process wrote its part), then
    keep the newest ``save_total_limit`` checkpoints as transformers does (``best``: its best model checkpoint)."""
    from transformers.trainer_utils import rotate_checkpoints  # here: loading a grid stays free of torch

    if final.exists():  # the same step saved again (a resumed run re-saving its first step)
        shutil.rmtree(final)
    os.replace(staged, final)
    try:
        staged.parent.rmdir()
    except OSError:
        pass
    rotate_checkpoints(
        output_dir=str(final.parent), save_total_limit=save_total_limit, best_model_checkpoint=best, use_mtime=False
    )


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the message says why (a full disk, when it was) and how to resume."""


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@contextmanager
def save_failures_named(run_dir: Path, name: str):
    """Around the writing of checkpoint ``name``: a failure raises :class:`CheckpointSaveError` that names the
    checkpoint, the free space, a full disk when that is the cause (torch's own message for it is only
    ``[enforce fail at inline_container.cc] unexpected pos``; sqlite says ``database or disk is full``) and the
    command that resumes. The half-written checkpoint is removed (it frees the space it took); complete ones stay."""
    try:
        yield
    except (OSError, RuntimeError, sqlite3.Error) as error:
        if isinstance(error, CheckpointSaveError):
            raise
        free = shutil.disk_usage(run_dir).free if run_dir.is_dir() else None
        discard_staging(run_dir)
        last = latest(run_dir)
        needed = max(_size(last), 2**26) if last is not None else 2**30  # the last one's size (64 MiB+), or 1 GiB
        full = (
            getattr(error, "errno", None) == errno.ENOSPC
            or "disk is full" in str(error).lower()
            or (free is not None and free < needed)
        )
        space = f"{free / 1e9:.1f} GB free" if free is not None else "free space unknown"
        takes = f", and a checkpoint of this run takes {needed / 1e9:.1f} GB" if last is not None else ""
        cause = (
            f" The disk is full: {space} on the disk of {run_dir}{takes}; free space there (or keep fewer "
            "checkpoints with save_total_limit, or save less often with save_steps)."
            if full
            else f" ({space} on its disk.)"
        )
        config = run_dir / "config.yaml"  # written by `lanpo train`; a trainer built in Python has none
        if last is not None:
            then = f"Resume from {last.name} with: lanpo train --resume latest --output_dir {run_dir}"
        else:
            then = "No complete checkpoint was written; " + (
                f"start again with: lanpo train --config {config} --overwrite"
                if config.is_file()
                else "start the run again."
            )
        raise CheckpointSaveError(
            f"Saving {name} in {run_dir} failed: {type(error).__name__}: {error}.{cause} The "
            f"half-written {name} was removed. {then}"
        ) from error


def read_pending(folder: Path, rank: int, world_size: int) -> list[Trial]:
    """The pending summaries this process resumes with. With another number of processes than the checkpoint's,
    the main process takes every process's pending trials (none is lost, none summarized twice)."""
    files = sorted(folder.glob("lanpo_state_rank*.json"))
    if not files:
        legacy = folder / "lanpo_state.json"  # written by lanpo 0.1 (main process only)
        return (
            [_trial(t) for t in json.loads(legacy.read_text()).get("pending", [])]
            if legacy.is_file() and rank == 0
            else []
        )
    states = [json.loads(f.read_text()) for f in files]
    if states[0].get("world_size") == world_size:
        mine = [s for s in states if s.get("rank") == rank]
        return [_trial(t) for s in mine for t in s.get("pending", [])]
    return [_trial(t) for s in states for t in s.get("pending", [])] if rank == 0 else []


def _trial(saved: dict) -> Trial:
    """A pending trial as saved; one saved before trials said their gold's kind has it read from the gold (older
    checkpoints held golds)."""
    return Trial(**({"gold_kind": gold_kind_of(saved.get("gold"))} | saved))


def with_golds(pending: list[Trial], golds: Mapping[str, str]) -> tuple[list[Trial], int]:
    """Resumed pending trials with their golds read back from the run's data (problem id -> gold answer; the
    summary's answer scrub needs it), and how many were dropped because the data no longer holds their problem (a
    summary that cannot be scrubbed of its answer is not written)."""
    kept = [
        replace(t, gold=t.gold if t.gold is not None else golds[t.problem_id])
        for t in pending
        if t.gold is not None or t.problem_id in golds
    ]
    return kept, len(pending) - len(kept)


def restore(folder: Path, pool, rank: int, world_size: int, run_dir: Path) -> list[Trial]:
    """Put the checkpoint's pool back into ``pool`` and return this process's pending summaries; the main
    process (rank 0) cuts the run's logs back to the checkpoint's step, since the steps after it are re-run."""
    if not (folder / POOL_FILE).is_file():
        raise FileNotFoundError(
            f"{folder} has no {POOL_FILE}: it was not written by LanpoTrainer (or not "
            "completely), so the experience pool cannot be resumed."
        )
    pool.restore_from(folder / POOL_FILE)
    step = json.loads((folder / "trainer_state.json").read_text())["global_step"]
    if rank == 0:  # metrics carry the step they report (1-based); samples and retrievals the step they were
        trim_jsonl(run_dir / "metrics.jsonl", step)  # generated at (0-based): those of step N are re-generated
        for log in ("samples.jsonl", "retrievals.jsonl"):
            trim_jsonl(run_dir / log, step - 1)
    return read_pending(folder, rank, world_size)


def finished_step(folder: Path, max_steps: int) -> int | None:
    """The step of checkpoint ``folder`` when it is the end of its run (``max_steps``, or the run's own planned
    steps when ``max_steps`` is -1), else None."""
    state = json.loads((folder / "trainer_state.json").read_text())
    target = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return state["global_step"] if target and state["global_step"] >= target else None


def trim_jsonl(path: Path, max_step: int) -> int:
    """Drop the lines of a per-step log written after ``max_step``; returns how many were dropped."""
    if not path.is_file():
        return 0
    kept = []
    dropped = 0
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            step = max_step + 1  # a line torn by the kill
        if isinstance(step, int | float) and step <= max_step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


def epoch_ordered(sampler):
    """TRL's ``RepeatSampler`` made to give epoch ``e`` the order it gives after ``e`` earlier epochs, whichever
    iterations came before: its shuffle draws from one generator seeded once, so a run resumed past its first epoch
    (a fresh sampler) would replay epoch 0's order. Transformers calls ``set_epoch`` before each epoch's iteration;
    here it reseeds and draws the earlier epochs' permutations again, so an uninterrupted run's order is TRL's own
    and a resumed run's is the uninterrupted one's. A sampler that does not shuffle, or has no seed, is returned as
    it is."""
    if not getattr(sampler, "shuffle", False) or getattr(sampler, "seed", None) is None:
        return sampler

    def set_epoch(epoch: int) -> None:
        import torch

        sampler.generator.manual_seed(sampler.seed)
        for _ in range(epoch):
            torch.randperm(sampler.num_samples, generator=sampler.generator)

    sampler.set_epoch = set_epoch
    return sampler


def save_run_state(staged: Path, pool, feedback_state: dict, teacher, run_dir: Path) -> None:
    """The main process's part of lanpo's checkpoint state: the pool, the hint ladder and transfer record
    (``feedback_state``), an EMA teacher's weights, and the run's ``config.yaml`` (what the checkpoint was trained
    with)."""
    pool.backup(staged / POOL_FILE)
    write_json(staged / FEEDBACK_STATE, feedback_state)
    if teacher is not None:
        teacher.save(staged)
    if (run_dir / "config.yaml").is_file():
        shutil.copyfile(run_dir / "config.yaml", staged / "config.yaml")


def resume_run_state(folder: Path, pool, rank: int, processes: int, run_dir: Path, dataset) -> tuple[list[Trial], dict]:
    """What :func:`save_run_state` and :func:`write_state` kept, put back: the pool (:func:`restore`), this process's
    pending trials with their golds read from the run's ``dataset`` (problem id -> answer; a trial whose problem is
    gone is dropped, with a warning), and the feedback state (empty in checkpoints of older runs)."""
    from lanpo.data.loaders import problem_of

    pending = restore(folder, pool, rank, processes, run_dir)
    golds = {problem_of(row)[0]: str(row["answer"]) for row in dataset} if pending else {}
    pending, dropped = with_golds(pending, golds)
    if dropped:
        logger.warning(
            "%d pending summaries of %s dropped: their problems are not in this run's data, so their lessons could "
            "not be scrubbed of the answer.",
            dropped,
            folder,
        )
    return pending, read_json(folder / FEEDBACK_STATE)
