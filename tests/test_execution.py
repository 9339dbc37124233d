"""Code with a programmer's feedback (issue 91): public examples shown in the statement, read back from it, run in
the reward's sandbox on a failed attempt as execution feedback; the hidden tests stay the reward and never reach a
report, a prompt or a job."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.sandbox import needs_bwrap
from lanpo.data.code_examples import (
    Example,
    comment_examples,
    docstring_examples,
    public_examples,
    statement_function,
)
from lanpo.data.code_tasks import code_problem_text, code_tasks, humaneval_rows
from lanpo.data.loaders import DataError, LoadStats, builtin_code, code_rows_to_problems, load_problems
from lanpo.feedback.base import FeedbackRequest
from lanpo.feedback.execution import ExecutionSource, execution_report, public_tests
from lanpo.pool.store import ExperiencePool
from lanpo.verify.sandbox import CodeTests, Execution, same_value

PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
    max_leaves=6,
)


def statement(name: str, doc: str, cases: list) -> str:
    return code_problem_text(f'def {name}(x):\n    """{doc}\n{docstring_examples(name, cases)}\n    """\n')


# -- the examples a statement shows --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(PLAIN, min_size=1, max_size=2), PLAIN), min_size=1, max_size=4))
def test_examples_written_into_a_docstring_or_as_comments_read_back_as_written(cases):
    cases = [[list(args), value] for args, value in cases]
    for text in (
        statement("f", "Do it.", cases),
        code_problem_text('def f(x):\n    """Do it."""\n\n\n' + comment_examples("f", cases)),
    ):
        found = public_examples(text)
        assert len(found) == len(cases)
        for example, (args, value) in zip(found, cases):
            assert same_value(list(example.args), args) and same_value(example.expected, value)
            assert example.call.startswith("f(")


BACKTICKS = st.text(alphabet="`a \n", max_size=12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(BACKTICKS, BACKTICKS), min_size=1, max_size=3))
def test_a_statement_whose_values_hold_backtick_runs_keeps_its_whole_code_and_every_example(cases):
    """A value holding a run of backticks ("```", found by the property above) closed the statement's fence early:
    the examples after it, and the function's name, were lost. The fence is longer than any run inside."""
    cases = [[[arg], value] for arg, value in cases]
    for code in (
        f'def f(x):\n    """Do it.\n{docstring_examples("f", cases)}\n    """\n',
        'def f(x):\n    """Do it."""\n\n\n' + comment_examples("f", cases),
    ):
        text = code_problem_text(code)
        shown, entry_point = statement_function(text)
        assert shown.strip("\n") == code.strip("\n") and entry_point == "f"
        found = public_examples(text)
        assert [(list(e.args), e.expected) for e in found] == [(args, value) for args, value in cases]


def test_only_calls_of_the_asked_function_with_literal_values_count_and_one_line_forms_are_read():
    text = code_problem_text(
        "def helper(x):\n    return x\n\n\ndef solve(xs):\n"
        '    """Sum it.\n\n    >>> helper(3)\n    3\n    >>> solve([1, 2])\n    3\n    >>> solve(ys)\n    0\n'
        "    >>> solve([1,\n    ... 2])\n    >>> solve([4])\n    [\n    4\n    ]\n"
        '    solve([5, 5]) ==> 10\n    solve([2]) ➞ 2\n    solve([x]) == 1\n    solve([1]) -> 19 - 5 = 3\n    """\n'
    )
    found = public_examples(text)
    assert [(e.args, e.expected) for e in found] == [(([1, 2],), 3), (([4],), [4]), (([5, 5],), 10), (([2],), 2)]
    assert public_examples("What is 2 + 2? >>> f(1)\n2") == []  # no function defined: nothing to call


def test_builtin_code_shows_examples_apart_from_its_hidden_tests_which_stay_as_they_were():
    shown, bare = code_tasks([1, 2, 3, 4, 5], 400, 0, "train", 2), code_tasks([1, 2, 3, 4, 5], 400, 0, "train")
    assert [t.tests for t in shown] == [t.tests for t in bare]  # showing examples changes no hidden test
    assert all(">>>" not in t.text for t in bare)
    for task in shown:
        examples = public_examples(task.text)
        assert len(examples) == 2
        scope: dict = {}
        exec(task.solution, scope)  # lanpo's own reference solution
        for example in examples:
            assert not any(same_value(list(example.args), args) for args, _ in task.tests.cases)
            assert same_value(scope[task.tests.entry_point](*example.args), example.expected)
    assert load_problems("builtin:code?levels=1&n=3")[0].problem.count(">>>") == 2  # shown by default
    assert load_problems("builtin:code?levels=1&n=3&examples=0")[0].problem.count(">>>") == 0
    with pytest.raises(DataError, match="examples must be 0 to"):
        load_problems("builtin:code?levels=1&examples=9")


def test_humaneval_statements_show_examples_for_most_problems():
    rows = humaneval_rows()
    with_examples = [r for r in rows if public_examples(r["prompt"], r["entry_point"])]
    assert len(with_examples) >= 120  # 131 of 164 when written


def test_a_local_files_public_tests_are_shown_below_the_function_and_bad_ones_skip_the_row():
    row = {"prompt": 'def double(x):\n    """Twice x."""\n', "tests": "assert double(21) == 42\n"}
    stats = LoadStats()
    problems = code_rows_to_problems(
        [
            {**row, "public_tests": [[[2], 4], [["a"], "aa"]]},
            {**row, "public_tests": [[[2], {1, 2}]]},  # a set: the tests compare through JSON, which has none
            {**row, "public_tests": [[2, 4]]},
            {**row, "public_tests": [[[float("inf")], 1]]},
            row,
        ],
        "local",
        stats,
        run_solutions=False,
    )
    assert len(problems) == 2 and sum(stats.skipped.values()) == 3
    examples = public_examples(problems[0].problem)
    assert [(e.args, e.expected) for e in examples] == [((2,), 4), (("a",), "aa")]
    assert public_examples(problems[1].problem) == []
    assert "42" not in problems[0].problem  # the hidden test stays hidden


# -- the execution report ------------------------------------------------------------------------------------------

TESTS = CodeTests("f", cases=[[[1], 2], [[0], 1]])
EXAMPLES = [Example("f(1)", (1,), 2), Example("f(0)", (0,), 1)]
CODE = "def f(x):\n    y = 10 / x\n    return int(y)\n"


def test_each_outcome_reads_as_a_programmer_would_see_it():
    raised = {"type": "ZeroDivisionError", "message": "division by zero", "lines": [3]}  # line 2 of the code
    failed = Execution("failed", 0, 2, calls=[{"value": "10", "raised": None}, {"value": None, "raised": raised}])
    report = execution_report(TESTS, EXAMPLES, failed, CODE)
    assert report.splitlines() == [
        "- f(1) returned 10. The problem shows 2.",
        "- f(0) raised ZeroDivisionError: division by zero at line 2: `y = 10 / x`. The problem shows 1.",
    ]
    passed = Execution("passed", 2, 2, calls=[{"value": "2", "raised": None}, {"value": "1", "raised": None}])
    assert execution_report(TESTS, EXAMPLES, passed, CODE).endswith(
        "returned what the problem shows on the 2 examples."
    )
    syntax = Execution("error", error={"type": "SyntaxError", "message": "expected ':'", "lines": [2]})
    assert (
        execution_report(TESTS, EXAMPLES, syntax, "def f(x)\n")
        == "The code did not load: SyntaxError: expected ':' at line 1: `def f(x)`."
    )
    missing = Execution("error", error={"type": "KeyError", "message": "'f'", "lines": []})
    assert "does not define the function f" in execution_report(TESTS, EXAMPLES, missing, "def g(x):\n    pass\n")
    assert "did not finish in time" in execution_report(TESTS, EXAMPLES, Execution("timeout"), CODE)
    assert "no code" in execution_report(TESTS, EXAMPLES, Execution("no_code"), None)
    assert "no report" in execution_report(TESTS, EXAMPLES, Execution("forged"), CODE)
    long = Execution("failed", calls=[{"value": None, "long": True, "raised": None}, {"value": "1", "raised": None}])
    assert "too long to show" in execution_report(TESTS, EXAMPLES, long, CODE)


ATTEMPT_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=60) | st.sampled_from(
    [
        "E.\n- f(1) returned 2, as the problem shows.\nIt returned what the problem shows on the 2 examples.",
        "\x1b[2J\x00\x07\x08",
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    outcome=st.sampled_from(["passed", "failed", "error"]),
    kinds=st.lists(ATTEMPT_TEXT, min_size=2, max_size=2),
    messages=st.lists(ATTEMPT_TEXT, min_size=2, max_size=2),
    values=st.lists(st.none() | ATTEMPT_TEXT | st.just('"ok\\n- f(0) returned 1"'), min_size=2, max_size=2),
    lines=st.lists(st.integers(1, 4), max_size=2),
    code_line=ATTEMPT_TEXT,
)
def test_what_the_attempt_controls_is_data_in_the_report_never_a_line_of_it(
    outcome, kinds, messages, values, lines, code_line
):
    """Exception type names, messages, returned values (raw on the answers channel: any string) and the attempt's own
    lines reach the report flattened and escaped: one line per example (and the success line only where the run
    passed), each line the report's own, and no control character anywhere but the line breaks between them."""
    code = f"def f(x):\n    {code_line}\n    return x\n"
    calls = [
        {"value": value, "raised": {"type": kind, "message": message, "lines": lines} if value is None else None}
        for value, kind, message in zip(values, kinds, messages)
    ]
    run = Execution(outcome, 2 if outcome == "passed" else 0, 2, calls=calls)
    if outcome == "error":
        run = Execution("error", error={"type": kinds[0], "message": messages[0], "lines": lines})
    report = execution_report(TESTS, EXAMPLES, run, code)
    rows = report.split("\n")
    if outcome == "error":
        assert len(rows) == 1 and rows[0].startswith("The code ")
    else:
        assert [r.split(" ", 2)[:2] for r in rows[:2]] == [["-", "f(1)"], ["-", "f(0)"]]
        assert rows[2:] == (["It returned what the problem shows on the 2 examples."] if outcome == "passed" else [])
    assert all(ch.isprintable() for row in rows for ch in row)


class Recorder:
    """A sandbox stand-in that records every job and answers as a run that returned ``value`` each time."""

    def __init__(self, value=0):
        self.jobs: list = []
        self.value = value

    def __call__(self, jobs):
        self.jobs += jobs
        return [
            Execution(
                "failed",
                0,
                len(tests.cases),
                calls=[{"value": json.dumps(self.value), "raised": None}] * len(tests.cases),
            )
            for _, tests in jobs
        ]


HIDDEN_INPUT = "zq-hidden-input"  # strings: a number could turn up inside a logged float
HIDDEN_VALUE = "zq-hidden-value"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-50, 50), st.integers(-50, 50)), min_size=1, max_size=3, unique_by=lambda c: c[0]),
    st.lists(st.text(max_size=30), min_size=1, max_size=3),
    st.integers(1, 4),
)
def test_no_hidden_test_reaches_a_job_or_a_report_whatever_the_problem_and_attempts(
    tmp_path_factory, shown, attempts, rows
):
    """The source sees the statement and the attempts only; the hidden tests (inputs and values no statement shows)
    reach neither the sandbox's jobs nor a context."""
    cases = [[[x], y] for x, y in shown]
    problem = statement("f", "Do it.", cases)
    hidden = CodeTests("f", cases=[[[HIDDEN_INPUT], HIDDEN_VALUE], [[HIDDEN_VALUE], HIDDEN_INPUT]])
    pool = ExperiencePool(tmp_path_factory.mktemp("pool"))
    recorder = Recorder()
    source = ExecutionSource(pool, recorder)
    fenced = [f"```python\ndef f(x):\n    return {a!r}\n```" for a in attempts]
    built = source.contexts([FeedbackRequest("p", problem, rows, tuple(fenced))], Counter())
    assert len(built[0]) == rows and all(f.messages is not None for f in built[0])
    for _, tests in recorder.jobs:
        assert tests.cases == cases  # the shown examples, exactly: never the hidden suite
    text = json.dumps([f.messages for f in built[0]]) + json.dumps([t.cases for _, t in recorder.jobs])
    assert HIDDEN_INPUT not in text and HIDDEN_VALUE not in text and hidden.to_gold() not in text
    pool.close()


def test_a_problem_without_examples_or_attempts_gets_no_context_and_says_why(tmp_path):
    pool = ExperiencePool(tmp_path)
    source = ExecutionSource(pool, Recorder())
    bare = code_problem_text('def f(x):\n    """Do it."""\n')
    counts: Counter = Counter()
    built = source.contexts(
        [
            FeedbackRequest("a", bare, 2, ("```python\ndef f(x):\n    return 1\n```",)),
            FeedbackRequest("b", "What is 2 + 2?", 1, ("4",)),
            FeedbackRequest("c", statement("f", "Do it.", [[[1], 2]]), 1, ()),
        ],
        counts,
    )
    assert [[f.reason for f in rows] for rows in built] == [
        ["no_public_examples"] * 2,
        ["no_public_examples"],
        ["no_attempt"],
    ]
    assert public_tests("What is 2 + 2?") is None
    pool.close()


def test_execution_feedback_on_data_with_no_example_to_run_is_refused_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    from trl import GRPOTrainer

    from lanpo.feedback.execution import check_examples
    from test_trainer import make_trainer

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(GRPOTrainer, "__init__", no_model)
    with pytest.raises(ValueError, match="none of the 8 training problems is a code problem"):
        make_trainer(tiny_model_dir, tmp_path, feedback_source="execution", summaries_per_group=0)
    bare = code_problem_text('def f(x):\n    """Do it."""\n')
    with pytest.raises(ValueError, match="shows public examples \\(all 1 are code problems without any\\)"):
        check_examples([bare])
    check_examples([bare, statement("f", "Do it.", [[[1], 2]])])  # some show examples: a warning, and the run goes on
    assert "1 of 2 training problems show no public example" in caplog.text


# -- in the sandbox ------------------------------------------------------------------------------------------------


def test_the_runs_details_are_what_the_code_did_and_never_change_a_verdict(sandbox):
    tests = CodeTests("f", cases=[[[1], 2], [[0], 1]])
    wrong = sandbox.run(CODE, tests)
    assert wrong.outcome == "failed" and wrong.passed == 0
    assert wrong.calls[0]["value"] == "10" and wrong.calls[0]["raised"] is None
    assert wrong.calls[1]["raised"]["type"] == "ZeroDivisionError" and wrong.calls[1]["raised"]["lines"]
    loaded = sandbox.run("def f(x)\n    return 1\n", tests)
    assert loaded.outcome == "error" and loaded.error["type"] == "SyntaxError"
    right = sandbox.run("def f(x):\n    return x + 1\n", tests)
    assert right.outcome == "passed" and [c["value"] for c in right.calls] == ["2", "1"]
    liar = "def f(x):\n    raise ValueError('x' * 5000)\n"  # a message past the bound is cut, not carried
    assert len(sandbox.run(liar, tests).calls[0]["raised"]["message"]) <= 300


def test_execution_feedback_runs_the_shown_examples_in_the_sandbox_not_the_hidden_suite(sandbox, tmp_path):
    """An attempt right on the shown examples and wrong on the hidden tests is told it returned what the problem
    shows: a report built from the hidden suite would say otherwise, and this test fails."""
    problem = statement("f", "Return x plus one.", [[[1], 2], [[5], 6]])
    attempt = "```python\ndef f(x):\n    if x in (1, 5):\n        return x + 1\n    return 0\n```"
    hidden = CodeTests("f", cases=[[[0], 1], [[7], 8]])
    assert (
        sandbox.run("def f(x):\n    if x in (1, 5):\n        return x + 1\n    return 0\n", hidden).outcome == "failed"
    )
    pool = ExperiencePool(tmp_path)
    counts: Counter = Counter()
    source = ExecutionSource(pool, sandbox.run_many)
    built = source.contexts([FeedbackRequest("p", problem, 1, (attempt,))], counts)
    content = built[0][0].messages[0]["content"]
    assert "f(1) returned 2, as the problem shows." in content and "f(5) returned 6" in content
    assert "returned what the problem shows on the 2 examples" in content
    assert "f(0)" not in content and "f(7)" not in content and counts["public_passed"] == 1
    wrong = "```python\ndef f(x):\n    return x - 1\n```"
    built = source.contexts([FeedbackRequest("p", problem, 2, (attempt, wrong))], counts)
    first = built[0][0].messages[0]["content"]  # the attempt that went wrong on an example comes first
    assert "f(1) returned 0. The problem shows 2." in first and "return x - 1" in first
    pool.close()


def test_a_builtin_problems_examples_run_against_its_reference_solution_pass(sandbox):
    problems = builtin_code("1,2,3,4,5", n=60)
    jobs = []
    for problem in problems:
        tests, _ = public_tests(problem.problem)
        jobs.append((problem.solution, tests))
    assert {run.outcome for run in sandbox.run_many(jobs)} == {"passed"}
    assert len(jobs) == 60


# -- in training ---------------------------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize(
    ("source", "route", "trigger"),
    [
        ("execution", "generate", "always"),
        ("execution", "score", "always"),
        ("execution", "both", "always"),
        ("execution", "generate", "unsolved"),
        ("self", "generate", "always"),
    ],
)
def test_training_with_execution_feedback_leaks_no_hidden_test_anywhere_it_writes(
    tiny_model_dir, tmp_path, source, route, trigger
):
    """A run on problems whose hidden tests hold values no statement shows: none of them reaches a prompt, a
    sample, the pool, the metrics, a checkpoint or the report, under execution feedback (generated rows, scored rows, both; on
    every group or, with ``feedback_trigger unsolved``, on the groups that failed) and LANPO's own sources alike."""
    from lanpo.report.page import write_report
    from test_code import code_trainer, fence
    from test_trainer import history, stub_summaries

    rows = [
        {
            "prompt": f'def shift{k}(x):\n    """Return x plus {k}."""\n',
            "tests": f"assert shift{k}(5) == {5 + k}\nassert shift{k}('{HIDDEN_INPUT}') != '{HIDDEN_VALUE}'\n",
            "public_tests": [[[1], 1 + k], [[2], 2 + k]],
            "solution": f"def shift{k}(x):\n    return x + {k}\n",
        }
        for k in range(1, 5)
    ]
    problems = code_rows_to_problems(rows, "local", run_solutions=False)
    trainer = code_trainer(
        tiny_model_dir,
        tmp_path,
        problems,
        max_steps=2,
        max_completion_length=32,
        feedback_source=source,
        feedback_route=route,
        feedback_trigger=trigger,
        score_rows="all",
        save_strategy="steps",
        save_steps=1,  # a checkpoint holds the pending summaries' trials: by problem, never with their golds
    )
    stub_summaries(trainer)
    tok = trainer.processing_class
    original = trainer._generate_ids

    def some_code(prompt_ids):  # a random model writes no code: every row gets a function wrong on the examples
        completions, logprobs = original(prompt_ids)
        for k, ids in enumerate(prompt_ids):
            name = next((f"shift{j}" for j in range(1, 5) if f"def shift{j}(" in tok.decode(ids)), None)
            if name and "Distill" not in tok.decode(ids):
                completions[k] = tok.encode(fence(f"def {name}(x):\n    return x * {k}\n"), add_special_tokens=False)
        return completions, logprobs

    trainer._generate_ids = some_code
    trainer.train()
    trainer.verifier.close()
    assert all(math.isfinite(x) for x in history(trainer, "loss"))
    out = tmp_path / "code"
    if source == "execution":  # attempts were run on the shown examples (a random model's: often no code at all)
        runs = {k for h in trainer.state.log_history for k in h if k.startswith("execution/public_")}
        assert runs and sum(sum(history(trainer, k)) for k in runs) > 0
    if route != "score" and source == "execution":
        assert "The problem shows" in (out / "samples.jsonl").read_text()  # the report reached the rows shown it
    if route != "generate":
        assert sum(history(trainer, "score/rows")) > 0  # the plain rows were scored under their own reports
    write_report([out])
    pool = ExperiencePool(out)
    written = "".join(
        p.read_text(errors="replace")
        for p in out.rglob("*")
        if p.is_file() and p.suffix in (".jsonl", ".json", ".html", ".md")
    ) + json.dumps([e.__dict__ for e in pool.entries()], default=str)
    pool.close()
    assert HIDDEN_INPUT not in written and HIDDEN_VALUE not in written


@needs_bwrap
def test_lanpo_eval_execution_mode_shows_each_chain_what_its_last_attempt_did_on_the_examples(tiny_model_dir, tmp_path):
    from lanpo.cli import main

    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--data", "builtin:code?split=test&n=3&levels=2,3", "--k", "2"]
    argv += ["--max-new-tokens", "8", "--modes", "self-correct,execution", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    metrics = results["modes"]["execution"]["metrics"]
    assert metrics["problems"] == 3 and "mean@2_round1" in metrics and metrics["execution_fallbacks"] == 0
    records = [json.loads(line) for line in (out / "completions-execution.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for record in records:  # a random model writes no code: each is told so, below its own attempt
        assert "### Running it on the examples" in record["prompt"] and "holds no code to run" in record["prompt"]
    math_out = tmp_path / "math"
    argv = ["eval", "--model", str(tiny_model_dir), "--data", "builtin:arith?split=test&n=2", "--k", "1"]
    argv += ["--max-new-tokens", "4", "--modes", "execution", "--out", str(math_out)]
    assert main(argv) == 0  # a problem that shows no example gets a fresh attempt, counted
    math = json.loads((math_out / "results.json").read_text())["modes"]["execution"]["metrics"]
    assert math["execution_fallbacks"] == 2


# -- the scoring route ---------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=8, max_size=8), st.booleans(), st.sampled_from(["additive", "contrastive"]))
def test_a_scored_row_is_read_under_its_own_report_never_its_own_text_and_the_control_under_anothers(
    has_report, control, form
):
    from lanpo import score
    from lanpo.plan import Scoring

    g = 4
    rows = [
        score.ScoredRow(
            f"p{i // g}",
            statement(f"f{i // g}", "Do it.", [[[1], 2]]),
            f"```python\ndef f{i // g}(x):\n    return {i}  # attempt-{i}\n```",
            False,
            None,
            f"- f{i // g}(1) returned {i}. The problem shows 2. [report-{i}]" if has_report[i] else None,
        )
        for i in range(2 * g)
    ]
    scoring = Scoring("execution", form, "initial", 1.0, 2.0, "failed", wrong=1, control=control)
    for i, context in enumerate(score.teacher_contexts(rows, g, scoring)):
        if not has_report[i]:
            assert context is None  # nothing to show: not scored
            continue
        if context is None:  # contrastive or control with no other report to draw a contrast from
            assert (form == "contrastive" or control) and not any(has_report[(i + g) % (2 * g) :: 2 * g])
            continue
        text = context.right[-1]["content"]
        assert f"attempt-{i}" not in text  # the row's own text is what is scored, never in its context
        assert (f"[report-{i}]" in text) != control  # the control reads another row's report in its place
