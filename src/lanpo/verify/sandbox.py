"""Run model-written Python in a sandbox and report whether its tests passed.

Model code is untrusted: under RL a policy finds whatever earns reward. Each execution is one fresh process under
Debian's ``bubblewrap``: only ``/usr`` visible, read-only; a private ``/tmp``; no network (a new network namespace
holds only its own loopback); new PID, IPC and UTS namespaces, so nothing outside can be seen or signalled; an
empty environment; no capabilities; and resource limits on CPU time, address space, processes, file size and open
files. The parent kills the whole sandbox at a wall-clock timeout (its PID namespace dies with it) and reads at most
``output_chars`` of its output. As root, the sandbox runs under an unprivileged uid of its own, so the process
limit counts its processes alone.

**A pass is the tests' own completion, reported out of band.** The trusted runner (:data:`RUNNER`) reads the code,
the tests and a fresh random token from its standard input, runs the tests and writes one line, ``token result``,
on a pipe of its own; the parent accepts exactly one such line and nothing else. An exit status, anything printed,
an early ``exit``, a ``SystemExit`` raised inside the function or a second line on that pipe earns nothing.
Tests come in two forms (:class:`CodeTests`):

* ``cases``: arguments and expected values. The runner sends back what the function *returned*, as JSON of plain
  values (an object that compares equal to anything is not one); the parent, which alone holds the expected
  values, compares. Nothing inside the sandbox can know what would pass.
* ``check``: a test program (HumanEval's ``check(candidate)``, or plain ``assert`` lines) run after the code, with
  the function wrapped so that a return value that is not a plain value fails. The token lives in the runner's
  memory, so code that searches the interpreter for it could forge a pass: ``cases`` tests have no such gap.

Without bubblewrap, :class:`Sandbox` refuses to start and says how to install it, unless ``allow_unsandboxed``
names the risk (the code then runs with the resource limits, an empty environment and a temporary working
directory, and no security boundary at all).
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
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

logger = logging.getLogger(__name__)

CODE_GOLD_KEY = "code_tests"  # a gold answer that starts with {"code_tests": is a test suite, not a math answer


@dataclass(frozen=True)
class CodeTests:
    """What a code problem is checked against: the function's name, and ``cases`` (``[[args], expected]`` pairs) or
    a ``check`` program; ``preamble`` (imports the problem statement gives) runs before the model's code."""

    entry_point: str
    cases: list = field(default_factory=list)
    check: str = ""
    preamble: str = ""

    def to_gold(self) -> str:
        return json.dumps({CODE_GOLD_KEY: asdict(self)}, sort_keys=True)

    @classmethod
    def from_gold(cls, gold: str) -> CodeTests:
        data = json.loads(gold)[CODE_GOLD_KEY]
        return cls(data["entry_point"], data.get("cases") or [], data.get("check") or "", data.get("preamble") or "")

    def __post_init__(self) -> None:
        if not self.entry_point.isidentifier():
            raise ValueError(f"entry_point must be a Python name, got {self.entry_point!r}.")
        if bool(self.cases) == bool(self.check.strip()):
            raise ValueError("Code tests need either cases or a check program (exactly one).")


def is_code_gold(gold) -> bool:
    return isinstance(gold, str) and gold.startswith('{"' + CODE_GOLD_KEY + '"')


@dataclass(frozen=True)
class Limits:
    """Per execution. ``timeout`` is wall-clock seconds for the whole sandbox, start-up included."""

    timeout: float = 5.0
    cpu_seconds: int = 4
    memory_mb: int = 512
    processes: int = 16
    file_mb: int = 8
    open_files: int = 64
    output_chars: int = 2000


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

    @property
    def share(self) -> float:
        return self.passed / self.total if self.total else 0.0


# The trusted runner: it runs inside the sandbox, reads its job from stdin and reports on the descriptor it names.
# Kept free of any import beyond the standard library, and compatible with the sandbox interpreter (Python >= 3.8).
RUNNER = r"""
import json, os, sys
def main():
    job = json.loads(sys.stdin.read())
    token = job.pop("token")
    report = os.fdopen(job.pop("report_fd"), "w")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    import resource
    for name, value in job.pop("rlimits"):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass
    PLAIN = (int, float, str, bool, type(None))
    def plain(value, depth=0):
        kind = type(value)
        if kind in PLAIN:
            return True
        if depth > 20:
            return False
        if kind in (list, tuple, set, frozenset):
            return all(plain(v, depth + 1) for v in value)
        if kind is dict:
            return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
        return False
    def send(result):
        report.write(token + " " + json.dumps(result) + "\n")
        report.flush()
        os._exit(0)
    scope = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(job["preamble"] + "\n" + job["code"], "<solution>", "exec"), scope)
        function = scope[job["entry_point"]]
        if not callable(function):
            raise TypeError("not callable")
    except BaseException as error:
        send({"error": type(error).__name__})
    if job["cases"]:
        values = []
        for args in job["cases"]:
            try:
                value = function(*args)
                values.append(json.dumps(value) if plain(value) else None)
            except BaseException:
                values.append(None)
        send({"values": values})
    def candidate(*args, **kwargs):
        value = function(*args, **kwargs)
        if not plain(value):
            raise TypeError("returned an object that is not a plain value")
        return value
    checks = dict(scope)
    checks[job["entry_point"]] = candidate
    try:
        exec(compile(job["check"], "<tests>", "exec"), checks)
        if callable(checks.get("check")):
            checks["check"](candidate)
    except BaseException as error:
        send({"failed": type(error).__name__})
    send({"passed": True})
main()
"""


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


def bwrap_argv(interpreter: str) -> list[str]:
    """The bubblewrap command line for one execution (the runner is read from ``-c``)."""
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
    argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--chdir", "/tmp", "--setenv", "HOME", "/tmp"]
    argv += ["--unshare-all", "--new-session", "--die-with-parent", "--cap-drop", "ALL", "--clearenv"]
    return argv + ["--", interpreter, "-I", "-S", "-B", "-c", RUNNER]


class Sandbox:
    """Runs :class:`CodeTests` against code, ``workers`` executions at a time. Thread-safe; counts outcomes in
    ``stats``. ``allow_unsandboxed`` runs without bubblewrap when it is missing (no security boundary)."""

    def __init__(self, limits: Limits | None = None, workers: int = 2, allow_unsandboxed: bool = False) -> None:
        self.limits = limits or Limits()
        self.workers = max(1, int(workers))
        self.stats: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._slots = list(range(self.workers))
        self._slot_count = self.workers
        self._pool: ThreadPoolExecutor | None = None
        self.interpreter = _interpreter()
        self.isolated = shutil.which("bwrap") is not None
        # As root, the sandbox drops to an unprivileged uid (root is exempt from the process limit); the interpreter
        # must be one that uid can read, and the kernel must let that uid make a user namespace.
        self.drop_to_uid = self.isolated and os.geteuid() == 0 and self.interpreter.startswith("/usr/")
        if self.drop_to_uid and not self._works():
            self.drop_to_uid = False
            logger.warning(
                "The sandbox cannot run under an unprivileged uid here: no process limit (only its PID "
                "namespace and the timeout bound a fork bomb)."
            )
        if self.isolated and not self._works():
            self.isolated = False
        if not self.isolated:
            if not allow_unsandboxed:
                raise SandboxUnavailable(INSTALL_HINT)
            self.interpreter = sys.executable
            logger.warning(
                "Running model-written code WITHOUT a sandbox (allow_unsandboxed_code): no security boundary."
            )

    @property
    def uids(self) -> range:
        """The unprivileged uids this process's sandboxes run under, as root (one per concurrent run)."""
        base = 200_000 + (os.getpid() % 10_000) * 64
        return range(base, base + 64)

    def _works(self) -> bool:
        """Whether one trivial run passes as runs will be made (bubblewrap present, namespaces allowed)."""
        return self._execute("def f():\n    return 1\n", CodeTests("f", cases=[[[], 1]]), 0).outcome == "passed"

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
            # a slot (an uid) per concurrent run; more than `workers` when run() is called from threads
            with self._lock:
                if not self._slots:
                    self._slots.append(self._slot_count % 64)
                    self._slot_count += 1
                slot = self._slots.pop()
            try:
                result = self._execute(code, tests, slot)
            finally:
                with self._lock:
                    self._slots.append(slot)
        with self._lock:
            self.stats[result.outcome] += 1
            self.stats["executions"] += 1
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- internals -------------------------------------------------------------------------------------------

    def _rlimits(self) -> list[tuple[str, int]]:
        """The limits the runner sets on itself before the model's code runs (inherited by all it starts)."""
        limits, mb = self.limits, 1024 * 1024
        rlimits = [
            ("RLIMIT_CPU", limits.cpu_seconds),
            ("RLIMIT_AS", limits.memory_mb * mb),
            ("RLIMIT_FSIZE", limits.file_mb * mb),
            ("RLIMIT_NOFILE", limits.open_files),
            ("RLIMIT_CORE", 0),
        ]
        return rlimits + ([("RLIMIT_NPROC", limits.processes)] if self.drop_to_uid else [])

    def _execute(self, code: str, tests: CodeTests, slot: int) -> Execution:
        token = secrets.token_hex(16)
        read_end, write_end = os.pipe()
        job = {"token": token, "report_fd": write_end, "rlimits": self._rlimits(), "code": code, **asdict(tests)}
        job["cases"] = [args for args, _ in tests.cases]  # the expected values never enter the sandbox
        argv = bwrap_argv(self.interpreter) if self.isolated else [self.interpreter, "-I", "-S", "-B", "-c", RUNNER]
        # As root, each worker slot runs as an unprivileged uid of its own: the process limit then counts the
        # sandbox's processes alone (root is exempt from it). util-linux's setpriv switches the uid after the spawn:
        # Popen's own user= rules out vfork, and a fork of a trainer holding gigabytes costs 0.05-0.25 s a run.
        uid = self.uids[slot] if self.drop_to_uid else None
        switch = {}
        if uid is not None and SETPRIV:
            argv = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
        elif uid is not None:
            switch = {"user": uid, "group": uid, "extra_groups": []}
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
                    pass_fds=(write_end,),
                    start_new_session=True,
                    cwd=workdir,
                    env={} if self.isolated else {"PATH": "/usr/bin:/bin", "HOME": workdir},
                    **switch,
                )
            except OSError as error:
                os.close(read_end)
                os.close(write_end)
                return Execution("crashed", 0, max(1, len(tests.cases)), f"could not start: {error}")
            os.close(write_end)
            report, timed_out = self._wait(process, json.dumps(job).encode(), read_end)
            seconds = time.monotonic() - started
            output.seek(0)
            text = output.read(self.limits.output_chars).decode("utf-8", "replace")
        result = self._judge(report, token, tests, timed_out, process.returncode, text, seconds)
        result.output = result.output[: self.limits.output_chars]
        return result

    def _wait(self, process: subprocess.Popen, job: bytes, read_end: int) -> tuple[bytes, bool]:
        """Send the job, collect the report pipe until the sandbox ends or the deadline passes (then kill it all)."""
        deadline = time.monotonic() + self.limits.timeout
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read_end, chunks, 1 << 16), daemon=True)
        reader.start()
        try:
            process.stdin.write(job)
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        timed_out = False
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
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
        if "error" in result:
            return Execution("error", 0, total, f"{result['error']}\n{text}", seconds)
        if "values" in result:
            values = result["values"]
            if not isinstance(values, list) or len(values) != len(tests.cases):
                return Execution("forged", 0, total, text, seconds)
            passed = sum(_same(value, expected) for value, (_, expected) in zip(values, tests.cases))
            return Execution("passed" if passed == total else "failed", passed, total, text, seconds)
        if result.get("passed") is True:
            return Execution("passed", 1, 1, text, seconds)
        return Execution("failed", 0, 1, f"{result.get('failed', '')}\n{text}", seconds)


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


def _kill_group(process: subprocess.Popen) -> None:
    """End the sandbox and everything in its process group (its PID namespace ends with bwrap)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
