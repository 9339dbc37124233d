"""The math verifier: extraction, checking, time limits, and the TRL reward function."""

from __future__ import annotations

import time

import pytest

from lanpo.verify.answers import extract_answer
from lanpo.verify.rewards import MathVerifier, make_accuracy_reward, prepare_gold


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(time_limit=2.0) as v:
        yield v


@pytest.mark.parametrize(
    "text,mode,expected",
    [
        ("so \\boxed{7}.", "boxed", "7"),
        ("first \\boxed{3} then \\boxed{\\frac{1}{2}}", "boxed", None),  # several boxed values: a hedge
        ("The answer is 12.", "boxed", None),
        ("The answer is 12.", "lenient", "12"),
        ("Final answer: -3.5", "lenient", "-3.5"),
        ("we get 2, then 1,234 apples", "lenient", "1234"),
        ("3 + 4 = 7 and 2,", "lenient", "2"),
        ("#### 56", "lenient", "56"),
        ("no numbers at all", "lenient", None),
        ("\\boxed{9} beats a later 10", "lenient", "9"),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


@pytest.mark.parametrize(
    "gold,pred",
    [
        ("18", "18"),
        ("18", "18.0"),
        ("1,000", "1000"),
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "\\dfrac{1}{2}"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
    ],
)
def test_equivalent_answers_score_one(verifier, gold, pred):
    assert verifier.score([gold], [pred]) == [1.0]


@pytest.mark.parametrize("gold,pred", [("18", "19"), ("\\frac{1}{2}", "\\frac{1}{3}"), ("5", "x"), ("5", None)])
def test_different_answers_score_zero(verifier, gold, pred):
    assert verifier.score([gold], [pred]) == [0.0]


def test_bare_latex_gold_is_wrapped():
    assert prepare_gold("\\frac{1}{2}") == "$\\frac{1}{2}$"
    assert prepare_gold("\\boxed{3}") == "\\boxed{3}"


@pytest.mark.alone
def test_pathological_answers_score_zero_within_the_limit_and_are_counted():
    with MathVerifier(time_limit=1.0, workers=1) as v:
        patho = ["10^{10^{10}}", "(" * 400 + "1" + ")" * 400, "1" * 100_000]
        start = time.monotonic()
        scores = v.score(["72"] * len(patho), patho)
        elapsed = time.monotonic() - start
        assert scores == [0.0, 0.0, 0.0]
        assert v.stats["too_long"] == 1
        assert v.stats["timeouts"] + sum(n for k, n in v.stats.items() if k.startswith("error:")) == 2
        # one answer at a time on one worker: never more than the limit each, plus restart slack
        assert elapsed < 2 * 1.0 + 3.0
        # the verifier still works after its worker was killed
        assert v.score(["4"], ["4.0"]) == [1.0]


def test_batch_scoring_keeps_order(verifier):
    golds = [str(i) for i in range(50)]
    preds = [str(i if i % 3 else i + 1) for i in range(50)]
    assert verifier.score(golds, preds) == [0.0 if i % 3 == 0 else 1.0 for i in range(50)]


def test_score_texts_uses_the_extraction_mode():
    with MathVerifier(extraction="boxed") as strict, MathVerifier(extraction="lenient") as lenient:
        texts = ["the answer is 5", "\\boxed{5}"]
        assert strict.score_texts(["5", "5"], texts) == [0.0, 1.0]
        assert lenient.score_texts(["5", "5"], texts) == [1.0, 1.0]
        assert strict.stats["no_answer"] == 1


def test_trl_reward_function_accepts_conversational_completions(verifier):
    reward = make_accuracy_reward(verifier)
    logged = {}
    completions = [[{"role": "assistant", "content": "\\boxed{3}"}], [{"role": "assistant", "content": "no"}]]
    scores = reward(
        prompts=None, completions=completions, answer=["3", "3"], log_metric=lambda k, v: logged.setdefault(k, v)
    )
    assert scores == [1.0, 0.0]
    assert reward.__name__ == "accuracy"
    assert logged["verifier/no_answer_rate"] == 0.5


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="time_limit"):
        MathVerifier(time_limit=0)
    with pytest.raises(ValueError, match="extraction"):
        MathVerifier(extraction="fuzzy")


def test_gsm8k_gold_rationales_verify(shared_data):
    import json

    rows = [json.loads(line) for line in (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines()]
    golds = [r["answer"].rsplit("####", 1)[1].strip() for r in rows]
    with MathVerifier(extraction="lenient") as v:  # rationales end in "#### N", not a box
        right = v.score_texts(golds, [r["answer"] for r in rows])
        wrong = v.score(golds, [str(int(g.replace(",", "")) + 1) for g in golds])
    assert sum(right) / len(rows) >= 0.995
    assert 1 - sum(wrong) / len(rows) >= 0.99


def test_math500_gold_solutions_verify(shared_data):
    import json

    rows = [json.loads(line) for line in (shared_data / "math500" / "test.jsonl").read_text().splitlines()]
    with MathVerifier(extraction="boxed", time_limit=5.0) as v:
        scores = v.score_texts([r["answer"] for r in rows], [r["solution"] for r in rows])
    assert sum(scores) / len(rows) >= 0.99


def test_worker_start_up_never_counts_against_the_time_limit():
    # spawn workers re-import math-verify and sympy (seconds); the limit covers only the verification itself
    with MathVerifier(time_limit=0.5, workers=1, start_method="spawn") as v:
        assert v.score(["18", "\\frac{1}{2}"], ["18.0", "0.5"]) == [1.0, 1.0]
        assert v.stats["timeouts"] == 0


@pytest.mark.parametrize("reader", ["find_answer", "read_alike"])
def test_a_reader_that_fails_costs_its_answer_never_the_batch(monkeypatch, caplog, reader):
    """Whatever bug one of lanpo's own answer readers has next (an evaluation once died of ``empty separator``
    72 minutes into a run), it scores that output 0, counts it, warns once with the text, and the others in the
    batch are scored as before."""
    import lanpo.verify.rewards as rewards

    real = getattr(rewards, reader)

    def failing(*args, **kwargs):
        if any("poison" in str(a) for a in args):
            raise ValueError("empty separator")
        return real(*args, **kwargs)

    monkeypatch.setattr(rewards, reader, failing)
    with MathVerifier(time_limit=2.0, extraction="lenient") as v, caplog.at_level("WARNING", logger=rewards.__name__):
        golds = ["7", "7", "7"]
        texts = ["so \\boxed{7}", "poison \\boxed{7} poison", "so \\boxed{8}"]
        if reader == "read_alike":
            assert v.score(golds, ["7", "7 poison", "8"]) == [1.0, 0.0, 0.0]
            assert v.score(golds, ["7 poison", "7", "7 poison"]) == [0.0, 1.0, 0.0]
        else:
            assert v.score_texts(golds, texts) == [1.0, 0.0, 0.0]
            assert v.score_texts(golds, [texts[1], texts[0], texts[1]]) == [0.0, 1.0, 0.0]
        assert v.stats["unreadable:ValueError"] == 3
        logged = {}
        reward = make_accuracy_reward(v)(texts, answer=golds, log_metric=logged.__setitem__)
        assert reward == ([1.0, 0.0, 0.0] if reader == "find_answer" else [1.0, 1.0, 0.0])
        assert logged["verifier/unreadable"] == (1.0 if reader == "find_answer" else 0.0)
    warnings = [r for r in caplog.records if "answer reader failed" in r.getMessage()]
    assert len(warnings) == 1 and "poison" in warnings[0].getMessage()


def test_find_answer_reads_a_reader_bug_as_unreadable_and_logs_it_once(monkeypatch, caplog):
    """The teacher, the pool's summaries, the gate and evaluations call ``find_answer`` on model text too: a bug
    below it gives ``(None, "unreadable")`` and one warning per kind of error, and the reward counts it."""
    import lanpo.verify.answers as answers

    def broken(text, mode, problem):
        if "poison" in text:
            raise IndexError("a reader bug")
        return "7", ""

    monkeypatch.setattr(answers, "_find_answer", broken)
    monkeypatch.setattr(answers, "_UNREADABLE_SEEN", set())
    with caplog.at_level("WARNING", logger=answers.__name__):
        assert answers.find_answer("poison 1", "lenient") == (None, "unreadable")
        assert answers.find_answer("poison 2", "strict") == (None, "unreadable")
        assert answers.find_answer("fine", "strict") == ("7", "")
        assert extract_answer("poison", "lenient") is None
    assert [r.getMessage().count("poison 1") for r in caplog.records if "reader failed" in r.getMessage()] == [1]
    with MathVerifier(time_limit=2.0, extraction="lenient") as v:
        assert v.score_texts(["7", "7"], ["poison", "fine"]) == [0.0, 1.0]
        assert v.stats["unreadable:find_answer"] == 1
