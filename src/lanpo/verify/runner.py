"""The trusted runner inside the sandbox: a *judge* that holds the report, and a *worker* that runs the model's code.

Model code is an adversary that may rewrite anything in the process it runs in: modules (``json.dumps``), builtins
(``type``), the frames of its callers, finalizers, threads. So nothing that decides pass or fail, or carries the
result out, lives in that process:

* The **judge** (``python -c SOURCE judge``) reads the job from its standard input: a fresh random token, the report
  descriptor, the tests, the code. It makes itself non-dumpable (no process of its uid can then ptrace it or open
  its ``/proc`` memory and descriptors), sets the resource limits, and starts the worker.
* The **worker** (``python -c SOURCE worker R W``) is a fresh interpreter, not a fork: it never holds the token, the
  report descriptor, the check program or an expected value. It runs the problem's imports and the model's code,
  then answers calls: one JSON line in (arguments), one JSON line out (the returned value, or the name of what it
  raised), on two pipes of its own. Its standard output is the sandbox's output, so what the code prints never
  reaches the channel.
* Values cross the channel as plain data only (:func:`encode` / :func:`decode`: ``None``, ``bool``, ``int``,
  ``float``, ``str``, ``bytes``, lists, tuples, sets, frozensets, dicts), rebuilt by the judge. Whatever the worker
  sends is just a value the function could have returned: no object of the model's class ever reaches a comparison.
* ``cases`` tests: the judge sends back the returned values; the parent, which alone holds the expected values,
  compares. ``check`` tests (HumanEval's ``check(candidate)``, ``assert`` lines): the judge runs the test program
  itself, after the problem's own code (its helpers), with the function's name bound to a proxy that calls the
  worker; a program that never calls the candidate fails.
* The judge writes one line, ``token result``, on the report descriptor, and exits.

Stdlib only and Python >= 3.8 (the sandbox runs the system interpreter); passed to it as source with ``-c``.
"""

import builtins
import json
import os
import subprocess
import sys

MAX_LINE = 1 << 24  # bytes of one message on the channel
MAX_DEPTH = 100  # nesting of one value
MAX_MESSAGE = 300  # characters of an exception's message kept for execution feedback
MAX_TRACE = 5  # lines of the model's code kept from one traceback

PR_SET_DUMPABLE = 4


class NotPlain(TypeError):
    """A value that is not plain data (or nested too deep) cannot cross the channel."""


def encode(value, depth=0):
    """A plain value as JSON-ready data that keeps its type: scalars as themselves, containers tagged."""
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return {"l": [encode(v, depth + 1) for v in value]}
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is set:
        return {"s": [encode(v, depth + 1) for v in value]}
    if kind is frozenset:
        return {"f": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.hex()}
    raise NotPlain("a value of type " + kind.__name__ + " is not plain data")


def decode(data, depth=0):
    """The value :func:`encode` made, rebuilt from builtin types alone; anything else raises :class:`NotPlain`."""
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is not dict or len(data) != 1:
        raise NotPlain("not an encoded value")
    ((tag, body),) = data.items()
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise NotPlain("not an encoded value")
    if tag == "d":
        pairs = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise NotPlain("not an encoded pair")
            pairs.append((decode(pair[0], depth + 1), decode(pair[1], depth + 1)))
        return dict(pairs)
    items = [decode(v, depth + 1) for v in body]
    builders = {"l": list, "t": tuple, "s": set, "f": frozenset}
    if tag not in builders:
        raise NotPlain("unknown tag")
    return builders[tag](items)


class WorkerEnded(EOFError):
    """The worker closed the channel: it exited, or a limit or a signal killed it."""


def _loads(line):
    """One message of the channel, bounded in size; anything malformed raises."""
    if not line:
        raise WorkerEnded("the worker ended")
    if len(line) >= MAX_LINE or not line.endswith(b"\n"):
        raise ValueError("the worker sent no complete message")
    message = json.loads(line)
    if type(message) is not dict:
        raise ValueError("not a message")
    return message


# ---------------------------------------------------------------------------------------------------------------
# The worker: runs the model's code, answers calls. Nothing here is trusted.


def worker(requests_fd, answers_fd):
    requests = os.fdopen(requests_fd, "rb")
    answers = os.fdopen(answers_fd, "wb")

    def answer(message):
        answers.write(json.dumps(message).encode() + b"\n")
        answers.flush()

    setup = json.loads(requests.readline())
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(setup["preamble"] + "\n" + setup["code"], "<solution>", "exec"), scope)
        function = scope[setup["entry_point"]]
        if not callable(function):
            raise TypeError("not callable")
    except BaseException as error:  # the code's own failure, whatever it raised
        answer({"error": type(error).__name__, **_explain(error)})
        return
    answer({"ready": True})
    for line in requests:
        call = json.loads(line)
        try:
            value = function(*decode(call["args"]), **decode(call["kwargs"]))
            answer({"value": encode(value)})
        except BaseException as error:
            answer({"raised": type(error).__name__, **_explain(error)})


def _explain(error):
    """What a programmer reads of an exception, for execution feedback only (never for a verdict): its message
    and the lines of the model's own code it passed through (``<solution>``'s line numbers, innermost last). Read
    from the exception's frames with no import: the code may have replaced any module."""
    try:
        message = str(error)[:MAX_MESSAGE]
    except BaseException:
        message = ""
    lines = []
    try:
        if isinstance(error, SyntaxError) and error.filename == "<solution>" and error.lineno:
            lines.append(int(error.lineno))
        frame = error.__traceback__
        while frame is not None and len(lines) < 3 * MAX_TRACE:
            if frame.tb_frame.f_code.co_filename == "<solution>":
                lines.append(int(frame.tb_lineno))
            frame = frame.tb_next
    except BaseException:
        pass
    return {"message": message, "lines": lines[-MAX_TRACE:]}


# ---------------------------------------------------------------------------------------------------------------
# The judge: holds the token and the report, runs the tests, talks to the worker over the channel.


class Worker:
    """The worker process, seen from the judge: ``call`` sends arguments and returns the decoded value."""

    def __init__(self, source):
        requests_read, self._requests = os.pipe()
        self._answers, answers_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", source, "worker", str(requests_read), str(answers_write)],
            stdin=subprocess.DEVNULL,
            pass_fds=(requests_read, answers_write),
            close_fds=True,
        )
        os.close(requests_read)
        os.close(answers_write)
        self._out = os.fdopen(self._requests, "wb")
        self._in = os.fdopen(self._answers, "rb")
        self.calls = 0
        self.last_raised = None  # what the last call raised (_detail), for execution feedback

    def start(self, setup):
        """Send the code; the worker answers ``ready`` or the ``error`` its code raised."""
        self._send(setup)
        return self._receive()

    def _send(self, message):
        self._out.write(json.dumps(message).encode() + b"\n")
        self._out.flush()

    def _receive(self):
        return _loads(self._in.readline(MAX_LINE))

    def call(self, args, kwargs):
        self.calls += 1
        self._send({"args": encode(tuple(args)), "kwargs": encode(dict(kwargs))})
        message = self._receive()
        if "raised" in message:
            self.last_raised = _detail(message, "raised")
            raise _exception(message["raised"])
        if "value" not in message:
            raise ValueError("the worker sent no value")
        return decode(message["value"])

    def close(self):
        try:
            self.process.kill()
        except OSError:
            pass

    def ended(self):
        """How the worker ended, for the report."""
        self.close()
        try:
            status = self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            status = None
        return {"crashed": "the worker ended (exit status " + str(status) + ")"}


def _detail(message, key):
    """An exception as the worker described it, kept as plain, bounded data: its type's name, message and the
    model's code lines (the worker is not trusted: anything else is dropped)."""
    lines = message.get("lines")
    return {
        "type": str(message.get(key))[:100],
        "message": message["message"][:MAX_MESSAGE] if type(message.get("message")) is str else "",
        "lines": [n for n in lines[:MAX_TRACE] if type(n) is int] if type(lines) is list else [],
    }


def _exception(name):
    """The exception a call raised in the worker, raised again here: a builtin ``Exception`` class by its name (so
    a test that expects a ``ValueError`` sees one), else a ``RuntimeError``; never ``SystemExit`` or the like."""
    error = getattr(builtins, name, None) if isinstance(name, str) else None
    if isinstance(error, type) and issubclass(error, Exception):
        return error("raised by the candidate")
    return RuntimeError("the candidate raised " + str(name)[:100])


def _undumpable():
    """No process of this uid may ptrace the judge or read its memory and descriptors through /proc."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def judge():
    job = json.loads(sys.stdin.read())
    token = job.pop("token")
    report = os.fdopen(job.pop("report_fd"), "w")
    os.set_inheritable(report.fileno(), False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    def send(result):
        report.write(token + " " + json.dumps(result) + "\n")
        report.flush()
        os._exit(0)

    try:
        _undumpable()
    except (OSError, AttributeError, ImportError) as error:
        send({"runner": "cannot protect the judge: " + str(error)})
    import resource

    for name, value in job.pop("rlimits"):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass
    setup = {"code": job["code"], "preamble": job["preamble"], "entry_point": job["entry_point"]}
    try:
        worker_process = Worker(job.pop("source"))
    except (OSError, ValueError) as error:
        send({"crashed": "the worker did not start: " + type(error).__name__})
    try:
        ready = worker_process.start(setup)
    except WorkerEnded:
        send(worker_process.ended())
    except ValueError:
        ready = {"error": "the worker's answer was not a message"}
    if "error" in ready or "ready" not in ready:
        detail = _detail(ready, "error") if "error" in ready else {}
        send({"error": str(ready.get("error", "the worker did not say it was ready"))[:100], "detail": detail})
    if job["cases"]:
        values, raised = [], []
        for args in job["cases"]:
            worker_process.last_raised = None
            try:
                values.append(json.dumps(worker_process.call(args, {})))
            except WorkerEnded:
                send(worker_process.ended())
            except Exception:
                values.append(None)
            raised.append(worker_process.last_raised)
        worker_process.close()
        send({"values": values, "raised": raised})
    result = _run_check(job, worker_process)
    send(worker_process.ended() if result.get("failed") == "WorkerEnded" else result)


def _run_check(job, worker_process):
    """Run the test program here, with the function's name bound to the worker: the result it comes to."""

    def candidate(*args, **kwargs):
        return worker_process.call(args, kwargs)

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        if job.get("helpers"):
            exec(compile(job["helpers"], "<problem>", "exec"), namespace)
        namespace[job["entry_point"]] = candidate
        exec(compile(job["check"], "<tests>", "exec"), namespace)
        if callable(namespace.get("check")):
            namespace["check"](candidate)
    except BaseException as error:
        return {"failed": type(error).__name__}
    if worker_process.calls == 0:
        return {"failed": "the tests never called the function"}
    return {"passed": True, "calls": worker_process.calls}


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(int(sys.argv[2]), int(sys.argv[3]))
    else:
        judge()
