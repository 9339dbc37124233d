"""Zero-shot evaluation end to end, and the metrics it reports."""

from __future__ import annotations

import json
import math

import pytest

from lanpo.cli import main
from lanpo.engine.generation import Sample
from lanpo.eval.evaluate import pass_at_k, summarize_scores


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 0, 1, 0.0),
        (4, 4, 1, 1.0),
        (4, 1, 1, 0.25),
        (4, 1, 4, 1.0),
        (4, 1, 2, 0.5),
        (5, 2, 2, 1 - (3 * 2) / (5 * 4)),
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),
    ],
)
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
    code = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(problems_file),
            "--problem-field",
            "q",
            "--answer-field",
            "sol",
            "--k",
            "2",
            "--max-new-tokens",
            "6",
            "--batch-size",
            "3",
            "--out",
            str(out),
        ]
    )
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


# -- LANPO's inference modes ------------------------------------------------------------------------------------


def _stub_pool(tmp_path, problems):
    """A run directory with a pool: one entry per problem, plus one entry whose text equals an eval problem."""
    from lanpo.pool.store import ExperiencePool, PoolEntry

    run = tmp_path / "pool-run"
    with ExperiencePool(run) as pool:
        pool.add(
            [
                PoolEntry(
                    problem_id=f"train-{i}",
                    problem=f"What is {i} + {i + 1}?",
                    flow_of_thought="add",
                    principles=["add the ones digits first", "write the sum in a box"],
                    pitfalls=["forgetting to carry"],
                )
                for i in range(6)
            ]
        )
        pool.add(
            [
                PoolEntry(
                    problem_id="other-id",
                    problem=problems[0]["q"],
                    flow_of_thought="",
                    principles=["SECRET LESSON OF THE SAME PROBLEM"],
                    pitfalls=[],
                )
            ]
        )
    (run / "config.json").write_text(
        json.dumps(
            {"relevance_scorer": "bm25", "relevance_threshold": 0.0, "retrieval_top_k": 2, "retrieval_candidates": 8}
        )
    )
    return run


def test_all_three_modes_end_to_end_on_a_tiny_model(tiny_model_dir, problems_file, tmp_path):
    rows = [json.loads(x) for x in problems_file.read_text().splitlines()]
    run = _stub_pool(tmp_path, rows)
    out = tmp_path / "modes"
    code = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(problems_file),
            "--problem-field",
            "q",
            "--answer-field",
            "sol",
            "--k",
            "2",
            "--max-new-tokens",
            "5",
            "--modes",
            "zero-shot,retrieval,self-correct",
            "--pool",
            str(run),
            "--rounds",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["modes"]) == {"zero-shot", "retrieval", "self-correct"}
    assert results["retrieval"]["scorer"] == "bm25" and results["retrieval"]["top_k"] == 2
    retrieval = [json.loads(x) for x in (out / "completions-retrieval.jsonl").read_text().splitlines()]
    assert results["modes"]["retrieval"]["metrics"]["context_rate"] > 0
    same = next(r for r in retrieval if r["problem"] == rows[0]["q"])
    assert "SECRET LESSON" not in same["prompt"]  # never the problem's own entries, even under another id
    assert results["modes"]["retrieval"]["same_problem_entries_excluded"] >= 1
    assert any("add the ones digits first" in r["prompt"] for r in retrieval)
    correct = [json.loads(x) for x in (out / "completions-self-correct.jsonl").read_text().splitlines()]
    assert all(len(chain) == 3 for r in correct for chain in r["rounds"])  # attempt + 2 reflection rounds
    metrics = results["modes"]["self-correct"]["metrics"]
    assert {"mean@2_round0", "mean@2_round1", "mean@2_round2"} <= set(metrics)
    assert metrics["mean@2"] == metrics["mean@2_round2"]  # the last round is the one scored
    from helpers.audit import leakage_problems

    for record in correct:  # the reflection prompt shows the model's own attempt, never the answer or a grade
        attempts = [step["text"] for chain in record["rounds"] for step in chain]
        assert "Earlier attempt" in record["prompt"]
        assert not leakage_problems(record["prompt"], record["answer"], [record["problem"], *attempts])
    assert "context on" in (out / "results.md").read_text()


def test_retrieval_mode_needs_a_pool(capsys):
    assert main(["eval", "--modes", "retrieval"]) == 2
    assert "--pool" in capsys.readouterr().err


def test_benchmark_registry_reads_local_files(tiny_model_dir, shared_data, tmp_path):
    out = tmp_path / "bench"
    assert (
        main(
            [
                "eval",
                "--model",
                str(tiny_model_dir),
                "--benchmarks",
                "math500,amc23",
                "--data-dir",
                str(shared_data),
                "--limit",
                "2",
                "--k",
                "1",
                "--max-new-tokens",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    for name in ("math500", "amc23"):
        results = json.loads((out / name / "results.json").read_text())
        assert results["data"] == name and results["modes"]["zero-shot"]["metrics"]["problems"] == 2


def test_compare_writes_table_and_plot(tmp_path):
    from lanpo.report.compare import compare

    runs = []
    for name, share in (("grpo", 0.0), ("lanpo", 0.75)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"feedback_ratio": share}))
        lines = [
            {
                "step": s,
                "accuracy/scratch/mean": 0.1 * s,
                "reward/scratch/mean": 0.1 * s,
                "lanpo/pool_size": 2 * s,
                **({"reward/feedback/mean": 0.2 * s} if share else {}),
            }
            for s in range(1, 6)
        ]
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n{broken\n")
        (run / "eval-after").mkdir()
        (run / "eval-after" / "results.json").write_text(
            json.dumps({"modes": {"zero-shot": {"metrics": {"mean@2": 0.5, "mean@2_stderr": 0.1}}}})
        )
        runs.append(str(run))
    md = compare(runs, tmp_path / "cmp")
    text = md.read_text()
    assert (
        "| grpo | 5 | 0.0 |" in text
        and "| lanpo | 5 | 0.75 |" in text
        and "eval-after/zero-shot" in text
        and "0.500" in text
    )
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000


def test_self_correct_with_an_empty_first_attempt_makes_a_fresh_attempt(monkeypatch):
    import lanpo.eval.evaluate as ev
    from lanpo.data.loaders import Problem

    calls = []

    def fake_generate(model, tokenizer, prompts, n=1, **kwargs):
        calls.append([p[-1]["content"] for p in prompts])
        text = "" if len(calls) == 1 else "\\boxed{2}"  # the first round writes nothing at all
        return [[Sample(text, 0 if not text else 3, False) for _ in range(n)] for _ in prompts]

    monkeypatch.setattr(ev, "generate", fake_generate)
    settings = ev.EvalSettings(k=2, rounds=1)
    with ev.Verifier(ev.MathVerifier()) as verifier:
        result = ev.run_self_correct(None, None, [Problem("p", "What is 1 + 1?", "2")], settings, verifier)
    assert result.metrics["reflection_fallbacks"] == 2 and result.metrics["mean@2"] == 1.0
    assert all("Earlier attempt" not in prompt for prompt in calls[1])  # nothing to reflect on: the plain prompt
