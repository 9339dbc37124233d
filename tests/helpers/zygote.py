"""A process that has imported lanpo's training stack and forks one child per launch (a zygote), for the tests that
start ``lanpo train`` processes and grid cells one after another.

A training process the suite starts spends longer importing torch, transformers and TRL (6 s on an idle 2-core
machine, 10 s and more under the suite's load) than on its tiny run. A launch through :class:`Zygote` forks the
zygote instead: the child takes the test's command line, environment, working folder and standard streams and runs
the script (or ``-m`` module, or ``-c`` code) as ``python`` would, as ``__main__``, and ends through Python's own
exit (atexit handlers run, buffered output is written). It is a process of its own: its pid, the signals sent to it,
its kills and its exit code are its own, and :class:`Launched` answers as :class:`subprocess.Popen` does (the exit
code is ``-N`` for a process ended by signal N). Its parent is the zygote, not the test.

What a child does not repeat is the interpreter's start and the imports: a test that checks what a fresh
interpreter prints while it imports (the command line's deprecation-warnings test) launches ``python`` itself.
Python's hash seed is the zygote's for every child.

The zygote never runs a torch operation (so no thread pool is forked) and ends, killing the children it still has,
when the pipe from its parent closes.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

MAX_MESSAGE = 1 << 20  # a request: the command line and the environment, as JSON


# -- the zygote ----------------------------------------------------------------------------------------------------


PRELOAD = ("lanpo.cli", "lanpo.commands.train", "lanpo.experiments.grid", "lanpo.trainer")  # what `lanpo train` imports


def serve(path: str, preload: list[str]) -> dict:
    """Import ``preload``, listen on ``path`` and fork a child for each request; return only in a child, with its
    request."""
    for module in preload:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wake-up pipe
    children: dict[int, socket.socket] = {}
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        readable = select.select([listener, wake_read, sys.stdin], [], [], 1.0)[0]
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):  # the parent is gone
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(0)
        if wake_read in readable:
            os.read(wake_read, 4096)
        if listener in readable:
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 3)
            pid = os.fork()
            if pid == 0:  # the child: nothing of the zygote's loop stays open in it
                request = json.loads(message)
                if request["new_session"]:
                    os.setsid()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for open_socket in (listener, connection, *children.values()):
                    open_socket.close()
                os.close(wake_read)
                os.close(wake_write)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            connection.send(str(pid).encode())
            children[pid] = connection
        reap(children)


def reap(children: dict[int, socket.socket]) -> None:
    """Send each ended child's exit code (``-N`` when signal N ended it) to its launcher."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            try:
                connection.send(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:  # the launcher is gone
                pass
            connection.close()


def become(request: dict) -> None:
    """Run the request's program in this process as ``python ARGV`` would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    argv = request["argv"]
    if argv[0] == "-u":  # unbuffered standard streams (torchrun starts its workers so)
        argv = argv[1:]
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    if argv[0] == "-m":
        sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    else:
        sys.argv, sys.path[0] = list(argv), str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


# -- the launcher ----------------------------------------------------------------------------------------------------


class Launched:
    """A child of the zygote, as :class:`subprocess.Popen` shows a process: ``pid``, ``returncode``, ``stdout`` and
    ``stderr`` (pipes, where asked), ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, args: list[str], connection: socket.socket, pid: int, stdout, stderr) -> None:
        self.args, self.pid, self.returncode = args, pid, None
        self.stdout, self.stderr = stdout, stderr
        self._connection = connection

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._ended(0)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and self._ended(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _ended(self, timeout: float | None) -> int | None:
        if select.select([self._connection], [], [], timeout)[0]:
            said = self._connection.recv(64)
            if not said:
                raise RuntimeError(f"the zygote ended before its child {self.pid} did")
            self.returncode = int(said)
            self._connection.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple:
        """Both pipes read to their end, then the exit code, within ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        read: dict[str, object] = {}
        readers = [
            threading.Thread(target=lambda name=name, pipe=pipe: read.__setitem__(name, pipe.read()), daemon=True)
            for name, pipe in (("stdout", self.stdout), ("stderr", self.stderr))
            if pipe is not None
        ]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for pipe in (self.stdout, self.stderr):
            if pipe is not None:
                pipe.close()
        return read.get("stdout"), read.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The zygote process (started at the first launch, kept for the test session) and launches through it.

    ``popen`` and ``run`` take a command that starts with ``sys.executable`` and ``subprocess``'s arguments for
    the streams (``None``: this process's own; ``PIPE``; ``DEVNULL``; ``STDOUT`` for stderr; an open file)."""

    def __init__(self, path: Path, preload: tuple[str, ...] = PRELOAD, *, owned: bool = True) -> None:
        self.path, self.preload, self.owned = str(path), preload, owned  # owned: this launcher starts and ends it
        self._process: subprocess.Popen | None = None
        self._starting = threading.Lock()  # a grid's cells launch from several threads at once

    @property
    def pid(self) -> int:
        """The zygote's pid: every child's parent."""
        if not self.owned:
            raise RuntimeError("a launcher attached to another process's zygote does not know its pid")
        self._started()
        return self._process.pid

    def _started(self) -> None:
        if not self.owned:  # another process started it: listening already
            return
        with self._starting:
            if self._process is None:
                process = subprocess.Popen(
                    [sys.executable, __file__, self.path, *self.preload], stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                if process.stdout.readline() != b"ready\n":
                    raise RuntimeError(f"the zygote did not start (exit code {process.wait()})")
                self._process = process  # listening from here on

    @classmethod
    def attach(cls, path: str) -> Zygote:
        """A launcher for the zygote another process started (and will close), listening on ``path``."""
        return cls(Path(path), owned=False)

    @property
    def address(self) -> str:
        """The zygote's socket, for another process to :meth:`attach` to (started first)."""
        self._started()
        return self.path

    def popen(
        self,
        command: list[str],
        *,
        env=None,
        cwd=None,
        stdin=None,
        stdout=None,
        stderr=None,
        text=False,
        start_new_session=False,
    ):
        if command[0] != sys.executable:
            raise ValueError(f"the zygote runs Python programs only: {command[0]}")
        self._started()
        opened, kept = [], {}

        def fd(stream, name: str, default: int) -> int:
            if stream is None:
                return default
            if stream == subprocess.DEVNULL:
                opened.append(os.open(os.devnull, os.O_RDWR))
                return opened[-1]
            if stream == subprocess.PIPE:
                read_end, write_end = os.pipe()
                kept[name] = open(read_end, "r" if text else "rb")  # noqa: SIM115  closed by communicate
                opened.append(write_end)
                return write_end
            return stream if isinstance(stream, int) else stream.fileno()

        fds = [fd(stdin if stdin is not None else subprocess.DEVNULL, "stdin", 0)]
        fds.append(fd(stdout, "stdout", 1))
        fds.append(fds[1] if stderr == subprocess.STDOUT else fd(stderr, "stderr", 2))
        request = {
            "argv": list(command[1:]),
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd or os.getcwd()),
            "new_session": start_new_session,
        }
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(self.path)
            socket.send_fds(connection, [json.dumps(request).encode()], fds)
            pid = int(connection.recv(64))
        finally:
            for each in opened:
                os.close(each)
        return Launched(command, connection, pid, kept.get("stdout"), kept.get("stderr"))

    def run(
        self, command: list[str], *, capture_output=False, timeout=None, check=False, text=False, **streams
    ) -> subprocess.CompletedProcess:
        """As :func:`subprocess.run`: the child killed at ``timeout`` (``TimeoutExpired`` raised)."""
        if capture_output:
            streams.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        launched = self.popen(command, text=text, **streams)
        try:
            out, err = launched.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            launched.kill()
            launched.wait()
            raise
        done = subprocess.CompletedProcess(command, launched.returncode, out, err)
        if check:
            done.check_returncode()
        return done

    def close(self) -> None:
        if self._process is not None:
            self._process.stdin.close()  # the zygote ends when its pipe closes
            self._process.wait(timeout=30)
            self._process = None


if __name__ == "__main__":
    become(serve(sys.argv[1], sys.argv[2:]))
