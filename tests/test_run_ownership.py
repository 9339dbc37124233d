"""No work lost to a dead runner, no file lost to a rewrite (issue 71): one trainer a run folder, a grid cell that
ends with its runner, rewrites that go through symlinks, keep the user's umask, sweep what killed rewrites left and
name the user's path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.cli import main
from lanpo.run.files import STALE_SECONDS, RunFolderBusy, hold_run_lock, read_user_text, write_text_atomic

HOLD = (
    "import sys, time\nfrom lanpo.run.files import hold_run_lock\nlock = hold_run_lock(sys.argv[1])\n"
    "print('held', flush=True)\ntime.sleep(120)\n"
)


def holder(run: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_folder_a_live_process_trains_is_refused_and_freed_when_it_dies(tmp_path, capsys, monkeypatch, how):
    import lanpo.engine.models

    monkeypatch.setattr(lanpo.engine.models, "resolve_model_path", lambda *a: pytest.fail("a model was loaded"))
    run = tmp_path / "run"
    process = holder(run)
    try:
        with pytest.raises(RunFolderBusy, match=f"pid {process.pid}"):
            hold_run_lock(run)
        assert main(["train", "--output_dir", str(run), "--data", "builtin:arith?n=8"]) == 2
        assert "being trained by a live process" in capsys.readouterr().err
    finally:
        process.send_signal(how)
        process.wait()
    hold_run_lock(run).close()  # the kernel dropped the dead holder's lock


def _processes_with(text: str) -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and " Z" not in line and "ps -e" not in line]


@pytest.mark.slow
def test_a_grid_cell_ends_with_its_runner_and_a_later_runner_finishes_it_once(tiny_model_dir, tmp_path):
    """A runner stopped mid-cell (SIGTERM), then a second one killed mid-cell (SIGKILL): each time the cell ends
    with it, and a third runner finishes the cell, every step logged once. (Once a test a signal: one cell's life
    holds both.)"""
    import yaml

    out = tmp_path / "out"
    spec = {
        "name": "kill",
        "settings": {
            "model_name_or_path": str(tiny_model_dir),
            "data": "builtin:arith?n=8",
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "max_completion_length": 8,
            "max_steps": 6,  # two steps left when checkpoint-4 appears: the second kill lands mid-cell
            "logging_steps": 1,
            "save_steps": 1,
            "disable_tqdm": True,
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
            "feedback_ratio": 0.0,
        },
        "seeds": [0],
        "arms": {"grpo": {}},
        "out": str(out),
    }
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(spec))
    run = out / "grpo" / "seed-0"
    command = [sys.executable, "-m", "lanpo.cli", "experiment", str(grid)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for how, checkpoint in ((signal.SIGTERM, 2), (signal.SIGKILL, 4)):
        runner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 240
        while not (run / f"checkpoint-{checkpoint}").is_dir():  # mid-cell: training, with checkpoints behind it
            assert runner.poll() is None and time.monotonic() < deadline, f"the runner ended before {checkpoint}"
            time.sleep(0.2)
        runner.send_signal(how)
        runner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _processes_with(str(run)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_with(str(run)) == [], f"the cell trains on as an orphan after {how.name}"
    last = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert last.returncode == 0, last.stderr[-3000:]
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 6  # every step logged once, in order, to the end
    assert json.loads((run / "cell.json").read_text())["seed"] == 0


# -- rewrites -------------------------------------------------------------------------------------------------


def test_a_rewrite_through_a_symlink_writes_the_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "docs" / "results.md"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "results-link.md"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077, 0o027])
def test_a_new_file_gets_the_users_umask_and_an_old_one_keeps_its_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "new.md", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "new.md").stat().st_mode & 0o777 == 0o666 & ~umask
    kept = tmp_path / "kept.md"
    kept.write_text("x")
    kept.chmod(0o640)
    write_text_atomic(kept, "y")
    assert kept.stat().st_mode & 0o777 == 0o640


def test_temporary_files_of_killed_rewrites_are_swept(tmp_path):
    path = tmp_path / "verdict.md"
    stale = [tmp_path / f".verdict.md.dead{i}.tmp" for i in range(6)]
    fresh = tmp_path / ".verdict.md.alive.tmp"  # a rewrite in progress right now: left alone
    other = tmp_path / ".other.md.dead.tmp"
    for stray in [*stale, fresh, other]:
        stray.write_text("x" * 1000)
    old = time.time() - STALE_SECONDS - 60
    for stray in [*stale, other]:
        os.utime(stray, (old, old))
    write_text_atomic(path, "done")
    assert not any(s.exists() for s in stale) and fresh.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".other.md.dead.tmp", fresh.name, "verdict.md"])


def test_a_rewrite_that_cannot_write_names_the_path_given(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("a file where a folder should be")
    target = blocker / "verdict.md"
    with pytest.raises(OSError, match=str(target)) as error:
        write_text_atomic(target, "x")
    assert ".tmp" not in str(error.value)


@settings(max_examples=40, deadline=None)
@given(head=st.binary(max_size=40), bad=st.sampled_from([b"\xff", b"\xc3\x28", b"\xe2\x82", b"\x80"]))
def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path_factory, head, bad):
    path = tmp_path_factory.mktemp("t") / "results.md"
    head = head.decode("utf-8", "ignore").encode("utf-8")
    path.write_bytes(head + bad + b"\nmore\n")
    with pytest.raises(ValueError, match="results.md is not UTF-8: line"):
        read_user_text(path)


def test_verdict_md_that_is_not_utf8_is_refused_naming_it(tiny_model_dir, tmp_path, capsys):
    from test_experiment import tiny_grid

    grid = tiny_grid(tmp_path, tiny_model_dir)
    verdict = tmp_path / "verdict-doc.md"
    verdict.write_bytes(b"# Results\n\xff\xfe\n")
    assert main(["experiment", str(grid), "--verdict-md", str(verdict), "--table-only"]) == 2
    assert f"{verdict} is not UTF-8" in capsys.readouterr().err
