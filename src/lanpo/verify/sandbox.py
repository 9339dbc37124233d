"""Run model-written Python in a sandbox and report whether its tests passed.

Model code is untrusted: under RL a policy finds whatever earns reward. Each execution is one fresh process under
Debian's ``bubblewrap``: only ``/usr`` visible, read-only; a private ``/tmp``; no network (a new network namespace
holds only its own loopback); new PID, IPC and UTS namespaces, so nothing outside can be seen or signalled; an
empty environment; no capabilities; and resource limits on CPU time, address space, processes, file size and open
files. The parent kills the whole sandbox at a wall-clock timeout (its PID namespace dies with it) and reads at most
``output_chars`` of its output. As root, the sandbox runs under an unprivileged uid of its own, so the process
limit counts its processes alone.

**A pass is the tests' own completion, reported out of band, by a process the model's code never runs in.** The
trusted runner (:mod:`lanpo.verify.runner`) is two processes inside the sandbox: a *judge* that holds a fresh random
token and the report descriptor, and a fresh *worker* interpreter that runs the model's code and answers calls over
a channel of plain values. The judge runs the tests and writes one line, ``token result``; the parent accepts
exactly one such line and nothing else. An exit status, anything printed, an early ``exit``, a ``SystemExit``
raised inside the function, a rebound module or builtin, or a second line on that pipe earns nothing. Tests come in
two forms (:class:`CodeTests`):

* ``cases``: arguments and expected values. The judge sends back what the function *returned*; the parent, which
  alone holds the expected values, compares, and a report without every value fails. Nothing inside the sandbox
  can know what would pass.
* ``check``: a test program (HumanEval's ``check(candidate)``, or plain ``assert`` lines) run by the judge after
  the problem's own code (``helpers``), with the function's name bound to a proxy of the worker: the test program
  and its expected values never enter the model's process, and every value it compares was rebuilt from plain data.

The sandbox bounds what it takes from the host: the memory of all of a run's processes together (a control group of
its own per run, :mod:`lanpo.verify.cgroups`; where none can be made, the address space of each process times the
processes it may have), the address space, CPU time, processes, file size and open files of each process, and
sized ``/tmp`` and ``/dev/shm`` (RAM-backed, so counted in ``tmp_mb`` and in the run's group); the rest of ``/dev``
is read-only, no nested user namespace can be made inside, and no kernel keyring can be reached (a seccomp filter
denies ``add_key``, ``keyctl`` and ``request_key``: keyrings are kept per uid, a channel between runs).

Without bubblewrap, :class:`Sandbox` refuses to start and says how to install it, unless ``allow_unsandboxed``
names the risk (the code then runs with the resource limits, an empty environment and a temporary working
directory, and no security boundary at all).
"""

from __future__ import annotations

import ast
import itertools
import json
import keyword
import logging
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from lanpo.verify.cgroups import MemoryBound, Reaper, RunGroup, find_memory_bound, group_name, sweep_stale
from lanpo.verify.seccomp import keyring_filter

logger = logging.getLogger(__name__)

CODE_GOLD_KEY = "code_tests"  # a gold answer that starts with {"code_tests": is a test suite, not a math answer
MAX_TESTS_CHARS = 1_000_000  # a test suite past this is data gone wrong (it would also choke the sandbox's stdin)
MAX_WORKERS = 64  # concurrent sandboxes: as root each runs under an unprivileged uid of its own, from 64 per process
SANDBOX_NUMBERS = itertools.count(1)  # the sandboxes of this process, told apart in their control groups' names


@dataclass(frozen=True)
class CodeTests:
    """What a code problem is checked against: the function's name, and ``cases`` (``[[args], expected]`` pairs) or
    a ``check`` program; ``preamble`` (imports the problem statement gives) runs before the model's code."""

    entry_point: str
    cases: list = field(default_factory=list)
    check: str = ""
    preamble: str = ""
    helpers: str = ""  # the problem's own code (HumanEval's helpers and the stub): run by the judge before `check`

    def to_gold(self) -> str:
        data = asdict(self)
        if not data["helpers"]:  # golds without helpers stay as they were written before the field existed
            del data["helpers"]
        return json.dumps({CODE_GOLD_KEY: data}, sort_keys=True)

    @classmethod
    def from_gold(cls, gold: str) -> CodeTests:
        data = json.loads(gold)[CODE_GOLD_KEY]
        return cls(
            data["entry_point"],
            data.get("cases") or [],
            data.get("check") or "",
            data.get("preamble") or "",
            data.get("helpers") or "",
        )

    def __post_init__(self) -> None:
        if not self.entry_point.isidentifier() or keyword.iskeyword(self.entry_point):
            raise ValueError(f"entry_point must be a Python name, got {self.entry_point!r}.")
        if bool(self.cases) == bool(self.check.strip()):
            raise ValueError("Code tests need either cases or a check program (exactly one).")

    def defects(self) -> list[str]:
        """Why these tests cannot judge a solution (empty when they can): a program that does not compile, one that
        never names the function it tests, sizes past the bounds."""
        size = len(self.check) + len(self.helpers) + len(self.preamble) + len(json.dumps(self.cases))
        if size > MAX_TESTS_CHARS:
            return [f"tests longer than {MAX_TESTS_CHARS:,} characters"]
        found = []
        for name, source in (("tests", self.check), ("problem code", self.helpers), ("imports", self.preamble)):
            try:
                ast.parse(source)
            except (SyntaxError, ValueError) as error:
                found.append(f"{name} do not compile ({type(error).__name__}: {getattr(error, 'msg', error)})")
        if self.check and not found:
            names = {node.id for node in ast.walk(ast.parse(self.check)) if isinstance(node, ast.Name)}
            if not names & {self.entry_point, "candidate"}:
                found.append(f"the tests never call {self.entry_point} (nor a check(candidate))")
        return found


GoldKind = Literal["math", "code"]  # what a gold answer is: a math answer, or a test suite (CodeTests.to_gold)
GOLD_KINDS: tuple[GoldKind, ...] = get_args(GoldKind)


def gold_kind_of(gold) -> GoldKind:
    """What a gold is, read from its text: only where the data does not say, once, as it is loaded (a data set
    handed to the trainer without a ``gold_kind`` column, TRL's reward called without one, a checkpoint written
    before the field). Everything lanpo's loaders build says (:attr:`lanpo.data.loaders.Problem.gold_kind`)."""
    return "code" if isinstance(gold, str) and gold.startswith('{"' + CODE_GOLD_KEY + '"') else "math"


def logged_gold(gold: str, kind: GoldKind) -> str:
    """A gold as a run's logs and report show it: a math answer as it is; a test suite by its size alone (the
    hidden tests are the reward: no log, report or page a person may pass on holds one)."""
    if kind != "code":
        return gold
    try:
        tests = CodeTests.from_gold(gold)
    except (ValueError, KeyError, TypeError):
        return "hidden tests"
    return f"hidden tests ({len(tests.cases)} cases)" if tests.cases else "hidden tests (a check program)"


@dataclass(frozen=True)
class Limits:
    """Per execution. ``timeout`` is wall-clock seconds for the whole sandbox, start-up included; ``memory_mb`` is
    the whole run's, all of its processes together (:attr:`Sandbox.bound` says how it is held here); ``processes``
    counts the sandbox's own four (two of bubblewrap, the judge, the worker) and what the code starts."""

    timeout: float = 5.0
    cpu_seconds: int = 4
    memory_mb: int = 512
    processes: int = 8
    file_mb: int = 8
    open_files: int = 64
    output_chars: int = 2000
    tmp_mb: int = 16  # each of /tmp and /dev/shm: RAM-backed, so this bounds what the sandbox's files take


OUTCOMES = ("passed", "failed", "error", "timeout", "crashed", "forged", "no_code")  # what a run can come to


@dataclass
class Execution:
    """One run's outcome: ``passed`` (every test), ``failed`` (a test failed or raised), ``error`` (the code did
    not define the function or did not compile), ``timeout``, ``crashed`` (killed by a limit or a signal, or exited
    without its report), ``forged`` (a report that was not the runner's one line), ``no_code``."""

    outcome: str
    passed: int = 0
    total: int = 0
    output: str = ""
    seconds: float = 0.0
    reason: str = ""  # why a run crashed, where the sandbox knows (a limit that killed it)
    peak_mb: float | None = None  # the most memory the run's processes held together (where a group counted it)
    # What the code did, for execution feedback only (never read for a verdict): per case of a ``cases`` suite,
    # ``{"value": the returned value as JSON, or None; "long": whether it was too long to keep; "raised": {"type",
    # "message", "lines"}, or None}``; for an ``error``, what its code raised as it loaded. The worker's word,
    # bounded: a program may write anything here.
    calls: list | None = None
    error: dict | None = None

    @property
    def share(self) -> float:
        return self.passed / self.total if self.total else 0.0


# The trusted runner (lanpo.verify.runner): its judge and worker run inside the sandbox, from this source.
RUNNER = (Path(__file__).with_name("runner.py")).read_text(encoding="utf-8")
RUNNER_ARGS = ["-I", "-S", "-B", "-c", RUNNER, "judge"]


def _same(value_json: str | None, expected) -> bool:
    """A returned value (as JSON) equals the expected one: same JSON types (``True`` is not ``1``), floats within
    1e-6 relative."""
    if value_json is None:
        return False
    try:
        value = json.loads(value_json)
    except ValueError:
        return False
    return _equal(value, json.loads(json.dumps(expected)))


def same_value(a, b) -> bool:
    """Two plain values are one as the tests compare them (:func:`_same`): a value passed as JSON and back."""
    return _equal(json.loads(json.dumps(a)), json.loads(json.dumps(b)))


def _equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------------------------------------------------------
# The sandbox


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot start here, and unsandboxed execution was not allowed."""


INSTALL_HINT = (
    "lanpo runs model-written code only inside bubblewrap: install it (Debian/Ubuntu: `apt-get install bubblewrap`; "
    "Fedora: `dnf install bubblewrap`). To run model code with no security boundary at all, pass "
    "--allow-unsandboxed-code (allow_unsandboxed_code: true)."
)


SETPRIV = shutil.which("setpriv")


def _interpreter() -> str:
    """The interpreter inside the sandbox: the system's (it lives under /usr, the one tree the sandbox shows)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def bwrap_argv(interpreter: str, tmp_mb: int = Limits.tmp_mb, seccomp_fd: int | None = None) -> list[str]:
    """The bubblewrap command line for one execution (the runner is read from ``-c``), with the keyring filter
    read from ``seccomp_fd`` when given."""
    argv = ["bwrap", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    home = Path(interpreter).resolve().parents[1]
    if not str(home).startswith("/usr"):
        argv += ["--ro-bind", str(home), str(home)]
    size = str(tmp_mb * 1024 * 1024)
    # /tmp and /dev/shm are tmpfs, which lives in the host's RAM and which RLIMIT_AS does not count: sized; the
    # rest of /dev (bubblewrap's own tmpfs) read-only
    argv += ["--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--proc", "/proc"]
    argv += ["--size", size, "--tmpfs", "/tmp", "--chdir", "/tmp", "--setenv", "HOME", "/tmp"]
    # bubblewrap's own root is a tmpfs too, unsized and writable: read-only once every mount above is made (a write
    # under / would otherwise take host RAM past every bound, whichever of cgroups or rlimits bounds the run)
    argv += ["--remount-ro", "/"]
    argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--new-session", "--die-with-parent"]
    argv += ["--cap-drop", "ALL", "--clearenv"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv + ["--", interpreter, *RUNNER_ARGS]


def check_workers(workers) -> int:
    """``workers`` as a count of concurrent sandboxes, 1 to :data:`MAX_WORKERS` (one uid each, as root)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"code_workers must be a whole number from 1 to {MAX_WORKERS}, got {workers!r}.")
    return workers


class Sandbox:
    """Runs :class:`CodeTests` against code, ``workers`` executions at a time. Thread-safe; counts outcomes in
    ``stats``. ``allow_unsandboxed`` runs without bubblewrap when it is missing (no security boundary)."""

    def __init__(self, limits: Limits | None = None, workers: int = 2, allow_unsandboxed: bool = False) -> None:
        self.limits = limits or Limits()
        self.workers = check_workers(workers)
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._slots = list(range(self.workers))
        self._pool: ThreadPoolExecutor | None = None
        self._runs = 0  # names each run's control group, with this sandbox's number
        self._number = next(SANDBOX_NUMBERS)
        self._reaper: Reaper | None = None
        self.interpreter = _interpreter()
        self.isolated = shutil.which("bwrap") is not None
        self.drop_to_uid = False
        # until the bound is found (_bound_memory): each process may take the whole, as the trial runs need
        self.bound = MemoryBound.rlimits(self.limits.memory_mb, 1, False)
        if not self.isolated:
            if not allow_unsandboxed:
                raise SandboxUnavailable(INSTALL_HINT)
            self.interpreter = sys.executable
            logger.warning(
                "Running model-written code WITHOUT a sandbox (allow_unsandboxed_code): no security boundary."
            )
            self._say_bound()
            return
        # As root, the sandbox drops to an unprivileged uid (root is exempt from the process limit); the interpreter
        # must be one that uid can read, and the kernel must let that uid make a user namespace.
        self.drop_to_uid = os.geteuid() == 0 and self.interpreter.startswith("/usr/")
        trial = self._trial()
        if self.drop_to_uid and trial.outcome != "passed":
            self.drop_to_uid = False
            logger.warning(
                "The sandbox cannot run under an unprivileged uid here: no process limit (only its PID "
                "namespace and the timeout bound a fork bomb)."
            )
            trial = self._trial()
        if trial.outcome != "passed":  # bubblewrap is here but does not work: no silent fallback to no sandbox
            raise SandboxUnavailable(
                f"bubblewrap is installed but a trial run in the sandbox came to {trial.outcome!r} "
                f"({trial.output.strip()[-300:] or 'no output'}). Check that this kernel allows unprivileged user "
                "namespaces (sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces)."
            )
        self._bound_memory()
        self._say_bound()

    def _bound_memory(self) -> None:
        """One memory limit for each run as a whole: a control group per run where this process can make them
        (tried with a run), else the rlimits' split (:mod:`lanpo.verify.cgroups`)."""
        found = find_memory_bound(self.limits.memory_mb, self.limits.processes, self.drop_to_uid)
        if found.kind != "rlimits":
            sweep_stale(found.parent)  # groups left by trainers that were killed before their reaper ran
            self.bound = found
            self._reaper = Reaper(found.parent, self._number)
            trial = self._trial()
            if trial.outcome == "passed":
                return
            logger.warning(
                "A run could not join a control group under %s (%s): each run's memory is bounded by rlimits instead.",
                found.parent,
                trial.output.strip()[-200:] or trial.outcome,
            )
            self._close_reaper()
        self.bound = MemoryBound.rlimits(self.limits.memory_mb, self.limits.processes, self.drop_to_uid)
        trial = self._trial()
        if trial.outcome != "passed":
            raise SandboxUnavailable(
                f"No control group can be made here, so a run's {self.limits.memory_mb} MB are split over its "
                f"{self.limits.processes} processes: {self.bound.per_process_mb} MB each is too little for the runner "
                f"({trial.outcome}: {trial.output.strip()[-200:]}). Raise the memory limit or lower the process count."
            )

    def _say_bound(self) -> None:
        logger.info("Code sandbox: each run's memory is bounded by %s.", self.bound.describe())

    def _trial(self) -> Execution:
        """One trivial run made as runs will be made, with time enough for a slow start (a short ``timeout``
        bounds the model's code, not this probe)."""
        return self._execute("def f():\n    return 1\n", CodeTests("f", cases=[[[], 1]]), 0, timeout=30.0)

    @property
    def uids(self) -> range:
        """The unprivileged uids this process's sandboxes run under, as root (one per concurrent run)."""
        base = 200_000 + (os.getpid() % 10_000) * MAX_WORKERS
        return range(base, base + MAX_WORKERS)

    # -- public API ------------------------------------------------------------------------------------------

    def run_many(self, jobs: list[tuple[str | None, CodeTests]]) -> list[Execution]:
        """Each ``(code, tests)`` run in its own sandbox; ``None`` code is ``no_code``. Never raises for what the
        code does."""
        if not jobs:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="lanpo-sandbox")
        return list(self._pool.map(lambda job: self.run(*job), jobs))

    def run(self, code: str | None, tests: CodeTests) -> Execution:
        if code is None or not code.strip():
            result = Execution("no_code", 0, max(1, len(tests.cases)))
        else:
            # a slot (an uid) per concurrent run: at most `workers` at once, however many threads call run()
            with self._free:
                self._free.wait_for(lambda: self._slots)
                slot = self._slots.pop()
            try:
                result = self._execute(code, tests, slot)
            finally:
                with self._free:
                    self._slots.append(slot)
                    self._free.notify()
        with self._lock:
            self.stats[result.outcome] += 1
            self.stats["executions"] += 1
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._close_reaper()

    def _close_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    # -- internals -------------------------------------------------------------------------------------------

    def _rlimits(self) -> list[tuple[str, int]]:
        """The limits the runner sets on itself before the model's code runs (inherited by all it starts)."""
        limits, mb = self.limits, 1024 * 1024
        rlimits = [
            ("RLIMIT_CPU", limits.cpu_seconds),
            ("RLIMIT_AS", self.bound.per_process_mb * mb),
            ("RLIMIT_FSIZE", limits.file_mb * mb),
            ("RLIMIT_NOFILE", limits.open_files),
            ("RLIMIT_CORE", 0),
        ]
        return rlimits + ([("RLIMIT_NPROC", limits.processes)] if self.drop_to_uid else [])

    def _execute(self, code: str, tests: CodeTests, slot: int, timeout: float | None = None) -> Execution:
        token = secrets.token_hex(16)
        read_end, write_end = os.pipe()
        job = {"token": token, "report_fd": write_end, "rlimits": self._rlimits(), "code": code, **asdict(tests)}
        job["source"] = RUNNER  # the judge starts the worker from the same source
        job["cases"] = [args for args, _ in tests.cases]  # the expected values never enter the sandbox
        passed_fds = [write_end]
        if self.isolated:
            seccomp = _program_pipe(keyring_filter())
            passed_fds.append(seccomp)
            argv = bwrap_argv(self.interpreter, self.limits.tmp_mb, seccomp)
        else:
            argv = [self.interpreter, *RUNNER_ARGS]
        # As root, each worker slot runs as an unprivileged uid of its own: the process limit then counts the
        # sandbox's processes alone (root is exempt from it). util-linux's setpriv switches the uid after the spawn:
        # Popen's own user= rules out vfork, and a fork of a trainer holding gigabytes costs 0.05-0.25 s a run.
        uid = self.uids[slot] if self.drop_to_uid else None
        switch = {}
        if uid is not None and SETPRIV:
            argv = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
        elif uid is not None:
            switch = {"user": uid, "group": uid, "extra_groups": []}
        group = None
        if self.bound.kind != "rlimits":  # the run is born in a group of its own: its memory counted as a whole
            try:
                group = RunGroup.make(self.bound, group_name(self._number, self._next_run()))
                argv = group.wrap(argv)
            except OSError as error:
                for fd in (read_end, *passed_fds):
                    os.close(fd)
                return Execution("crashed", 0, max(1, len(tests.cases)), "", 0.0, f"no control group: {error}")
        started = time.monotonic()
        # bubblewrap starts in its private /tmp; without it the code gets a temporary directory of its own
        workdir_context = nullcontext("/") if self.isolated else tempfile.TemporaryDirectory(prefix="lanpo-code-")
        with workdir_context as workdir, tempfile.TemporaryFile() as output:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    pass_fds=tuple(passed_fds),
                    start_new_session=True,
                    cwd=workdir,
                    env={} if self.isolated else {"PATH": "/usr/bin:/bin", "HOME": workdir},
                    **switch,
                )
            except OSError as error:
                for fd in (read_end, *passed_fds):
                    os.close(fd)
                if group is not None:
                    group.remove()
                return Execution("crashed", 0, max(1, len(tests.cases)), f"could not start: {error}")
            for fd in passed_fds:
                os.close(fd)
            report, timed_out = self._wait(process, json.dumps(job).encode(), read_end, timeout)
            seconds = time.monotonic() - started
            output.seek(0)
            text = output.read(self.limits.output_chars).decode("utf-8", "replace")
        result = self._judge(report, token, tests, timed_out, process.returncode, text, seconds)
        if group is not None:
            killed, result.peak_mb = group.oom_kills(), group.peak_mb()
            group.remove()
            if killed:  # a process of the run met the group's limit: the run as a whole took too much
                result = Execution(
                    "crashed",
                    0,
                    max(1, len(tests.cases)),
                    result.output,
                    seconds,
                    f"killed at the run's memory limit ({self.bound.total_mb} MB for all its processes together; "
                    f"{killed} process(es) killed)",
                    result.peak_mb,
                )
        result.output = result.output[: self.limits.output_chars]
        return result

    def _next_run(self) -> int:
        with self._lock:
            self._runs += 1
            return self._runs

    def _wait(self, process: subprocess.Popen, job: bytes, read_end: int, timeout: float | None) -> tuple[bytes, bool]:
        """Send the job, collect the report pipe until the sandbox ends or the deadline passes (then kill it all)."""
        deadline = time.monotonic() + (timeout or self.limits.timeout)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read_end, chunks, 1 << 16), daemon=True)
        reader.start()
        try:
            process.stdin.write(job)
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        timed_out = not _wait_for_exit(process, max(0.0, deadline - time.monotonic()))
        _kill_group(process)
        reader.join(timeout=max(0.5, deadline - time.monotonic()))
        if reader.is_alive():  # a grandchild still holds the report pipe open: it was killed with the group
            timed_out = True
        return b"".join(chunks), timed_out

    def _judge(self, report, token, tests, timed_out, returncode, text, seconds) -> Execution:
        total = max(1, len(tests.cases))
        lines = report.decode("utf-8", "replace").splitlines()
        if timed_out:
            return Execution("timeout", 0, total, text, seconds)
        if not lines:
            return Execution("crashed", 0, total, text + f"\n[exit status {returncode}]", seconds)
        if not all(line.startswith(token + " ") for line in lines):
            return Execution("forged", 0, total, text, seconds)
        if len(lines) > 1:  # the code forked and more than one copy reported: no single run of the tests
            return Execution("failed", 0, total, text, seconds)
        try:
            result = json.loads(lines[0][len(token) + 1 :])
        except ValueError:
            return Execution("forged", 0, total, text, seconds)
        if not isinstance(result, dict):
            return Execution("forged", 0, total, text, seconds)
        for key in ("runner", "crashed"):  # the judge could not protect itself; the worker died
            if key in result:
                return Execution("crashed", 0, total, f"{result[key]}\n{text}", seconds)
        if "error" in result:
            error = _raised(result.get("detail"))
            return Execution("error", 0, total, f"{result['error']}\n{text}", seconds, error=error)
        if tests.cases:  # a suite of cases passes on its values alone, compared here
            values = result.get("values")
            if not isinstance(values, list) or len(values) != len(tests.cases):
                return Execution("forged", 0, total, text, seconds)
            passed = sum(_same(value, expected) for value, (_, expected) in zip(values, tests.cases))
            raised = result.get("raised")
            raised = raised if isinstance(raised, list) and len(raised) == len(values) else [None] * len(values)
            calls = [
                {
                    "value": value if isinstance(value, str) and len(value) <= MAX_VALUE_JSON else None,
                    "long": isinstance(value, str) and len(value) > MAX_VALUE_JSON,
                    "raised": _raised(why),
                }
                for value, why in zip(values, raised)
            ]
            return Execution("passed" if passed == total else "failed", passed, total, text, seconds, calls=calls)
        if result.get("passed") is True and isinstance(result.get("calls"), int) and result["calls"] > 0:
            return Execution("passed", 1, 1, text, seconds)
        return Execution("failed", 0, 1, f"{result.get('failed', '')}\n{text}", seconds)


MAX_DETAIL = 300  # characters of one exception's type or message kept (execution feedback)
MAX_VALUE_JSON = 2000  # characters of one returned value kept (execution feedback)


def _raised(detail) -> dict | None:
    """An exception as the run described it, or None: plain strings and line numbers, bounded (the judge bounds
    them too; a program that forged its own report is caught before this)."""
    if not isinstance(detail, dict) or not isinstance(detail.get("type"), str):
        return None
    lines = detail.get("lines")
    return {
        "type": detail["type"][:MAX_DETAIL],
        "message": detail["message"][:MAX_DETAIL] if isinstance(detail.get("message"), str) else "",
        "lines": [n for n in lines[:5] if type(n) is int and n > 0] if isinstance(lines, list) else [],
    }


def _program_pipe(program: bytes) -> int:
    """A descriptor bubblewrap reads a seccomp program from (a pipe holding it, its writing end closed)."""
    read_end, write_end = os.pipe()
    os.write(write_end, program)  # a few hundred bytes: within any pipe's buffer
    os.close(write_end)
    return read_end


def _drain(fd: int, chunks: list[bytes], limit: int) -> None:
    """Read a descriptor to its end, keeping at most ``limit`` bytes."""
    kept = 0
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            if kept < limit:
                chunks.append(data[: limit - kept])
                kept += len(data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _wait_for_exit(process: subprocess.Popen, timeout: float) -> bool:
    """Wait until ``process`` ends (True) or ``timeout`` seconds pass (False), waking the moment it ends.

    ``Popen.wait(timeout)`` polls with sleeps that double up to 50 ms, which added 25 ms on average to a run of about
    60 ms; a pidfd (Linux 5.3) turns readable when the process ends. Elsewhere, Popen's own wait."""
    if process.returncode is not None:
        return True
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd here, or the process is gone already
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        poller = select.poll()  # not select(): a trainer may hold more than 1024 descriptors
        poller.register(pidfd, select.POLLIN)
        ready = poller.poll(math.ceil(timeout * 1000))
    finally:
        os.close(pidfd)
    if ready:
        process.wait()  # it has ended: this reaps it
    return bool(ready)


def _kill_group(process: subprocess.Popen) -> None:
    """End the sandbox and everything in its process group (its PID namespace ends with bwrap)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _wait_for_exit(process, 5)
