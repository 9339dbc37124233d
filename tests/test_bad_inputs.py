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
    (tmp_path / "nan.yaml").write_text("strip_ratio_clip: .nan\n")
    from lanpo.pool.io import export_jsonl

    with ExperiencePool(tmp_path / "pool.sqlite", readonly=True) as pool:
        export_jsonl(pool, tmp_path / "one.jsonl")
    (tmp_path / "null-g.yaml").write_text("num_generations: null\n")
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
    # round four (issue 50): numbers that are not numbers, refused before anything loads
    (["train", "--strip_ratio_clip", "nan"], "strip_ratio_clip"),
    (["train", "--shaping_gamma", "inf"], "shaping_gamma"),
    (["train", "--learning_rate", "nan"], "learning_rate"),
    (["train", "--config", "nan.yaml"], "strip_ratio_clip"),
    (["sft", "--data", "missing.jsonl", "--learning_rate", "nan"], "learning_rate"),
    (["eval", "--temperature", "nan"], "--temperature"),
    (["eval", "--temperature", "inf"], "--temperature"),
    (["eval", "--gamma", "nan"], "--gamma"),
    (["eval", "--top-p", "nan"], "--top-p"),
    (["sft-data", "--out", "x.jsonl", "--temperature", "nan"], "--temperature"),
    (["sft-data", "--out", "x.jsonl", "--mix", "nan,1,1"], "nan,1,1"),
    (["report", "nosteps", "--serve", "--port", "65536"], "--port"),
    # round four: settings checked before anything loads, named
    (["train", "--config", "null-g.yaml"], "num_generations"),
    (["train", "--output_dir", ""], "output_dir"),
    (["train", "--output_dir", "  "], "output_dir"),
    (["pool", "import", UNWRITABLE + "/pool.sqlite", "one.jsonl"], UNWRITABLE),
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


# -- numbers that are not numbers, as a class (issue 50) ------------------------------------------------------


def _float_fields():
    import dataclasses

    from lanpo.config import LanpoConfig

    return sorted(f.name for f in dataclasses.fields(LanpoConfig) if f.init and isinstance(f.default, float))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", _float_fields())
def test_every_float_setting_refuses_non_finite_values_by_name(tmp_path, name, value):
    from lanpo.config import LanpoConfig

    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{name: value})


def _numeric_flags():
    """(command, flag, type) for every flag of every lanpo command whose value is a number."""
    import argparse
    import importlib

    from lanpo.cli import COMMANDS

    found = []
    for name, (module, line) in COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).add_parser(sub, name, line)
        parser = sub.choices[name]
        actions = [a for a in parser._actions if a.type is not None]
        for group in parser._subparsers._group_actions if parser._subparsers else []:
            for child in group.choices.values():
                actions += [a for a in child._actions if a.type is not None]
        for action in actions:
            for sample in ("1", "1,1,1"):
                try:
                    value = action.type(sample)
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    continue
                if isinstance(value, int | float) or (isinstance(value, list) and isinstance(value[0], float)):
                    flag = action.option_strings[0] if action.option_strings else action.dest
                    found.append((name, flag, action.type))
                break
    return found


NUMERIC_FLAGS = _numeric_flags()


def test_the_numeric_flags_are_found():
    flags = {(c, f) for c, f, _ in NUMERIC_FLAGS}
    assert {("eval", "--temperature"), ("eval", "--gamma"), ("sft-data", "--mix"), ("report", "--port")} <= flags


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
@pytest.mark.parametrize("command,flag,kind", NUMERIC_FLAGS, ids=[f"{c} {f}" for c, f, _ in NUMERIC_FLAGS])
def test_every_numeric_flag_refuses_non_finite_values(command, flag, kind, text):
    import argparse

    if kind is int:  # Python's int() refuses these itself
        with pytest.raises(ValueError):
            kind(text)
        return
    value = text if flag != "--mix" else f"{text},1,1"
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        kind(value)


def test_valid_spellings_of_numbers_are_accepted():
    from lanpo.commands.args import port, probability, skill_mix, unit_interval

    assert probability("1e0") == 1.0 and probability("0.95") == 0.95 and probability(".5") == 0.5
    assert unit_interval("1E-1") == 0.1 and skill_mix("1,2e0,0") == [1.0, 2.0, 0.0]
    assert port("0") == 0 and port("65535") == 65535


def test_use_vllm_without_vllm_is_refused_before_a_model_loads(workdir, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["train", "--use_vllm", "true", "--output_dir", "r"]) == 2
    text = capsys.readouterr().err
    assert "use_vllm needs vLLM" in text and "a model was loaded" not in text and not (workdir / "r").exists()


def test_a_run_stopped_before_its_first_checkpoint_points_at_a_command_that_works(workdir, capsys):
    """Killed during the step-0 evaluation: --resume latest and the original command each refused, pointing at
    the other. Both now point at starting it again with --overwrite."""
    run = workdir / "stopped"
    run.mkdir()
    (run / "config.yaml").write_text(f"model_name_or_path: smollm2-135m\noutput_dir: {run}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/arith/zero-shot/mean@4": 0.2}) + "\n")
    assert main(["train", "--resume", "latest", "--output_dir", str(run)]) == 2
    resume = capsys.readouterr().err
    assert main(["train", "--output_dir", str(run)]) == 2
    again = capsys.readouterr().err
    assert f"--config {run / 'config.yaml'} --overwrite" in resume
    assert "--overwrite" in again and "--resume latest" not in again and "nothing to continue" in again


# -- round five: integers that are not integers, limits no run can use, refusals before the model (issue 71) ----


def _int_fields():
    """Every field LANPO declares as an integer (its own annotations, as check_whole_numbers reads them)."""
    from lanpo.config import LanpoConfig

    return sorted(
        name
        for name, kind in vars(LanpoConfig)["__annotations__"].items()
        if "int" in str(kind).replace(" ", "").split("|")
    )


def test_the_integer_fields_are_found():
    assert {"hint_level", "code_workers", "pool_cap", "eval_k"} <= set(_int_fields())


@pytest.mark.parametrize("value", [2.5, 2.0, True, "3"])
@pytest.mark.parametrize("name", _int_fields())
def test_every_integer_setting_refuses_what_is_not_a_whole_number_by_name(tmp_path, name, value):
    from lanpo.config import LanpoConfig

    with pytest.raises(ValueError, match=f"{name} must be a whole number"):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{name: value})


@pytest.mark.parametrize(
    "yaml_text, names",
    [
        ("hint_level: 2.5\n", "hint_level"),
        ("hint_level: true\n", "hint_level"),
        ("code_workers: 2.0\n", "code_workers"),
        ("code_workers: 65\n", "code_workers"),
        ("code_timeout: 1.0e9\n", "code_timeout"),
        ("eval_modes: zero-shot,zero-shot\n", "eval_modes"),
    ],
)
def test_a_yaml_setting_no_run_can_use_exits_2_before_a_model_loads(workdir, capsys, yaml_text, names):
    (workdir / "c.yaml").write_text(yaml_text)
    assert main(["train", "--config", "c.yaml", "--output_dir", "r"]) == 2
    text = capsys.readouterr().err
    assert names in text and "a model was loaded" not in text and not (workdir / "r").exists()


ROUND_FIVE = [
    (["eval", "--modes", "gold,gold"], "twice"),
    (["eval", "--code-workers", "65"], "code_workers"),
    (["eval", "--code-timeout", "1e9"], "code_timeout"),
    (["train", "--data", "nosolution.jsonl", "--solution_field", "nosuch", "--output_dir", "r"], "nosuch"),
    (["train", "--data", "nosolution.jsonl", "--feedback_source", "reference", "--output_dir", "r"], "reference"),
    (["train", "--data", "nosolution.jsonl", "--feedback_source", "self-hint", "--output_dir", "r"], "self-hint"),
]


@pytest.mark.parametrize("argv,names", ROUND_FIVE, ids=[" ".join(c[0])[:60] for c in ROUND_FIVE])
def test_round_five_refusals_exit_2_before_a_model_loads(workdir, capsys, argv, names):
    (workdir / "nosolution.jsonl").write_text(json.dumps({"question": "1 + 1?", "answer": "2"}) + "\n")
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    text = "".join(capsys.readouterr())
    assert code == 2 and names in text and "a model was loaded" not in text, text[-2000:]
    assert not (workdir / "r").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_code_without_bubblewrap_is_refused_before_a_model_loads(workdir, capsys, monkeypatch, command):
    import shutil

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    argv = {"train": ["train", "--data", "builtin:code", "--output_dir", "r"], "eval": ["eval", "--data", "humaneval"]}
    assert main(argv[command]) == 2
    text = capsys.readouterr().err
    assert "apt-get install bubblewrap" in text and "a model was loaded" not in text


@pytest.mark.parametrize(
    "overrides, says",
    [
        ({"reflection_source": "ahead", "feedback_ratio": 0.0}, "reflection_source ahead does nothing"),
        ({"reflection_source": "ahead", "feedback_source": "reference"}, "reflection_source ahead does nothing"),
        ({"feedback_trigger_pass_rate": 0.25}, "feedback_trigger_pass_rate does nothing"),
    ],
)
def test_options_that_do_nothing_in_the_combination_given_are_warned_about(tmp_path, caplog, overrides, says):
    from lanpo.config import LanpoConfig

    LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **overrides)
    assert says in caplog.text
    caplog.clear()
    LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert "does nothing" not in caplog.text


def test_code_partial_credit_on_data_without_code_is_warned_about_before_a_model_loads(workdir, caplog):
    code = main(["train", "--data", "builtin:arith?n=8", "--code_partial_credit", "true", "--output_dir", "r"])
    assert "code_partial_credit does nothing here" in caplog.text
    assert code == 2  # the fixture refuses the model load that follows: the warning came before it


# -- round six: floats that train nothing finite, batches that cannot fill, refusals that leave nothing (93) --


def test_the_float_fields_are_found():
    from lanpo.config import LanpoConfig, float_fields

    found = set(float_fields(LanpoConfig(output_dir="x", use_cpu=True, bf16=False)))
    assert {"score_coef", "score_clip", "learning_rate", "min_p", "reward_weights", "warmup_steps"} <= found


def _all_float_fields():
    from lanpo.config import LanpoConfig, float_fields

    return sorted(float_fields(LanpoConfig(output_dir="x", use_cpu=True, bf16=False)))


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300, -1e300, -1.0])
@pytest.mark.parametrize("name", _all_float_fields())
def test_every_float_field_refuses_what_trains_nothing_finite(tmp_path, name, value):
    from lanpo.config import LanpoConfig

    if name == "reward_weights" and value == -1.0:
        pytest.skip("a negative reward weight penalizes that reward: meaningful")
    given = [value] if name == "reward_weights" else value
    with pytest.raises(ValueError, match=name):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{name: given})


@pytest.mark.parametrize(
    "argv",
    [
        ["--score_coef", "1e300"],
        ["--score_coef", "-inf"],
        ["--score_clip", "-1e300"],
        ["--learning_rate", "1e300"],
        ["--temperature", "-Infinity"],
    ],
    ids=lambda a: " ".join(a),
)
def test_float_flags_past_their_range_exit_2_naming_the_field_before_a_model_loads(workdir, capsys, argv):
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    code = main(["train", "--output_dir", "r", *argv])
    text = "".join(capsys.readouterr())
    assert code == 2 and argv[0][2:] in text and "expected one argument" not in text, text[-2000:]
    assert "a model was loaded" not in text
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before


def test_training_that_cannot_fill_one_batch_is_refused_naming_the_numbers(workdir, capsys):
    argv = ["train", "--data", "builtin:arith?n=1", "--per_device_train_batch_size", "16", "--output_dir", "r"]
    code = main(argv)
    text = "".join(capsys.readouterr())
    assert code == 2 and "1 training problem(s) cannot fill one batch" in text and "takes 2 distinct" in text, text
    assert "a model was loaded" not in text and not (workdir / "r").exists()


def test_a_run_that_ends_short_of_its_steps_says_so(caplog):
    from lanpo.commands.train import say_missing_steps

    say_missing_steps(30, 30)
    assert "optimizer steps" not in caplog.text
    say_missing_steps(0, 30)
    assert "Trained 0 of the 30 optimizer steps asked for" in caplog.text


@pytest.mark.parametrize("refusal", ["a model that is not there", "a pool that will not open"])
def test_a_refused_run_leaves_no_lock_file_and_no_folder_it_made(tmp_path, monkeypatch, capsys, refusal):
    import lanpo.trainer

    monkeypatch.chdir(tmp_path)
    argv = ["train", "--output_dir", "deep/er/run", "--max_steps", "1"]
    if refusal == "a model that is not there":
        argv += ["--model", str(tmp_path / "no-such-model")]
    else:  # the trainer opens the run's pool: a corrupt one raises there, as sqlite3 does

        def corrupt(*args, **kwargs):
            raise sqlite3.DatabaseError("file is not a database")

        monkeypatch.setattr(lanpo.trainer, "LanpoTrainer", corrupt)
        monkeypatch.setattr("lanpo.engine.models.resolve_model_path", lambda name: name)
        monkeypatch.setattr("lanpo.engine.models.load_tokenizer", lambda name: None)
    try:
        code = main(argv)
    except (sqlite3.DatabaseError, OSError):
        code = 1
    capsys.readouterr()
    assert code != 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == [], "a refused run left something behind"
    (tmp_path / "kept").mkdir()  # a folder that was there before stays, and so does a lock that was
    (tmp_path / "kept" / ".run.lock").write_text("pid 1\n")
    argv[argv.index("deep/er/run")] = "kept/run"
    try:
        main(argv)
    except (sqlite3.DatabaseError, OSError):
        pass
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.rglob("*")) == [".run.lock", "kept"]
