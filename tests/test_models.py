"""The model loader: local dirs, GGUF files, the embedded default, dtype/device choice, offline errors."""

from __future__ import annotations

import os
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lanpo.engine import models
from lanpo.engine.models import (
    EMBEDDED_MODELS,
    cpu_bf16_native,
    default_extraction,
    embedded_gguf_path,
    emulated_bf16,
    load_model,
    parse_dtype,
    prepare_emulated_bf16,
    resolve_model_path,
)


def test_local_directory_loads_on_cpu_in_fp32(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir))
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


def test_dtype_can_be_overridden(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir), dtype="bfloat16", device="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_dtype_defaults_and_errors():
    assert parse_dtype(None, "cpu") == torch.float32
    assert parse_dtype("auto", "cpu") == torch.float32
    with pytest.raises(ValueError, match="Unknown dtype"):
        parse_dtype("float8", "cpu")


def test_missing_paths_and_offline_hub_ids_fail_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError):
        resolve_model_path("./no/such/model")
    with pytest.raises(OSError, match="offline"):
        load_model("some-org/some-model-that-is-not-cached")


@pytest.mark.slow
def test_embedded_default_converts_once_then_loads_fast_and_generates():
    from lanpo.engine.generation import generate
    from lanpo.prompts import solve_messages

    assert embedded_gguf_path("smollm2-135m").name.endswith(".gguf")
    path = resolve_model_path("smollm2-135m")  # converts on first use (cached under LANPO_CACHE)
    start = time.monotonic()
    again = resolve_model_path("smollm2-135m")
    assert again == path and time.monotonic() - start < 1.0
    model, tokenizer = load_model("smollm2-135m", device="cpu")
    assert model.config.model_type == "llama" and not hasattr(model.config, "quantization_config")
    torch.manual_seed(0)
    samples = generate(model, tokenizer, [solve_messages("What is 2 + 3?")], n=2, max_new_tokens=24)
    assert all(s.num_tokens > 0 and s.text.strip() for s in samples[0])


def test_a_conversion_finished_second_gives_way_to_the_first_and_leaves_nothing(tmp_path):
    """Two processes converting one GGUF at once (grid cells, test workers on a fresh cache): the first to finish is
    the cache, the second's copy is dropped, with no error; a copy that cannot be placed otherwise still raises."""
    from lanpo.engine.models import _place

    out = tmp_path / "models" / "smollm2"
    out.parent.mkdir()
    for n in (1, 2):
        converted = out.parent / f".smollm2-{n}"
        converted.mkdir()
        (converted / "config.json").write_text(f'{{"by": {n}}}')
        _place(converted, out)
        assert not converted.exists()
    assert (out / "config.json").read_text() == '{"by": 1}' and sorted(p.name for p in out.parent.iterdir()) == [
        "smollm2"
    ]
    stray = tmp_path / ".stray"
    stray.mkdir()
    with pytest.raises(OSError):
        _place(stray, tmp_path / "no-such-folder" / "smollm2")


def test_answers_are_graded_leniently_only_for_the_embedded_model():
    """One rule for every command that grades (sft-data, eval, the SFT parse-rate benchmark): the embedded model
    rarely boxes its answer, every other model is held to the final \\boxed{}."""
    from lanpo.commands.args import extraction as _extraction

    assert all(default_extraction(name) == "lenient" for name in EMBEDDED_MODELS)
    assert default_extraction("Qwen/Qwen2.5-7B-Instruct") == "strict"
    assert default_extraction("runs/sft-embedded/final") == "strict"
    assert _extraction(None, "smollm2-135m") == "lenient" and _extraction("strict", "smollm2-135m") == "strict"


@pytest.mark.parametrize("cores,processes,expected", [(2, 1, 2), (2, 2, 1), (16, 4, 4), (1, 4, 1)])
def test_torch_threads_are_the_cores_this_process_may_use_shared_by_lanpos_processes(
    monkeypatch, cores, processes, expected
):
    import os

    import torch

    import lanpo.engine.models
    from lanpo.engine.models import size_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(lanpo.engine.models, "cores_busy_elsewhere", lambda *a: 0.0)  # an idle machine
    before = torch.get_num_threads()
    try:
        assert size_cpu_threads() == expected and torch.get_num_threads() == expected
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice wins
        torch.set_num_threads(1)
        assert size_cpu_threads() == 1
    finally:
        torch.set_num_threads(before)


# -- a CPU shared with other work (issue 50) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "cores,processes,elsewhere,expected",
    [
        (2, 1, 0.0, 2),
        (2, 1, 0.4, 2),
        (2, 1, 0.9, 1),
        (2, 1, 2.0, 1),
        (2, 1, None, 2),
        (16, 4, 4.2, 3),
        (16, 1, 3.0, 13),
    ],
)
def test_threads_are_the_cores_other_work_leaves_idle(cores, processes, elsewhere, expected):
    from lanpo.engine.models import cpu_threads

    assert cpu_threads(cores, processes, elsewhere) == expected


def test_the_started_run_sizes_threads_to_the_idle_cores_and_omp_num_threads_still_wins(monkeypatch):
    import os

    import torch

    import lanpo.engine.models

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(lanpo.engine.models, "cores_busy_elsewhere", lambda *a: 1.0)  # one busy process
    before = torch.get_num_threads()
    try:
        assert lanpo.engine.models.size_cpu_threads() == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        torch.set_num_threads(2)
        assert lanpo.engine.models.size_cpu_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_thread_sizer_follows_other_work_between_steps(monkeypatch):
    from types import SimpleNamespace

    import torch

    from lanpo.engine.models import thread_sizer

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    readings = iter([1.1, 1.0, 0.1])

    class Share:
        seconds = 5.0

        def elsewhere(self):
            return next(readings)

        def mark(self):
            pass

    sizer = thread_sizer()
    sizer.share = Share()
    state = SimpleNamespace(global_step=1)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        seen = []
        for _ in range(3):
            sizer.on_step_end(None, state, None)
            seen.append(torch.get_num_threads())
        assert seen == [1, 1, 2]  # down beside a busy process, back up when it stops
        sizer.share.seconds = 0.5  # a short step: a few clock ticks, no measurement
        sizer.on_step_end(None, state, None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.alone
def test_cpu_share_counts_other_programs_not_this_process_or_its_children():
    """A busy program started apart (not a child) shows as about one core; this process's own children (the
    verifier's workers, a vLLM engine) do not."""
    import os
    import subprocess
    import sys
    import time

    from lanpo.engine.models import CpuShare

    if not os.path.exists("/proc/stat"):
        pytest.skip("needs /proc/stat")

    def measured() -> float | None:
        time.sleep(0.3)
        share = CpuShare()
        time.sleep(1.5)
        return share.elsewhere()

    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # lanpo's own work
    try:
        own = measured()
    finally:
        child.kill()
        child.wait()
    out = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    other = int(out.stdout.strip())
    try:
        elsewhere = measured()
    finally:
        os.kill(other, 9)
    assert own is not None and own < 0.5, own
    assert elsewhere is not None and 0.6 < elsewhere < 1.6, elsewhere


# -- bf16 on a CPU that only emulates it ---------------------------------------------------------------------------


@given(bf16=st.booleans(), bf16_sampler=st.booleans(), native=st.booleans(), model=st.booleans())
def test_emulated_bf16_names_each_part_in_bf16_and_nothing_on_a_native_cpu(bf16, bf16_sampler, native, model):
    slow = emulated_bf16(bf16, bf16_sampler, native, model)
    assert len(slow) == (0 if native else bf16 + bf16_sampler + model)
    assert any("loaded in bfloat16" in part for part in slow) == (model and not native)
    assert any("training pass" in part for part in slow) == (bf16 and not native)
    assert any("sampler" in part for part in slow) == (bf16_sampler and not native)


def test_native_bf16_is_a_bool_and_false_where_torch_cannot_tell(monkeypatch):
    assert isinstance(cpu_bf16_native(), bool)

    def broken():
        raise RuntimeError("no oneDNN in this build")

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", broken)
    assert cpu_bf16_native() is False


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("setting", ["", "torch"])
def test_emulated_bf16_gets_lanpos_matmuls_or_a_warning_with_the_cost_and_the_remedy(
    monkeypatch, caplog, native, setting
):
    from lanpo.engine import bf16_matmul

    monkeypatch.setattr(models, "cpu_bf16_native", lambda: native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(bf16_matmul.ENV, setting)
    with caplog.at_level("INFO", logger="lanpo.engine.models"):
        prepare_emulated_bf16(False, False, "Nothing runs in bf16.")
        assert not bf16_matmul.installed() and caplog.records == []
        prepare_emulated_bf16(True, True, "Set bf16 false.")
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    if native:
        assert messages == [] and not bf16_matmul.installed()
        return
    assert len(messages) == 1
    level, message = messages[0]
    assert "training pass" in message and "vLLM sampler" in message
    if setting == "torch":  # torch's own kernels, as asked: the cost and the remedy
        assert level == "WARNING" and not bf16_matmul.installed()
        assert models.EMULATED_BF16_PASS in message and models.EMULATED_BF16_SAMPLER in message
        assert "Set bf16 false." in message
    else:
        assert level == "INFO" and bf16_matmul.installed()
        assert models.UPCAST_BF16_PASS in message and models.UPCAST_BF16_SAMPLER in message
        assert f"{bf16_matmul.ENV}=torch" in message


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_model_loaded_in_bf16_on_a_cpu_without_it_gets_lanpos_bf16_matmuls(tiny_model_dir, monkeypatch, dtype):
    from lanpo.engine import bf16_matmul

    monkeypatch.setattr(models, "cpu_bf16_native", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(bf16_matmul.ENV, raising=False)
    model, _ = models.load_model(str(tiny_model_dir), dtype=dtype, device="cpu")
    assert bf16_matmul.installed() == (dtype == "bf16")
    assert next(model.parameters()).dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)


@pytest.mark.parametrize("set_port", [None, "12999"])
@pytest.mark.parametrize("world_size", [None, "1", "2"])
@pytest.mark.parametrize("use_vllm, mode", [(True, "colocate"), (True, "server"), (False, "colocate")])
def test_a_colocated_run_of_one_process_takes_a_rendezvous_port_of_its_own(
    monkeypatch, set_port, world_size, use_vllm, mode
):
    """Two colocate runs starting at once raced for TRL's first free port (29500) and one failed: a colocated run
    of one process gets a port the OS picks, unused; a port set by the user or a launcher, and every other run,
    are left as they are."""
    import socket
    from types import SimpleNamespace

    from lanpo.engine import vllm_cpu

    for name, value in (("MASTER_PORT", set_port), ("WORLD_SIZE", world_size)):
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    monkeypatch.setattr(vllm_cpu, "applies", lambda args: False)  # the CPU engine's settings are not this test's
    vllm_cpu.prepare(SimpleNamespace(use_vllm=use_vllm, vllm_mode=mode))
    port = os.environ.get("MASTER_PORT")
    if set_port is not None or world_size == "2" or not use_vllm or mode != "colocate":
        assert port == set_port
        return
    assert port is not None and port != "29500"
    with socket.socket() as probe:  # nothing listens on it: the engine can bind it
        probe.bind(("127.0.0.1", int(port)))
    ports = set()
    for _ in range(5):  # each run its own, not one fixed choice
        monkeypatch.delenv("MASTER_PORT")
        vllm_cpu.prepare(SimpleNamespace(use_vllm=use_vllm, vllm_mode=mode))
        ports.add(os.environ["MASTER_PORT"])
    assert len(ports) > 1
