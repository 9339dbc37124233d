"""One memory limit for every process of one sandboxed run: a control group of its own, made and removed per run.

Resource limits count one process at a time: a completion that forks children which each fill their own address
space takes ``processes × memory_mb`` from the host in one run. A control group counts all of its processes
together, forks, threads, anonymous maps and the RAM-backed ``/tmp`` alike, and the kernel kills inside it when
the total passes its limit. :func:`find_memory_bound` looks for one this process may make:

* **cgroup v2** (``memory.max``): a sibling of this process's own group (a delegated subtree: systemd's
  ``user@UID.service``, ``systemd-run --user --scope``, a container with its own namespace), or a child where this
  process's group is the hierarchy's root;
* **cgroup v1**'s memory controller (``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap is
  counted): a child of this process's own group, as root.

Each candidate is tried by making a probe group, setting its limit and removing it. Where none works, the bound is
the rlimits' (:meth:`MemoryBound.rlimits`): ``memory_mb`` split over the processes the run may have, which holds in
total only where the process limit holds (as root, each run under an unprivileged uid of its own).

A run joins its group before anything of it starts: the sandbox's command is prefixed by a shell that writes its
own pid to the group's ``cgroup.procs`` and then ``exec``s (:meth:`RunGroup.wrap`), so every process of the run is
born inside. Groups are named after the owning process (``lanpo-PID-N``). If that process dies without removing
them (SIGKILL), a reaper process each sandbox starts removes that sandbox's groups when its pipe closes
(:class:`Reaper`), and any later sandbox removes the groups of owners that are gone (:func:`sweep_stale`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

PREFIX = "lanpo-"  # every group lanpo makes: lanpo-<owner pid>-<sandbox>-<run>
BoundKind = Literal["cgroup2", "cgroup1", "rlimits"]
JOIN = 'echo $$ > "$0" && exec "$@"'  # the shell that puts the run in its group, then becomes the run
MB = 1024 * 1024


@dataclass(frozen=True)
class MemoryBound:
    """How a sandboxed run's memory is bounded: ``kind`` (a group per run of cgroup v2 or v1, or rlimits alone),
    ``total_mb`` for the whole run, ``per_process_mb`` (RLIMIT_AS of each process), ``processes`` (RLIMIT_NPROC,
    where it is set) and, for groups, ``parent``, the folder the run groups are made in. ``total`` says whether the
    total holds: always for a group; for rlimits only where the process limit is in force."""

    kind: BoundKind
    total_mb: int
    per_process_mb: int
    processes: int | None
    parent: Path | None = None

    @property
    def total(self) -> bool:
        return self.kind != "rlimits" or self.processes is not None

    @classmethod
    def rlimits(cls, memory_mb: int, processes: int, process_limit: bool) -> MemoryBound:
        """No group: each process gets ``memory_mb / processes``, so the run holds at most ``memory_mb`` while no
        more than ``processes`` exist (the process limit, where it is set)."""
        return cls("rlimits", memory_mb, max(1, memory_mb // processes), processes if process_limit else None)

    def describe(self) -> str:
        """One line for the start of a run: which bound is in force."""
        if self.kind != "rlimits":
            return (
                f"a control group per run ({self.kind} memory controller, under {self.parent}): {self.total_mb} MB "
                "for all of a run's processes together"
            )
        if self.processes is not None:
            return (
                f"resource limits (no control group could be made here): {self.processes} processes x "
                f"{self.per_process_mb} MB each, at most {self.total_mb} MB for a run"
            )
        return (
            f"resource limits only, per process ({self.per_process_mb} MB each): no control group could be made and "
            "no process limit holds here (not root), so a run that forks is bounded by its timeout and CPU time, "
            "not in total; run lanpo inside a delegated cgroup (e.g. systemd-run --user --scope) to bound it"
        )


# ---------------------------------------------------------------------------------------------------------------
# Finding a place to make groups


@dataclass(frozen=True)
class Candidate:
    kind: BoundKind
    parent: Path


def own_groups(proc_cgroup: str, mountinfo: str) -> list[Candidate]:
    """Where this process could make run groups, best first, from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo`` (their texts, so a test can hand in another machine's)."""
    mounts: dict[str, tuple[Path, str]] = {}  # "v2" or "v1:memory" -> (mount point, root of the mount)
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        root, point = fields[3], Path(fields[4].replace("\\040", " "))
        if fstype == "cgroup2":
            mounts.setdefault("v2", (point, root))
        elif fstype == "cgroup" and "memory" in options:
            mounts.setdefault("v1:memory", (point, root))
    found: list[Candidate] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "" and "v2" in mounts:
            point, root = mounts["v2"]
            own = point / _relative(path, root)
            controllers_here = _read(own / "cgroup.controllers").split()
            if own == point or "memory" in _read(own / "cgroup.subtree_control").split():
                found.append(Candidate("cgroup2", own))  # a child of a root or of a group with no processes
            if own != point and "memory" in controllers_here:
                found.append(Candidate("cgroup2", own.parent))  # a sibling, in the subtree delegated to us
        elif "memory" in controllers.split(",") and "v1:memory" in mounts:
            point, root = mounts["v1:memory"]
            found.append(Candidate("cgroup1", point / _relative(path, root)))
    return found


def _relative(path: str, root: str) -> str:
    """A group's path below the mount's root (a container mounts its own group as ``/``)."""
    path, root = path.strip(), root.strip()
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return path.lstrip("/")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def find_memory_bound(memory_mb: int, processes: int, process_limit: bool) -> MemoryBound:
    """The best bound this process can give a run of ``memory_mb``: a group per run where one can be made (tried
    with a probe group), else the rlimits'."""
    try:
        candidates = own_groups(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError:
        candidates = []
    for candidate in candidates:
        bound = MemoryBound(
            candidate.kind, memory_mb, memory_mb, processes if process_limit else None, candidate.parent
        )
        try:
            RunGroup.make(bound, group_name(0, "probe")).remove()
        except OSError as error:
            logger.debug("no run groups under %s: %s", candidate.parent, error)
            continue
        return bound
    return MemoryBound.rlimits(memory_mb, processes, process_limit)


# ---------------------------------------------------------------------------------------------------------------
# One run's group


class RunGroup:
    """The control group of one run: made with its limit, joined by the run's first process, read for an OOM kill
    once the run ends, then emptied and removed."""

    def __init__(self, path: Path, kind: BoundKind) -> None:
        self.path, self.kind = path, kind

    @classmethod
    def make(cls, bound: MemoryBound, name: str) -> RunGroup:
        path = bound.parent / name
        path.mkdir()
        group = cls(path, bound.kind)
        try:
            limit = str(bound.total_mb * MB)
            if bound.kind == "cgroup2":
                (path / "memory.max").write_text(limit)
                _write_if_present(path / "memory.swap.max", "0")  # swap would let a run past its bound
            else:
                (path / "memory.limit_in_bytes").write_text(limit)
                _write_if_present(path / "memory.memsw.limit_in_bytes", limit)  # memory and swap together
        except OSError:
            group.remove()
            raise
        return group

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started inside this group: nothing of the run exists before it has joined."""
        return ["/bin/sh", "-c", JOIN, str(self.path / "cgroup.procs"), *argv]

    def oom_kills(self) -> int:
        """Processes of the run the kernel killed at the group's limit."""
        text = _read(self.path / ("memory.events" if self.kind == "cgroup2" else "memory.oom_control"))
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        if self.kind == "cgroup1":  # kernels before 4.13 do not count kills: hitting the limit is the sign
            failures = _read(self.path / "memory.failcnt").strip()
            return int(failures) if failures.isdigit() and "under_oom 1" in text else 0
        return 0

    def peak_mb(self) -> float | None:
        """The most memory the run's processes held together (None where the kernel does not say)."""
        text = _read(self.path / ("memory.peak" if self.kind == "cgroup2" else "memory.max_usage_in_bytes")).strip()
        return int(text) / MB if text.isdigit() else None

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.path / "cgroup.procs").split() if p.isdigit()]

    def remove(self, wait: float = 5.0) -> bool:
        """Kill whatever of the run is left and remove the group; False when it could not be removed in ``wait``
        seconds (a reaper or a later sandbox tries again)."""
        return remove_group(self.path, wait)


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        try:
            path.write_text(value)
        except OSError:
            pass  # the controller does not count swap here: memory alone is bounded


def remove_group(path: Path, wait: float = 5.0) -> bool:
    """Kill every process in the group at ``path`` and remove it."""
    deadline = time.monotonic() + wait
    while True:
        pids = [int(p) for p in _read(path / "cgroup.procs").split() if p.isdigit()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                logger.warning("The sandbox's control group %s could not be removed: %s", path, pids or "busy")
                return False
            time.sleep(0.02)


def group_name(sandbox: int, run: int | str) -> str:
    """The name of a run group of this process: its pid, the sandbox that made it, the run."""
    return f"{PREFIX}{os.getpid()}-{sandbox}-{run}"


def owner_of(name: str) -> int | None:
    """The pid that made a run group, from its name (``lanpo-PID-SANDBOX-RUN``)."""
    parts = name.split("-")
    return int(parts[1]) if len(parts) == 4 and parts[0] + "-" == PREFIX and parts[1].isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(parent: Path, owners: set[int] | None = None) -> int:
    """Remove run groups under ``parent`` left by owners that are gone (or, with ``owners``, by those): the ones
    a killed trainer left. Returns how many were removed."""
    removed = 0
    try:
        entries = list(parent.iterdir())
    except OSError:
        return 0
    for entry in entries:
        owner = owner_of(entry.name)
        if owner is None or not entry.is_dir():
            continue
        if (owners is not None and owner in owners) or (owners is None and not _alive(owner)):
            removed += remove_group(entry, wait=2.0)
    return removed


# ---------------------------------------------------------------------------------------------------------------
# The reaper: removes this process's groups however it ends

REAPER = """
import os, signal, sys, time
from pathlib import Path
parent, prefix = Path(sys.argv[1]), sys.argv[2]
sys.stdin.buffer.read()  # until the owner closes the pipe: it ended, however it ended
for _ in range(250):
    left = [g for g in parent.glob(prefix + '-*') if g.is_dir()]
    if not left:
        break
    for group in left:
        try:
            pids = (group / 'cgroup.procs').read_text().split()
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        try:
            group.rmdir()
        except OSError:
            pass
    time.sleep(0.02)
"""


class Reaper:
    """A small process that outlives its owner just long enough to remove the owner's run groups: it waits for the
    end of a pipe only the owner holds, which the kernel closes however the owner ends (SIGKILL included)."""

    def __init__(self, parent: Path, sandbox: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", REAPER, str(parent), group_name(sandbox, "").rstrip("-")],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the trainer's terminal does not end it before its work
            close_fds=True,
        )

    def close(self) -> None:
        """The owner is done: the reaper removes what is left and exits."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
