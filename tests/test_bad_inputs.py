"""Bad input, table-driven (issue 12): every case exits 2 with a message naming what is wrong, prints no
traceback, loads no model and leaves no file behind."""

from __future__ import annotations

import json
import sqlite3

import pytest

from lanpo.cli import main


class ModelLoaded(Exception):
    pass


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A directory with a few things to point at: a file, a pool, a corrupt pool, a future-schema pool, runs."""
    import transformers

    import lanpo.engine.models

    def refuse(*args, **kwargs):
        raise ModelLoaded("a model was loaded")

    for module, name in (
        (lanpo.engine.models, "load_model"),
        (lanpo.engine.models, "resolve_model_path"),
        (transformers.AutoModelForCausalLM, "from_pretrained"),
    ):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory")
    from lanpo.pool.store import ExperiencePool, PoolEntry

    with ExperiencePool(tmp_path / "pool.sqlite") as pool:
        pool.add([PoolEntry("p", "q", "f", ["a principle"], ["a pitfall"])])
    (tmp_path / "corrupt.sqlite").write_bytes(b"this is no database at all" * 10)
    with ExperiencePool(tmp_path / "future.sqlite"):
        pass
    conn = sqlite3.connect(tmp_path / "future.sqlite")
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    (tmp_path / "bad.yaml").write_text("model_name_or_path: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "unknown.yaml").write_text("model_name_or_path: x\nnot_a_field: 3\n")
    (tmp_path / "nometrics").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "metrics.jsonl").write_text("not json\n[1, 2]\n")
    (tmp_path / "export.jsonl").write_text(json.dumps({"type": "header", "schema_version": 1}) + "\n")
    for name, text in (
        ("typed-list", "learning_rate: [0.001]\n"),
        ("typed-map", "num_generations: {a: 1}\n"),
        ("typed-null", "beta: null\n"),
        ("typed-choice", "context_in_loss: [strip]\n"),
        ("typed-str", "data: [gsm8k, math]\n"),
    ):
        (tmp_path / f"{name}.yaml").write_text(text)
    (tmp_path / "latin1.yaml").write_bytes("learning_rate: 0.001\n# caf\u00e9\n".encode("latin-1"))
    (tmp_path / "nosteps").mkdir()
    (tmp_path / "nosteps" / "metrics.jsonl").write_text("")
    return tmp_path


UNWRITABLE = "/sys/kernel/lanpo-unwritable"  # sysfs refuses new files even to root


CASES = [  # (argv, what the message must name)
    # lanpo eval
    (["eval", "--k", "0"], "--k"),
    (["eval", "--k", "two"], "two"),
    (["eval", "--batch-size", "0"], "--batch-size"),
    (["eval", "--modes", "zero-shot,magic"], "magic"),
    (["eval", "--limit", "-1"], "--limit"),
    (["eval", "--limit", "0"], "--limit"),
    (["eval", "--temperature", "-1"], "--temperature"),
    (["eval", "--top-p", "1.5"], "--top-p"),
    (["eval", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["eval", "--rounds", "-1"], "--rounds"),
    (["eval", "--rounds", "0"], "--rounds"),
    (["eval", "--gamma", "2"], "--gamma"),
    (["eval", "--top-k", "0"], "--top-k"),
    (["eval", "--out", "afile"], "afile"),
    (["eval", "--modes", "retrieval"], "--pool"),
    (["eval", "--modes", "retrieval", "--pool", "corrupt.sqlite"], "corrupt.sqlite"),
    (["eval", "--modes", "retrieval", "--pool", "future.sqlite"], "schema version 99"),
    (["eval", "--pool", "nowhere"], "nowhere"),
    (["eval", "--data", "nope.jsonl"], "nope.jsonl"),
    (["eval", "--data", "builtin:arith?levels=9"], "levels 1 to 5"),
    (["eval", "--data", "builtin:nope"], "nope"),
    (["eval", "--benchmarks", "mystery"], "mystery"),
    (["eval", "--extraction", "fuzzy"], "fuzzy"),
    (["eval", "--answer-format", "weird"], "weird"),
    (["eval", "--dtype", "float7"], "float7"),
    (["eval", "--model", "./no-such-model"], "no-such-model"),
    (["eval", "--model", "afile"], "afile"),
    (["eval", "--data", "export.jsonl"], "cannot find"),
    # lanpo sft-data
    (["sft-data", "--out", "x.jsonl", "--tries", "0"], "--tries"),
    (["sft-data", "--out", "x.jsonl", "--n", "0"], "--n"),
    (["sft-data", "--out", "x.jsonl", "--mix", "1,1"], "1,1"),
    (["sft-data", "--out", "x.jsonl", "--mix", "a,b,c"], "a,b,c"),
    (["sft-data", "--out", "x.jsonl", "--batch-size", "0"], "--batch-size"),
    (["sft-data", "--out", "x.jsonl", "--temperature", "-1"], "--temperature"),
    (["sft-data", "--out", "x.jsonl", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["sft-data", "--out", "x.jsonl", "--limit", "-1"], "--limit"),
    (["sft-data", "--out", "nometrics"], "nometrics"),
    (["sft-data"], "--out"),
    (["sft-data", "--out", "x.jsonl", "--data", "nope.jsonl"], "nope.jsonl"),
    (["sft-data", "--out", "afile/x.jsonl"], "afile"),
    # lanpo pool
    (["pool", "show", "pool.sqlite", "--limit", "-1"], "--limit"),
    (["pool", "stats", "nowhere.sqlite"], "nowhere"),
    (["pool", "stats", "afile"], "afile"),
    (["pool", "stats", "corrupt.sqlite"], "corrupt.sqlite"),
    (["pool", "stats", "future.sqlite"], "99"),
    (["pool", "export", "pool.sqlite", "pool.sqlite"], "itself"),
    (["pool", "export", "pool.sqlite", "nometrics"], "nometrics"),
    (["pool", "export", "nowhere", "o.jsonl"], "nowhere"),
    (["pool", "import", "pool.sqlite", "export.jsonl", "--cap", "0"], "--cap"),
    (["pool", "import", "export.jsonl", "pool.sqlite"], "swapped"),
    (["pool", "import", "new.jsonl", "export.jsonl"], ".jsonl"),
    (["pool", "import", "pool.sqlite", "missing.jsonl"], "missing.jsonl"),
    (["pool", "frob"], "frob"),
    # lanpo compare
    (["compare", "nometrics"], "metrics.jsonl"),
    (["compare", "garbage"], "no usable metrics"),
    (["compare", "garbage", "nometrics", "--names", "x"], "--names"),
    (["compare", "garbage", "--out", "afile"], "afile"),
    # lanpo train
    (["train", "--config", "missing.yaml"], "missing.yaml"),
    (["train", "--config", "bad.yaml"], "not valid yaml"),
    (["train", "--config", "list.yaml"], "mapping"),
    (["train", "--config", "unknown.yaml"], "not_a_field"),
    (["train", "--output_dir", "afile"], "afile"),
    (["train", "--learning_rate", "-1"], "learning_rate"),
    (["train", "--max_completion_length", "0"], "max_completion_length"),
    (["train", "--num_generations", "1"], "num_generations"),
    (["train", "--feedback_ratio", "1.5"], "feedback_ratio"),
    (["train", "--eval_every", "1", "--data", "mine.jsonl"], "eval_benchmarks"),
    (["train", "--eval_every", "1", "--data", "gsm8k", "--data_split", "test"], "eval_benchmarks"),
    (["train", "--eval_modes", "magic"], "eval_modes"),
    (["train", "--eval_every", "1", "--eval_benchmarks", "missing-heldout.jsonl"], "missing-heldout.jsonl"),
    (["train", "--relevance_scorer", "vibes"], "vibes"),
    (["train", "--temperature", "0"], "temperature"),
    (["train", "--beta", "-0.1"], "beta"),
    (["train", "--max_steps", "0"], "max_steps"),
    (["train", "--per_device_train_batch_size", "6"], "num_generations"),
    (["train", "--resume", "latest"], "--output_dir"),
    (["train", "--resume", "nowhere"], "nowhere"),
    (["train", "--data", "nope.jsonl"], "nope.jsonl"),
    (["train", "--not_a_flag", "1"], "not_a_flag"),
    (["train", "--bf16", "maybe"], "maybe"),
    (["train", "--answer_extraction", "fuzzy"], "fuzzy"),
    (["train", "--model", "./no-such-model", "--output_dir", "r"], "no-such-model"),
    (["train", "--summaries_per_group", "-1"], "summaries_per_group"),
    (["train", "--pool_cap", "0"], "pool_cap"),
    # lanpo sft
    (["sft"], "--data"),
    (["sft", "--data", "missing.jsonl"], "missing.jsonl"),
    # round three (issue 37): wrongly typed YAML values, bad encodings, outputs that cannot be written, empty runs
    (["train", "--config", "typed-list.yaml"], "learning_rate"),
    (["train", "--config", "typed-map.yaml"], "num_generations"),
    (["train", "--config", "typed-null.yaml"], "beta"),
    (["train", "--config", "typed-choice.yaml"], "context_in_loss"),
    (["train", "--config", "typed-str.yaml"], "data is a list"),
    (["train", "--config", "latin1.yaml"], "line 2"),
    (["train", "--output_dir", UNWRITABLE], UNWRITABLE),
    (["eval", "--out", UNWRITABLE, "--limit", "2"], UNWRITABLE),
    (["sft-data", "--out", UNWRITABLE + "/x.jsonl"], UNWRITABLE),
    (["report", "nosteps"], "no step"),
    (["eval", "--top-p", "0"], "--top-p"),
]


@pytest.mark.parametrize("argv,names", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_bad_input_exits_2_naming_it_without_traceback_model_or_files(workdir, capsys, argv, names):
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 2, text[-2000:]
    assert "Traceback" not in text and "a model was loaded" not in text, text[-2000:]
    assert names.lower() in text.lower(), text[-2000:]
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before, "a file was left behind"
