"""Real runs (issue 11): the settings given are the settings that run, resume restores them, checkpoints are
complete or absent, a kill loses and repeats nothing, and every process agrees."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from helpers.launch import accelerate_launch
from lanpo.cli import main

SCRIPT = Path(__file__).parent / "helpers" / "train_script.py"


def tiny_args(model_dir: Path, run: Path, **overrides) -> list[str]:
    settings = {
        "model_name_or_path": model_dir,
        "data": "builtin:arith?n=8",
        "output_dir": run,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "max_steps": 2,
        "logging_steps": 1,
        "save_steps": 1,
        "relevance_scorer": "bm25",
        "relevance_threshold": 0.0,
        "disable_tqdm": "true",
        "seed": 0,
        **overrides,
    }
    return [x for k, v in settings.items() for x in (f"--{k}", str(v))]


def steps_logged(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_minimal_yaml_gets_the_library_defaults_not_the_demo_ones(tmp_path, capsys):
    from trl import GRPOConfig

    from lanpo.commands.train import EMBEDDED_DEFAULTS
    from lanpo.config import LanpoConfig

    config = tmp_path / "x.yaml"
    config.write_text("model_name_or_path: Qwen/Qwen2.5-7B-Instruct\ndata: gsm8k\nnum_train_epochs: 1\n")
    assert main(["train", "--config", str(config), "--print-config"]) == 0  # offline: loading it would fail
    resolved = yaml.safe_load(capsys.readouterr().out)
    lanpo_fields = set(LanpoConfig.__dataclass_fields__) - set(GRPOConfig.__dataclass_fields__)
    for name in lanpo_fields:
        assert resolved[name] == LanpoConfig.__dataclass_fields__[name].default, name
    assert resolved["relevance_scorer"] == "llm" and resolved["relevance_threshold"] == 0.9
    assert resolved["answer_extraction"] == "strict" and resolved["max_steps"] == -1
    for name in ("max_completion_length", "num_generations", "temperature", "beta", "learning_rate", "save_steps"):
        assert resolved[name] == GRPOConfig.__dataclass_fields__[name].default, name
    assert resolved["max_completion_length"] != EMBEDDED_DEFAULTS["max_completion_length"]
    assert not (tmp_path / "runs").exists() and "generation_batch_size" not in resolved


def test_resume_restores_the_run_settings_and_refuses_changes_that_make_another_run(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(tiny_model_dir, run)]) == 0
    assert main(["train", "--output_dir", str(run), "--resume", "latest", "--num_generations", "2"]) == 2
    assert "num_generations: 4 -> 2" in capsys.readouterr().err
    assert main(["train", "--output_dir", str(run), "--resume", "latest", "--max_steps", "3"]) == 0
    resumed = yaml.safe_load((run / "config.resumed.yaml").read_text())
    assert (resumed["num_generations"], resumed["max_completion_length"], resumed["max_steps"]) == (4, 8, 3)
    assert resumed["relevance_scorer"] == "bm25" and resumed["model_name_or_path"] == str(tiny_model_dir)
    steps = steps_logged(run)
    assert max(steps) == 3 and len([s for s in steps if s == 3]) <= 2  # a step line and the end-of-train line


def test_a_saved_config_runs_again_in_a_new_directory(tiny_model_dir, tmp_path):
    run, new = tmp_path / "run", tmp_path / "new"
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1)]) == 0
    assert main(["train", "--config", str(run / "config.yaml"), "--output_dir", str(new)]) == 0
    assert (new / "final" / "config.json").is_file() and (new / "final" / "README.md").is_file()
    card = (new / "final" / "README.md").read_text()
    assert "LANPO" in card and "feedback_ratio" in card and "2510.16552" in card


def test_an_existing_run_is_continued_or_replaced_never_mixed(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1)]) == 0
    before = (run / "metrics.jsonl").read_text()
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1)]) == 2
    assert "--resume latest" in capsys.readouterr().err and (run / "metrics.jsonl").read_text() == before
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1), "--overwrite", "true"]) == 0
    assert steps_logged(run) == steps_logged(run)[:1] * len(steps_logged(run))  # only the new run's step 1


def test_a_run_that_cannot_start_leaves_nothing_behind(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--model_name_or_path", str(tmp_path / "no-model"), "--output_dir", str(run)]) == 2
    assert not run.exists()


def test_push_to_hub_offline_fails_clearly_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code = main(
        [
            "train",
            "--model_name_or_path",
            "Qwen/Qwen2.5-7B-Instruct",
            "--output_dir",
            str(tmp_path / "r"),
            "--push_to_hub",
            "true",
            "--hub_model_id",
            "me/x",
        ]
    )
    assert code == 2 and "offline" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_the_trainer_finds_the_answer_in_a_solution_column(tiny_model_dir, tmp_path):
    import datasets

    from lanpo.data.loaders import DataError, with_answer_column
    from lanpo.prompts import solve_messages

    rows = [{"prompt": solve_messages("1+1?"), "Solution": "so \\boxed{2}"}]
    assert with_answer_column(datasets.Dataset.from_list(rows))["answer"] == ["2"]
    assert with_answer_column(datasets.Dataset.from_list([{"prompt": [], "gt": "5"}]), "gt")["answer"] == ["5"]
    with pytest.raises(DataError, match="no answer column"):
        with_answer_column(datasets.Dataset.from_list([{"prompt": [], "label": "5"}]))


@pytest.fixture(scope="session")
def script(zygote):
    """``train_script.py ARGS`` in a process of its own under ``ENV``: one process forked from the zygote
    (tests/helpers/zygote.py: torch, transformers and TRL already imported), or ``processes`` under ``accelerate
    launch`` with their workers forked from it (the FSDP test launches fresh ones)."""

    def run(args: list[str], env: dict, processes: int = 1) -> subprocess.CompletedProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
        if processes == 1:
            return zygote.run(
                [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=env
            )
        launch = [*accelerate_launch(processes, zygote=zygote), str(SCRIPT), *args]  # workers forked too
        return subprocess.run(launch, capture_output=True, text=True, timeout=600, env=env)

    return run


def _report(folder: Path, processes: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(processes)]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory, script):
    """The uninterrupted run the kill, Ctrl-C and resume tests compare with, made once for the module per
    ``max_steps``: (its run folder, its report)."""
    made: dict[int, tuple[Path, dict]] = {}

    def run(max_steps: int) -> tuple[Path, dict]:
        if max_steps not in made:
            folder = tmp_path_factory.mktemp(f"uninterrupted-{max_steps}")
            args = tiny_args(tiny_model_dir, folder / "run", max_steps=max_steps)
            done = script(args, {"LANPO_REPORT": str(folder / "report")})
            assert done.returncode == 0, done.stderr[-3000:]
            made[max_steps] = (folder / "run", _report(folder / "report", 1)[0])
        return made[max_steps]

    return run


@pytest.mark.slow
def test_kills_mid_checkpoint_and_mid_step_then_resumes_lose_and_repeat_nothing(
    tiny_model_dir, tmp_path, uninterrupted, script
):
    """A run killed while checkpoint-2 is written, resumed and killed again in the middle of step 3 (its rollouts
    done, not yet in a checkpoint), then resumed to the end, holds the uninterrupted run's pool, samples, retrievals
    and step log. (The single kill mid-step, the single kill mid-save and the two killed resumes, in one run.)"""
    run = tmp_path / "run"
    reference, ref = uninterrupted(4)
    killed = script(tiny_args(tiny_model_dir, run, max_steps=4), {"LANPO_KILL_AT": "save:2"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (run / ".staging").exists() and not (run / "checkpoint-2").exists()  # half-written, not in place
    resume = ["--output_dir", str(run), "--resume", "latest"]
    killed = script(resume, {"LANPO_KILL_AT": "step:3"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (run / "checkpoint-2").is_dir() and not (run / "checkpoint-3").exists()
    resumed = script(resume, {"LANPO_REPORT": str(tmp_path / "res")})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [res] = _report(tmp_path / "res", 1)
    assert res["digest"] == ref["digest"] and len(res["rollout_ids"]) == len(set(res["rollout_ids"])) > 0
    assert steps_logged(run) == steps_logged(reference) and not (run / ".staging").exists()
    for log in ("samples.jsonl", "retrievals.jsonl"):
        assert _samples_steps(run, log) == _samples_steps(reference, log), log


@pytest.mark.slow
def test_two_processes_killed_and_resumed_hold_the_same_pool_and_lose_no_pending_trial(
    tiny_model_dir, tmp_path, script
):
    run, reference = tmp_path / "run", tmp_path / "reference"

    def args(out):
        return tiny_args(tiny_model_dir, out, max_steps=4, per_device_train_batch_size=4, advantage_grouping="separate")

    done = script(args(reference), {"LANPO_REPORT": str(tmp_path / "ref"), "LANPO_LENGTH_REWARD": "1"}, processes=2)
    assert done.returncode == 0, done.stderr[-4000:]
    # separate advantages by value: the whole batch's (both processes') rewards, each process its own slice
    import torch

    from lanpo.objective import separate_advantages

    ref = _report(tmp_path / "ref", 2)
    assert ref[0]["rewards_per_func"] == ref[1]["rewards_per_func"]  # gathered: the same on both
    flags = ref[0]["flags"] + ref[1]["flags"]
    expected = separate_advantages(torch.tensor(ref[0]["rewards_per_func"]), torch.ones(1), flags, 4, "group")
    assert torch.allclose(torch.tensor(ref[0]["advantages"] + ref[1]["advantages"]), expected, atol=1e-6)
    assert expected.abs().sum() > 0
    killed = script(args(run), {"LANPO_KILL_AT": "step:3", "LANPO_LENGTH_REWARD": "1"}, processes=2)
    assert killed.returncode != 0 and (run / "checkpoint-2" / "lanpo_state_rank1.json").is_file()
    resumed = script(
        ["--output_dir", str(run), "--resume", "latest"],
        {"LANPO_REPORT": str(tmp_path / "res"), "LANPO_LENGTH_REWARD": "1"},
        processes=2,
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    res = _report(tmp_path / "res", 2)
    assert res[0]["world_size"] == 2 and res[0]["digest"] == res[1]["digest"] == ref[0]["digest"]
    ids = res[0]["rollout_ids"]
    assert len(ids) == len(set(ids))  # no summary inserted twice
    ranks_per_step = {(i.split(":")[0], i.split(":")[1]) for i in ids}
    assert {s for s, _ in ranks_per_step} == {"0", "1", "2", "3"} and {r for _, r in ranks_per_step} == {"0", "1"}
    assert steps_logged(run) == steps_logged(reference)


@pytest.mark.parametrize("fails", [False, True])
def test_a_finished_train_destroys_its_process_group_and_a_failed_one_leaves_it(tmp_path, monkeypatch, fails):
    """A process that exits with its gloo group alive can abort in shutdown and fail a finished multi-process run;
    after an error no barrier may wait for processes that will never come."""
    import torch.distributed as dist

    import lanpo.commands.train

    def run(argv):
        if fails:
            raise ValueError("bad row")
        return tmp_path

    monkeypatch.setattr(lanpo.commands.train, "run", run)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert main(["train", "--output_dir", str(tmp_path)]) == (2 if fails else 0)
        assert dist.is_initialized() == fails
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("config", sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_trains_one_step_on_a_tiny_model(config, tiny_model_dir, tmp_path):
    overrides = tiny_args(tiny_model_dir, tmp_path / "run", max_steps=1) + [
        "--use_vllm",
        "false",
        "--use_peft",
        "false",
        "--bf16",
        "false",
        "--gradient_checkpointing",
        "false",
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        "--data_dir",
        "",
        "--data_limit",
        "8",
        "--vllm_mode",
        "colocate",
        "--dtype",
        "float32",
    ]
    assert main(["train", "--config", str(config), *overrides]) == 0
    assert (tmp_path / "run" / "final" / "config.json").is_file()


FSDP = [
    "--use_fsdp",
    "--fsdp_sharding_strategy",
    "FULL_SHARD",
    "--fsdp_auto_wrap_policy",
    "TRANSFORMER_BASED_WRAP",
    "--fsdp_transformer_layer_cls_to_wrap",
    "LlamaDecoderLayer",
    "--fsdp_state_dict_type",
    "SHARDED_STATE_DICT",
    "--fsdp_sync_module_states",
    "false",
    "--fsdp_cpu_ram_efficient_loading",
    "false",
]


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_trains_agrees_and_saves_the_whole_model(tiny_model_dir, tmp_path, zygote):
    """torch's FSDP runs on gloo here; accelerate's FSDP plugin needs sync_module_states off on CPU. (The two workers
    are forked from the suite's zygote, as torchrun would start them.)"""
    import torch
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    launch = [
        *accelerate_launch(2, *FSDP, zygote=zygote),
        str(SCRIPT),
        *tiny_args(tiny_model_dir, run, per_device_train_batch_size=4, learning_rate=1e-2),
    ]
    done = subprocess.run(
        launch,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "LANPO_REPORT": str(tmp_path / "rep"), "LANPO_LENGTH_REWARD": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = _report(tmp_path / "rep", 2)
    assert ranks[0]["world_size"] == 2 and ranks[0]["digest"] == ranks[1]["digest"] and ranks[0]["rollout_ids"]
    assert (run / "checkpoint-2" / "lanpo_state_rank1.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    final = AutoModelForCausalLM.from_pretrained(run / "final").state_dict()
    assert base.keys() == final.keys() and all(base[k].shape == final[k].shape for k in base)
    assert sum(float((base[k] - final[k]).abs().sum()) for k in base) > 0  # trained, and saved whole
    assert all(torch.isfinite(v).all() for v in final.values())


Usage = namedtuple("Usage", "total used free")


def test_a_checkpoint_save_on_a_full_disk_names_it_removes_the_half_save_and_resumes(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import torch

    run, save = tmp_path / "run", torch.save

    def full_at_step_2(obj, f, *args, **kwargs):  # what torch says when the disk fills mid-save
        if "checkpoint-2" in str(f):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1110")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_at_step_2)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**6, 10**6))
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=3)]) == 2
    err = capsys.readouterr().err
    assert "Saving checkpoint-2" in err and "The disk is full: 0.0 GB free" in err and "unexpected pos" in err
    assert f"Resume from checkpoint-1 with: lanpo train --resume latest --output_dir {run}" in err
    assert (run / "checkpoint-1").is_dir() and not (run / "checkpoint-2").exists() and not (run / ".staging").exists()
    monkeypatch.undo()
    assert main(["train", "--output_dir", str(run), "--resume", "latest"]) == 0
    assert max(steps_logged(run)) == 3 and (run / "final").is_dir()


ERRORS = st.one_of(
    st.builds(
        lambda n, text: OSError(n, text),
        st.sampled_from([errno.ENOSPC, errno.EIO, errno.EACCES, errno.EROFS]),
        st.text(max_size=30),
    ),
    st.builds(
        RuntimeError,
        st.sampled_from(
            [
                "[enforce fail at inline_container.cc:672] . unexpected pos 12 vs 10",
                "PytorchStreamWriter failed writing file data/3: file write failed",
                "CUDA error: device-side assert",
            ]
        ),
    ),
    st.builds(sqlite3.OperationalError, st.sampled_from(["database or disk is full", "disk I/O error"])),
)


@given(error=ERRORS, free=st.integers(0, 10**13), last_bytes=st.one_of(st.none(), st.integers(1, 5000)))
def test_every_failed_save_is_named_with_its_resume_point_and_a_full_disk_only_when_it_is_one(error, free, last_bytes):
    from lanpo.run import checkpoints

    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder)
        if last_bytes is not None:
            (run / "checkpoint-4").mkdir()
            (run / "checkpoint-4" / "optimizer.pt").write_bytes(b"x" * last_bytes)
        (run / ".staging" / "checkpoint-8").mkdir(parents=True)
        (run / "config.yaml").write_text("output_dir: run\n")  # as `lanpo train` writes it before any save
        real = shutil.disk_usage
        shutil.disk_usage = lambda path: Usage(10**13, 10**13 - free, free)
        try:
            with pytest.raises(checkpoints.CheckpointSaveError) as raised:
                with checkpoints.save_failures_named(run, "checkpoint-8"):
                    raise error
        finally:
            shutil.disk_usage = real
        message = str(raised.value)
        needed = max(last_bytes, 2**26) if last_bytes is not None else 2**30  # a checkpoint's size, 64 MiB at least
        said_full = getattr(error, "errno", None) == errno.ENOSPC or "disk is full" in str(error) or free < needed
        assert message.startswith(f"Saving checkpoint-8 in {run} failed: {type(error).__name__}")
        assert ("The disk is full" in message) == said_full
        if last_bytes is not None:
            assert message.endswith(f"Resume from checkpoint-4 with: lanpo train --resume latest --output_dir {run}")
        else:  # nothing to resume from: the command that starts the run again
            assert message.endswith(f"start again with: lanpo train --config {run / 'config.yaml'} --overwrite")
        assert raised.value.__cause__ is error
        assert not (run / ".staging").exists() and (run / "checkpoint-4").is_dir() == (last_bytes is not None)


def test_an_error_that_is_not_a_write_failure_passes_through_a_save_unchanged(tmp_path):
    from lanpo.run import checkpoints

    with pytest.raises(ValueError, match="a bug"):
        with checkpoints.save_failures_named(tmp_path, "checkpoint-1"):
            raise ValueError("a bug")


def test_a_first_checkpoint_that_fails_says_how_to_start_again_and_that_command_runs(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    import torch

    run, save = tmp_path / "run", torch.save

    def denied(obj, f, *args, **kwargs):
        if "checkpoint-1" in str(f):
            raise OSError(errno.EACCES, "Permission denied")
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", denied)
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1)]) == 2
    err = capsys.readouterr().err
    assert "Saving checkpoint-1" in err and "Permission denied" in err and "The disk is full" not in err
    command = err.split("start again with: ")[1].split()
    assert command[:2] == ["lanpo", "train"] and not list(run.glob("checkpoint-*"))
    monkeypatch.undo()
    assert main(command[1:]) == 0 and (run / "checkpoint-1").is_dir() and (run / "final").is_dir()


# -- nothing lost, round three (issue 37) -------------------------------------------------------------------------


def _samples_steps(run: Path, log: str = "samples.jsonl") -> list[int]:
    return sorted(json.loads(line)["step"] for line in (run / log).read_text().splitlines())


def test_resuming_a_finished_run_does_nothing_and_a_missing_final_model_is_written_without_training(
    tiny_model_dir, tmp_path, caplog
):
    caplog.set_level("INFO", logger="lanpo")
    run = tmp_path / "run"
    assert main(["train", *tiny_args(tiny_model_dir, run)]) == 0
    final = (run / "final" / "model.safetensors").read_bytes()
    before = {log: (run / log).read_text() for log in ("metrics.jsonl", "samples.jsonl")}
    assert main(["train", "--output_dir", str(run), "--resume", "latest"]) == 0
    assert "nothing to do" in caplog.text
    assert sorted(p.name for p in checkpoints_of(run)) == ["checkpoint-1", "checkpoint-2"]
    assert (run / "final" / "model.safetensors").read_bytes() == final
    assert {log: (run / log).read_text() for log in before} == before
    shutil.rmtree(run / "final")  # killed after its last checkpoint, before the final model
    assert main(["train", "--output_dir", str(run), "--resume", "latest"]) == 0
    assert (run / "final" / "model.safetensors").read_bytes() == final  # the checkpoint's weights, no extra step
    assert not (run / "checkpoint-3").exists() and {log: (run / log).read_text() for log in before} == before


def checkpoints_of(run: Path) -> list[Path]:
    from lanpo.run.checkpoints import checkpoints

    return checkpoints(run)


def test_a_config_edited_by_hand_after_a_checkpoint_is_refused_on_resume(tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *tiny_args(tiny_model_dir, run, max_steps=1)]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**saved, "num_generations": 2}, sort_keys=False))
    assert main(["train", "--output_dir", str(run), "--resume", "latest", "--max_steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "edited after checkpoint-1" in err and "num_generations: 4 -> 2" in err
    assert not (run / "checkpoint-2").exists()


@pytest.mark.slow
def test_ctrl_c_mid_step_and_mid_save_each_say_where_the_run_stands_in_one_line_and_resume_loses_nothing(
    tiny_model_dir, tmp_path, uninterrupted, script
):
    """Ctrl-C in the middle of step 2, then, resumed, in the middle of checkpoint-2's save: each time one line
    that names the newest whole checkpoint and the command that resumes; the run resumed to the end equals the
    uninterrupted one. (The two cases, mid-step and mid-save, in one run.)"""
    run = tmp_path / "run"
    reference, ref = uninterrupted(4)
    command = tiny_args(tiny_model_dir, run, max_steps=4)
    resume = ["--output_dir", str(run), "--resume", "latest"]
    for argv, where in ((command, "step:2"), (resume, "save:2")):
        stopped = script(argv, {"LANPO_INTERRUPT_AT": where})
        assert stopped.returncode == 130, stopped.stderr[-3000:]
        assert "Traceback" not in stopped.stderr and "KeyboardInterrupt" not in stopped.stderr, stopped.stderr[-3000:]
        [line] = [x for x in stopped.stderr.splitlines() if "interrupted" in x]
        assert f"--resume latest --output_dir {run}" in line and "checkpoint-1" in line, (where, line)
    resumed = script(resume, {"LANPO_REPORT": str(tmp_path / "res")})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    [res] = _report(tmp_path / "res", 1)
    assert res["digest"] == ref["digest"] and steps_logged(run) == steps_logged(reference)
    assert _samples_steps(run) == _samples_steps(reference)


@pytest.mark.slow
def test_the_command_line_prints_step_lines_and_no_library_deprecation_warnings(tiny_model_dir, tmp_path):
    """Issue 50: `lanpo train` printed FutureWarnings of transformers' and TRL's own renames between the bar and
    the step lines; the command line leaves them out (the Python API does not filter them)."""
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "lanpo.cli", "train", *tiny_args(tiny_model_dir, run, max_steps=1)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "default"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout + done.stderr
    assert "FutureWarning" not in text and "are deprecated" not in text, text[-3000:]
    assert "step 1/1 | reward" in text and "{'loss'" not in text


class _Stop(Exception):
    """Raised in place of building the trainer: what `lanpo train` said before it is all a test needs."""


@pytest.mark.parametrize("bf16", ["true", "false"])
@pytest.mark.parametrize("setting", ["", "torch"])
def test_training_takes_lanpos_bf16_matmuls_or_warns_before_the_model_loads_when_bf16_would_be_emulated(
    tiny_model_dir, tmp_path, monkeypatch, caplog, bf16, setting
):
    import lanpo.trainer
    from lanpo.commands import train
    from lanpo.engine import bf16_matmul, models

    installed_when_built = []

    def stop(*args, **kwargs):
        installed_when_built.append(bf16_matmul.installed())
        raise _Stop

    monkeypatch.setattr(models, "cpu_bf16_native", lambda: False)
    monkeypatch.setattr(lanpo.trainer, "LanpoTrainer", stop)
    monkeypatch.setenv(bf16_matmul.ENV, setting)
    with caplog.at_level("INFO", logger="lanpo.engine.models"), pytest.raises(_Stop):
        train.run(tiny_args(tiny_model_dir, tmp_path / "run", bf16=bf16))
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "no native bf16" in r.getMessage()]
    assert len(said) == (bf16 == "true")
    assert installed_when_built == [bf16 == "true" and setting == ""]  # before the model loads
    if said:
        level, message = said[0]
        assert level == ("WARNING" if setting else "INFO") and "the training pass (bf16: true)" in message
        assert ("Set bf16 false" in message) == (setting == "torch")
        assert "sampler" not in message.split("bf16:")[0]  # no vLLM sampler in this run


def test_a_checkpoint_names_pending_trials_by_problem_and_a_resume_reads_their_golds_from_the_data(tmp_path):
    from lanpo.run import checkpoints
    from lanpo.summarize import Trial

    suite = '{"code_tests": {"cases": [[[41], 42]], "entry_point": "f"}}'
    pending = [
        Trial("a", "def f(x): ...", "try", False, gold=suite, gold_kind="code"),
        Trial("b", "1+1", "2", True, "2"),
    ]
    checkpoints.write_state(tmp_path, 0, 1, 3, pending)
    saved = (tmp_path / checkpoints.state_file(0)).read_text()
    assert "code_tests" not in saved and "[[41], 42]" not in saved
    read = checkpoints.read_pending(tmp_path, 0, 1)
    assert [t.gold for t in read] == [None, None] and [t.gold_kind for t in read] == ["code", "math"]
    resumed, dropped = checkpoints.with_golds(read, {"a": suite, "b": "2"})
    assert resumed == pending and dropped == 0
    resumed, dropped = checkpoints.with_golds(read, {"b": "2"})  # the data no longer holds problem a
    assert resumed == pending[1:] and dropped == 1
