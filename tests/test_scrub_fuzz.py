"""Lessons never state their own problem's answer, in any form (issue 12): a fuzz with a non-circular oracle.

The generator writes each lesson knowing whether it states the answer (in one of many forms) or another value;
every lesson of the first kind must be dropped, every lesson of the second kind kept.
"""

from __future__ import annotations

import os
from collections import Counter
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.summarize import Trial, entry_from_summary

EXAMPLES = 10_000 if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else 300

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty", 6: "sixty", 7: "seventy", 8: "eighty", 9: "ninety"}


def words(n: int) -> str:
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    return ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " and " + words(n % 100))


def forms(value: Fraction) -> list[str]:
    """Ways a lesson may write ``value``."""
    out = []
    if value.denominator == 1:
        n = int(value)
        minus = "\u2212" if n < 0 else ""
        a = abs(n)
        out += [
            str(n),
            f"{n}.0",
            f"{2 * n}/2",
            f"\\frac{{{2 * n}}}{{2}}",
            f"{minus}{a}",
            "".join(chr(0xFF10 + int(d)) if d.isdigit() else d for d in str(n)),
        ]
        if 0 <= n < 1000:
            out.append(words(n))
        if n < 0:
            out += [f"minus {a}", f"negative {a}", f"- {a}"] + (
                [f"negative {words(a)}", f"minus {words(a)}"] if a < 1000 else []
            )
        if a >= 1000:
            out += [f"{n:,}", f"{n:,}".replace(",", " ")]
        if a >= 10 and str(a).strip("0") == "1":
            out.append(f"{'-' if n < 0 else ''}10^{len(str(a)) - 1}")
    else:
        decimal = f"{float(value):.6g}"
        out += [
            decimal,
            f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
            f"{value.numerator}/{value.denominator}",
            f"\\frac{{{value.numerator}}} {{{value.denominator}}}",
        ]
        if decimal.startswith("0."):
            out.append(decimal[1:])
        if value == Fraction(1, 2):
            out.append("one half")
    return out


TEMPLATES = [
    "Remember that the total is {x} here.",
    "Split the work into {x} equal parts first.",
    "After adding, {x} should come out.",
    "Check whether {x} fits every condition.",
]
values = st.one_of(
    st.integers(-5000, 5000).map(Fraction),
    st.sampled_from([Fraction(1, 2), Fraction(3, 4), Fraction(5, 2), Fraction(1, 8), Fraction(-7, 4)]),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(value=values, data=st.data())
def test_no_kept_lesson_states_its_source_answer_in_any_form(value, data):
    gold = str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    stating = [
        data.draw(st.sampled_from(TEMPLATES)).format(x=data.draw(st.sampled_from(forms(value))))
        for _ in range(data.draw(st.integers(1, 4)))
    ]
    other = value + data.draw(st.integers(1, 50)) * data.draw(st.sampled_from([1, -1]))
    innocent = [
        data.draw(st.sampled_from(TEMPLATES)).format(x=data.draw(st.sampled_from(forms(other)))),
        "Line up the digits before adding.",
    ]
    lessons = data.draw(st.permutations(stating + innocent))
    summary = "FLOW OF THOUGHT: plan.\nPRINCIPLES:\n" + "\n".join(f"- {x}" for x in lessons) + "\nPITFALLS:\n- none"
    stats = Counter()
    entry = entry_from_summary(Trial("p", "What is it?", f"... so \\boxed{{{gold}}}", True, gold=gold), summary, stats)
    kept = set(entry.principles) if entry else set()
    assert not kept & set(stating), (gold, kept & set(stating))
    assert set(innocent) <= kept, (gold, set(innocent) - kept)
    assert stats["lessons_dropped:states_its_answer"] == len(stating)
