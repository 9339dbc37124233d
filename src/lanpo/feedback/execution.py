"""Execution feedback (``feedback_source execution``): the model's own attempt, and what running it on the examples
its problem shows did, as a programmer sees it (RLEF's split: the public examples are feedback, the hidden tests
are the reward).

Per example the call, the value the problem shows and what the attempt returned, or the exception it raised with
its message and the lines of the attempt it passed through, or that it timed out, or did not load. The examples
are read from the statement the model sees (:func:`lanpo.data.code_examples.public_examples`): this module never
receives a gold, so no hidden test's input, value or count can reach a report. The examples run in the reward's
sandbox and judge (:class:`lanpo.verify.sandbox.Sandbox`), never in this process.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

from lanpo.data.code_examples import Example, public_examples, statement_function
from lanpo.data.code_tasks import preamble_of
from lanpo.feedback.base import Feedback, FeedbackRequest, SourceKit
from lanpo.feedback.reflection import ReflectionSource
from lanpo.plan import ATTEMPTS, Attempts
from lanpo.pool.store import ExperiencePool
from lanpo.prompts import execution_messages, is_code_problem
from lanpo.verify.code import extract_code
from lanpo.verify.sandbox import CodeTests, Execution, same_value

logger = logging.getLogger(__name__)

RunCode = Callable[[list[tuple[str | None, CodeTests]]], list[Execution]]  # Sandbox.run_many
MAX_SHOWN_CHARS = 200  # of one value or message in a report


class Tried(NamedTuple):
    """One attempt run on its problem's public examples: how the run came out, the attempt, the report and the
    feedback prompt built from them."""

    outcome: str  # the run's (lanpo.verify.sandbox.OUTCOMES)
    attempt: str
    report: str
    messages: list

    @property
    def went_wrong(self) -> bool:
        return self.outcome != "passed"


def public_tests(problem: str) -> tuple[CodeTests, list[Example]] | None:
    """The examples a code problem's statement shows, as a suite of cases to run (the statement's imports first),
    with the examples themselves; None when it shows none."""
    if not is_code_problem(problem):
        return None
    code, entry_point = statement_function(problem)
    examples = public_examples(problem, entry_point)
    if not examples or entry_point is None:
        return None
    cases = [[list(example.args), example.expected] for example in examples]
    return CodeTests(entry_point, cases=cases, preamble=preamble_of(code)), examples


def check_examples(problems: Sequence[str]) -> None:
    """``feedback_source execution`` runs attempts on the public examples a code problem's statement shows: refused
    where no training problem shows any (math data, or code without examples: every feedback row would go plain, as
    ``no_public_examples``), warned where only some do."""
    showing = sum(public_tests(problem) is not None for problem in problems)
    if not showing:
        code = sum(is_code_problem(problem) for problem in problems)
        what = "is a code problem" if not code else f"shows public examples (all {code} are code problems without any)"
        raise ValueError(
            f"feedback_source execution runs each attempt on the public examples its code problem shows, and none of "
            f"the {len(problems)} training problems {what}: every feedback row would fall back to the plain prompt. "
            "Train on code with examples (builtin:code, humaneval, a file with public_tests), or choose another "
            "feedback_source (self for math)."
        )
    if showing < len(problems):
        logger.warning(
            "feedback_source execution: %d of %d training problems show no public example; their feedback rows get "
            "the plain prompt (lanpo/fallback/no_public_examples).",
            len(problems) - showing,
            len(problems),
        )


def _short(text) -> str:
    """Text the attempt controls (a type's name, a message, a value's repr, a line of its code) as one line of data:
    every character that is not printable (newlines, NUL, BEL, BS, ESC, line and paragraph separators, ...) written
    as its escape (``\\n``, ``\\x1b``), runs of spaces made one, at most :data:`MAX_SHOWN_CHARS`. It can never start
    a line of the report, nor reach a terminal or a prompt as a control character."""
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text))
    text = " ".join(text.split())  # only spaces are left to split on: every other space character was escaped
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + " [...]"


def _type_name(name) -> str:
    """An exception type as the run named it: a dotted Python name as it is; anything else (a class the attempt
    named with spaces, newlines or sentences) quoted and escaped, so it reads as the data it is."""
    name = str(name)
    if name and all(part.isidentifier() for part in name.split(".")) and len(name) <= MAX_SHOWN_CHARS:
        return name
    return f"an exception named {_short(repr(name))}"


def _returned(value_json: str):
    """A returned value the run wrote as JSON, or None where it is not JSON (the worker's word: it may be forged)."""
    try:
        return (json.loads(value_json),)
    except (ValueError, TypeError, RecursionError):
        return None


def _where(lines: Sequence[int], code: str, preamble: str) -> str:
    """The attempt's line an exception was raised at (the innermost of its own), quoted."""
    own = code.splitlines()
    offset = preamble.count("\n") + 1  # the worker compiles the imports, a newline, then the code
    for number in reversed(lines):
        index = number - offset - 1
        if 0 <= index < len(own) and own[index].strip():
            return f" at line {index + 1}: `{_short(own[index].strip())}`"
    return ""


def execution_report(tests: CodeTests, examples: Sequence[Example], run: Execution, code: str | None) -> str:
    """What running an attempt on its problem's public examples did, in a programmer's words."""
    count = len(examples)
    shown = "the example" if count == 1 else f"the {count} examples"
    if code is None or run.outcome == "no_code":
        return "The attempt holds no code to run: no complete Python function was found in it."
    if run.outcome == "error":
        error = run.error or {}
        kind, message = error.get("type", ""), error.get("message", "")
        if kind == "KeyError" and message.strip("'\"") == tests.entry_point:
            return f"The code ran, but it does not define the function {tests.entry_point}."
        if not kind:
            return "The code did not load."
        where = _where(error.get("lines", []), code, tests.preamble)
        return f"The code did not load: {_type_name(kind)}: {_short(message)}{where}."
    if run.outcome == "timeout":
        return f"Running it on {shown} did not finish in time (an endless loop, or far too slow)."
    if run.outcome == "crashed":
        return f"Running it on {shown} was stopped: {_short(run.reason) if run.reason else 'a limit killed it'}."
    if run.outcome == "forged" or run.calls is None or len(run.calls) != count:
        return "Running it gave no report: the code wrote to the test runner's channel, or returned too much."
    lines = []
    for example, call in zip(examples, run.calls):
        want = _short(repr(example.expected))
        raised = call.get("raised")
        if raised:
            where = _where(raised.get("lines", []), code, tests.preamble)
            message = f": {_short(raised['message'])}" if raised.get("message") else ""
            kind = _type_name(raised["type"])
            lines.append(f"- {example.call} raised {kind}{message}{where}. The problem shows {want}.")
        elif call.get("value") is None or _returned(call["value"]) is None:
            why = "too long to show" if call.get("long") else "not a plain value (a number, string, list, ...)"
            lines.append(f"- {example.call} returned a value {why}. The problem shows {want}.")
        else:
            (got,) = _returned(call["value"])
            if same_value(got, example.expected):
                lines.append(f"- {example.call} returned {want}, as the problem shows.")
            else:
                lines.append(f"- {example.call} returned {_short(repr(got))}. The problem shows {want}.")
    if run.outcome == "passed":
        lines.append(f"It returned what the problem shows on {shown}.")
    return "\n".join(lines)


def try_attempts(pairs: Sequence[tuple[str, str]], run_code: RunCode | None, extraction: str) -> list[Tried | str]:
    """Each (problem, attempt) run on the problem's public examples, all in one batch of the sandbox: a
    :class:`Tried`, or why there is no context (``no_public_examples``, ``no_sandbox``)."""
    out: list[Tried | str | None] = [None] * len(pairs)
    jobs, where = [], []
    for index, (problem, attempt) in enumerate(pairs):
        public = public_tests(problem)
        if public is None:
            out[index] = "no_public_examples"
        elif run_code is None:
            out[index] = "no_sandbox"
        else:
            code = extract_code(attempt, extraction)
            jobs.append((code, public[0]))
            where.append((index, code, public))
    for (index, code, (tests, examples)), run in zip(where, run_code(jobs) if jobs else []):
        problem, attempt = pairs[index]
        report = execution_report(tests, examples, run, code)
        out[index] = Tried(run.outcome, attempt, report, execution_messages(problem, attempt, report))
    return out


class ExecutionSource(ReflectionSource):
    """Execution feedback rows: each shows one of the group's own attempts (handed over, or stored as reflection's
    are: ``reflection_source``) with what running it on the problem's public examples did. Attempts that
    went wrong on an example come first; a problem that shows no example gets no context (the row goes plain,
    counted as ``no_public_examples``)."""

    kind = "execution"

    def __init__(
        self,
        pool: ExperiencePool,
        run_code: RunCode | None,
        extraction: str = "lenient",
        mode: Attempts = ATTEMPTS["auto"],
    ) -> None:
        super().__init__(pool, mode)
        self.run_code = run_code
        self.extraction = extraction

    @classmethod
    def for_run(cls, kit: SourceKit) -> ExecutionSource:
        return cls(kit.pool, kit.run_code, kit.args.answer_extraction, kit.args.attempts)

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        pairs, spans, shows, steps = [], [], [], {}  # each request's distinct attempts, run together in one batch
        for request in requests:
            shows.append(public_tests(request.problem) is not None)
            dated = self.dated_attempts(request) if shows[-1] else []
            attempts = list(dict.fromkeys(text for text, _ in dated))
            for text, step in reversed(dated):  # a text written twice: its newest step
                steps[(request.problem, text)] = step
            spans.append((len(pairs), len(pairs) + len(attempts)))
            pairs += [(request.problem, attempt) for attempt in attempts]
        tried = try_attempts(pairs, self.run_code, self.extraction)
        built = []
        for request, (start, end), examples_shown in zip(requests, spans, shows):
            mine = tried[start:end]
            if not mine:
                reason = "no_attempt" if examples_shown else "no_public_examples"
                built.append([Feedback(None, reason)] * request.rows)
                continue
            if any(isinstance(t, str) for t in mine):  # no sandbox: one reason for the whole problem
                built.append([Feedback(None, next(t for t in mine if isinstance(t, str)))] * request.rows)
                continue
            counts.update(f"public_{t.outcome}" for t in mine)
            ordered = [t for t in mine if t.went_wrong] + [t for t in mine if not t.went_wrong]
            shown = [ordered[j % len(ordered)] for j in range(request.rows)]
            built.append([Feedback(t.messages, shown_step=steps.get((request.problem, t.attempt))) for t in shown])
        return built
