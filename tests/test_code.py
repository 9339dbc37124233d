"""The code domain: problems with tests, the sandboxed reward, its security and reward-hack battery, code prompts."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers.sandbox import needs_bwrap
from lanpo.data.code_tasks import FAMILIES, code_tasks
from lanpo.data.loaders import DataError, builtin_code, load_problems, to_prompt_dataset, with_answer_column
from lanpo.feedback.labels import clean_lessons
from lanpo.feedback.privileged import ground_truth, states_answer, take_references
from lanpo.prompts import (
    CODE_INSTRUCTION,
    SOLVE_INSTRUCTION,
    abstraction_text,
    reflection_text,
    solve_messages,
    summary_messages,
)
from lanpo.verify.code import FENCE, CodeSettings, CodeVerifier, Verifier, extract_code, fenced
from lanpo.verify.rewards import MathVerifier, make_accuracy_reward
from lanpo.verify.sandbox import CodeTests, Execution, Limits, Sandbox, SandboxUnavailable

ADD = CodeTests("add", cases=[[[1, 2], 3], [[2, 2], 4], [[0, 0], 0]])
ADD_CHECK = CodeTests(
    "add", check="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
)
ADD_ASSERTS = CodeTests("add", check="assert add(1, 2) == 3\nassert add(5, 5) == 10\n")
RIGHT = "def add(a, b):\n    return a + b\n"


def fence(code: str) -> str:
    return f"Here is the function.\n```python\n{code}```\nDone."


# -- problems -------------------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_builtin_code_splits_by_task_so_no_restatement_crosses(seed):
    train = code_tasks([1, 2, 3, 4, 5], 1000, seed, "train")
    test = code_tasks([1, 2, 3, 4, 5], 1000, seed, "test")
    assert train and test
    assert not {t.task for t in train} & {t.task for t in test}
    assert len({t.id for t in train}) == len(train)
    assert {t.level for t in test} == {1, 2, 3, 4, 5}
    names = {t.tests.entry_point for t in train if t.task == train[0].task}
    assert all(f"def {name}(" in t.text for t in train for name in [t.tests.entry_point])
    assert names  # the restatements of one task differ only in their name


def test_builtin_code_problems_are_reproducible_and_carry_tests_and_a_solution():
    first = builtin_code("1,2", n=20, seed=3, split="train")
    assert first == builtin_code("1,2", n=20, seed=3, split="train")
    problem = first[0]
    assert problem.problem.startswith("Write the Python function below.") and "```python\ndef " in problem.problem
    tests = CodeTests.from_gold(problem.answer)
    assert problem.gold_kind == "code" and len(tests.cases) >= 5
    assert f"def {tests.entry_point}(" in problem.solution and "return" in problem.solution
    assert "return" not in problem.problem  # the statement holds the signature and docstring, never the body
    with pytest.raises(DataError, match="levels 1-5"):
        builtin_code("6")
    with pytest.raises(DataError, match="no option"):
        load_problems("builtin:code?level=1")


@pytest.mark.slow
@needs_bwrap
def test_every_reference_solution_passes_its_own_tests_and_a_wrong_one_fails():
    """Every task of every level and split: its reference passes its tests and a wrong body (``return None``)
    fails them, checked as the sandbox compares (through JSON); a third of them, every level and split, through the
    reward's sandbox itself (the sandbox credits exactly what the generation's own check does: a test below)."""
    problems = load_problems("builtin:code?levels=1,2,3,4,5&n=400") + load_problems(
        "builtin:code?split=test&n=400&levels=1,2,3,4,5"
    )
    tasks = code_tasks([1, 2, 3, 4, 5], 400, 0, "train", 2) + code_tasks([1, 2, 3, 4, 5], 400, 0, "test", 2)

    def wrong(solution: str) -> str:  # the body's last line returns None
        return solution.rsplit("\n    ", 1)[0] + "\n    return None\n"

    assert all(_credits(t, t.solution) for t in tasks)
    assert sum(_credits(t, wrong(t.solution)) for t in tasks) < 0.05 * len(tasks)
    sample = problems[::3]
    with closing(CodeVerifier(CodeSettings())) as verifier:
        right = verifier.score_texts([p.answer for p in sample], [fence(p.solution) for p in sample])
        wrong_scores = verifier.score_texts([p.answer for p in sample], [fence(wrong(p.solution)) for p in sample])
    assert right == [1.0] * len(sample)
    assert sum(wrong_scores) < 0.05 * len(sample)


def _credits(task, source: str) -> bool:
    """Whether ``source`` passes every hidden case of ``task``, compared as the sandbox compares (through JSON)."""
    from lanpo.data.code_tasks import _reference, json_copy
    from lanpo.verify.sandbox import same_value

    try:
        function = _reference(task.tests.entry_point, source)
        return all(same_value(function(*json_copy(args)), value) for args, value in task.tests.cases)
    except Exception:
        return False


def test_one_token_mutants_change_one_token_of_the_code_and_never_the_docstring():
    from lanpo.data.mutants import mutants

    source = 'def f(xs):\n    """Keep x > 4 and x != 7."""\n    return [x for x in xs if x > 4 and x != 7]\n'
    changes = sorted(m.what for m in mutants(source))
    assert changes == sorted(
        ["line 3: > to >=", "line 3: 4 to 3", "line 3: 4 to 5", "line 3: != to ==", "line 3: 7 to 6", "line 3: 7 to 8"]
        + ["line 3: and to or"]
    )
    assert all('"""Keep x > 4 and x != 7."""' in m.source for m in mutants(source))
    assert mutants("def f(:\n") == []


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_builtin_code_tests_credit_no_near_miss_of_the_reference_over_seeds(seed):
    """Of every one-token mutant of every task's reference (a boundary, an off-by-one constant, and/or, a
    comparison's sense), at most 5% pass the hidden tests, and each one that does is the same function: it agrees
    with the reference on hundreds of drawn inputs and on every input at the task's constants."""
    import random

    from lanpo.data.code_tasks import FAMILIES, _draw, _reference, boundary_cases, json_copy
    from lanpo.data.mutants import mutants
    from lanpo.verify.sandbox import same_value

    run = credited = 0
    for split in ("train", "test"):
        for task in code_tasks([1, 2, 3, 4, 5], 1000, seed, split):
            family = FAMILIES[int(task.task.split(":")[0])]
            const = family.consts[[str(c) for c in family.consts].index(task.task.split(":", 1)[1])]
            reference = _reference(task.tests.entry_point, task.solution)
            own = random.Random(seed)
            probe = boundary_cases(family, const, task.solution) + [_draw(family.args, own) for _ in range(200)]
            for mutant in mutants(task.solution):
                run += 1
                if _credits(task, mutant.source):
                    credited += 1
                    near = _reference(task.tests.entry_point, mutant.source)
                    assert all(same_value(near(*json_copy(a)), reference(*json_copy(a))) for a in probe), mutant.what
    assert run > 300 and credited <= 0.05 * run


def test_drawn_tests_are_the_ones_the_recorded_code_cells_ran_on():
    """``tests=drawn`` keeps builtin:code's tests as they were when verdict-code's cells ran (the grid pins it):
    the problems of its training and test specs, over its five seeds, hash as they did at 420abaf."""
    import hashlib

    digest = hashlib.sha256()
    for spec in ("builtin:code?levels=2,3,4,5&tests=drawn", "builtin:code?levels=2,3,4,5&split=test&tests=drawn"):
        for seed in range(5):
            for p in load_problems(spec, seed=seed):
                digest.update(json.dumps([p.id, p.problem, p.answer, p.solution]).encode())
    assert digest.hexdigest() == "ce22169fb0dc6bf5bf8c263f30ff0213b8673165c7c1ed26a8352e9eda8148bc"
    checked = load_problems("builtin:code?levels=2,3,4,5", seed=0)
    drawn = load_problems("builtin:code?levels=2,3,4,5&tests=drawn", seed=0)
    assert all(
        len(CodeTests.from_gold(c.answer).cases) > len(CodeTests.from_gold(d.answer).cases)
        for c, d in zip(checked, drawn)
    )
    with pytest.raises(DataError, match="tests must be one of checked, drawn"):
        load_problems("builtin:code?tests=strict")


@needs_bwrap
def test_the_sandbox_credits_the_mutants_the_generation_found_credited():
    """The generation's own check (in-process, on lanpo's reference code) agrees with the reward's sandbox, run on
    every mutant of a dozen tasks: off-by-one code earns nothing there."""
    from lanpo.data.mutants import mutants

    tasks = code_tasks([2, 3, 5], 12, 1, "train")
    jobs = [(task, m.source) for task in tasks for m in mutants(task.solution)]
    with closing(CodeVerifier(CodeSettings())) as verifier:
        scores = verifier.score_texts([t.tests.to_gold() for t, _ in jobs], [fence(source) for _, source in jobs])
    assert [s >= 1.0 for s in scores] == [_credits(t, source) for t, source in jobs]
    assert sum(s >= 1.0 for s in scores) <= 0.05 * len(jobs)


@needs_bwrap
def test_a_local_code_file_whose_tests_pass_mutants_of_its_solution_is_loaded_with_a_warning(tmp_path, caplog):
    rows = [
        {  # no test sits on the threshold: x >= 4 passes too
            "prompt": 'def above(xs):\n    """The numbers greater than 4."""\n',
            "tests": "assert above([1, 9]) == [9]\nassert above([5, 0, 7]) == [5, 7]",
            "solution": "    return [x for x in xs if x > 4]\n",
        },
        {  # pinned at 4 and 5
            "prompt": 'def big(xs):\n    """The numbers greater than 4."""\n',
            "tests": "assert big([3, 4, 5]) == [5]\nassert big([]) == []\nassert big([6]) == [6]",
            "solution": "    return [x for x in xs if x > 4]\n",
        },
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = load_problems(str(path))
    assert len(problems) == 2  # a warning, not a refusal
    assert "the tests of 1 of 2 problems with a solution pass one-token mutants" in caplog.text
    assert "row(s) 1" in caplog.text and "(2 of 6 mutants" in caplog.text  # x >= 4 and x > 3


@pytest.mark.slow
@needs_bwrap
def test_humaneval_loads_from_the_wheel_and_its_canonical_solutions_pass():
    problems = load_problems("humaneval")
    assert len(problems) == 164
    assert all(p.solution and p.gold_kind == "code" for p in problems)
    assert "check(candidate)" not in problems[0].problem and "def has_close_elements" in problems[0].problem
    with closing(CodeVerifier(CodeSettings())) as verifier:
        scores = verifier.score_texts([p.answer for p in problems], [fence(p.solution) for p in problems])
        stubs = verifier.score_texts(
            [p.answer for p in problems[:20]],
            [fence(p.problem.split("```python\n")[1] + "    return None\n") for p in problems[:20]],
        )
    assert scores == [1.0] * 164
    assert sum(stubs) == 0


def test_local_code_files_load_and_bad_rows_are_counted(tmp_path):
    rows = [
        {
            "prompt": 'def double(x):\n    """Twice x."""\n',
            "tests": "assert double(2) == 4\nassert double(3) == 6",
            "solution": "    return 2 * x\n",
        },
        {
            "prompt": "def f(x):\n",
            "test": "def check(candidate):\n    assert candidate(1) == 1\n    assert candidate(2) == 3\n",
            "entry_point": "f",
        },
        {"prompt": "", "tests": "assert True"},
        {"prompt": "def g(x):\n"},
        "not an object",
    ]
    path = tmp_path / "code.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = load_problems(str(path))
    assert [CodeTests.from_gold(p.answer).entry_point for p in problems] == ["double", "f"]
    assert problems[0].solution.startswith("def double(x):") and "return 2 * x" in problems[0].solution
    assert problems[1].solution is None


# -- extraction -------------------------------------------------------------------------------------------------


def test_extraction_strict_and_lenient():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    two = "```python\nx = 1\n```\ntext\n```py\ndef f():\n    return 2\n```"
    assert extract_code(two) == "def f():\n    return 2\n"
    assert extract_code("def f():\n    return 1") is None  # no fence: strict finds nothing
    assert extract_code("Sure:\ndef f():\n    return 1", "lenient") == "def f():\n    return 1\n"
    assert extract_code("```python\ndef f():\n    return 1", "lenient") == "def f():\n    return 1\n"  # cut off
    assert extract_code("```javascript\nfunction f() {}\n```") is None
    assert extract_code("no code here", "lenient") is None
    assert extract_code("") is None and extract_code(None) is None


@settings(max_examples=50, deadline=None)
@given(body=st.text(st.characters(blacklist_characters="`\r", blacklist_categories=("Cs",)), min_size=1))
def test_the_fenced_block_is_extracted_exactly(body):
    code = "def f():\n    return " + body.replace("\n", " ") + "\n"
    assert extract_code(f"prose\n```python\n{code}```\nmore prose") == code


CODE_WITH_BACKTICKS = st.text(alphabet="`ab \n", max_size=30).map(lambda t: f"def f():\n    return {t!r}\n")


@settings(max_examples=100, deadline=None)
@given(code=CODE_WITH_BACKTICKS, prose=st.text(alphabet="ab .\n", max_size=20))
def test_code_holding_backtick_runs_is_fenced_so_it_reads_back_whole(code, prose):
    """A string of backticks in a program ("```" in a docstring example, a Markdown template) closed the fence put
    around it: statements, half solutions shown as hints and reference solutions checked at load lost their end."""
    assert extract_code(fenced(code)) == code
    assert extract_code(f"{prose}\n{fenced(code)}\n", "lenient") == code


OLD_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["```", "```python\n", "```py\n", "\n", "def f(): pass", "x", " ", "``", "`"]), max_size=12
    )
)
def test_texts_fenced_with_three_backticks_read_as_they_always_did(pieces):
    """The fence of any length reads a model's fences of three backticks as before (the first ``` closes them)."""
    text = "".join(pieces)
    assume("````" not in text)
    assert [body for _, _, body in FENCE.findall(text)] == [body for _, body in OLD_FENCE.findall(text)]


# -- the sandbox: outcomes, security and reward hacks ----------------------------------------------------------


def run(sandbox, code, tests=ADD):
    return sandbox.run(code, tests)


@needs_bwrap
@pytest.mark.parametrize("tests", [ADD, ADD_CHECK, ADD_ASSERTS], ids=["cases", "check", "asserts"])
def test_a_right_function_passes_and_a_wrong_one_fails(sandbox, tests):
    assert run(sandbox, RIGHT, tests).outcome == "passed"
    assert run(sandbox, "def add(a, b):\n    return a - b\n", tests).outcome == "failed"
    assert run(sandbox, "def plus(a, b):\n    return a + b\n", tests).outcome == "error"  # not the named function
    assert run(sandbox, "def add(a, b) return a + b\n", tests).outcome == "error"  # does not compile
    assert run(sandbox, None, tests).outcome == "no_code"


def test_partial_credit_is_the_share_of_cases(sandbox):
    half = "def add(a, b):\n    return 3 if a == 1 else a * b\n"  # right on (1, 2) and (2, 2), wrong on nothing else
    result = run(sandbox, half)
    assert (result.passed, result.total) == (3, 3)
    result = run(sandbox, "def add(a, b):\n    return a + b if a else 7\n")
    assert (result.passed, result.total, result.outcome) == (2, 3, "failed")


HACKS = {
    "exits 0 before the tests": "import os\nos._exit(0)\n" + RIGHT,
    "sys.exit at import": "import sys\n" + RIGHT + "sys.exit(0)\n",
    "SystemExit inside the function": "def add(a, b):\n    raise SystemExit(0)\n",
    "KeyboardInterrupt inside": "def add(a, b):\n    raise KeyboardInterrupt\n",
    "prints what a harness looks for": "print('All tests passed')\nprint('PASSED')\ndef add(a, b):\n    return -1\n",
    "equal to anything": "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
    "def add(a, b):\n    return Any()\n",
    "an int subclass equal to anything": "class Any(int):\n    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Any(0)\n",
    "writes a report on every descriptor": "import os, json\nfor fd in range(3, 64):\n    try:\n"
    "        os.write(fd, b'x {\"passed\": true}\\n')\n    except OSError:\n        pass\n"
    "def add(a, b):\n    return -1\n",
    "patches the assert away": "import builtins\nbuiltins.AssertionError = Exception\ndef add(a, b):\n    return -1\n",
    "exits from an atexit hook": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n"
    "    return -1\n",
}


@needs_bwrap
@pytest.mark.parametrize("tests", [ADD, ADD_CHECK, ADD_ASSERTS], ids=["cases", "check", "asserts"])
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_reward_hacks_score_zero(sandbox, hack, tests):
    result = run(sandbox, HACKS[hack], tests)
    assert result.outcome != "passed" and result.share == 0.0, result


def sandbox_processes_left(sandbox, wait: float = 5.0) -> list[str]:
    """Live processes of this sandbox's uids (zombies excluded: they run nothing, and the host's init reaps them),
    after waiting up to ``wait`` seconds for the kernel to finish the kill."""
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["ps", "-e", "-o", "uid=,stat=,pid=,cmd="], capture_output=True, text=True).stdout
        rows = [line.split(None, 3) for line in out.splitlines() if line.split()]
        live = [" ".join(r) for r in rows if int(r[0]) in sandbox.uids and not r[1].startswith("Z")]
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


@needs_bwrap
def test_network_is_unreachable_from_the_sandbox(sandbox):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            try:
                accepted.append(listener.accept())
            except OSError:
                pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')\n" + RIGHT
    result = run(sandbox, code)
    thread.join()
    listener.close()
    assert result.outcome == "error" and not accepted
    assert sandbox.run("import socket\nsocket.getaddrinfo('pypi.org', 443)\n" + RIGHT, ADD).outcome == "error"


@needs_bwrap
def test_writes_outside_the_private_tmp_fail_and_nothing_lands_on_the_host(sandbox, tmp_path):
    target = tmp_path / "escaped.txt"
    for path in (target, Path("/usr/lanpo-escaped"), Path.home() / "lanpo-escaped"):
        code = f"open({str(path)!r}, 'w').write('x')\n" + RIGHT
        assert run(sandbox, code).outcome == "error"
        assert not path.exists()
    inside = run(sandbox, "open('/tmp/scratch.txt', 'w').write('ok')\n" + RIGHT)
    assert inside.outcome == "passed"  # its own /tmp is writable, and private
    assert not Path("/tmp/scratch.txt").exists()


@needs_bwrap
def test_the_trainers_environment_and_files_are_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("LANPO_SECRET_TOKEN", "hunter2")
    code = (
        "import os\nleak = os.environ.get('LANPO_SECRET_TOKEN', '')\n"
        "for pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
        "        try:\n            leak += open(f'/proc/{pid}/environ').read()\n        except OSError:\n"
        "            pass\nprint(leak)\n"
        "def add(a, b):\n    return a + b + (1000 if 'hunter2' in leak or os.path.exists('/root') or "
        "os.path.exists('/home') or os.path.exists('/etc/passwd') else 0)\n"
    )
    result = run(sandbox, code)
    assert result.outcome == "passed" and "hunter2" not in result.output


@pytest.fixture(scope="module")
def quick_sandbox(sandbox):
    """The shared sandbox's bounds with a time limit of 1.5 s and a CPU limit of 1 s: the attacks that run until a
    limit ends them (the machine to themselves: tests marked `alone`) wait for it half as long."""
    from dataclasses import replace

    box = Sandbox(replace(sandbox.limits, timeout=1.5, cpu_seconds=1), workers=2)
    yield box
    box.close()


@needs_bwrap
@pytest.mark.parametrize(
    "kind, code",
    [
        ("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
        (
            "forks that sleep",
            "import os, time\nfor _ in range(500):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n    except OSError:\n        pass\n"
            "def add(a, b):\n    return -1\n",
        ),
        ("memory", "blocks = []\nwhile True:\n    blocks.append(bytearray(50_000_000))\n"),
        ("endless loop", "while True:\n    pass\n"),
        ("endless sleep", "import time\ntime.sleep(600)\n"),
        ("output flood", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"),
        ("file flood", "with open('/tmp/big', 'wb') as f:\n    while True:\n        f.write(b'x' * 1_000_000)\n"),
        (
            "signals its parent",
            "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n" + RIGHT,
        ),
        (
            "a daemon left behind",
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\ndef add(a, b):\n    return -1\n",
        ),
    ],
)
@pytest.mark.alone
def test_resource_attacks_end_with_zero_and_leave_nothing_running(quick_sandbox, kind, code):
    sandbox = quick_sandbox
    before = dict(sandbox.stats)
    started = time.monotonic()
    result = run(sandbox, code)
    elapsed = time.monotonic() - started
    assert result.share == 0.0 and result.outcome != "passed"
    assert elapsed < sandbox.limits.timeout + 6
    assert len(result.output) <= sandbox.limits.output_chars
    assert sandbox.stats[result.outcome] == before.get(result.outcome, 0) + 1
    assert sandbox_processes_left(sandbox) == []
    assert run(sandbox, RIGHT).outcome == "passed"  # and the next run is unharmed


def test_a_runs_end_is_seen_when_it_comes_and_its_deadline_still_holds():
    """The sandbox waits for a run on a pidfd (no polling): an ended process is reaped with its status, a running one
    is left running at the deadline (for the sandbox to kill), and one reaped already reads as ended."""
    import sys

    from lanpo.verify.sandbox import _wait_for_exit

    ending = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert _wait_for_exit(ending, 60) and ending.returncode == 3
    assert _wait_for_exit(ending, 0)  # reaped already
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        assert not _wait_for_exit(sleeping, 0.2) and sleeping.poll() is None
        assert time.monotonic() - started >= 0.2
    finally:
        sleeping.kill()
        sleeping.wait()


@needs_bwrap
def test_many_runs_at_once_keep_their_results_apart(sandbox):
    jobs = [(f"def add(a, b):\n    return a + b + {i % 2}\n", ADD) for i in range(16)]
    results = sandbox.run_many(jobs)
    assert [r.outcome for r in results] == ["passed", "failed"] * 8


def test_without_bubblewrap_lanpo_refuses_unless_the_risk_is_named(monkeypatch):
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        Sandbox()
    unsafe = Sandbox(Limits(timeout=5), allow_unsandboxed=True)
    assert not unsafe.isolated
    assert unsafe.run(RIGHT, ADD).outcome == "passed"
    assert unsafe.run("def add(a, b):\n    return a * b\n", ADD).outcome == "failed"
    assert unsafe.run("while True:\n    pass\n", ADD).outcome in ("timeout", "crashed")
    # math needs no sandbox: a verifier on a machine without bubblewrap still scores math
    with Verifier(MathVerifier()) as verifier:
        assert verifier.score_texts(["4"], ["\\boxed{4}"], kinds=["math"]) == [1.0]
        with pytest.raises(SandboxUnavailable):
            verifier.score_texts([ADD.to_gold()], [fence(RIGHT)], kinds=["code"])


@needs_bwrap
def test_the_verifier_routes_each_gold_and_counts_outcomes():
    with Verifier(MathVerifier(), CodeSettings(workers=2)) as verifier:
        golds = ["4", ADD.to_gold(), ADD_CHECK.to_gold(), "7", ADD.to_gold()]
        texts = ["\\boxed{4}", fence(RIGHT), fence("def add(a, b):\n    return 0\n"), "\\boxed{8}", "no code"]
        kinds = ["math", "code", "code", "math", "code"]
        assert verifier.score_texts(golds, texts, [None] * 5, kinds=kinds) == [1.0, 1.0, 0.0, 0.0, 0.0]
        stats = verifier.stats
        assert stats["code/passed"] == 1 and stats["code/failed"] == 1 and stats["code/no_code"] == 1
        assert verifier.score_texts(['{"code_tests": "garbage"'], [fence(RIGHT)], kinds=["code"]) == [0.0]
        assert verifier.stats["code/bad_tests"] == 1


# A math answer's text can be anything, a test suite's JSON included: what a gold is comes from where it was loaded.
MATH_ANSWERS = st.one_of(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=30),
    st.just(ADD.to_gold()),
    st.text(max_size=20).map(lambda t: '{"code_tests": ' + json.dumps(t)),
)


@settings(max_examples=15, deadline=None)
@given(answer=MATH_ANSWERS)
def test_a_gold_is_what_its_loader_says_whatever_its_text(tmp_path_factory, answer):
    path = tmp_path_factory.mktemp("math") / "math.jsonl"
    path.write_text(json.dumps({"problem": "What is it?", "answer": answer}) + "\n")
    try:
        problems = load_problems(str(path))
    except DataError:  # an answer that is only white space: the row is skipped, and no row is left
        assume(False)
    assert [p.gold_kind for p in problems] == ["math"]
    dataset = with_answer_column(to_prompt_dataset(problems))
    assert dataset["gold_kind"] == ["math"]
    _, references = take_references(dataset)
    assert [r.gold_kind for r in references.values()] == ["math"]
    gold = problems[0].answer
    with Verifier(MathVerifier(), CodeSettings(workers=1)) as verifier:
        reward = make_accuracy_reward(verifier)
        reward([f"\\boxed{{{gold}}}"], answer=[gold], gold_kind=dataset["gold_kind"])
        assert not [k for k in verifier.stats if k.startswith("code/")]  # never run as a test suite
    assert ground_truth(gold, problems[0].gold_kind) == f"the ground truth is {gold.strip()}"


def test_a_data_set_that_does_not_say_gets_its_kinds_once_where_it_enters_and_one_that_says_keeps_them():
    problems = load_problems("builtin:code?levels=1&n=2") + load_problems("builtin:arith?n=1")
    assert [p.gold_kind for p in problems] == ["code", "code", "math"]
    dataset = to_prompt_dataset(problems)
    assert dataset["gold_kind"] == ["code", "code", "math"]
    assert with_answer_column(dataset.remove_columns("gold_kind"))["gold_kind"] == ["code", "code", "math"]
    said = dataset.remove_columns("gold_kind").add_column("gold_kind", ["math"] * 3)
    assert with_answer_column(said)["gold_kind"] == ["math"] * 3  # the data set's word, not the text's


@settings(max_examples=20, deadline=None)
@given(kind=st.one_of(st.text(max_size=10), st.none(), st.integers()).filter(lambda k: k not in ("math", "code")))
def test_a_gold_kind_column_that_names_no_kind_is_refused_at_the_door(kind):
    import datasets

    rows = [{"prompt": [], "answer": "2", "gold_kind": "math"}, {"prompt": [], "answer": "3", "gold_kind": kind}]
    try:
        dataset = datasets.Dataset.from_list(rows)
    except (TypeError, ValueError, OverflowError):  # a column arrow cannot hold: refused before lanpo sees it
        assume(False)
    with pytest.raises(DataError, match="gold_kind column holds"):
        with_answer_column(dataset)


# -- prompts and lessons ---------------------------------------------------------------------------------------


def test_code_prompts_ask_for_code_and_never_show_test_results():
    problem = builtin_code("2", n=1)[0]
    assert CODE_INSTRUCTION in solve_messages(problem.problem)[0]["content"]
    assert SOLVE_INSTRUCTION in solve_messages("What is 2 + 2?")[0]["content"]
    text = reflection_text(problem.problem, ["```python\ndef f(xs):\n    return xs\n```"])
    assert CODE_INSTRUCTION in text and "check every line of code" in text and "boxed" not in text
    tests = CodeTests.from_gold(problem.answer)
    for args, _ in tests.cases:
        assert f"{tests.entry_point}({', '.join(map(repr, args))})" not in text
    assert "assert" not in text and "passed" not in text.lower() and "failed" not in text.lower()
    assert CODE_INSTRUCTION in abstraction_text(problem.problem, [(["Check the empty list first."], [])])
    assert "Do not write any code" in summary_messages(problem.problem, "attempt", True)[0]["content"]
    truth = ground_truth(
        problem.answer, problem.gold_kind
    )  # gold critique (privileged): one test, never the solution or raw tests
    assert truth.startswith("a test it must pass is: assert ") and "{" not in truth
    assert ground_truth("42", "math") == "the ground truth is 42"


SOLUTION_LINES = [line.strip() for f in FAMILIES for line in f.body.format(c=3, ch="a").splitlines()]


@given(st.sampled_from(SOLUTION_LINES), st.sampled_from(["", "Use ", "Remember: ", "- "]))
def test_lessons_and_hints_that_hold_code_are_dropped(line, prefix):
    kept, dropped = clean_lessons([prefix + line], [], code=True)
    assert not kept and (dropped["holds_code"] or dropped["states_an_answer"])
    assert states_answer(prefix + line, ADD.to_gold(), "code")


@given(
    st.sampled_from(
        [
            "Check the empty list before taking the largest value.",
            "Count with a variable that starts at zero.",
            "Read the docstring twice and handle negative numbers.",
            "Loop over the words in order.",
        ]
    )
)
def test_lessons_in_words_are_kept_for_code(lesson):
    assert clean_lessons([lesson], [], code=True)[0] == [lesson]
    assert not states_answer(lesson, ADD.to_gold(), "code")


# -- training --------------------------------------------------------------------------------------------------


def code_trainer(model_dir, tmp_path, problems, **overrides):
    from lanpo.config import LanpoConfig
    from lanpo.data.loaders import to_prompt_dataset
    from lanpo.engine.models import load_tokenizer
    from lanpo.trainer import LanpoTrainer
    from test_trainer import common

    settings = {"relevance_scorer": "bm25", "relevance_threshold": 0.0, "summaries_per_group": 1, **overrides}
    return LanpoTrainer(
        model=str(model_dir),
        args=LanpoConfig(**common(tmp_path, "code", **settings)),
        train_dataset=to_prompt_dataset(problems),
        processing_class=load_tokenizer(str(model_dir)),
    )


@needs_bwrap
@pytest.mark.parametrize("mode", ["strip", "keep"])
def test_lanpo_trains_on_code_with_the_sandboxed_reward(tiny_model_dir, tmp_path, mode):
    from test_trainer import history, stub_summaries

    problems = builtin_code("1", n=4)
    trainer = code_trainer(
        tiny_model_dir, tmp_path, problems, max_steps=2, context_in_loss=mode, max_completion_length=64
    )
    args = trainer.args
    stub_summaries(trainer)
    tok = trainer.processing_class
    solutions = {p.problem: p.solution for p in problems}
    original = trainer._generate_ids

    def half_right(prompt_ids):  # a random model writes no code: every other row gets its reference solution
        completions, logprobs = original(prompt_ids)
        for k, ids in enumerate(prompt_ids):
            text = tok.decode(ids)
            solution = next((s for p, s in solutions.items() if p.split("def ")[1][:20] in text), None)
            if solution and k % 2 == 0 and "Distill" not in text:
                completions[k] = tok.encode(fence(solution), add_special_tokens=False) + [tok.eos_token_id]
        return completions, logprobs

    trainer._generate_ids = half_right
    trainer.train()
    trainer.verifier.close()
    losses = history(trainer, "loss")
    assert losses and all(math.isfinite(x) for x in losses)
    logged = {k for h in trainer.state.log_history for k in h}
    assert {"code/passed", "code/failed", "code/no_code", "code/timeout"} <= logged
    assert sum(history(trainer, "code/passed")) > 0
    samples = [json.loads(line) for line in (Path(args.output_dir) / "samples.jsonl").read_text().splitlines()]
    assert samples and all("assert" not in s.get("prompt", "") for s in samples)
    assert not os.environ.get("LANPO_SANDBOX_LEAK")


def test_the_reference_context_of_a_code_problem_shows_the_first_lines_below_the_signature():
    from lanpo.feedback.privileged import reference_prompt

    problem = builtin_code("3", n=40)
    task = next(p for p in problem if "first number in xs greater than" in p.problem)
    text = reference_prompt(task.problem, task.solution, 0.5)[0]["content"]
    shown = text[len(task.problem) :]
    assert "```python\n    for i, x in enumerate(xs):\n        if x > " in shown
    assert "return i" not in shown and "return -1" not in shown and "def " not in shown
    one_line = next(p for p in builtin_code("1", n=40) if "return x + " in p.solution)
    assert reference_prompt(one_line.problem, one_line.solution, 0.75) is None  # never the last (only) line


@needs_bwrap
@pytest.mark.parametrize("source", ["reference", "gold", "self-hint"])
def test_each_privileged_source_and_the_unsolved_trigger_train_on_code(tiny_model_dir, tmp_path, source):
    from test_trainer import history, stub_summaries

    trainer = code_trainer(
        tiny_model_dir,
        tmp_path,
        builtin_code("3", n=4),
        max_steps=2,
        max_completion_length=16,
        feedback_source=source,
        feedback_trigger="unsolved",
        hint_level=2,
        summaries_per_group=0,
    )
    stub_summaries(trainer)
    trainer.train()
    trainer.verifier.close()
    assert all(math.isfinite(x) for x in history(trainer, "loss"))
    logged = {k for h in trainer.state.log_history for k in h}
    assert "code/no_code" in logged and "lanpo/triggered_share" in logged
    # a random model solves nothing: from the second step (the trigger reads the attempts made a step ahead) every
    # group triggers
    assert history(trainer, "lanpo/triggered_share")[-1] == 1.0
    assert history(trainer, "lanpo/feedback_share")[-1] > 0


@needs_bwrap
def test_eval_on_code_runs_every_inference_mode_and_reports_pass_at_k(tiny_model_dir, tmp_path):
    from lanpo.cli import main
    from lanpo.pool.store import ExperiencePool, PoolEntry

    run = tmp_path / "code-run"  # a pool of lessons from training tasks, as a LANPO run on code leaves one
    with ExperiencePool(run) as pool:
        lessons = ["check the empty list before anything else", "walk the list once and keep a counter"]
        pool.add([PoolEntry(p.id, p.problem, "", lessons, ["an index off by one"]) for p in builtin_code("2,3", n=6)])
    settings = {"relevance_scorer": "bm25", "relevance_threshold": 0.0, "retrieval_top_k": 2}
    (run / "config.json").write_text(json.dumps(settings))
    out = tmp_path / "eval"
    modes = "zero-shot,retrieval,self-correct,reference,gold"
    argv = ["eval", "--model", str(tiny_model_dir), "--data", "builtin:code?split=test&n=3&levels=2,3", "--k", "2"]
    argv += ["--max-new-tokens", "8", "--modes", modes, "--pool", str(run), "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["prompt"]["instruction"] == CODE_INSTRUCTION
    assert results["modes"]["retrieval"]["metrics"]["context_rate"] > 0
    retrieved = [json.loads(line) for line in (out / "completions-retrieval.jsonl").read_text().splitlines()]
    assert any("check the empty list" in r["prompt"] and CODE_INSTRUCTION in r["prompt"] for r in retrieved)
    for mode in modes.split(","):
        metrics = results["modes"][mode]["metrics"]
        assert metrics["problems"] == 3 and "pass@2" in metrics and metrics["mean@2"] == 0.0  # a random model
    stats = results["modes"]["zero-shot"]["verifier"]["stats"]
    assert stats["code/executions"] + stats.get("code/no_code", 0) >= 6
    records = [json.loads(line) for line in (out / "completions-gold.jsonl").read_text().splitlines()]
    assert all("a test it must pass is: assert" in r["prompt"] for r in records)


@needs_bwrap
def test_where_the_unprivileged_uid_cannot_sandbox_it_falls_back_and_says_so(monkeypatch, caplog):
    real = Sandbox._trial
    calls = []

    def trial(self):  # as a kernel that forbids user namespaces to other uids would answer
        calls.append(self.drop_to_uid)
        return Execution("crashed") if self.drop_to_uid else real(self)

    monkeypatch.setattr(Sandbox, "_trial", trial)
    box = Sandbox()
    assert box.isolated and not box.drop_to_uid
    assert box.run(RIGHT, ADD).outcome == "passed"
    assert os.geteuid() != 0 or ("no process limit" in caplog.text and calls[0] is True)


def test_code_rows_with_the_same_id_keep_distinct_problem_ids(tmp_path):
    row = {"id": "t1", "prompt": "def f(x):\n", "tests": "assert f(1) == 2\nassert f(2) == 4"}
    path = tmp_path / "dupes.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [row, row, {**row, "id": None}]) + "\n")
    ids = [p.id for p in load_problems(str(path))]
    assert len(ids) == len(set(ids)) == 3


# -- round five: what the sandbox takes from the host, the probe, code data that cannot judge (issue 71) --------


def _host_shmem_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


@needs_bwrap
@pytest.mark.parametrize("bound", ["as found", "rlimits"])
@pytest.mark.alone
def test_writes_past_the_tmpfs_bound_fail_and_the_hosts_memory_stays_bounded(monkeypatch, bound):
    """/tmp and /dev/shm are RAM-backed: each is sized, the rest of /dev and bubblewrap's own root (a tmpfs too) are
    read-only, so 2 sandboxes that try to write 60 files of 1 MB in each place (/ and a new folder under it
    included) take at most their two bounds from the host (before the bounds, 360 MB; before the root was read-only,
    1.5-1.9 GB a run under the rlimits bound), whether a control group or the rlimits bound the run."""
    if bound == "rlimits":
        from lanpo.verify import cgroups

        monkeypatch.setattr(cgroups, "own_groups", lambda *args: [])
    box = Sandbox(Limits(timeout=8.0, cpu_seconds=6, tmp_mb=8), workers=2)
    assert bound != "rlimits" or box.bound.kind == "rlimits"
    code = (
        "import os, time\nwritten = {}\n"
        "for place in ('/tmp', '/dev/shm', '/dev', '/tmp/sub', '/', '/new'):\n    written[place] = 0\n"
        "    try:\n        os.makedirs(place, exist_ok=True)\n        for i in range(60):\n"
        "            with open(f'{place}/fill{i}', 'wb') as f:\n                f.write(b'x' * 1_000_000)\n"
        "            written[place] += 1\n"
        "    except OSError:\n        pass\n"
        "time.sleep(0.75)\n"
        "def add(a, b):\n    return max(written.values()) + 100 * (written['/'] + written['/new'])\n"
    )
    before = _host_shmem_mb()
    peak = [before]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _host_shmem_mb())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        written = box.run_many([(code, CodeTests("add", cases=[[[0, 0], -1]])), (code, ADD)])
    finally:
        stop.set()
        watcher.join()
        box.close()
    assert all(r.outcome == "failed" for r in written), written
    assert all(int(r.calls[0]["value"]) < 100 for r in written), written  # nothing was written under / at all
    # two sandboxes, each at most 8 MB in /tmp and 8 MB in /dev/shm (plus noise from the rest of the machine)
    assert peak[0] - before < 2 * 2 * 8 + 24, (before, peak[0])


@needs_bwrap
def test_the_sandbox_reports_how_much_it_could_write(sandbox):
    code = (
        "def add(a, b):\n    n = 0\n    try:\n        with open('/dev/shm/x', 'wb') as f:\n"
        "            for _ in range(200):\n                f.write(b'x' * 1_000_000)\n                f.flush()\n"
        "                n += 1\n    except OSError:\n        pass\n    return n\n"
    )
    bound = min(sandbox.limits.tmp_mb, sandbox.limits.file_mb)
    result = sandbox.run(code, CodeTests("add", check=f"assert 0 < add(0, 0) <= {bound}\n"))
    assert result.outcome == "passed"  # it wrote up to its bound in MB, and no more


@needs_bwrap
def test_no_nested_user_namespace_can_be_made_inside(sandbox):
    code = "import ctypes\nlibc = ctypes.CDLL(None)\nmade = libc.unshare(0x10000000)\n" + (
        "def add(a, b):\n    return a + b if made != 0 else -1\n"
    )
    assert run(sandbox, code).outcome == "passed"  # unshare(CLONE_NEWUSER) failed


@pytest.mark.parametrize("workers", [0, 65, 1000, 2.0, True, -1])
def test_workers_past_the_uid_range_are_refused_with_a_clear_error(workers):
    with pytest.raises(ValueError, match="code_workers must be a whole number from 1 to 64"):
        CodeSettings(workers=workers)
    with pytest.raises(ValueError, match="code_workers"):
        Sandbox(workers=workers)


@pytest.mark.parametrize("timeout", [0, -1, 1e9, 301, float("nan")])
def test_timeouts_no_run_can_use_are_refused(timeout):
    with pytest.raises(ValueError, match="code_timeout"):
        CodeSettings(timeout=timeout)


@needs_bwrap
def test_a_timeout_too_short_for_start_up_still_starts_the_sandbox_and_scores_zero():
    box = Sandbox(Limits(timeout=0.001))
    assert box.isolated
    assert box.run(RIGHT, ADD).outcome == "timeout"


@needs_bwrap
def test_allow_unsandboxed_keeps_a_working_sandbox():
    assert Sandbox(allow_unsandboxed=True).isolated


@needs_bwrap
def test_a_bubblewrap_that_fails_is_refused_with_its_reason_even_when_unsandboxed_is_allowed(monkeypatch):
    monkeypatch.setattr(Sandbox, "_trial", lambda self: Execution("crashed", output="bwrap: No permissions"))
    for allow in (False, True):
        with pytest.raises(SandboxUnavailable, match="installed but a trial run") as error:
            Sandbox(allow_unsandboxed=allow)
        assert "No permissions" in str(error.value) and "apt-get install" not in str(error.value)


@needs_bwrap
def test_threads_calling_run_never_hold_more_sandboxes_than_workers():
    box = Sandbox(Limits(timeout=5), workers=2)
    busy, peak, lock = [0], [0], threading.Lock()
    real = box._execute

    def counting(*args, **kwargs):
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                busy[0] -= 1

    box._execute = counting
    threads = [threading.Thread(target=box.run, args=(RIGHT, ADD)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] <= 2 and box.stats["passed"] == 8


BAD_CODE_ROWS = {
    "tests that do not compile": ({"prompt": "def f(x):\n", "tests": "assert f(1) == = 1"}, "do not compile"),
    "an entry point that is a keyword": (
        {"prompt": "def f(x):\n", "tests": "assert f(1) == 1", "entry_point": "lambda"},
        "entry_point must be a Python name",
    ),
    "an entry point the prompt does not define": (
        {"prompt": 'def f(x):\n    """x"""\n', "tests": "assert g(1) == 1", "entry_point": "g"},
        "does not define g",
    ),
    "a check that never calls the candidate": ({"prompt": "def f(x):\n", "tests": "assert True"}, "never call f"),
    "a test string past the bound": (
        {"prompt": "def f(x):\n", "tests": "assert f(1) == 1\n" + "#" * 1_100_000},
        "tests longer than",
    ),
    "a reference solution that fails its own tests": (
        {"prompt": 'def f(x):\n    """x"""\n', "tests": "assert f(1) == 1", "solution": "    return 2\n"},
        "reference solution fails",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_CODE_ROWS))
def test_code_rows_that_cannot_judge_anything_are_skipped_naming_the_row(tmp_path, caplog, kind):
    if kind.startswith("a reference") and shutil_which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: reference solutions are not run at load")
    good = {
        "prompt": 'def ok(x):\n    """x"""\n',
        "tests": "assert ok(1) == 2\nassert ok(2) == 3",
        "solution": "    return x + 1\n",
    }
    bad, says = BAD_CODE_ROWS[kind]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    problems = load_problems(str(path))
    assert [CodeTests.from_gold(p.answer).entry_point for p in problems] == ["ok"]
    assert says in caplog.text and "row(s) 2" in caplog.text


def shutil_which(name: str):
    import shutil

    return shutil.which(name)


@settings(max_examples=60, deadline=None)
@given(tests=st.text(max_size=60))
def test_every_code_row_kept_has_tests_that_compile_and_name_its_function(tmp_path_factory, tests):
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "def f(x):\n", "tests": tests}) + "\n")
    try:
        problems = load_problems(str(path))
    except DataError:
        return  # no usable row: refused, saying so
    check = CodeTests.from_gold(problems[0].answer).check
    compile(check, "<tests>", "exec")
    assert "f" in check or "candidate" in check


def test_the_configs_code_bounds_are_the_verifiers():
    from lanpo import config
    from lanpo.verify import code, sandbox

    assert config.MAX_CODE_WORKERS == sandbox.MAX_WORKERS and config.MAX_CODE_TIMEOUT == code.MAX_TIMEOUT


def test_evaluation_during_training_honours_the_runs_code_settings(tmp_path):
    from lanpo.config import LanpoConfig
    from lanpo.eval.during_training import eval_settings

    args = LanpoConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        code_timeout=7.5,
        code_workers=3,
        code_partial_credit=True,
        allow_unsandboxed_code=True,
    )
    assert eval_settings(args, 4).code == CodeSettings(7.5, 3, True, True)
    assert eval_settings(args, 4).seed == args.seed + 4


def test_lanpo_eval_builds_its_code_settings_where_training_does():
    """`lanpo eval`'s flags reach the sandbox through verify.code.code_settings, the one builder training and
    evaluation during training use; no other module builds CodeSettings from a run's options."""
    import argparse
    import ast

    from lanpo.commands import eval as eval_command
    from lanpo.verify.code import code_settings

    parser = argparse.ArgumentParser()
    eval_command.add_parser(parser.add_subparsers(), "eval", "")
    args = parser.parse_args(
        ["eval", "--model", "m", "--code-timeout", "7.5", "--code-workers", "3", "--allow-unsandboxed-code"]
    )
    assert code_settings(args) == CodeSettings(7.5, 3, False, True)
    package = Path(eval_command.__file__).parents[1]
    options = {"code_timeout", "code_workers", "code_partial_credit", "allow_unsandboxed_code"}
    for path in package.rglob("*.py"):
        if path.name == "code.py" and path.parent.name == "verify":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "CodeSettings"
            ):
                read = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
                assert not read & options, f"{path}: builds CodeSettings from options itself"
