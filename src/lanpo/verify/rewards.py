"""Math answer checking: extract the final answer, verify it with ``math-verify``, within a time limit.

``math-verify`` enforces its own timeouts with ``signal.alarm``, which only works on the main thread; off it,
frameworks catch the error and silently score 0. And some answers (``10^{10^{10}}``) make sympy compute for
minutes in C code that no signal interrupts. So verification runs in worker processes with math-verify's
timeouts off, and the parent enforces the limit: a worker that overruns is killed and replaced, the answer
scores 0, and the event is counted. Nothing here blocks for longer than the limit per answer.

The batch API (:meth:`MathVerifier.score`) and :func:`make_accuracy_reward` (a TRL reward function) share
one checker, used by training, evaluation and the SFT data builder alike.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait

from lanpo.verify.answers import (
    boxes_as_list,
    extraction_mode,
    find_answer,
    gold_answer,
    latex_number,
    names_several_values,
    normalize_gold,
    read_alike,
)
from lanpo.verify.code import Verifier
from lanpo.verify.numerals import numbers_match, strip_thousands
from lanpo.verify.sandbox import OUTCOMES, gold_kind_of

logger = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 1000  # longer "answers" are garbage: scored 0 without parsing, and counted


def _normalize(answer: str) -> str:
    """A conservative normal form for an exact-match fast path (never for declaring two answers different)."""
    s = answer.strip().strip("$").strip()
    s = re.sub(r"\\[,!;: ]|\\text\{\s*\}|\s+", "", s)
    return strip_thousands(s.rstrip("."))


def prepare_gold(gold: str) -> str:
    """Gold answers as math-verify parses them: bare LaTeX gets wrapped in ``$...$`` (``\\frac{1}{2}`` alone fails),
    unit notes go (``9 (apples)``), e-notation becomes a power of ten (``4.5e33``: else ``e`` is Euler's)."""
    gold = normalize_gold(gold)
    if "\\boxed" in gold or (gold.startswith("$") and gold.endswith("$")):
        return gold
    return f"${strip_thousands(gold)}$"


def prepare_prediction(answer: str) -> str:
    return f"\\boxed{{{latex_number(strip_thousands(answer.strip()))}}}"


# ---------------------------------------------------------------------------------------------------------------
# Worker process


def _worker_main(conn: Connection) -> None:  # pragma: no cover - runs in the child process
    """Verify (index, gold, prediction) items one by one, replying with (index, score, error)."""
    import functools
    import logging as _logging
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: no traceback from here

    _logging.getLogger("math_verify").setLevel(_logging.CRITICAL)
    from math_verify import parse, verify

    @functools.lru_cache(maxsize=4096)
    def parse_gold(gold: str):
        return parse(gold, parsing_timeout=None)

    conn.send(("ready", None, None))  # imports done: from now on, time spent is verification time
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for index, gold, prediction in batch:
            try:
                gold_parsed = parse_gold(gold)
                pred_parsed = parse(prediction, parsing_timeout=None)
                score = float(
                    bool(gold_parsed) and bool(pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=None)
                )
                conn.send((index, score, None))
            except BaseException as error:  # RecursionError, MemoryError, sympy errors: a 0, counted
                conn.send((index, 0.0, type(error).__name__))


STARTUP_TIMEOUT = 120.0  # seconds a new worker may take to import math-verify (slow on a busy machine)


class _Worker:
    def __init__(self, ctx) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="lanpo-verifier")
        self.process.start()
        child.close()
        self.pending: list[tuple[int, str, str]] = []  # sent, not yet answered, in order
        self.deadline = 0.0
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the worker has imported math-verify, so start-up never counts against an answer."""
        if self.ready:
            return
        if not self.conn.poll(STARTUP_TIMEOUT):
            self.kill()
            raise RuntimeError(f"A math-verify worker did not start within {STARTUP_TIMEOUT:.0f} s.")
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise RuntimeError(
                "A math-verify worker process exited while starting. Worker processes re-import the main module "
                "(spawn/forkserver): when lanpo is used from a script, put the calling code under "
                '`if __name__ == "__main__":`.'
            ) from None
        if message[0] != "ready":
            raise RuntimeError(f"Unexpected first message from a math-verify worker: {message!r}")
        self.ready = True

    def send(self, items: list[tuple[int, str, str]], limit: float) -> None:
        self.pending = list(items)
        self.deadline = time.monotonic() + limit
        self.conn.send(items)

    def kill(self) -> None:
        try:
            self.process.kill()
            self.process.join(timeout=5)
        finally:
            self.conn.close()


_CONTEXTS: dict[str, object] = {}


def _context(method: str | None = None):
    """A multiprocessing context; forkserver (the default) preloads math-verify so replacing a killed worker
    takes milliseconds, spawn works everywhere."""
    method = method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    if method not in _CONTEXTS:
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(["lanpo.verify.rewards", "math_verify"])
        _CONTEXTS[method] = ctx
    return _CONTEXTS[method]


class MathVerifier:
    """Batch math answer checker with a hard per-answer time limit.

    Args:
        time_limit: seconds one answer may take before it scores 0 (its worker is replaced).
        extraction: ``strict`` (the final ``\\boxed{}``) or ``lenient`` (see ``lanpo.verify.answers``).
        workers: worker processes (default: up to 2, fewer on a 1-core machine).
        start_method: ``forkserver`` (default where available) or ``spawn``. Start-up time never counts against
            the time limit: a worker gets work only once it reports that math-verify is imported.
    """

    def __init__(
        self,
        time_limit: float = 2.0,
        extraction: str = "strict",
        workers: int | None = None,
        start_method: str | None = None,
    ) -> None:
        if time_limit <= 0:
            raise ValueError(f"time_limit must be > 0 seconds, got {time_limit}.")
        self.time_limit = float(time_limit)
        self.extraction = extraction_mode(extraction)
        self.num_workers = workers or max(1, min(2, os.cpu_count() or 1))
        self.start_method = start_method
        self.stats: Counter[str] = Counter()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    # -- public API ------------------------------------------------------------------------------------------

    def score(self, golds: Sequence[str], predictions: Sequence[str | None]) -> list[float]:
        """Score extracted answers against gold answers (1.0 or 0.0 each). ``None`` predictions score 0.

        A prediction is first read for the value it states (``answers.stated_value``: a chain of equalities, a
        label, a repeated value); plain numbers are compared exactly here (see ``numbers.numbers_match`` for the
        tolerance policy); a prediction that names more values than the gold (a hedge) scores 0; the rest goes
        to math-verify in the worker processes.
        """
        if len(golds) != len(predictions):
            raise ValueError(f"{len(golds)} gold answers but {len(predictions)} predictions.")
        scores = [0.0] * len(golds)
        todo: list[tuple[int, str, str]] = []
        for i, (raw_gold, pred) in enumerate(zip(golds, predictions)):
            self.stats["answers"] += 1
            gold = gold_answer(raw_gold)  # several boxes, a set, "and", one label: the plain list of its values
            if pred is None or not str(pred).strip():
                self.stats["no_answer"] += 1
                continue
            pred = str(pred)
            if len(pred) > MAX_ANSWER_CHARS:
                self.stats["too_long"] += 1
                continue
            try:
                gold, pred = read_alike(gold, pred)  # lists, labels, ±, intervals: one rule for either side
                several = pred is not None and names_several_values(pred, gold)
            except Exception as error:  # noqa: BLE001 - a reader's bug costs this answer, never the run
                self._unreadable(error, pred)
                continue
            if pred is None or several:
                self.stats["hedged"] += 1
            elif (same := numbers_match(gold, pred)) is not None:
                scores[i] = float(same)
                self.stats["numeric"] += 1
            elif _normalize(pred) == _normalize(gold):
                scores[i] = 1.0
                self.stats["exact_match"] += 1
            else:
                todo.append((i, prepare_gold(gold), prepare_prediction(pred)))
        if todo:
            with self._lock:
                for i, value in self._verify(todo).items():
                    scores[i] = value
        self.stats["correct"] += int(sum(scores))
        return scores

    def score_texts(
        self, golds: Sequence[str], texts: Sequence[str], problems: Sequence[str | None] | None = None
    ) -> list[float]:
        """Extract the final answer of each model output, then :meth:`score` it. With ``problems``, lenient
        extraction never reads a number the output copied from its problem statement."""
        problems = problems if problems is not None else [None] * len(texts)
        answers = []
        for text, gold, problem in zip(texts, golds, problems):
            try:
                answer, why = find_answer(text, self.extraction, problem)
                if why == "hedged" and isinstance(text, str):  # several boxes: one answer where they list the gold's
                    answer = boxes_as_list(text, str(gold))
                    why = "" if answer is not None else why
            except Exception as error:  # noqa: BLE001 - a reader's bug costs this output, never the run
                self._unreadable(error, text)
                answer, why = None, ""
            if why == "unreadable":  # find_answer's own guard caught a reader's bug (and logged it)
                self.stats["unreadable:find_answer"] += 1
            if why == "hedged":
                self.stats["hedged"] += 1
            answers.append(answer)
        return self.score(golds, answers)

    def _unreadable(self, error: Exception, text: object) -> None:
        """Count (``unreadable``) a model output or answer that one of lanpo's own readers failed on: it scores
        0 and the run goes on; the first of each kind is logged with the text, so the reader can be mended."""
        key = f"unreadable:{type(error).__name__}"
        if not self.stats[key]:
            logger.warning(
                "an answer reader failed (%s: %s) on %r; scored 0 and counted as %s",
                type(error).__name__,
                error,
                str(text)[:300],
                key,
            )
        self.stats[key] += 1

    def close(self) -> None:
        with self._lock:
            for worker in self._workers:
                try:
                    worker.conn.send(None)
                except (OSError, BrokenPipeError):
                    pass
                worker.kill()
            self._workers = []

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(_context(self.start_method)))
        for worker in self._workers:  # started together, waited for together
            worker.wait_ready()

    def _verify(self, items: list[tuple[int, str, str]]) -> dict[int, float]:
        self._ensure_workers()
        results: dict[int, float] = {}
        queue = list(items)
        chunk = max(1, min(64, len(queue) // (2 * len(self._workers)) or 1))
        idle = list(self._workers)
        busy: list[_Worker] = []
        while queue or busy:
            while idle and queue:
                worker = idle.pop()
                worker.wait_ready()
                worker.send(queue[:chunk], self.time_limit)
                del queue[:chunk]
                busy.append(worker)
            now = time.monotonic()
            ready = wait([w.conn for w in busy], timeout=max(0.0, min(w.deadline for w in busy) - now))
            for worker in list(busy):
                if worker.conn in ready:
                    try:
                        while worker.conn.poll():
                            index, value, error = worker.conn.recv()
                            results[index] = value
                            if error:
                                self.stats[f"error:{error}"] += 1
                            worker.pending.pop(0)
                            worker.deadline = time.monotonic() + self.time_limit
                    except (EOFError, OSError):  # the worker died (e.g. out of memory): treat as overrun
                        worker.deadline = 0.0
                if not worker.pending:
                    busy.remove(worker)
                    idle.append(worker)
                elif time.monotonic() >= worker.deadline:
                    stuck = worker.pending.pop(0)
                    results[stuck[0]] = 0.0
                    self.stats["timeouts"] += 1
                    logger.warning(
                        "Verifying %r against %r exceeded %.1fs; scored 0 (worker restarted)",
                        stuck[2][:80],
                        stuck[1][:40],
                        self.time_limit,
                    )
                    queue = worker.pending + queue  # the rest of its chunk goes to a fresh worker
                    busy.remove(worker)
                    self._workers.remove(worker)
                    worker.kill()
                    replacement = _Worker(_context(self.start_method))
                    self._workers.append(replacement)
                    idle.append(replacement)
        return results


# ---------------------------------------------------------------------------------------------------------------
# Shared default verifier and the TRL reward function

_DEFAULT: dict[tuple[float, str], Verifier] = {}


def get_verifier(time_limit: float = 2.0, extraction: str = "strict") -> Verifier:
    """A process-wide verifier per (time limit, extraction mode), closed at exit: math answers, and code problems'
    tests in the sandbox (started on the first code gold)."""
    key = (float(time_limit), extraction)
    if key not in _DEFAULT:
        _DEFAULT[key] = Verifier(MathVerifier(time_limit=time_limit, extraction=extraction))
    return _DEFAULT[key]


@atexit.register
def _close_default_verifiers() -> None:
    for verifier in _DEFAULT.values():
        verifier.close()


def completion_text(completion) -> str:
    """TRL passes completions as strings or as chat messages; return the text either way."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        return str(completion[-1].get("content", ""))
    return ""


def make_accuracy_reward(verifier: Verifier | MathVerifier | None = None):
    """A TRL reward function: 1.0 when the completion's final answer matches the ``answer`` column (for a code
    problem, its ``gold_kind`` column "code", when its function passes the tests the column holds), else 0.0. A
    data set without a ``gold_kind`` column (one not built by lanpo) has each gold's kind read from its text."""
    verifier = verifier or get_verifier()

    def accuracy(completions, answer, problem=None, gold_kind=None, log_metric=None, **kwargs) -> list[float]:
        before = Counter(verifier.stats)
        texts = [completion_text(c) for c in completions]
        problems = list(problem) if problem is not None else None
        if isinstance(verifier, Verifier):
            kinds = list(gold_kind) if gold_kind is not None else [gold_kind_of(a) for a in answer]
            scores = verifier.score_texts(list(answer), texts, problems, kinds=kinds)
        else:  # a math verifier: every gold is a math answer
            scores = verifier.score_texts(list(answer), texts, problems)
        if log_metric is not None and completions:
            delta = verifier.stats - before
            log_metric("verifier/no_answer_rate", delta["no_answer"] / len(completions))
            log_metric("verifier/hedged_rate", delta["hedged"] / len(completions))
            log_metric("verifier/timeouts", float(delta["timeouts"]))
            log_metric("verifier/unreadable", float(sum(n for k, n in delta.items() if k.startswith("unreadable:"))))
            if "code/executions" in delta:  # code problems (lanpo.verify.code.Verifier): each outcome, counted
                for outcome in OUTCOMES:
                    log_metric(f"code/{outcome}", float(delta[f"code/{outcome}"]))
        return scores

    accuracy.__name__ = "accuracy"
    return accuracy
