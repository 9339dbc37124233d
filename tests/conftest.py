"""Shared fixtures: tiny random models built offline, small data files, the shared data directory."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs a few hundred examples per property; HYPOTHESIS_PROFILE=thorough runs the large fuzzes at 10,000.
settings.register_profile("ci", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=10_000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Under pytest-xdist (`make test`: `-n 2`) each worker gets its share of the cores, so two workers' torch threads never
# fight over one core (a thread on a core another process holds stalls every parallel region); the processes a test
# starts (`lanpo train`, grid cells) inherit it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.hookimpl(tryfirst=True)  # before -m deselects any
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist the slow tests (marked ``slow``: several processes, the real model) go first, so that no
    worker starts a minute-long test while the others have nothing left to run (the longest-first rule).

    `make test` collects its ``alone`` part from the files whose text marks a test ``pytest.mark.alone`` (collecting
    the rest would cost every module's imports): a test marked otherwise would be left out of both parts, so it
    stops the run."""
    says_alone = functools.cache(lambda path: "pytest.mark.alone" in Path(path).read_text())  # a file read once
    for item in items:
        if item.get_closest_marker("alone") and not says_alone(str(item.fspath)):
            raise pytest.UsageError(f"{item.nodeid} is marked alone, but its file never says pytest.mark.alone")
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT") or getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_model(path: Path, seed: int = 0, vocab_size: int = 320, hidden: int = 32, heads: int = 2) -> Path:
    """A 2-layer Llama (hidden size 32; vLLM's CPU attention needs a head size of 32 or more) and a small BPE
    tokenizer with a ChatML template, saved to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "What is 3 + 4? Please reason step by step, and put your final answer within \\boxed{}.",
        "The answer is \\boxed{7}. FLOW OF THOUGHT: add. PRINCIPLES: - add the digits PITFALLS: - carry",
        "Problem: earlier attempt review each step lessons principles pitfalls Yes No",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        chat_template=CHATML,
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(autouse=True)
def _torch_bf16_matmuls_after_each_test():
    """A test that trains or loads in bf16 on a CPU without native bf16 installs lanpo's bf16 matmuls process-wide
    (as `lanpo train` does); the next test starts with torch's own kernels."""
    yield
    from lanpo.engine import bf16_matmul

    bf16_matmul.uninstall()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """Python programs launched by forking one process that has imported lanpo's training stack
    (tests/helpers/zygote.py): the 6-10 s of imports a fresh `lanpo train` spends, once per worker. Started at the
    first launch, so a worker whose tests launch nothing (test_experiment.py asks for it in every test) never pays."""
    from helpers.zygote import Zygote

    launcher = Zygote(tmp_path_factory.mktemp("zygote") / "socket")
    yield launcher
    launcher.close()


@pytest.fixture()
def tiny_model(tiny_model_dir):
    from lanpo.engine.models import load_model

    return load_model(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture()
def problems_file(tmp_path) -> Path:
    rows = [
        {"q": f"What is {a} + {b}?", "sol": str(a + b), "key": f"p{i}"}
        for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 1), (2, 2)])
    ]
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def sandbox():
    """The code sandbox the code tests share (small bounds; skipped where bubblewrap is not installed)."""
    from helpers.sandbox import HAS_BWRAP
    from lanpo.verify.sandbox import Limits, Sandbox

    if not HAS_BWRAP:
        pytest.skip("bubblewrap is not installed")
    box = Sandbox(Limits(timeout=3.0, cpu_seconds=2, memory_mb=256, processes=12, output_chars=500), workers=2)
    yield box
    box.close()
