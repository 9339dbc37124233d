"""Held-out problems by default: training reads a preset's train split, and `--eval_every N` alone evaluates the
training data's held-out split (never problems training sees)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.cli import main
from lanpo.data.loaders import load_problems, parse_builtin
from lanpo.data.presets import HELD_OUT, PRESETS, training_split
from lanpo.eval.during_training import held_out_benchmark
from test_runs import tiny_args


@settings(max_examples=25, deadline=None)
@given(
    levels=st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True),
    seed=st.integers(0, 50),
    n=st.integers(4, 40),
    named_split=st.booleans(),
)
def test_builtin_held_out_is_the_test_split_of_the_same_levels_and_shares_no_problem(levels, seed, n, named_split):
    spec = f"builtin:arith?levels={','.join(map(str, levels))}&seed={seed}&n={n}" + ("&split=train" * named_split)
    held = held_out_benchmark(spec)
    name, options = parse_builtin(held)
    assert name == "builtin:arith" and options["split"] == "test" and "n" not in options
    assert options["levels"] == ",".join(map(str, levels)) and options["seed"] == str(seed)
    train = {p.problem for p in load_problems(spec)}
    test = {p.problem for p in load_problems(held, limit=n)}
    assert test and not train & test
    assert held_out_benchmark(spec.replace("&split=train", "") + "&split=test") is None  # trained on test: none
    assert held_out_benchmark(spec, split="test") is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_training_reads_a_presets_train_split_and_its_held_out_set_is_another_file(name):
    preset = PRESETS[name]
    split = training_split(name)
    if "train" in preset.local:
        assert split == "train"
    held = held_out_benchmark(name)
    if held is not None:
        eval_preset = PRESETS[held]
        assert eval_preset.local[eval_preset.split] != preset.local[split]  # evaluation never reads training data
    assert held_out_benchmark(name, split="test") is None
    assert set(HELD_OUT) <= set(PRESETS) and set(HELD_OUT.values()) <= set(PRESETS)


@pytest.mark.parametrize("data", ["mine.jsonl", "org/some-dataset", "math500", "aime24", "dapo-math-17k"])
def test_no_held_out_set_is_invented_where_lanpo_knows_none(data):
    assert held_out_benchmark(data) is None


def write_gsm8k(folder: Path, split: str, start: int, n: int) -> list[str]:
    texts = [
        f"Sam has {i} apples and buys {i + 1} more. How many apples does Sam have now?" for i in range(start, start + n)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text(
        "".join(
            json.dumps({"question": t, "answer": f"steps\n#### {2 * i + 1}"}) + "\n"
            for t, i in zip(texts, range(start, start + n))
        )
    )
    return texts


def test_eval_every_alone_trains_on_gsm8k_train_and_evaluates_its_test_split(tiny_model_dir, tmp_path):
    data_dir = tmp_path / "data"
    train = write_gsm8k(data_dir / "gsm8k", "train", 0, 8)
    test = write_gsm8k(data_dir / "gsm8k", "test", 100, 5)
    run = tmp_path / "run"
    argv = tiny_args(tiny_model_dir, run, data="gsm8k", data_dir=data_dir, max_steps=2, eval_every=1, eval_k=1)
    assert main(["train", *argv]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text())["eval_benchmarks"] == "gsm8k"  # saved as resolved
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/gsm8k/zero-shot/mean@1" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert set(json.loads(x)["problem"] for x in (run / "samples.jsonl").read_text().splitlines()) <= set(train)
    assert len(test) == 5 and not set(train) & set(test)


def _fact(text: str) -> tuple:
    """A problem's fact read independently of lanpo: its numbers (order-free) and its operations."""
    import re

    words = {
        "+": "+",
        "sum": "+",
        "more": "+",
        "-": "-",
        "subtract": "-",
        "away": "-",
        "left": "-",
        "×": "*",
        "*": "*",
        "times": "*",
    }
    tokens = re.findall(r"\d+|[+\-*×]|[a-z]+", text.lower())
    return tuple(sorted(t for t in tokens if t.isdigit())), tuple(sorted({words[t] for t in tokens if t in words}))


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_no_held_out_arithmetic_fact_is_a_training_fact(level, seed):
    """ "Compute 4 + 3." held out while "What is 3 + 4?" is trained is recall, not generalization: the split is by
    fact (operands order-free and operations), at every level."""
    from lanpo.data.loaders import builtin_arith

    train = builtin_arith(str(level), n=400, seed=seed)
    test = builtin_arith(str(level), n=100, seed=seed, split="test")
    assert len(train) > 50 and len(test) > 10
    shared = {_fact(p.problem) for p in train} & {_fact(p.problem) for p in test}
    assert not shared, sorted(shared)[:5]
