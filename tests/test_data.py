"""Problems: one schema, every loader, the built-in generator."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.data.loaders import (
    DataError,
    LoadStats,
    Problem,
    builtin_arith,
    load_problems,
    rows_to_problems,
    to_prompt_dataset,
)
from lanpo.data.presets import PRESETS
from lanpo.verify.answers import gsm8k_answer, last_boxed


def test_jsonl_loader_maps_fields_and_ids(problems_file):
    problems = load_problems(str(problems_file), problem_field="q", answer_field="sol", id_field="key")
    assert problems[1] == Problem("problems-p1", "What is 3 + 4?", "7", "problems")


def test_json_and_parquet_loaders_agree_with_jsonl(tmp_path, problems_file):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in problems_file.read_text().splitlines()]
    (tmp_path / "p.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    kwargs = {"problem_field": "q", "answer_field": "sol"}
    as_json = load_problems(str(tmp_path / "p.json"), **kwargs)
    as_parquet = load_problems(str(tmp_path / "p.parquet"), **kwargs)
    assert [(p.problem, p.answer) for p in as_json] == [(p.problem, p.answer) for p in as_parquet]
    assert len(as_json) == 4


def test_bad_rows_are_counted_and_skipped_not_fatal(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"problem": "1+1?", "answer": "2"}\n{not json\n{"problem": "", "answer": "3"}\n'
        '{"problem": "2+2?", "answer": null}\n[1, 2]\n{"problem": "3+3?", "answer": 6}\n'
    )
    problems = load_problems(str(path))
    assert [(p.problem, p.answer) for p in problems] == [("1+1?", "2"), ("3+3?", "6")]


def test_unknown_field_names_give_an_actionable_error(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"text": "1+1?", "label": "2"}\n')
    with pytest.raises(DataError, match="--problem-field"):
        load_problems(str(path))


def test_missing_file_and_unknown_spec_fail_clearly():
    with pytest.raises(DataError, match="not found"):
        load_problems("nope/missing.jsonl")
    with pytest.raises(DataError, match="Unknown data"):
        load_problems("definitely-not-a-dataset")


def test_hub_name_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="offline"):
        load_problems("some-org/some-math-set")


def test_answer_formats():
    assert gsm8k_answer("so 3 + 4 = 7\n#### 1,234") == "1234"
    assert gsm8k_answer("no marker") is None
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("nothing here") is None


def test_solution_field_found_by_guessing_yields_its_boxed_answer():
    rows = [{"problem": "p", "solution": "work ... so \\boxed{42}."}]
    assert rows_to_problems(rows, "x")[0].answer == "42"


def test_builtin_generator_is_seeded_and_reproducible():
    a = builtin_arith("1,2,3,4,5", n=50, seed=7)
    b = builtin_arith("1,2,3,4,5", n=50, seed=7)
    c = builtin_arith("1,2,3,4,5", n=50, seed=8)
    assert a == b
    assert a != c
    assert {p.source for p in a} == {f"builtin:arith/L{i}" for i in range(1, 6)}


def test_builtin_train_and_test_splits_are_disjoint():
    train = builtin_arith("1,2", n=300, split="train")
    test = builtin_arith("1,2", n=100, split="test")
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert len({p.id for p in train}) == len(train)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_builtin_answers_are_right(level):
    # Every answer is an integer that eval(problem) reproduces for the expression forms.
    for p in builtin_arith([level], n=40, seed=1):
        expr = p.problem
        if expr.startswith(("What is", "Compute")) and "times" not in expr:
            body = re.sub(r"^(What is|Compute)\s+", "", expr).rstrip("?.").replace("\u00d7", "*")
            assert eval(body) == int(p.answer), p  # noqa: S307 - generated arithmetic only
        assert int(p.answer) >= 0


def test_builtin_spec_options_and_errors():
    assert len(load_problems("builtin:arith?levels=2&n=10&seed=3")) == 10
    assert load_problems("builtin:arith?n=5", split="test")[0].id != load_problems("builtin:arith?n=5")[0].id
    with pytest.raises(DataError, match="no option"):
        load_problems("builtin:arith?level=2")
    with pytest.raises(DataError, match="levels 1 to 5"):
        load_problems("builtin:arith?levels=9")


def test_prompt_dataset_has_what_trl_and_rewards_need():
    ds = to_prompt_dataset(builtin_arith("1", n=3))
    row = ds[0]
    assert row["prompt"][0]["role"] == "user" and "\\boxed{}" in row["prompt"][0]["content"]
    assert set(row) >= {"prompt", "answer", "problem_id", "problem"}


# -- the shared data sets, read by path ---------------------------------------------------------------------------


def test_gsm8k_preset_reads_local_files(shared_data):
    test = load_problems("gsm8k", data_dir=shared_data)
    train = load_problems("gsm8k", split="train", data_dir=shared_data)
    assert len(test) == 1319 and len(train) == 7473
    assert all(p.answer.lstrip("-").replace(".", "").isdigit() for p in test)


@pytest.mark.parametrize("name,rows", [("math500", 500), ("aime24", 30), ("amc23", 40)])
def test_benchmark_presets_read_local_files(shared_data, name, rows):
    problems = load_problems(name, data_dir=shared_data)
    assert len(problems) == rows
    assert all(p.problem and p.answer for p in problems)


def test_math_train_preset_reads_the_json_array(shared_data):
    problems = load_problems("math", data_dir=shared_data, limit=50)
    assert len(problems) == 50 and all(p.answer for p in problems)


def test_local_split_that_does_not_exist_is_reported(shared_data):
    with pytest.raises(DataError, match="no local"):
        load_problems("math500", split="train", data_dir=shared_data)


# -- word-problem sets: templates, case-insensitive fields, unit notes, sources (issue 13) ----------------------


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_a_problem_template_keeps_the_body_and_the_question(tmp_path, caplog):
    rows = [
        {
            "ID": "a1",
            "Body": "Ann has 5 pears and eats 2 of them slowly.",
            "Question": "How many are left?",
            "Answer": "3 (pears)",
        }
    ]
    path = _jsonl(tmp_path / "asdiv" / "test.jsonl", rows)
    with caplog.at_level("WARNING"):
        plain = load_problems(str(path))  # without the template only the question survives, and it says so
    assert plain[0].problem == "How many are left?" and "Body" in caplog.text and "--problem-template" in caplog.text
    [p] = load_problems(str(path), problem_template="{body} {QUESTION}")
    assert p.problem == "Ann has 5 pears and eats 2 of them slowly. How many are left?"
    assert p.answer == "3" and p.id == "asdiv-test-a1"  # unit note removed; id from the case-insensitive ID field


def test_a_template_naming_a_missing_field_fails_before_anything_loads(tmp_path):
    path = _jsonl(tmp_path / "set.jsonl", [{"Body": "b", "Answer": "1"}])
    with pytest.raises(DataError, match="Question"):
        load_problems(str(path), problem_template="{Body} {Question}")


def test_sources_are_named_after_their_folder_so_ids_never_collide(tmp_path):
    a = _jsonl(tmp_path / "set_a" / "test.jsonl", [{"problem": "1+1?", "answer": "2"}])
    b = _jsonl(tmp_path / "set_b" / "test.jsonl", [{"problem": "2+2?", "answer": "4"}])
    pa, pb = load_problems(str(a))[0], load_problems(str(b))[0]
    assert (pa.source, pb.source) == ("set_a-test", "set_b-test") and pa.id != pb.id
    named = _jsonl(tmp_path / "x" / "my_set.jsonl", [{"problem": "3+3?", "answer": "6"}])
    assert load_problems(str(named))[0].source == "my_set"


def test_unit_notes_are_removed_only_after_a_number(tmp_path):
    rows = [{"problem": f"q{i}", "answer": a} for i, a in enumerate(["9 (apples)", "f (x)", "(A)", "12"])]
    stats = LoadStats()
    problems = rows_to_problems(rows, "s", stats=stats)
    assert [p.answer for p in problems] == ["9", "f (x)", "(A)", "12"] and stats.unit_notes_removed == 1


@pytest.mark.parametrize(
    "text,specs",
    [
        ("math500", ["math500"]),
        ("math500, aime24,amc23", ["math500", "aime24", "amc23"]),
        ("builtin:arith?levels=1,2&split=test", ["builtin:arith?levels=1,2&split=test"]),
        ("builtin:arith?levels=1,2,3,math500", ["builtin:arith?levels=1,2,3", "math500"]),
        (
            "gsm8k,builtin:arith?levels=1,2,data/x.jsonl,org/name",
            ["gsm8k", "builtin:arith?levels=1,2", "data/x.jsonl", "org/name"],
        ),
        (" , math500,, ", ["math500"]),
    ],
)
def test_comma_separated_specs_keep_commas_inside_a_query(text, specs):
    from lanpo.data.loaders import split_specs

    assert split_specs(text) == specs


def test_held_out_levels_load_through_eval_benchmarks():
    from lanpo.eval.during_training import load_eval_problems

    with pytest.raises(ValueError, match="would log as eval/arith"):  # one would silently replace the other
        load_eval_problems("builtin:arith?levels=1,2&split=test,builtin:arith?split=test", 8)
    problems = load_eval_problems("builtin:arith?levels=1,2&split=test", 128)["arith"]
    assert len(problems) == 128 and {p.source for p in problems} == {"builtin:arith/L1", "builtin:arith/L2"}


# -- round three (issue 37): inputs that used to pass silently ----------------------------------------------------


@pytest.mark.parametrize("answer", [{"value": 5}, [[1, 2]], [{"a": 1}], {"answers": ["5"]}])
def test_an_answer_that_is_an_object_is_skipped_and_its_row_named(tmp_path, caplog, answer):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "\n".join(json.dumps(r) for r in [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": answer}])
        + "\n"
    )
    problems = load_problems(str(path))
    assert [p.answer for p in problems] == ["2"]
    assert "answer is an object" in caplog.text and "row(s) 2" in caplog.text


def test_a_problem_far_longer_than_any_math_problem_is_skipped_and_named(tmp_path, caplog):
    from lanpo.data.loaders import MAX_PROBLEM_CHARS

    path = tmp_path / "rows.jsonl"
    rows = [
        {"problem": "1+1?", "answer": "2"},
        {"problem": "x" * (50 * 2**20), "answer": "3"},
        {"problem": "y" * MAX_PROBLEM_CHARS, "answer": "4"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = load_problems(str(path))
    assert [p.answer for p in problems] == ["2", "4"]  # at the limit: kept
    assert f"longer than {MAX_PROBLEM_CHARS:,}" in caplog.text and "row(s) 2" in caplog.text


def test_bytes_that_are_not_utf8_name_their_file_and_line(tmp_path, caplog):
    lines = tmp_path / "rows.jsonl"
    lines.write_bytes(b'{"problem": "1+1?", "answer": "2"}\n{"problem": "caf\xe9", "answer": "3"}\n')
    assert [p.answer for p in load_problems(str(lines))] == ["2"]
    assert "rows.jsonl:2 is not UTF-8" in caplog.text
    whole = tmp_path / "rows.json"
    whole.write_bytes(b'[{"problem": "1+1?",\n "answer": "caf\xe9"}]')
    with pytest.raises(DataError, match="rows.json is not UTF-8: line 2"):
        load_problems(str(whole))


def _preset_rows(name: str) -> list[dict]:
    """Three rows in the layout a preset's local file has: GSM8K's rationale with ``####``, MATH's problem, answer and
    worked solution, the others their hub's field names."""
    preset = PRESETS[name]
    if preset.answer_format == "gsm8k":
        return [
            {preset.problem_field: f"What is {i} + 3?", preset.answer_field: f"Add <<{i}+3={i + 3}>>.\n#### {i + 3}"}
            for i in range(3)
        ]
    if preset.local_answer_format:  # the local copy stores the final answer beside the worked solution
        return [
            {"problem": f"What is {i} + 3?", "answer": str(i + 3), "solution": f"Add: $\\boxed{{{i + 3}}}$."}
            for i in range(3)
        ]
    return [{preset.problem_field: f"What is {i} + 3?", preset.answer_field: str(i + 3)} for i in range(3)]


@pytest.mark.parametrize("name, split", [(name, split) for name, preset in PRESETS.items() for split in preset.local])
def test_a_presets_file_loaded_by_path_is_read_as_that_preset(tmp_path, name, split):
    local = tmp_path / "data" / PRESETS[name].local[split]
    local.parent.mkdir(parents=True, exist_ok=True)
    rows = _preset_rows(name)
    local.write_text(json.dumps(rows) if local.suffix == ".json" else "".join(json.dumps(r) + "\n" for r in rows))
    by_name = load_problems(name, split=split, data_dir=tmp_path / "data")
    by_path = load_problems(str(local))
    triples = [(p.problem, p.answer, p.solution) for p in by_path]
    assert triples == [(p.problem, p.answer, p.solution) for p in by_name]
    assert [p.answer for p in by_path] == ["3", "4", "5"]  # the final answer, never a rationale


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "gsm8k").is_dir(), reason="../shared/data is not beside the checkout")
def test_the_shared_gsm8k_file_by_path_gives_final_answers_and_rationales():
    by_path = load_problems(str(SHARED / "gsm8k" / "train.jsonl"), limit=50)
    by_name = load_problems("gsm8k", split="train", data_dir=SHARED, limit=50)
    assert [(p.answer, p.solution) for p in by_path] == [(p.answer, p.solution) for p in by_name]
    assert all("####" not in p.answer and "<<" not in (p.solution or "<<") for p in by_path)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.integers(-10_000, 10_000), min_size=1, max_size=5),
    stem=st.text("abcdefghij_-", min_size=1, max_size=12),
)
def test_a_file_written_gsm8k_s_way_under_any_name_is_read_as_gsm8k(tmp_path_factory, values, stem):
    path = tmp_path_factory.mktemp("any") / f"{stem}.jsonl"
    rows = [{"question": f"Q{i}?", "answer": f"Step <<1+1=2>> one.\nThen {v}.\n#### {v}"} for i, v in enumerate(values)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems(str(path))
    assert [p.answer for p in problems] == [str(v) for v in values]
    assert all(p.solution and "####" not in p.solution and "<<" not in p.solution for p in problems)
