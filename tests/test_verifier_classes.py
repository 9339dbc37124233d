"""The reward on real data, class by class: false rejects, false accepts, hedges, hangs (issue 13).

Each table row is one member of a class the verifier once got wrong; the hypothesis properties generate the
class (hedges, echoes, unclosed boxes, huge values, nested LaTeX, long whitespace, unicode, NUL bytes) and
assert no crash, no call over the time limit + 0.5 s, and no wrong answer rewarded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanpo.answers import extract_answer, names_several_values
from lanpo.numbers import numbers_match, to_number
from lanpo.rewards import MathVerifier

LIMIT = 1.0


@pytest.fixture(scope="module")
def strict():
    with MathVerifier(time_limit=LIMIT, extraction="strict") as v:
        yield v


@pytest.fixture(scope="module")
def lenient():
    with MathVerifier(time_limit=LIMIT, extraction="lenient") as v:
        yield v


@pytest.mark.parametrize("gold,completion", [
    ("9 (apples)", "\\boxed{9}"),  # unit note in the gold
    ("3 (dollars)", "so \\boxed{3}"),
    ("4.5e33", "\\boxed{4.5 \\times 10^{33}}"),  # e-notation gold (not Euler's e)
    ("1e-5", "\\boxed{10^{-5}}"),
    ("2.7778e-6", "\\boxed{2.7778 \\times 10^{-6}}"),
    ("4.5e33", "\\boxed{4.5e33}"),
    ("0.6666666667", "\\boxed{0.67}"),  # rounded decimal gold: agree to the shorter precision
    ("0.6666666667", "\\boxed{\\frac{2}{3}}"),
    ("9" * 999, "\\boxed{" + "9" * 999 + "}"),  # huge, but plain
    ("2", "\\boxed{" + "\\frac{1}{" * 20 + "2" + "}" * 20 + "}"),  # 20-deep: 1/(1/(...(1/2))) = 2
    ("−3", "\\boxed{-3}"),  # unicode minus in the gold
    ("7", "\\boxed{７}"),  # fullwidth digit in the answer
])
def test_right_answers_in_other_forms_are_credited(strict, gold, completion):
    start = time.perf_counter()
    assert strict.score_texts([gold], [completion]) == [1.0]
    assert time.perf_counter() - start < LIMIT + 0.5


@pytest.mark.parametrize("gold,completion,mode", [
    ("9", "\\boxed 9, since \\frac{18}{2} is 9", "strict"),  # token box: 9, not the 18 of a later brace
    ("1024", "the answer is 2^{10}", "lenient"),
    ("3\\sqrt{2}", "The answer is $3\\sqrt{2}$.", "lenient"),
    ("5000", "The answer is $5 \\times 10^{3}$.", "lenient"),
    ("4.5e33", "so about 4.5e33 joules", "lenient"),
])
def test_whole_answers_are_extracted(strict, lenient, gold, completion, mode):
    assert (strict if mode == "strict" else lenient).score_texts([gold], [completion]) == [1.0]


@pytest.mark.parametrize("gold,completion,mode", [
    ("18", "\\boxed 9, since \\frac{18}{2}", "strict"),  # the first brace after \boxed is not the box
    ("2", "the answer is 2^{10}", "lenient"),
    ("3", "the answer is 3\\sqrt{2}", "lenient"),
    ("5", "the answer is 5 \\times 10^{3}", "lenient"),
    ("1e-1", "\\boxed{e-1}", "strict"),  # Euler's e in a gold cuts both ways
    ("2.5", "\\boxed{3}", "strict"),
    ("2.7778e-6", "\\boxed{2.7779e-6}", "strict"),
    ("12", "\\boxed{12.0004}", "strict"),
])
def test_wrong_answers_are_not_credited(strict, lenient, gold, completion, mode):
    assert (strict if mode == "strict" else lenient).score_texts([gold], [completion]) == [0.0]


@pytest.mark.parametrize("gold,completion", [
    ("7", "\\boxed{3} no wait \\boxed{5} final \\boxed{7}"),  # several boxed values, the right one last
    ("g", "\\boxed{w = g}"),
    ("g", "\\boxed{w \\lor g}"),
    ("2", "\\boxed{2 \\text{ or } 3}"),
    ("2", "\\boxed{2, 3}"),
    ("1+\\sqrt{2}", "\\boxed{1 \\pm \\sqrt{2}}"),
    ("B", "\\boxed{A \\text{ or } B}"),
])
def test_hedges_score_zero(strict, gold, completion):
    assert strict.score_texts([gold], [completion]) == [0.0]
    assert strict.stats["hedged"] > 0


def test_labelled_and_restated_single_answers_are_not_hedges(strict):
    assert strict.score_texts(["5", "x^2+1", "0.5", "(1,2)", "B"],
                              ["\\boxed{x = 5}", "\\boxed{y = x^2+1}", "\\boxed{\\frac{1}{2} = 0.5}",
                               "\\boxed{(1, 2)}", "\\boxed{\\text{(B)}}"]) == [1.0] * 5


def test_lenient_never_reads_a_number_copied_from_the_problem(lenient):
    problem = "Tom has 3 apples and buys 4 more. He then counts 12 pears. How many apples does he have, 7?"
    echo = f"Let me restate: {problem}"
    assert lenient.score_texts(["7", "12"], [echo, echo], [problem, problem]) == [0.0, 0.0]
    assert lenient.score_texts(["7"], [echo + " So he has 7."], [problem]) == [1.0]


def test_long_whitespace_and_huge_inputs_stay_inside_the_limit(lenient):
    texts = ["the answer is" + " " * 100_000 + "x", "answer" + " \t" * 50_000 + ":", "{" * 100_000,
             "\\boxed{" * 30_000, "1," * 50_000, "answer is " * 20_000]
    for text in texts:
        start = time.perf_counter()
        lenient.score_texts(["1"], [text])
        assert time.perf_counter() - start < LIMIT + 0.5, text[:30]


def test_numbers_match_policy():
    assert numbers_match("0.5", "1/2") and numbers_match("1,234", "1234") and numbers_match("7", "7.0")
    assert numbers_match("0.333", "\\frac{1}{3}") and not numbers_match("0.5", "0.51")
    assert not numbers_match("7", "7.3") and numbers_match("x", "1") is None and numbers_match("10\\%", "10") is None
    assert to_number("1e99999") is None  # a huge exponent is left to math-verify, inside its time limit


def test_a_script_without_a_main_guard_gets_a_clear_message(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text("from lanpo.rewards import MathVerifier\n"
                      "v = MathVerifier(start_method='spawn', workers=1)\n"
                      "print(v.score(['1'], ['\\\\sqrt{1}']))\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "__main__" in result.stderr and "EOFError" not in result.stderr.splitlines()[-1]


# -- properties ------------------------------------------------------------------------------------------------

golds = st.one_of(st.integers(-10**6, 10**6).map(str),
                  st.fractions(max_denominator=50).filter(lambda f: f.denominator > 1).map(
                      lambda f: f"\\frac{{{f.numerator}}}{{{f.denominator}}}"),
                  st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(str))


def _wrong(gold: str, delta: int) -> str:
    value = to_number(gold)
    return str(value + delta) if value.denominator == 1 else f"\\frac{{{(value + delta).numerator}}}" \
        f"{{{(value + delta).denominator}}}"


noise = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="0123456789"), max_size=200)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gold=golds, delta=st.integers(1, 1000), pad=noise, kind=st.sampled_from(
    ["several_boxes", "or", "comma", "equals", "lor", "pm", "unclosed", "wrong", "answer_is_or"]))
def test_no_hedge_or_wrong_answer_is_rewarded(strict, lenient, gold, delta, pad, kind):
    wrong = _wrong(gold, delta)
    completion = {
        "several_boxes": f"\\boxed{{{wrong}}} {pad} \\boxed{{{gold}}}",
        "or": f"{pad}\\boxed{{{gold} \\text{{ or }} {wrong}}}",
        "comma": f"\\boxed{{{wrong}, {gold}}}{pad}",
        "equals": f"\\boxed{{{wrong} = {gold}}}",
        "lor": f"\\boxed{{{gold} \\lor {wrong}}}",
        "pm": f"\\boxed{{{gold} \\pm {wrong}}}",
        "unclosed": f"{pad} \\boxed{{{gold}",
        "wrong": f"{pad} \\boxed{{{wrong}}}",
        "answer_is_or": f"{pad} the answer is {gold} or {wrong}.",
    }[kind]
    for verifier in (strict, lenient):
        start = time.perf_counter()
        assert verifier.score_texts([gold], [completion]) == [0.0], (kind, completion)
        assert time.perf_counter() - start < LIMIT + 0.5


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=3000), junk=st.sampled_from(["\x00", "\u2212", "\ufeff", "{", "}", "\\boxed", "$",
                                                          " " * 500, "\\frac{", "１２", "e-"]))
def test_arbitrary_text_never_crashes_and_never_earns_an_absent_answer(lenient, text, junk):
    gold = "987654321"  # not in the text's digits unless hypothesis writes it: then it may be credited
    completion = junk.join([text, text[::-1], ""])
    start = time.perf_counter()
    [score] = lenient.score_texts([gold], [completion])
    assert time.perf_counter() - start < LIMIT + 0.5
    assert score == 0.0 or gold in completion.translate({0xFF10 + i: str(i) for i in range(10)})
    extract_answer(completion, "strict")


@settings(max_examples=100, deadline=None)
@given(st.fractions(max_denominator=1000), st.integers(-40, 40))
def test_a_value_written_in_scientific_notation_matches_itself(value, exponent):
    mantissa = Fraction(value.numerator % 1000 + 1, 100)
    gold = f"{float(mantissa):.2f}e{exponent}"
    assert numbers_match(gold, f"{float(mantissa):.2f} \\times 10^{{{exponent}}}")
    assert names_several_values(f"{gold}, 123456789", gold)  # a second, different value: a hedge
