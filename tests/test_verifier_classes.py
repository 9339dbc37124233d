"""The reward on real data, class by class: false rejects, false accepts, hedges, hangs (issue 13).

Each table row is one member of a class the verifier once got wrong; the hypothesis properties generate the
class (hedges, echoes, unclosed boxes, huge values, nested LaTeX, long whitespace, unicode, NUL bytes) and
assert no crash and no wrong answer rewarded. The tests marked `alone` also hold every call to the time limit + 0.5 s
(wall clock: `make test` runs them with the machine to themselves); the others check what is read, beside the rest of
the suite, with a limit no load reaches.
"""

from __future__ import annotations

import subprocess
import sys
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanpo.verify.answers import extract_answer, find_answer, gold_answer, names_several_values, read_alike
from lanpo.verify.numerals import numbers_match, to_number
from lanpo.verify.rewards import MathVerifier

LIMIT = 1.0  # the time limit the tests marked `alone` hold each call to (wall clock, the machine to themselves)
READING_LIMIT = 30.0  # what the reading tests give an answer: they check what is read, beside other tests' load


def _verifier(time_limit: float, extraction: str):
    """A module's verifier fixture: one ``MathVerifier`` (its worker processes) shared by the module's tests."""

    @pytest.fixture(scope="module")
    def verifier():
        with MathVerifier(time_limit=time_limit, extraction=extraction) as shared:
            yield shared

    return verifier


strict, lenient = _verifier(READING_LIMIT, "strict"), _verifier(READING_LIMIT, "lenient")
timed_strict, timed_lenient = _verifier(LIMIT, "strict"), _verifier(LIMIT, "lenient")


@pytest.mark.parametrize(
    "gold,completion",
    [
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
    ],
)
@pytest.mark.alone
def test_right_answers_in_other_forms_are_credited(timed_strict, gold, completion):
    start = time.perf_counter()
    assert timed_strict.score_texts([gold], [completion]) == [1.0]
    assert time.perf_counter() - start < LIMIT + 0.5


@pytest.mark.parametrize(
    "gold,completion,mode",
    [
        ("9", "\\boxed 9, since \\frac{18}{2} is 9", "strict"),  # token box: 9, not the 18 of a later brace
        ("1024", "the answer is 2^{10}", "lenient"),
        ("3\\sqrt{2}", "The answer is $3\\sqrt{2}$.", "lenient"),
        ("5000", "The answer is $5 \\times 10^{3}$.", "lenient"),
        ("4.5e33", "so about 4.5e33 joules", "lenient"),
    ],
)
def test_whole_answers_are_extracted(strict, lenient, gold, completion, mode):
    assert (strict if mode == "strict" else lenient).score_texts([gold], [completion]) == [1.0]


@pytest.mark.parametrize(
    "gold,completion,mode",
    [
        ("18", "\\boxed 9, since \\frac{18}{2}", "strict"),  # the first brace after \boxed is not the box
        ("2", "the answer is 2^{10}", "lenient"),
        ("3", "the answer is 3\\sqrt{2}", "lenient"),
        ("5", "the answer is 5 \\times 10^{3}", "lenient"),
        ("1e-1", "\\boxed{e-1}", "strict"),  # Euler's e in a gold cuts both ways
        ("2.5", "\\boxed{3}", "strict"),
        ("2.7778e-6", "\\boxed{2.7779e-6}", "strict"),
        ("12", "\\boxed{12.0004}", "strict"),
    ],
)
def test_wrong_answers_are_not_credited(strict, lenient, gold, completion, mode):
    assert (strict if mode == "strict" else lenient).score_texts([gold], [completion]) == [0.0]


@pytest.mark.parametrize(
    "gold,completion",
    [
        ("7", "\\boxed{3} no wait \\boxed{5} final \\boxed{7}"),  # several boxed values, the right one last
        ("g", "\\boxed{w = g}"),
        ("g", "\\boxed{w \\lor g}"),
        ("2", "\\boxed{2 \\text{ or } 3}"),
        ("2", "\\boxed{2, 3}"),
        ("1+\\sqrt{2}", "\\boxed{1 \\pm \\sqrt{2}}"),
        ("B", "\\boxed{A \\text{ or } B}"),
        ("1, 2", "\\boxed{2,2} or maybe \\boxed{1,2}"),  # boxes that are lists are not one value a box
        ("f(4 - x)", "\\boxed{f(5 - x) = f(4 - x)}"),  # a label-shaped gold: the left side is a second value
        ("n", "\\boxed{m = n}"),
        ("11", "\\boxed{x = 5 + 5 + 1 = 7 = 11}"),  # a chain whose steps disagree
        ("2", "\\boxed{2, 3, 2}"),
    ],
)
def test_hedges_score_zero(strict, gold, completion):
    assert strict.score_texts([gold], [completion]) == [0.0]
    assert strict.stats["hedged"] > 0


@pytest.mark.parametrize(
    "gold,completion,mode,expected",
    [
        ("(5, 8)", "\\boxed{(x, y) = (5, 8)}", "strict", 1.0),  # labels wider than one letter
        ("5", "\\boxed{AB = 5}", "strict", 1.0),
        ("5", "\\boxed{f(2) = 5}", "strict", 1.0),
        ("30", "\\boxed{\\angle ABC = 30^\\circ}", "strict", 1.0),
        ("2", "\\boxed{2, 2}", "strict", 1.0),  # a repeated value is one value
        ("32349", "\\boxed{32,\\! 349}", "strict", 1.0),  # thin-space grouping
        ("500", "\\boxed{0,500}", "strict", 0.0),  # a first group of 0 does not group thousands
        ("111", "\\boxed{0,111}", "strict", 0.0),
        ("2, 3", "the roots are \\boxed{2} and \\boxed{3}", "strict", 1.0),  # a box per value of a list gold
        ("11", "\\boxed{x = 5 + 5 + 1 = 11}", "strict", 1.0),  # a consistent chain
        ("9", "so $\\frac{10}{9}$", "lenient", 0.0),  # the fallback reads no piece of an expression
        ("1", "so we have (9+1)", "lenient", 0.0),
        ("2", "so $\\frac{1+\\sqrt5}{2}$", "lenient", 0.0),
    ],
)
def test_the_issue_36_examples(strict, lenient, gold, completion, mode, expected):
    assert (strict if mode == "strict" else lenient).score_texts([gold], [completion]) == [expected]


def test_labelled_and_restated_single_answers_are_not_hedges(strict):
    assert (
        strict.score_texts(
            ["5", "x^2+1", "0.5", "(1,2)", "B"],
            [
                "\\boxed{x = 5}",
                "\\boxed{y = x^2+1}",
                "\\boxed{\\frac{1}{2} = 0.5}",
                "\\boxed{(1, 2)}",
                "\\boxed{\\text{(B)}}",
            ],
        )
        == [1.0] * 5
    )


def test_lenient_never_reads_a_number_copied_from_the_problem(lenient):
    problem = "Tom has 3 apples and buys 4 more. He then counts 12 pears. How many apples does he have, 7?"
    echo = f"Let me restate: {problem}"
    assert lenient.score_texts(["7", "12"], [echo, echo], [problem, problem]) == [0.0, 0.0]
    assert lenient.score_texts(["7"], [echo + " So he has 7."], [problem]) == [1.0]


@pytest.mark.alone
def test_long_whitespace_and_huge_inputs_stay_inside_the_limit(timed_lenient):
    texts = [
        "the answer is" + " " * 100_000 + "x",
        "answer" + " \t" * 50_000 + ":",
        "{" * 100_000,
        "\\boxed{" * 30_000,
        "1," * 50_000,
        "answer is " * 20_000,
    ]
    for text in texts:
        start = time.perf_counter()
        timed_lenient.score_texts(["1"], [text])
        assert time.perf_counter() - start < LIMIT + 0.5, text[:30]


def test_numbers_match_policy():
    assert numbers_match("0.5", "1/2") and numbers_match("1,234", "1234") and numbers_match("7", "7.0")
    assert numbers_match("0.333", "\\frac{1}{3}") and not numbers_match("0.5", "0.51")
    assert not numbers_match("7", "7.3") and numbers_match("x", "1") is None and numbers_match("10\\%", "10") is None
    assert to_number("1e99999") is None  # a huge exponent is left to math-verify, inside its time limit


def test_a_script_without_a_main_guard_gets_a_clear_message(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(
        "from lanpo.verify.rewards import MathVerifier\n"
        "v = MathVerifier(start_method='spawn', workers=1)\n"
        "print(v.score(['1'], ['\\\\sqrt{1}']))\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "__main__" in result.stderr and "EOFError" not in result.stderr.splitlines()[-1]


# -- properties ------------------------------------------------------------------------------------------------

golds = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.fractions(max_denominator=50)
    .filter(lambda f: f.denominator > 1)
    .map(lambda f: f"\\frac{{{f.numerator}}}{{{f.denominator}}}"),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(str),
)


def _wrong(gold: str, delta: int) -> str:
    value = to_number(gold)
    return (
        str(value + delta)
        if value.denominator == 1
        else f"\\frac{{{(value + delta).numerator}}}{{{(value + delta).denominator}}}"
    )


noise = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="0123456789"), max_size=200)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gold=golds,
    delta=st.integers(1, 1000),
    pad=noise,
    kind=st.sampled_from(["several_boxes", "or", "comma", "equals", "lor", "pm", "unclosed", "wrong", "answer_is_or"]),
)
@pytest.mark.alone
def test_no_hedge_or_wrong_answer_is_rewarded(timed_strict, timed_lenient, gold, delta, pad, kind):
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
    for verifier in (timed_strict, timed_lenient):
        start = time.perf_counter()
        assert verifier.score_texts([gold], [completion]) == [0.0], (kind, completion)
        assert time.perf_counter() - start < LIMIT + 0.5


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(max_size=3000),
    junk=st.sampled_from(["\x00", "\u2212", "\ufeff", "{", "}", "\\boxed", "$", " " * 500, "\\frac{", "１２", "e-"]),
)
@pytest.mark.alone
def test_arbitrary_text_never_crashes_and_never_earns_an_absent_answer(timed_lenient, text, junk):
    gold = "987654321"  # not in the text's digits unless hypothesis writes it: then it may be credited
    completion = junk.join([text, text[::-1], ""])
    start = time.perf_counter()
    [score] = timed_lenient.score_texts([gold], [completion])
    assert time.perf_counter() - start < LIMIT + 0.5
    assert score == 0.0 or gold in completion.translate({0xFF10 + i: str(i) for i in range(10)})
    extract_answer(completion, "strict")


BOX_PIECES = [
    "\\boxed{",
    "\\fbox{",
    "\\boxed ",
    "{",
    "}",
    "}",
    "",
    " ",
    "3",
    "12",
    "-1",
    "x = 2",
    "\\frac{1}{2}",
    ", ",
    " and ",
    " or ",
    "; ",
    "\\quad",
    "\\text{ and }",
    "The answer is ",
    " no wait ",
    "\n",
    "$",
    "\\pm",
    "####",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.sampled_from(BOX_PIECES), max_size=24), gold=st.sampled_from(["3", "2, 3", "x = 2"]))
def test_texts_made_of_boxes_never_crash_any_reader(lenient, pieces, gold):
    """The class behind the crash a grid evaluation met (``empty separator`` in the rule that reads several boxes
    as one list: a box with nothing in it beside another box): texts made of boxes, empty and nested and unclosed, with
    separators and prose between, go through every reader of model text (both extractions, the reader of a
    stated answer, the gold's reader, the rule that brings both sides to one form, and the reward itself)
    without an exception, as answers or as golds."""
    text = "".join(pieces)
    for mode in ("strict", "lenient"):
        assert find_answer(text, mode, "What is 1 + 2?")[1] != "unreadable"  # its guard caught no reader bug
        assert find_answer(text, mode)[1] != "unreadable"
    gold_answer(text)
    read_alike(gold, text)
    read_alike(text, gold)
    [score] = lenient.score_texts([gold], [text])
    assert score in (0.0, 1.0)
    assert lenient.score_texts([text], [gold]) in ([0.0], [1.0])


def test_an_empty_box_states_nothing_and_the_other_box_is_the_answer(strict):
    """``\\boxed{}`` beside a box was an ``empty separator`` crash; now it is read as no box at all."""
    for text in ("\\boxed{} and \\boxed{3}", "\\boxed{ }, \\boxed{3}", "so \\boxed{3}. \\boxed{}"):
        assert gold_answer(text) == "3"
        assert strict.score_texts(["3"], [text]) == [1.0]
        assert strict.score_texts([text], ["\\boxed{3}"]) == [1.0]
    assert strict.score_texts(["3"], ["\\boxed{} + \\boxed{}"]) == [0.0]


@settings(max_examples=100, deadline=None)
@given(st.fractions(max_denominator=1000), st.integers(-40, 40))
def test_a_value_written_in_scientific_notation_matches_itself(value, exponent):
    mantissa = Fraction(value.numerator % 1000 + 1, 100)
    gold = f"{float(mantissa):.2f}e{exponent}"
    assert numbers_match(gold, f"{float(mantissa):.2f} \\times 10^{{{exponent}}}")
    assert names_several_values(f"{gold}, 123456789", gold)  # a second, different value: a hedge


# -- round three (issue 36): each class generated, right answers credited and wrong ones not ----------------------

integers = st.integers(-(10**6), 10**6)
label_names = st.one_of(
    st.text(alphabet="ABCDEFGHPQRS", min_size=2, max_size=3),  # segments: AB, PQR
    st.builds(lambda f, k: f"{f}({k})", st.sampled_from(["f", "g", "h", "P", "T"]), st.integers(0, 99)),
    st.builds(lambda abc: f"\\angle {abc}", st.text(alphabet="ABCDEFGH", min_size=3, max_size=3)),
    st.builds(lambda s, k: f"{s}_{{{k}}}", st.sampled_from(["S", "a", "x"]), st.integers(0, 99)),
    st.sampled_from(["x", "y", "n", "m", "k"]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(label=label_names, gold=integers, delta=st.integers(1, 1000))
def test_a_label_of_any_width_before_the_value_is_not_a_value(strict, label, gold, delta):
    assert strict.score_texts([str(gold)], [f"\\boxed{{{label} = {gold}}}"]) == [1.0]
    assert strict.score_texts([str(gold)], [f"\\boxed{{{label} = {gold + delta}}}"]) == [0.0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=integers, b=integers, delta=st.integers(1, 1000))
def test_a_tuple_label_before_a_tuple_value(strict, a, b, delta):
    gold = f"({a}, {b})"
    assert strict.score_texts([gold], [f"\\boxed{{(x, y) = ({a}, {b})}}"]) == [1.0]
    assert strict.score_texts([gold], [f"\\boxed{{(x, y) = ({a}, {b + delta})}}"]) == [0.0]


def _expression_for(value: int, parts: list[int], kind: str) -> str:
    """An arithmetic expression equal to ``value`` built from ``parts``."""
    if kind == "sum":
        return " + ".join(map(str, parts)) + f" + {value - sum(parts)}"
    if kind == "product":
        return f"{parts[0]} \\times {value} - {parts[0] - 1} \\cdot {value}"
    return f"\\frac{{{2 * value}}}{{2}}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gold=st.integers(-(10**4), 10**4),
    parts=st.lists(st.integers(0, 50), min_size=1, max_size=3),
    kinds=st.lists(st.sampled_from(["sum", "product", "frac"]), min_size=1, max_size=3),
    delta=st.integers(1, 100),
    where=st.integers(0, 2),
)
def test_a_consistent_chain_states_its_last_value_and_a_disagreeing_step_makes_it_a_hedge(
    strict, gold, parts, kinds, delta, where
):
    steps = [_expression_for(gold, parts, kind) for kind in kinds]
    assert strict.score_texts([str(gold)], ["\\boxed{x = " + " = ".join([*steps, str(gold)]) + "}"]) == [1.0]
    steps.insert(where % (len(steps) + 1), str(gold + delta))  # one step states another value
    assert strict.score_texts([str(gold)], ["\\boxed{x = " + " = ".join([*steps, str(gold)]) + "}"]) == [0.0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gold=integers, repeats=st.integers(2, 4), other=integers)
def test_a_repeated_value_is_one_value_and_a_different_one_is_a_hedge(strict, gold, repeats, other):
    assert strict.score_texts([str(gold)], ["\\boxed{" + ", ".join([str(gold)] * repeats) + "}"]) == [1.0]
    if other != gold:
        assert strict.score_texts(
            [str(gold)], ["\\boxed{" + ", ".join([str(gold)] * repeats + [str(other)]) + "}"]
        ) == [0.0]
        two = f"{min(gold, other)}, {max(gold, other)}"
        assert strict.score_texts([two], [f"\\boxed{{{gold}, {gold}, {other}}}"]) == [1.0]  # distinct values


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.integers(1000, 10**12),
    negative=st.booleans(),
    separator=st.sampled_from([",", ",\\!", ",\\! ", ",\\!  ", "{,}", "\\,", ",\\,", "\\!"]),
)
def test_thousands_written_with_any_latex_separator_are_one_number(strict, value, negative, separator):
    n = -value if negative else value
    written = ("-" if negative else "") + f"{value:,}".replace(",", separator)
    assert strict.score_texts([str(n)], [f"\\boxed{{{written}}}"]) == [1.0]
    assert strict.score_texts([str(n + 1)], [f"\\boxed{{{written}}}"]) == [0.0]
    assert to_number(written) == n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.integers(0, 999), rest=st.text(alphabet="0123456789", min_size=1, max_size=5))
def test_a_comma_groups_thousands_only_before_three_digit_groups_after_a_nonzero_first_group(strict, first, rest):
    written = f"{first},{rest}"
    grouping = first > 0 and len(rest) == 3
    assert (to_number(written) == int(f"{first}{rest}")) is grouping
    if not grouping and first != int(rest):  # 0,500 is not 500, and 12,34 is not 1234 (0,0 repeats 0)
        assert strict.score_texts([str(int(rest))], [f"\\boxed{{{written}}}"]) == [0.0]
        assert strict.score_texts([f"{first}{rest}".lstrip("0") or "0"], [f"\\boxed{{{written}}}"]) == [0.0]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(integers, min_size=2, max_size=4, unique=True),
    order=st.randoms(use_true_random=False),
    wrong=integers,
    pad=st.sampled_from([" and ", " ", ", so "]),
)
def test_boxes_that_state_a_list_gold_one_value_a_box_are_one_answer(strict, values, order, wrong, pad):
    gold = ", ".join(map(str, values))
    shuffled = list(values)
    order.shuffle(shuffled)
    boxes = [f"\\boxed{{{v}}}" for v in shuffled]
    assert strict.score_texts([gold], [pad.join(boxes)]) == [1.0]
    if wrong not in values:
        assert strict.score_texts([gold], [pad.join(boxes[:-1] + [f"\\boxed{{{wrong}}}"])]) == [0.0]
        assert strict.score_texts([gold], [pad.join(boxes + [f"\\boxed{{{wrong}}}"])]) == [0.0]  # one too many
        assert strict.score_texts([str(values[0])], [f"\\boxed{{{values[0]}}} {pad} \\boxed{{{wrong}}}"]) == [0.0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gold=st.integers(2, 10**5),
    other=st.integers(1, 99),
    form=st.sampled_from(
        [
            "\\frac{{{o}}}{{{g}}}",
            "({o}+{g})",
            "\\sqrt{{{g}}}",
            "\\sqrt {g}",
            "{o}^{{{g}}}",
            "{o}^{g}",
            "{o} \\times {g}",
            "x_{{{g}}}",
            "{o}/{g}",
            "{o} + {g}",
            "\\frac{{{o}+\\sqrt{g}}}{{{g}}}",
            "[{o}, {g}]",
        ]
    ),
)
def test_lenient_fallback_never_reads_a_number_out_of_an_expression(lenient, gold, other, form):
    expression = form.format(o=other, g=gold)
    worth = {
        "\\frac{{{o}}}{{{g}}}": Fraction(other, gold),
        "{o}/{g}": Fraction(other, gold),
        "{o} \\times {g}": other * gold,
    }
    if worth.get(form) == gold:  # 4/2 for the gold 2: the expression is the answer, not a piece of one
        return
    assert lenient.score_texts([str(gold)], [f"so we get ${expression}$"]) == [0.0], expression
    assert lenient.score_texts([str(gold)], [f"so we get ${expression}$, which makes {gold}."]) == [1.0]


LABELS = st.sampled_from(["x", "y", "a", "b", "p", "q", "n", "x_1", "x_{2}", "\\alpha"])
JOINS = st.sampled_from([", ", ",\\, ", ",\\ ", "; ", " \\text{ and } "])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(-50, 50), min_size=2, max_size=4, unique=True),
    labels=st.lists(LABELS, min_size=4, max_size=4),
    labelled=st.lists(st.booleans(), min_size=4, max_size=4),
    join=JOINS,
    wrong=st.integers(-50, 50),
)
def test_a_labelled_list_stating_every_gold_value_and_no_other_is_credited(
    strict, values, labels, labelled, join, wrong
):
    """Issue 50: `\\boxed{a=4,\\,-8,\\,-10}` and `x = -5, p = 14/3` for a list gold were scored 0. A list whose items
    are labelled or not, each stating one value, is credited when it states every value of the gold and no
    other; a missing, extra or wrong value, or an item whose chain disagrees, stays wrong."""
    gold = ", ".join(map(str, values))
    items = [f"{label} = {v}" if flag else str(v) for v, label, flag in zip(values, labels, labelled)]
    if not any(labelled[: len(values)]):
        items[0] = f"{labels[0]} = {values[0]}"  # at least one label: the class this test is about
    assert strict.score_texts([gold], [f"\\boxed{{{join.join(items)}}}"]) == [1.0], items
    if wrong not in values:
        extra = join.join([*items, f"{labels[1]} = {wrong}"])
        swapped = join.join([*items[:-1], f"{labels[2]} = {wrong}"])
        chain = join.join([f"{labels[0]} = {values[0]} = {wrong}", *items[1:]])
        for hedge in (extra, swapped, chain, join.join(items[:-1])):
            assert strict.score_texts([gold], [f"\\boxed{{{hedge}}}"]) == [0.0], hedge


GOLD_FORMS = st.sampled_from(["boxes", "and", "or-dollars", "first-label", "same-label"])


def _rich_gold(values: list[int], form: str) -> str:
    if form == "boxes":
        return "".join(f"\\boxed{{{v}}}" for v in values)
    if form == "and":
        return f"\\boxed{{{', '.join(map(str, values[:-1]))} \\text{{ and }} {values[-1]}}}"
    if form == "or-dollars":
        return f"${', '.join(map(str, values[:-1]))}$ or ${values[-1]}$"
    if form == "first-label":
        rest = ",\\,".join(map(str, values[1:]))
        return f"\\boxed{{a={values[0]},\\,{rest}}}"
    return "\\boxed{" + " \\text{ and } ".join(f"p = {v}" for v in values) + "}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(-50, 50), min_size=2, max_size=4, unique=True),
    form=GOLD_FORMS,
    order=st.randoms(use_true_random=False),
    wrong=st.integers(-50, 50),
)
def test_a_gold_listing_its_values_in_a_rich_form_credits_the_plain_list_and_nothing_else(
    strict, values, form, order, wrong
):
    """Issue 50 (Math-Verify's own cases): golds written as several boxes, joined by "and" or "or", or under one
    label are the set of their values: a plain list of exactly those values, in any order, is credited; a list
    with a value missing, one wrong or one extra is not."""
    gold = _rich_gold(values, form)
    shuffled = list(values)
    order.shuffle(shuffled)
    assert strict.score_texts([gold], [f"\\boxed{{{', '.join(map(str, shuffled))}}}"]) == [1.0], gold
    if wrong not in values:
        for bad in (shuffled[:-1], [*shuffled[:-1], wrong], [*shuffled, wrong]):
            assert strict.score_texts([gold], [f"\\boxed{{{', '.join(map(str, bad))}}}"]) == [0.0], (gold, bad)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.integers(-50, 50), second=st.integers(-50, 50), number=st.integers(1000, 10**7))
def test_golds_that_say_which_value_is_which_or_are_one_number_stay_as_written(strict, first, second, number):
    """Different labels name each value (x = 2, y = 3): the swapped answer stays wrong. A number written with
    thousands separators is one value, never a list."""
    from lanpo.verify.answers import gold_as_list

    gold = f"x = {first}, y = {second}"
    assert gold_as_list(gold) is None and gold_as_list(f"{number:,}") is None
    if first != second:
        assert strict.score_texts([gold], [f"\\boxed{{x = {second}, y = {first}}}"]) == [0.0]
    assert strict.score_texts([gold], [f"\\boxed{{x = {first}, y = {second}}}"]) == [1.0]


# -- issue 71: the list rule reads alike on either side -------------------------------------------------------


def _list_form(values: list, form: str) -> str:
    """One list of values written one way; every form is both a gold and (boxed) a completion's answer."""
    text = [str(v) for v in values]
    if form == "boxes-commas":
        return ", ".join(f"\\boxed{{{v}}}" for v in text)
    if form == "boxes-and":
        return " and ".join(f"\\boxed{{{v}}}" for v in text)
    if form == "boxes-quad":
        return " \\quad \\text{and} \\quad ".join(f"\\boxed{{{v}}}" for v in text)
    if form == "indexed-boxes":
        return " \\quad \\text{and} \\quad ".join(f"\\boxed{{x_{i + 1} = {v}}}" for i, v in enumerate(text))
    if form == "one-box-and":
        return f"\\boxed{{{', '.join(text[:-1])} \\text{{ and }} {text[-1]}}}"
    if form == "indexed":
        return "\\boxed{" + ", \\quad ".join(f"x_{{{i + 1}}} = {v}" for i, v in enumerate(text)) + "}"
    if form == "set":
        return f"\\boxed{{\\{{{', '.join(text)}\\}}}}"
    return f"\\boxed{{{', '.join(text)}}}"  # plain


LIST_FORMS = ["boxes-commas", "boxes-and", "boxes-quad", "indexed-boxes", "one-box-and", "indexed", "set", "plain"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.lists(st.integers(-50, 50), min_size=2, max_size=3, unique=True),
    wrong=st.integers(-50, 50),
    order=st.randoms(use_true_random=False),
)
def test_a_list_answer_reads_alike_as_gold_and_as_prediction(strict, values, wrong, order):
    """Every pair of forms, each side either way round: the same values are credited; a value wrong, missing or
    extra on the prediction's side is not (no form is read more leniently on one side than on the other)."""
    shuffled = list(values)
    order.shuffle(shuffled)
    pairs = [(g, p) for g in LIST_FORMS for p in LIST_FORMS]
    golds = [_list_form(values, g) for g, _ in pairs]
    right = strict.score_texts(golds, [_list_form(shuffled, p) for _, p in pairs])
    assert right == [1.0] * len(pairs), [pair for pair, s in zip(pairs, right) if s != 1.0]
    if wrong not in values:
        for bad in ([*shuffled[:-1], wrong], [*shuffled, wrong], shuffled[:-1]):
            if len(bad) < 2:
                continue
            scores = strict.score_texts(golds, [_list_form(bad, p) for _, p in pairs])
            assert scores == [0.0] * len(pairs), [pair for pair, s in zip(pairs, scores) if s]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.integers(-50, 50),
    second=st.integers(-50, 50),
    words=st.lists(st.sampled_from(["no", "wait", "hmm", "not", "maybe", "then"]), min_size=1, max_size=5),
)
def test_a_gold_with_prose_between_its_boxes_is_its_last_box(strict, first, second, words):
    """Math-Verify reads the last box of such a gold: the pair of both boxes is not its answer."""
    if first == second:
        return
    gold = f"\\boxed{{{first}}} {' '.join(words)} \\boxed{{{second}}}"
    assert strict.score_texts([gold, gold], [f"\\boxed{{{first}, {second}}}", f"\\boxed{{{second}}}"]) == [0.0, 1.0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.integers(-50, 50), second=st.integers(1, 50), labels=st.sampled_from([("x", "p"), ("k", "n")]))
def test_labels_on_either_side_and_values_in_order(strict, first, second, labels):
    """A gold that names each value under its own label credits the same values unlabelled in its order, and the
    labelled answer; the values swapped are not credited either way."""
    a, b = labels
    if Fraction(first) == Fraction(second, 3):
        return  # one value twice: two boxes of it are a repeat, not a list
    gold = f"{a} = {first}, {b} = \\frac{{{second}}}{{3}}"
    same = [
        f"\\boxed{{{first}, \\frac{{{second}}}{{3}}}}",
        f"\\boxed{{{a} = {first}}} \\quad \\text{{and}} \\quad \\boxed{{{b} = \\frac{{{second}}}{{3}}}}",
        f"\\boxed{{{gold}}}",
    ]
    assert strict.score_texts([gold] * 3, same) == [1.0] * 3
    assert strict.score_texts([gold], [f"\\boxed{{\\frac{{{second}}}{{3}}, {first}}}"]) == [0.0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    low=st.integers(-50, 0),
    width=st.integers(1, 50),
    left=st.sampled_from(["\\le", "<"]),
    right=st.sampled_from(["\\le", "<"]),
)
def test_an_interval_and_its_inequality_read_alike_either_way_round(strict, low, width, left, right):
    high = low + width
    inequality = f"{low} {left} x {right} {high}"
    interval = f"{'[' if left == chr(92) + 'le' else '('}{low}, {high}{']' if right == chr(92) + 'le' else ')'}"
    wrong = f"{'(' if left == chr(92) + 'le' else '['}{low}, {high}{']' if right == chr(92) + 'le' else ')'}"
    golds = [inequality, interval, f"x \\in {interval}", inequality, interval]
    preds = [
        f"\\boxed{{{interval}}}",
        f"\\boxed{{{inequality}}}",
        f"\\boxed{{{inequality}}}",
        f"\\boxed{{x \\in {interval}}}",
        f"\\boxed{{x \\in {interval}}}",
    ]
    assert strict.score_texts(golds, preds) == [1.0] * 5, (golds, preds)
    assert strict.score_texts([inequality, interval], [f"\\boxed{{{wrong}}}", f"\\boxed{{{wrong}}}"]) == [0.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    whole=st.integers(0, 99),
    numerator=st.integers(1, 9),
    extra=st.integers(1, 9),
    sign=st.sampled_from(["", "-"]),
    form=st.sampled_from(["\\frac{{{n}}}{{{d}}}", "\\tfrac{{{n}}}{{{d}}}", " {n}/{d}"]),
)
def test_a_mixed_number_in_a_lesson_is_found_by_the_scrub(whole, numerator, extra, sign, form):
    from lanpo.verify.answers import mentions_answer

    denominator = numerator + extra
    value = (Fraction(whole) + Fraction(numerator, denominator)) * (-1 if sign else 1)
    text = f"so it comes to {sign}{whole}{form.format(n=numerator, d=denominator)} in the end"
    answer = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    assert mentions_answer(text, answer), (text, answer)


@pytest.mark.alone
def test_the_list_and_interval_rules_stay_linear_on_long_adversarial_answers():
    """They run in the trainer's process, outside the verifier's time limit (a generous bound, not a benchmark)."""
    from lanpo.verify.answers import as_interval, gold_answer, read_alike
    from lanpo.verify.numerals import _MIXED

    long_inputs = [
        "1" + " <" * 20_000 + " x" * 20_000,
        "x" * 100_000 + " \\in",
        "\\boxed{1} " * 5_000 + "no " * 5_000,
        "1" * 50_000 + " " * 50_000 + "1/2",
        ("x_1 = 2, " * 10_000) + "\\quad",
        "-1\\frac" * 20_000,
    ]
    start = time.perf_counter()
    for text in long_inputs:
        as_interval(text)
        gold_answer(text)
        read_alike(text[:2_000], text[:1_000])
        list(_MIXED.finditer(text))
    assert time.perf_counter() - start < 10.0
