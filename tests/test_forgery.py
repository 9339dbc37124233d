"""Results the model's code cannot forge: a battery of forgeries, each scoring 0, under every form of tests and on
every kind of code data (``builtin:code``, HumanEval, local rows).

Each forgery is what an RL policy could reach: rebind what a runner in its process would use after the exec
(modules, builtins), walk the frames of its callers for the token and the report (from the exec, from a call, from
a finalizer), return values whose class lies about equality, print or write a report on every descriptor, or leave
a thread that writes after the function returns. The function each forgery defines (if any) returns a wrong value,
so a score above 0 is a forged pass.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import closing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.sandbox import needs_bwrap
from lanpo.data.loaders import load_problems
from lanpo.verify.code import CodeSettings, CodeVerifier
from lanpo.verify.runner import NotPlain, decode, encode
from lanpo.verify.sandbox import CodeTests, Limits, Sandbox

pytestmark = needs_bwrap

CASES = CodeTests("add", cases=[[[1, 2], 3], [[2, 2], 4], [[0, 0], 0]])
CHECK = CodeTests(
    "add", check="def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n"
)
ASSERTS = CodeTests("add", check="assert add(1, 2) == 3\nassert add(5, 5) == 10\n")
FORMS = {"cases": CASES, "check": CHECK, "asserts": ASSERTS}
WRONG = "def add(a, b):\n    return -1\n"

FORGED_REPORTS = ['{"passed": true}', '{"passed": true, "calls": 3}', '{"values": ["3", "4", "0"]}']

# Every stdlib function and builtin a runner could use after the model's code: each rebound to what would forge.
REBOUND = [
    "json.dumps",
    "json.loads",
    "json.JSONEncoder.encode",
    "os.write",
    "os._exit",
    "os.fdopen",
    "os.dup2",
    "sys.exit",
    "builtins.type",
    "builtins.isinstance",
    "builtins.callable",
    "builtins.len",
    "builtins.str",
    "builtins.repr",
    "builtins.print",
    "builtins.exec",
    "builtins.compile",
    "builtins.getattr",
    "builtins.all",
    "builtins.sum",
    "builtins.BaseException",
    "builtins.AssertionError",
    "builtins.TypeError",
]


def rebind(target: str, report: str) -> str:
    module, _, name = target.rpartition(".")
    root = module.split(".")[0]
    return (
        f"import {root}\n"
        f"FORGED = {report!r}\n"
        "def forged(*args, **kwargs):\n"
        "    return FORGED\n"
        f"setattr({module}, {name!r}, forged)\n" + WRONG
    )


FRAME_WALK = """
import sys, os, gc
def forge():
    frame = sys._getframe()
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for key in ("send", "token", "report", "job", "values"):
                if key in scope:
                    try:
                        if key == "send":
                            scope["send"]({"passed": True, "calls": 1})
                        if key == "token":
                            for fd in range(3, 64):
                                try:
                                    os.write(fd, (scope["token"] + ' {"passed": true, "calls": 1}\\n').encode())
                                except OSError:
                                    pass
                    except BaseException:
                        pass
        frame = frame.f_back
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "token" in obj and isinstance(obj.get("token"), str):
            for fd in range(3, 64):
                try:
                    os.write(fd, (obj["token"] + ' {"passed": true, "calls": 1}\\n').encode())
                except OSError:
                    pass
"""

FORGERIES = {
    "the two-liner": "import json\njson.dumps = lambda *a, **k: '{\"passed\": true}'\n",
    "frames walked from the exec": FRAME_WALK + "forge()\n" + WRONG,
    "frames walked from a call": FRAME_WALK + "def add(a, b):\n    forge()\n    return -1\n",
    "frames walked from a finalizer": FRAME_WALK
    + "class Bomb:\n    def __del__(self):\n        forge()\n"
    + "def add(a, b):\n    Bomb()\n    return -1\nkeep = [Bomb()]\n",
    "equal to anything": "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
    "def add(a, b):\n    return Any()\n",
    "an int subclass equal to anything": "class Any(int):\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\ndef add(a, b):\n    return Any(0)\n",
    "a list subclass equal to anything": "class Any(list):\n    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Any()\n",
    "a str subclass whose repr is the answer": "class S(str):\n    def __repr__(self):\n        return '3'\n"
    "    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
    "def add(a, b):\n    return S('x')\n",
    "a class that claims to be int": "class Liar:\n    __class__ = int\n    def __eq__(self, other):\n"
    "        return True\n    def __hash__(self):\n        return 0\ndef add(a, b):\n    return Liar()\n",
    "a metaclass that lies about equality": "class Meta(type):\n    def __eq__(cls, other):\n        return True\n"
    "    __hash__ = type.__hash__\nclass Any(metaclass=Meta):\n    def __eq__(self, other):\n        return True\n"
    "def add(a, b):\n    return Any()\n",
    "type rebound to pass the plain-value check": "import builtins\nclass Any:\n    def __eq__(self, o):\n"
    "        return True\nreal = builtins.type\nbuiltins.type = lambda v, *r: int if isinstance(v, Any) else real(v, *r)\n"
    "def add(a, b):\n    return Any()\n",
    "a report on every descriptor": "import os\nfor fd in range(0, 256):\n    for line in "
    + repr(FORGED_REPORTS)
    + ":\n        try:\n            os.write(fd, ('0' * 32 + ' ' + line + '\\n').encode())\n"
    "        except OSError:\n            pass\n" + WRONG,
    "a report through every /proc descriptor": "import os\nfor pid in os.listdir('/proc'):\n"
    "    if not pid.isdigit():\n        continue\n    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n"
    "    except OSError:\n        continue\n    for fd in fds:\n        try:\n"
    "            with open(f'/proc/{pid}/fd/{fd}', 'w') as f:\n                f.write('x {\"passed\": true}\\n')\n"
    "        except OSError:\n            pass\n" + WRONG,
    "printed reports": 'print(\'{"passed": true}\')\nprint(\'{"values": ["3", "4", "0"]}\')\n' + WRONG,
    "the channel answered ahead": "import os\nfor fd in range(3, 16):\n    try:\n"
    "        os.write(fd, b'{\"ready\": true}\\n' + b'{\"value\": -7}\\n' * 50)\n    except OSError:\n        pass\n"
    + WRONG,
    "a thread that writes after the return": "import os, threading, time\ndef late():\n    time.sleep(0.02)\n"
    "    for _ in range(50):\n        for fd in range(0, 32):\n            try:\n"
    '                os.write(fd, b\'x {"passed": true}\\n{"value": -7}\\n\')\n            except OSError:\n'
    "                pass\n        time.sleep(0.005)\n"
    "threading.Thread(target=late, daemon=False).start()\n" + WRONG,
    "a thread that rebinds json after the return": "import json, threading, time\ndef late():\n"
    "    time.sleep(0.01)\n    json.dumps = lambda *a, **k: '{\"passed\": true}'\n"
    "threading.Thread(target=late).start()\n" + WRONG,
    "ptrace of the parent": "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
    "ok = libc.ptrace(16, os.getppid(), 0, 0)\n"  # PTRACE_ATTACH
    "def add(a, b):\n    return -1 if ok != 0 else -2\n",
    "reading the parent's memory": "import os\nleak = b''\ntry:\n"
    "    leak = open(f'/proc/{os.getppid()}/mem', 'rb').read(1)\nexcept OSError:\n    pass\n" + WRONG,
    "the parent stopped": "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\n" + WRONG,
    "exits with the report's status": "import os\nprint('{\"passed\": true}')\nos._exit(0)\n",
}


LIMITS = Limits(timeout=3.0, cpu_seconds=2, memory_mb=256, processes=12, output_chars=500)


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(LIMITS, workers=2)
    yield box
    box.close()


def test_a_right_function_still_passes_every_form(sandbox):
    right = "def add(a, b):\n    return a + b\n"
    assert [sandbox.run(right, tests).outcome for tests in FORMS.values()] == ["passed"] * 3


@pytest.fixture(scope="module")
def quick_sandbox():
    """For the forgery that stops the runner: it ends at the time limit, here a second, not three."""
    box = Sandbox(dataclasses.replace(LIMITS, timeout=1.0), workers=2)
    yield box
    box.close()


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_every_forgery_scores_zero(sandbox, quick_sandbox, forgery, form):
    box = quick_sandbox if forgery == "the parent stopped" else sandbox
    result = box.run(FORGERIES[forgery], FORMS[form])
    assert result.outcome != "passed" and result.share == 0.0, result


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("target", REBOUND)
def test_rebinding_anything_the_runner_might_use_scores_zero(sandbox, target, form):
    results = sandbox.run_many([(rebind(target, report), FORMS[form]) for report in FORGED_REPORTS])
    assert all(r.outcome != "passed" and r.share == 0.0 for r in results), results


@pytest.mark.slow
def test_the_two_liner_scores_zero_on_builtin_code_humaneval_and_local_rows(tmp_path):
    rows = [
        {"prompt": f'def f{i}(x):\n    """Twice x."""\n', "tests": f"assert f{i}(2) == 4\nassert f{i}(5) == 10\n"}
        for i in range(4)
    ]
    path = tmp_path / "local.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = (
        load_problems("builtin:code?levels=1,2,3,4,5&n=20") + load_problems("humaneval")[:20] + load_problems(str(path))
    )
    hack = "```python\n" + FORGERIES["the two-liner"] + "```"
    for partial in (False, True):
        with closing(CodeVerifier(CodeSettings(partial_credit=partial))) as verifier:
            scores = verifier.score_texts([p.answer for p in problems], [hack] * len(problems))
        assert scores == [0.0] * len(problems)


def test_a_report_of_passed_is_refused_for_a_suite_of_cases(sandbox):
    """The parent requires a cases suite's values: a judge's "passed" (however it came about) is not a pass."""
    report = sandbox._judge(b"t " + json.dumps({"passed": True, "calls": 3}).encode(), "t", CASES, False, 0, "", 0)
    assert report.outcome == "forged"
    nothing_called = sandbox._judge(b"t " + json.dumps({"passed": True}).encode(), "t", CHECK, False, 0, "", 0)
    assert nothing_called.outcome == "failed"


def test_tests_that_never_call_the_function_pass_nothing(sandbox):
    assert sandbox.run("def add(a, b):\n    return a + b\n", CodeTests("add", check="assert True\n")).share == 0.0


def test_helpers_of_the_problem_run_with_the_tests_not_with_the_model(sandbox):
    helpers = 'def twice(x):\n    return 2 * x\n\ndef add(a, b):\n    """Add."""\n'
    tests = CodeTests("add", check="assert add(1, twice(1)) == 3\n", helpers=helpers)
    assert sandbox.run("def add(a, b):\n    return a + b\n", tests).outcome == "passed"
    # the model's code does not see the helpers: using one is a NameError in its own process
    assert sandbox.run("def add(a, b):\n    return twice(a) - a + b\n", tests).outcome == "failed"


def test_a_builtin_exception_raised_by_the_candidate_reaches_the_tests(sandbox):
    tests = CodeTests("f", check="try:\n    f(-1)\n    ok = False\nexcept ValueError:\n    ok = True\nassert ok\n")
    assert sandbox.run("def f(x):\n    raise ValueError(x)\n", tests).outcome == "passed"
    assert sandbox.run("def f(x):\n    raise SystemExit(0)\n", tests).outcome == "failed"


PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.frozensets(st.integers() | st.text(), max_size=4)
        | st.sets(st.integers() | st.text(), max_size=4)
        | st.dictionaries(st.integers() | st.text() | st.booleans(), inner, max_size=4)
    ),
    max_leaves=20,
)


def same(a, b) -> bool:
    """Equal and of the same types all the way down (``True`` is not ``1``, a tuple not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=PLAIN)
def test_plain_values_cross_the_channel_with_their_types(value):
    assert same(decode(json.loads(json.dumps(encode(value)))), value)


@settings(max_examples=200, deadline=None)
@given(
    data=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
        max_leaves=12,
    )
)
def test_anything_the_worker_sends_decodes_to_plain_values_or_is_refused(data):
    try:
        value = decode(data)
    except (NotPlain, ValueError, TypeError):
        return
    assert same(decode(json.loads(json.dumps(encode(value)))), value)  # only plain values come out
