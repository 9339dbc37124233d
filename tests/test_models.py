"""The model loader: local dirs, GGUF files, the embedded default, dtype/device choice, offline errors."""

from __future__ import annotations

import time

import pytest
import torch

from lanpo.engine.models import (
    EMBEDDED_MODELS,
    default_extraction,
    embedded_gguf_path,
    load_model,
    parse_dtype,
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

    from lanpo.engine.models import size_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    before = torch.get_num_threads()
    try:
        assert size_cpu_threads() == expected and torch.get_num_threads() == expected
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's choice wins
        torch.set_num_threads(1)
        assert size_cpu_threads() == 1
    finally:
        torch.set_num_threads(before)
