"""Nothing lost, round six (issue 93): a sandboxed run's memory bounded as a whole, no keyring shared across runs,
code tests a trivial function cannot pass."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.sandbox import HAS_BWRAP, needs_bwrap
from lanpo.data.code_tasks import FAMILIES, code_tasks, expected_constants
from lanpo.data.loaders import load_problems
from lanpo.verify import cgroups
from lanpo.verify.cgroups import MemoryBound, own_groups
from lanpo.verify.code import mem_available_mb
from lanpo.verify.sandbox import CodeTests, Limits, Sandbox

ADD = CodeTests("add", cases=[[[1, 2], 3], [[2, 2], 4]])
RIGHT = "def add(a, b):\n    return a + b\n"
BOUND_MB = 256
# What a run moves MemAvailable beyond its bound: the kernel's own records of its namespaces, mounts and page
# tables, bubblewrap's start, and the estimate's own noise (a run that sleeps 2 s and fills nothing moved it by
# ~60 MB here; runs held at 256 MB by their group, by 160-410 MB). Without a bound on the whole, each filler
# below takes 720-880 MB within the default process limit.
OVERHEAD_MB = 300

# Up to 8 forked children each fill a block of their own (every page touched), until the process limit stops them,
# and hold it a second (a hundred of the watcher's samples: filling takes a quarter of that).
FORK_EACH = """
import mmap, os, time
for _ in range(8):
    try:
        child = os.fork()
    except OSError:  # the process limit
        break
    if child == 0:
        try:
            block = {fill}
            for i in range(0, len(block), 4096):
                block[i] = 1
        except (OSError, MemoryError, ValueError):
            pass
        time.sleep(1.0)
        os._exit(0)
time.sleep(1.0)
"""
# Code a policy could write that takes memory through more than one process: each piece stays under the
# per-process limit, the run as a whole would take 1.2-1.6 GB without a bound on the whole.
FILLERS = {
    "fork and fill": FORK_EACH.format(fill="bytearray(220 * 1024 * 1024)"),
    "threads that fill": """
import threading, time
held = []
def fill():
    try:
        for _ in range(8):
            block = bytearray(25 * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            held.append(block)
    except MemoryError:
        pass
threads = [threading.Thread(target=fill) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
time.sleep(0.75)
""",
    "a chain of subprocesses": """
import subprocess, sys, time
CHILD = '''
import subprocess, sys, time
depth = int(sys.argv[1])
try:
    block = bytearray(180 * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
except MemoryError:
    pass
if depth < 7:
    try:
        subprocess.Popen([sys.executable, '-c', sys.argv[2], str(depth + 1), sys.argv[2]])
    except OSError:  # the process limit
        pass
time.sleep(1.5)
'''
subprocess.Popen([sys.executable, '-c', CHILD, '1', CHILD])
time.sleep(1.5)
""",
    "anonymous maps": FORK_EACH.format(
        fill="mmap.mmap(-1, 180 * 1024 * 1024, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)"
    ),
}
KILLED_BY_THE_GROUP = {"fork and fill", "a chain of subprocesses", "anonymous maps"}  # the threads meet RLIMIT_AS


def least_drop_mb(work, within_mb: float, tries: int = 3) -> tuple[float, object]:
    """The smallest of up to ``tries`` runs' drops of MemAvailable, stopping at the first within ``within_mb``.

    Anything else the machine does while ``work()`` runs (another job on a shared CI host, the page cache giving way)
    only adds to a drop, never takes from it, so the least of a few runs is the better reading of what the run itself
    took; a run its bound does not hold takes 720-880 MB every time, so repeats cannot hide it."""
    least = None
    for _ in range(tries):
        drop, result = largest_drop_mb(work)
        if least is None or drop < least[0]:
            least = (drop, result)
        if drop <= within_mb:
            break
    return least


def largest_drop_mb(work) -> tuple[float, object]:
    """How far MemAvailable fell below where it stood while ``work()`` ran (sampled every 10 ms), and its result."""
    start = mem_available_mb()
    lowest, stop = [start], threading.Event()

    def watch():
        while not stop.is_set():
            lowest[0] = min(lowest[0], mem_available_mb())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = work()
    finally:
        stop.set()
        watcher.join()
    return start - lowest[0], result


@pytest.fixture(scope="module")
def bounded():
    if not HAS_BWRAP:
        pytest.skip("bubblewrap is not installed")
    box = Sandbox(Limits(timeout=10.0, cpu_seconds=8, memory_mb=BOUND_MB), workers=2)
    yield box
    box.close()


def groups_of(pid: int, parent: Path | None) -> list[str]:
    if parent is None:
        return []
    return [p.name for p in parent.iterdir() if p.name.startswith(f"lanpo-{pid}-")]


@needs_bwrap
@pytest.mark.parametrize("kind", sorted(FILLERS))
@pytest.mark.alone  # reads the host's memory around the run
def test_a_runs_processes_together_take_no_more_than_its_bound(bounded, kind):
    code = FILLERS[kind] + RIGHT
    drop, result = least_drop_mb(lambda: bounded.run(code, ADD), BOUND_MB + OVERHEAD_MB)
    assert drop <= BOUND_MB + OVERHEAD_MB, (kind, round(drop), bounded.bound.describe(), result)
    if bounded.bound.kind != "rlimits":  # the group's own count: exact
        assert result.peak_mb is not None and result.peak_mb <= BOUND_MB, result
        if kind in KILLED_BY_THE_GROUP:
            assert result.outcome == "crashed" and f"memory limit ({BOUND_MB} MB" in result.reason, result
    assert groups_of(os.getpid(), bounded.bound.parent) == []
    assert bounded.run(RIGHT, ADD).outcome == "passed"  # and the next run is unharmed


@needs_bwrap
@pytest.mark.alone  # reads the host's memory around the run
def test_the_bound_holds_for_each_run_with_several_workers(bounded):
    code = FILLERS["fork and fill"] + RIGHT
    drop, results = least_drop_mb(lambda: bounded.run_many([(code, ADD), (code, ADD)]), 2 * BOUND_MB + OVERHEAD_MB)
    assert drop <= 2 * BOUND_MB + OVERHEAD_MB, (round(drop), results)
    if bounded.bound.kind != "rlimits":
        assert [r.outcome for r in results] == ["crashed", "crashed"]


@needs_bwrap
@pytest.mark.alone  # reads the host's memory around the run
def test_without_a_control_group_the_rlimits_split_the_bound_over_the_processes(monkeypatch):
    monkeypatch.setattr(cgroups, "own_groups", lambda *args: [])
    box = Sandbox(Limits(timeout=10.0, cpu_seconds=8, memory_mb=512, processes=8), workers=1)
    try:
        assert box.bound.kind == "rlimits" and box.bound.per_process_mb == 64
        assert box.run(RIGHT, ADD).outcome == "passed"  # the runner itself fits in its share
        if os.geteuid() == 0:  # the process limit holds, so the total does
            assert box.bound.total and "8 processes x 64 MB" in box.bound.describe()
            drop, result = least_drop_mb(lambda: box.run(FILLERS["fork and fill"] + RIGHT, ADD), 512 + OVERHEAD_MB)
            assert drop <= 512 + OVERHEAD_MB, (round(drop), result)
        else:
            assert not box.bound.total and "not in total" in box.bound.describe()
    finally:
        box.close()


KILLED_OWNER = """
import sys, time
from lanpo.verify.sandbox import CodeTests, Limits, Sandbox
box = Sandbox(Limits(timeout=60.0, cpu_seconds=50, memory_mb=192), workers=2)
print(box.bound.kind, box.bound.parent, flush=True)
code = "import time\\nblock = bytearray(60 * 1024 * 1024)\\ntime.sleep(50)\\ndef add(a, b):\\n    return a + b\\n"
box.run_many([(code, CodeTests("add", cases=[[[1, 2], 3]]))] * 2)
"""


@needs_bwrap
def test_a_trainer_killed_mid_run_leaves_no_group_and_no_process():
    owner = subprocess.Popen([sys.executable, "-c", KILLED_OWNER], stdout=subprocess.PIPE, text=True)
    kind, parent = owner.stdout.readline().split()
    parent = Path(parent) if kind != "rlimits" else None
    uids = set(range(200_000 + (owner.pid % 10_000) * 64, 200_000 + (owner.pid % 10_000) * 64 + 64))

    def running() -> list[str]:
        out = subprocess.run(["ps", "-e", "-o", "uid=,stat=,pid="], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if int(line.split()[0]) in uids and "Z" not in line.split()[1]]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(running()) < 2:
        time.sleep(0.1)
    assert running(), "the runs never started"
    if parent is not None:
        assert len(groups_of(owner.pid, parent)) == 2
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (running() or groups_of(owner.pid, parent)):
        time.sleep(0.1)
    assert running() == [] and groups_of(owner.pid, parent) == []


@needs_bwrap
def test_a_sandbox_says_which_bound_is_in_force(bounded):
    said = bounded.bound.describe()
    assert f"{BOUND_MB} MB" in said
    assert ("control group" in said) == (bounded.bound.kind != "rlimits")


# -- where groups can be made, read from another machine's files ----------------------------------------------

V1_MOUNTS = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V2_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_cgroup_v1_groups_are_made_below_this_process_own_group():
    found = own_groups("4:memory:/process_api/abc\n0::/\n", V1_MOUNTS)
    assert [(c.kind, str(c.parent)) for c in found] == [("cgroup1", "/sys/fs/cgroup/memory/process_api/abc")]


def test_a_container_mounting_its_own_group_as_root_is_read_relative_to_the_mount():
    mounts = "35 31 0:32 /docker/xyz /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    found = own_groups("4:memory:/docker/xyz/inner\n", mounts)
    assert [str(c.parent) for c in found] == ["/sys/fs/cgroup/memory/inner"]


def test_cgroup_v2_groups_are_siblings_in_a_delegated_subtree(tmp_path):
    root = tmp_path / "cg"
    own = root / "user.slice/user@1000.service/app.slice/run.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")
    mounts = V2_MOUNTS.replace("/sys/fs/cgroup", str(root))
    found = own_groups("0::/user.slice/user@1000.service/app.slice/run.scope\n", mounts)
    assert [(c.kind, c.parent) for c in found] == [("cgroup2", own.parent)]
    (own / "cgroup.controllers").write_text("cpu pids\n")  # no memory controller delegated: nowhere
    assert own_groups("0::/user.slice/user@1000.service/app.slice/run.scope\n", mounts) == []


def test_where_no_group_can_be_made_the_rlimits_bound_is_said_in_numbers():
    bound = MemoryBound.rlimits(512, 8, process_limit=True)
    assert (bound.per_process_mb, bound.total) == (64, True)
    assert "8 processes x 64 MB" in bound.describe()
    assert not MemoryBound.rlimits(512, 8, process_limit=False).total


# -- keyrings -------------------------------------------------------------------------------------------------

WRITE_KEY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NUMBERS = {"x86_64": (248, 250), "aarch64": (217, 219)}
import platform
add_key, keyctl = NUMBERS[platform.machine()]
made = [libc.syscall(add_key, b"user", b"MARK", b"secret", 6, ctypes.c_int(ring)) for ring in (-4, -3, -5)]
def add(a, b):
    return max(made)
"""
READ_KEY = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NUMBERS = {"x86_64": (248, 250), "aarch64": (217, 219)}
add_key, keyctl = NUMBERS[platform.machine()]
seen = ""
for name in ("/proc/keys", "/proc/key-users"):
    try:
        seen += open(name).read()
    except OSError:
        pass
found = [libc.syscall(keyctl, 10, ctypes.c_int(ring), b"user", b"MARK", 0) for ring in (-4, -3, -5)]
def add(a, b):
    return ("MARK" in seen, max(found) > 0)
"""


@needs_bwrap
def test_no_key_written_by_one_run_can_be_found_by_a_later_run():
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the probe knows the keyring calls' numbers of x86-64 and AArch64")
    mark = "lanpo-" + secrets.token_hex(6)
    box = Sandbox(Limits(timeout=5.0), workers=1)  # one worker: both runs under the same uid
    try:
        wrote = box.run(WRITE_KEY.replace("MARK", mark), CodeTests("add", cases=[[[0, 0], -1]]))
        assert wrote.outcome == "passed", wrote  # every add_key was refused (-1)
        found = box.run(READ_KEY.replace("MARK", mark), CodeTests("add", cases=[[[0, 0], [False, False]]]))
        assert found.outcome == "passed", found
    finally:
        box.close()


# -- tests a trivial function cannot pass ---------------------------------------------------------------------


def trivially_passed(cases: list) -> bool:
    """Checked here by hand, apart from the generator's own check: one value expected everywhere, or the first
    argument returned everywhere."""
    expected = [json.dumps(value) for _, value in cases]
    identity = [json.dumps(args[0]) if args else None for args, _ in cases]
    return len(set(expected)) == 1 or identity == expected


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 100_000), split=st.sampled_from(["train", "test"]))
def test_every_builtin_code_task_tells_its_solution_from_constants_and_the_identity(seed, split):
    tasks = code_tasks([1, 2, 3, 4, 5], 10_000, seed, split)
    assert tasks and not [t.tests.entry_point for t in tasks if trivially_passed(t.tests.cases)]


def test_the_four_tasks_a_constant_passed_are_kept_with_tests_that_judge():
    names = {"sum_greater", "wordy", "is_multiple", "letter_count"}
    tasks = code_tasks([1, 4, 5], 10_000, 0, "train") + code_tasks([1, 4, 5], 10_000, 0, "test")
    kept = {t.tests.entry_point for t in tasks} & names
    assert kept == names  # none dropped
    assert all(not trivially_passed(t.tests.cases) for t in tasks if t.tests.entry_point in names)
    assert {f.names[0] for f in FAMILIES if set(f.names) & names} == {
        "sum_greater",
        "long_words",
        "divisible",
        "count_letter",
    }


@pytest.mark.slow
@needs_bwrap
def test_no_constant_scores_on_builtin_code_in_the_sandbox():
    """The property above, over every task of many seeds, checks the tests in process; here a third of a load's
    problems, every level and both splits, go through the sandbox the reward runs."""
    from lanpo.verify.code import CodeSettings, CodeVerifier

    problems = load_problems("builtin:code?levels=1,2,3,4,5&n=40") + load_problems(
        "builtin:code?levels=1,2,3,4,5&n=20&split=test"
    )
    problems = problems[::3]  # 14 of the 40 train problems and 6 of the 20 test ones
    assert {p.id.split("-")[1] for p in problems} == {"L1", "L2", "L3", "L4", "L5"}
    constants = [None, True, 0, ""]
    texts, golds = [], []
    for problem in problems:
        entry = CodeTests.from_gold(problem.answer).entry_point
        for value in constants + ["IDENTITY"]:
            body = "return args[0]" if value == "IDENTITY" else f"return {value!r}"
            texts.append(f"```python\ndef {entry}(*args):\n    {body}\n```")
            golds.append(problem.answer)
    with closing(CodeVerifier(CodeSettings(workers=2))) as verifier:
        scores = verifier.score_texts(golds, texts)
    assert sum(scores) == 0.0


@pytest.mark.parametrize(
    "check, constant",
    [
        ("assert f(2) == 4\nassert f(3) == 4\n", 4),
        ("def check(candidate):\n    assert candidate('a') == 'b'\n", "b"),
        ("assert f(1) is None\n", None),
        ("assert [1, 2] == f(0)\n", [1, 2]),
    ],
)
def test_the_values_a_test_program_expects_are_tried_as_constants(check, constant):
    assert constant in expected_constants(check)


@needs_bwrap
def test_a_local_row_a_constant_passes_is_skipped_naming_it(tmp_path, caplog):
    rows = [
        {"prompt": 'def f(x):\n    """x"""\n', "tests": "assert f(2) == 4\nassert f(5) == 4\n"},
        {"prompt": 'def g(x):\n    """x"""\n', "tests": "assert g(2) == 2\nassert g(7) == 7\n"},
        {"prompt": 'def h(x):\n    """x"""\n', "tests": "assert h(2) == 4\nassert h(5) == 10\n"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    problems = load_problems(str(path))
    assert [CodeTests.from_gold(p.answer).entry_point for p in problems] == ["h"]
    assert "passed by the constant 4: row(s) 1" in caplog.text
    assert "passed by the identity of the first argument: row(s) 2" in caplog.text


@needs_bwrap
def test_starting_a_sandbox_says_which_bound_is_in_force(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="lanpo.verify.sandbox"):
        box = Sandbox(Limits(memory_mb=300), workers=1)
    box.close()
    assert "Code sandbox: each run's memory is bounded by" in caplog.text and "300 MB" in caplog.text


# -- concurrency within the machine ---------------------------------------------------------------------------


def test_workers_are_lowered_to_what_fits_beside_the_model_and_refused_when_none_does():
    from lanpo.verify.code import workers_that_fit

    # 24 GiB free, a 0.5 GB model x 5: half of the rest is 9.5 GB, room for 18 runs of 512 MB
    assert workers_that_fit(64, 512, 2600, 24_000) == by_hand_fit(512, 2600, 24_000)
    assert workers_that_fit(2, 512, 2600, 24_000) == 2  # a setting that fits is left alone
    with pytest.raises(ValueError, match="Not even one code sandbox fits beside the model: 1,000 MB free"):
        workers_that_fit(2, 512, 800, 1000)


def by_hand_fit(run_mb: int, reserved_mb: float, available_mb: float) -> int:
    """Computed by hand: half of what is left beside the model, in whole runs."""
    return int((available_mb - reserved_mb) / 2 // run_mb)


def test_code_workers_past_the_machine_are_lowered_with_a_warning_naming_the_numbers(monkeypatch, caplog):
    from lanpo.verify import code

    monkeypatch.setattr(code, "mem_available_mb", lambda: 8192.0)
    assert code.fit_code_workers(64, 512 * 1024 * 1024, 4) == 6  # (8192 - 2048) / 2 / 512
    assert "code_workers lowered from 64 to 6" in caplog.text and "8192 MB free" in caplog.text
