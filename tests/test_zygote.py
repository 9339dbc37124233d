"""The zygote the suite launches training processes from (tests/helpers/zygote.py) starts them as ``python`` would:
its own process, the test's command line, environment, folder and streams, Python's exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.zygote import Zygote

PROGRAM = """
import atexit, os, sys
atexit.register(lambda: print("atexit ran"))
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("ZYGOTE_TEST"))
print("pid", os.getpid(), "parent", os.getppid(), file=sys.stderr)
sys.stdout.write("unflushed at exit")
sys.exit(int(sys.argv[-1]))
"""


def test_a_launch_runs_its_script_module_or_code_with_its_own_argv_folder_environment_and_exit(zygote, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    (tmp_path / "zymodule.py").write_text(PROGRAM)
    env = {**os.environ, "ZYGOTE_TEST": "seen"}
    commands = ([str(script), "a", "3"], ["-m", "zymodule", "a", "3"], ["-c", PROGRAM, "a", "3"])
    for command in commands:
        done = zygote.run([sys.executable, *command], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 3, (command, done.stderr)
        first, *rest = done.stdout.splitlines()
        assert first == f"argv ['a', '3'] cwd {tmp_path.name} env seen", command
        assert rest == ["unflushed at exitatexit ran"], command  # Python's exit: buffers written, atexit run
        pid, parent = [int(word) for word in done.stderr.split() if word.isdigit()]
        assert parent == zygote.pid != pid != os.getpid()
    assert "ZYGOTE_TEST" not in zygote.run([sys.executable, "-c", PROGRAM, "0"], capture_output=True).stdout.decode()


def _as_from_a_terminal():
    """A zygote's child starts as a python started from a terminal does: Ctrl-C raises KeyboardInterrupt. A fresh
    python keeps SIGINT ignored where its parent had it ignored (the suite run as a shell's background job), so the
    fresh one compared with it starts with SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_launched_process_takes_signals_exceptions_timeouts_and_shared_streams_as_a_python_process_does(
    zygote, tmp_path
):
    sleeper = zygote.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sleeper.send_signal(signal.SIGKILL)
    assert sleeper.wait(timeout=30) == -signal.SIGKILL and sleeper.poll() == -signal.SIGKILL
    for code in (  # the exit code and the last line of stderr a fresh python gives
        "import os, signal; os.kill(os.getpid(), signal.SIGINT)",  # an unhandled Ctrl-C: Python ends by SIGINT
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
        "raise ValueError('no')",
        "import sys; sys.exit('a message')",
    ):
        fresh = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=_as_from_a_terminal
        )
        forked = zygote.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert forked.returncode == fresh.returncode != 0, code
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], code
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert time.monotonic() - started < 30
    with (tmp_path / "log").open("w") as log:  # one file for both streams, as a grid cell's log
        zygote.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"], stdout=log,
                   stderr=subprocess.STDOUT)  # fmt: skip
    assert sorted((tmp_path / "log").read_text().split()) == ["err", "out"]
    with pytest.raises(ValueError, match="Python programs only"):
        zygote.run(["echo", "hi"])


def test_launches_from_several_threads_at_once_start_one_zygote_and_all_run(tmp_path):
    """A grid's cells launch from a thread each: the first launches must wait for the one zygote to listen."""
    zygote = Zygote(tmp_path / "socket", preload=())
    try:
        with ThreadPoolExecutor(4) as threads:
            done = list(threads.map(lambda k: zygote.run([sys.executable, "-c", f"exit({k})"]), range(4)))
        assert [d.returncode for d in done] == [0, 1, 2, 3]
    finally:
        zygote.close()


def test_accelerate_launch_from_the_zygote_forks_its_workers_there_each_in_a_session_of_its_own(zygote, tmp_path):
    """torchrun's agent starts its workers with start_new_session and ends them by process group: here they are
    the zygote's children, each leading its own session, and see torchrun's environment."""
    from helpers.launch import accelerate_launch

    script = tmp_path / "worker.py"
    script.write_text(
        "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'parent', os.getppid(),"
        " 'leads', os.getsid(0) == os.getpid(), flush=True)\n"
    )
    done = subprocess.run(
        [*accelerate_launch(2, zygote=zygote), str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank"))
    assert lines == [f"rank {r} of 2 parent {zygote.pid} leads True" for r in (0, 1)], done.stdout
