"""Zero-shot evaluation end to end, and the metrics it reports."""

from __future__ import annotations

import json
import math

import pytest

from lanpo.cli import main
from lanpo.evaluate import pass_at_k, summarize_scores
from lanpo.generation import Sample


@pytest.mark.parametrize("n,c,k,expected", [
    (4, 0, 1, 0.0), (4, 4, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 4, 1.0), (4, 1, 2, 0.5),
    (5, 2, 2, 1 - (3 * 2) / (5 * 4)), (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
])
def test_pass_at_k_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_summary_metrics_by_hand():
    scores = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    samples = [[Sample("a", 10, False), Sample("b", 20, True)]] * 3
    m = summarize_scores(scores, samples)
    assert m["mean@2"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx(2 / 3)
    assert m["pass@1"] == pytest.approx(0.5)
    assert m["mean_length"] == 15 and m["truncation_rate"] == 0.5
    assert m["mean@2_stderr"] == pytest.approx(0.5 / math.sqrt(3))


def test_eval_cli_end_to_end_on_a_tiny_model(tiny_model_dir, problems_file, tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(tiny_model_dir), "--data", str(problems_file), "--problem-field", "q",
                 "--answer-field", "sol", "--k", "2",
                 "--max-new-tokens", "6", "--batch-size", "3", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    metrics = results["modes"]["zero-shot"]["metrics"]
    assert metrics["problems"] == 4 and metrics["samples"] == 8
    assert 0.0 <= metrics["mean@2"] <= 1.0
    assert results["settings"]["k"] == 2 and "boxed" in results["prompt"]["instruction"]
    records = [json.loads(line) for line in (out / "completions-zero-shot.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(len(r["completions"]) == 2 for r in records)
    assert "mean@2" in (out / "results.md").read_text()
    assert "mean@2" in capsys.readouterr().out


def test_eval_cli_reports_bad_data_without_a_traceback(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err
