"""The pool audit (issue 90): specificity, answers stated, lessons repeated across problems, length and parse
state, each entry's lift with its interval, retrieval concentration, the random draw; `lanpo pool audit` and the
report's section."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.browser import CHROMIUM
from lanpo.cli import main as lanpo
from lanpo.pool.store import ExperiencePool, PoolEntry, StepWorth
from lanpo.pool.worth import Observation, Worth, fold
from lanpo.report.audit import (
    STOPWORDS,
    Gold,
    audit_pool,
    concentration_curve,
    is_specific,
    lift_interval,
    markdown,
    names_the_domain,
    near_duplicate_key,
    problem_details,
    states_an_answer,
    top_share,
)
from lanpo.student_t import t975

GENERAL = ["Check each step before the next", "Write the quantities down first", "Re-read the question at the end"]


def entry(problem_id, problem="Compute 37 + 45.", principles=(), pitfalls=(), flow="add", id=None, step=0):
    return PoolEntry(problem_id, problem, flow, list(principles), list(pitfalls), step=step, id=id)


# ------------------------------------------------------------------ one lesson


@settings(max_examples=80, deadline=None)
@given(number=st.integers(2, 10**6), name=st.sampled_from(["Ava", "Tom", "Kowalski", "Marguerite"]))
def test_a_lesson_repeating_its_problems_number_or_name_is_specific_and_a_general_one_is_not(number, name):
    problem = f"Today {name} has {number:,} stickers and buys 1 more. How many does {name} have?"
    numbers, names = problem_details(problem)
    assert str(number) in numbers and name in names and "How" not in names and "Today" not in names
    assert is_specific(f"Start from the {number} stickers.", numbers, names)
    assert is_specific(f"Remember that {name} buys more.", numbers, names)
    for lesson in GENERAL + ["Add 1 to the count only once."]:  # 0 and 1 are nobody's detail
        assert not is_specific(lesson, numbers, names)


@settings(max_examples=60, deadline=None)
@given(value=st.integers(2, 999), form=st.sampled_from(["digits", "word", "fraction"]))
def test_a_lesson_stating_its_own_gold_in_any_form_is_counted_and_not_without_the_gold(value, form):
    words = {2: "two", 7: "seven", 12: "twelve", 40: "forty"}
    if form == "word" and value not in words:
        value = 7
    written = {"digits": str(value), "word": words.get(value, ""), "fraction": f"{2 * value}/2"}[form]
    lesson = f"The total comes to {written} in the end"
    assert states_an_answer(lesson, Gold(str(value)))
    assert not states_an_answer(lesson, Gold(str(value + 1000)))
    assert not states_an_answer(lesson, None)  # no gold known: only answer statements count
    assert states_an_answer("So the answer is 5.", None) and states_an_answer("\\boxed{5}", None)


def test_a_code_problems_lesson_holding_code_is_counted():
    gold = Gold("def check(candidate):\n    assert candidate(2) == 4\n", "code")
    assert states_an_answer("Use return x * 2 for the doubling", gold)
    assert not states_an_answer("Handle the empty list first", gold)


@settings(max_examples=80, deadline=None)
@given(
    words=st.lists(st.sampled_from(["check", "arithmetic", "carefully", "units", "carry", "sum"]), min_size=1),
    extra=st.lists(st.sampled_from(sorted(STOPWORDS)), max_size=4),
    seed=st.integers(0, 1000),
    number=st.integers(0, 99),
)
def test_near_duplicates_ignore_order_case_stopwords_and_numbers(words, extra, seed, number):
    a = " ".join(words)
    shuffled = words + extra + [str(number)]
    random.Random(seed).shuffle(shuffled)
    b = " ".join(w.upper() if i % 2 else w for i, w in enumerate(shuffled)) + "."
    assert near_duplicate_key(a) == near_duplicate_key(b)
    assert near_duplicate_key(a) != near_duplicate_key(a + " fractions")


# ------------------------------------------------------------------ figures


@settings(max_examples=80, deadline=None)
@given(lifts=st.lists(st.sampled_from([-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0]), min_size=0, max_size=30))
def test_the_lift_interval_is_the_t_interval_of_the_credited_rows(lifts):
    records = fold({}, [Observation(1, x, 0.0, False) for x in lifts], step=1)
    mean, low, high = lift_interval(records.get(1, Worth()))
    if not lifts:
        assert mean is None and low is None
    elif len(lifts) == 1:
        assert mean == lifts[0] and low is None
    else:
        half = t975(len(lifts) - 1) * statistics.stdev(lifts) / math.sqrt(len(lifts))
        assert math.isclose(mean, statistics.fmean(lifts), abs_tol=1e-9)
        assert math.isclose(low, mean - half, abs_tol=1e-6) and math.isclose(high, mean + half, abs_tol=1e-6)


def test_uncredited_rows_count_as_uses_but_not_in_the_interval():
    records = fold({}, [Observation(1, None, 1.0, True), Observation(1, 0.5, 1.0, True)], step=1)
    assert records[1].uses == 2 and lift_interval(records[1]) == (0.5, None, None)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), each=st.integers(1, 20))
def test_even_retrieval_gives_the_top_tenth_about_a_tenth_and_one_favourite_gives_it_all(n, each):
    even = top_share({i: each for i in range(n)}, n)
    assert math.isclose(even, math.ceil(0.1 * n) / n)
    assert top_share({0: each}, n) == 1.0
    assert top_share({}, n) is None


PRINCIPLES = [  # general, and repeated across problems as naturally as praise: each names an operation, a quantity or a check
    "Line up the digits by place value.",
    "Check a difference by adding it back to the smaller number.",
    "Carry the tens when a column sums past nine.",
    "Multiply before you add unless parentheses say otherwise.",
    "Keep the units of each quantity until the end.",
    "Estimate the result first and compare it with the answer.",
    "An empty list has no largest element: return None for it.",
    "Loop over every index, the last one included.",
    "Compare with x > 4, not x >= 4, when the boundary is excluded.",
    "Subtracting a negative number adds its value.",
]
PRAISE = [  # empty: praise and advice that names nothing of the domain
    "This is a great example of clarity.",
    "Stay focused and be careful.",
    "Always be thorough and thoughtful.",
    "A step should be a step.",
    "Good work shows good thinking.",
    "Read the problem carefully.",
    "Go step-by-step and do your best.",
    "It is significant to think clearly.",
    "Believe in the approach and stay motivated.",
    "The mindset of the customer matters most.",
]


@pytest.mark.parametrize("lesson", PRINCIPLES)
def test_a_general_principle_names_the_domain(lesson):
    assert names_the_domain(lesson)


@pytest.mark.parametrize("lesson", PRAISE)
def test_empty_praise_names_nothing_of_the_domain(lesson):
    assert not names_the_domain(lesson)


def test_repeated_principles_are_counted_apart_from_repeated_praise_and_only_praise_is_boilerplate():
    """Three problems whose entries repeat the same lessons: a principle and a line of praise in each. Both are
    repeated; only the praise is empty, and the entries are boilerplate only where half their lessons are empty."""
    principled = [entry(f"p{i}", f"Compute {10 + i} + 7.", [PRINCIPLES[0]], [PRINCIPLES[1]], id=i) for i in range(3)]
    praised = [entry(f"q{i}", f"Compute {20 + i} + 7.", [PRAISE[0]], [PRINCIPLES[2]], id=10 + i) for i in range(3)]
    audit = audit_pool(principled + praised, {})
    summary = audit.summary()
    assert summary["repeated_lesson_share"] == 1.0  # every lesson repeats across problems
    assert summary["repeated_general_share"] == 9 / 12 and summary["empty_lesson_share"] == 3 / 12
    assert [e.empty_lessons for e in audit.entries] == [0, 0, 0, 1, 1, 1]
    assert summary["boilerplate_entries"] == 0.5  # the entries of praise: half their lessons empty
    text = markdown(audit)
    assert "| 3 | This is a great example of clarity. | nothing (empty) |" in text
    assert "| 3 | Line up the digits by place value. | the domain |" in text


def test_the_audit_of_a_hand_built_pool():
    a = entry("a", "Ava has 12 apples and eats 5.", ["Start from Ava's 12 apples", GENERAL[0]], [GENERAL[1]], id=1)
    b = entry("b", "Compute 37 + 45.", ["check each step before the NEXT one"], [], flow="", id=2)
    c = entry("c", "Compute 80 - 3.", ["The answer is 77"], ["Line the digits up by place"], id=3)
    worth = {1: fold({}, [Observation(1, x, 1.0, True) for x in (0.5, 0.5, 0.25)], 1)[1]}
    worth[2] = fold({}, [Observation(2, x, 0.0, False) for x in (-1.0, -0.5, -0.75, -1.0)], 2)[2]
    audit = audit_pool([a, b, c], worth, {"c": Gold("77")}, name="hand")
    figures = {e.id: e for e in audit.entries}
    assert [figures[i].specific_lessons for i in (1, 2, 3)] == [1, 0, 0]  # Ava, 12; "77" is not in c's problem
    assert [figures[i].answers_stated for i in (1, 2, 3)] == [0, 0, 1]
    assert [figures[i].repeated_lessons for i in (1, 2, 3)] == [1, 1, 0]  # "check each step" in a and b
    assert audit.repeated == [(GENERAL[0], 2)]
    assert [figures[i].parse for i in (1, 2, 3)] == ["complete", "no flow of thought or pitfalls", "complete"]
    assert [figures[i].lift_reading for i in (1, 2, 3)] == ["helped", "hurt", "never shown"]
    summary = audit.summary()
    assert summary["answers_stated"] == 1 and summary["golds_known"] == 1 and summary["lessons"] == 6
    assert summary["top10_share"] == 4 / 7 and summary["retrieved_entries"] == 2  # entry 2's 4 uses of 7
    text = markdown(audit)
    assert "| lessons repeated across problems (near-duplicates) | 33.3% |" in text
    assert "rating: ___" in text and text.count("### entry") == 3


def test_old_pools_count_concentration_from_the_logged_retrievals():
    entries = [entry(f"p{i}", id=i) for i in range(1, 21)]
    logged = [{"step": 1, "problem_id": "x", "retrieved": [{"entry_id": 1}, {"entry_id": 2}]}] * 9
    logged += [{"step": 2, "problem_id": "y", "retrieved": [{"entry_id": 3}, {"entry_id": "bad"}]}, {"step": 3}]
    audit = audit_pool(entries, {}, None, logged)
    assert audit.retrievals == 19 and "retrievals.jsonl" in audit.retrieval_source
    assert audit.top_share == 18 / 19  # the top 10% of 20 entries: entries 1 and 2


@settings(max_examples=50, deadline=None)
@given(uses=st.lists(st.integers(0, 40), min_size=1, max_size=60))
def test_the_concentration_curve_reads_the_top_share_at_the_same_share_of_every_entry(uses):
    """The plot and the table say one thing: the curve's x is a share of every entry, never-retrieved ones too."""
    entries = [entry(f"p{i}", id=i) for i in range(len(uses))]
    worth = {i: Worth(uses=n) for i, n in enumerate(uses) if n}
    audit = audit_pool(entries, worth)
    x, y = concentration_curve(audit.retrieval_counts, points=10_000)
    if not any(uses):
        assert audit.top_share is None and x == []
        return
    top = math.ceil(0.1 * len(uses))
    assert len(audit.retrieval_counts) == len(uses)
    assert y[x.index(top / len(uses))] == pytest.approx(audit.top_share)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 120), seed=st.integers(0, 5))
def test_the_draw_for_a_person_is_fifty_distinct_entries_and_the_same_for_a_seed(n, seed):
    entries = [entry(f"p{i}", id=i) for i in range(n)]
    drawn = audit_pool(entries, {}, seed=seed).sample
    assert len({e.id for e in drawn}) == len(drawn) == min(50, n)
    assert [e.id for e in drawn] == [e.id for e in audit_pool(entries, {}, seed=seed).sample]


# ------------------------------------------------------------------ the command and the report


def _run(folder, data="builtin:arith?levels=1"):
    """A run folder whose config names its data, and a pool of three of those problems' entries with worth."""
    from lanpo.data.loaders import load_problems

    problems = load_problems(data)[:3]
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"data: {data}\noutput_dir: {folder}\n")
    logged = [
        {"step": 1, "summaries/requested": 4, "summaries/added": 3, "summaries/parse_failures": 1},
        {"step": 2, "summaries/requested": 4.0, "summaries/added": "x", "lanpo/lessons_dropped": 2},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    with ExperiencePool(folder / "pool.sqlite") as pool:
        pool.add(
            [
                entry(
                    p.id,
                    p.problem,
                    [f"Write down the {'value ' + p.answer if i == 0 else ('second', 'third')[i - 1]}"],
                    [GENERAL[2]],
                )
                for i, p in enumerate(problems)
            ]
        )
        ids = [e.id for e in pool.entries()]
        seen = [Observation(ids[1], lift, 0.0, False) for lift in (-1.0, -1.0, -0.5, -1.0)]
        pool.add_attempts([], StepWorth(1, entries=seen + [Observation(ids[2], 0.5, 1.0, True)]))
    return folder, problems


def test_lanpo_pool_audit_writes_markdown_and_a_plot_with_golds_from_the_runs_data(tmp_path, capsys):
    run, problems = _run(tmp_path / "run")
    assert lanpo(["pool", "audit", str(run), "--sample", "3"]) == 0
    text = (run / "pool-audit.md").read_text()
    assert text == capsys.readouterr().out.split("Wrote ")[0].rstrip("\n") + "\n"
    assert "(golds known for 3 of 3 entries)" in text and f"{problems[0].problem[:40]}" in text
    assert "| lessons stating an answer, code, or their problem's gold | 1 " in text  # "the value <gold>"
    assert "| lessons repeated across problems (near-duplicates) | 50.0% |" in text  # GENERAL[2] in all three
    assert "| lift: helped / hurt / unclear (95% interval) | 0 / 1 / 1 |" in text
    assert "| summaries over the run | 8 requested, 3 added to the pool, 1 did not parse, 2 lessons dropped" in text
    assert text.count("rating: ___") == 3 and "Golds for the answers check: builtin:arith?levels=1." in text
    assert (run / "pool-audit.png").stat().st_size > 10_000


def test_a_bare_pool_file_is_audited_and_says_its_golds_are_unknown(tmp_path, capsys):
    run, _ = _run(tmp_path / "run")
    (run / "pool.sqlite").rename(tmp_path / "moved.sqlite")
    out = tmp_path / "audit"
    assert lanpo(["pool", "audit", str(tmp_path / "moved.sqlite"), "--out", str(out)]) == 0
    text = (out / "pool-audit.md").read_text()
    assert "(golds known for 0 of 3 entries)" in text and "Golds for the answers check: unknown" in text
    assert "| summaries over the run | not known (no metrics.jsonl) |" in text
    assert lanpo(["pool", "audit", str(tmp_path / "moved.sqlite"), "--out", str(out), "--data", "nope:x"]) == 0
    assert "could not be loaded" in (out / "pool-audit.md").read_text()
    capsys.readouterr()
    for taken in (out / "pool-audit.md", out / "pool-audit.md" / "deeper"):  # --out names a file, or a path under one
        assert lanpo(["pool", "audit", str(tmp_path / "moved.sqlite"), "--out", str(taken)]) == 2
        said = capsys.readouterr().err
        assert "is a file, and --out names a folder" in said and "Errno" not in said


def test_the_report_embeds_the_audit(tmp_path):
    import lanpo.report.page

    run, _ = _run(tmp_path / "run")
    audit = lanpo.report.page.collect(run)["pool"]["audit"]
    assert audit["summary"]["entries"] == 3 and audit["summary"]["readings"] == {
        "never shown": 1,
        "hurt": 1,
        "unclear": 1,
    }
    assert [round(x[0], 3) for x in audit["lifts"]] == [-0.875, 0.5]
    assert audit["concentration"][-1] == [1.0, 1.0]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it when apt-get can)")
def test_the_pool_tab_shows_the_audit_with_its_plots(tmp_path):
    from helpers.browser import Browser

    run, _ = _run(tmp_path / "run")
    out = tmp_path / "report.html"
    assert lanpo(["report", str(run), "--out", str(out)]) == 0
    with Browser() as browser:
        browser.open(out.as_uri() + "#tab=Pool")
        browser.wait_for("document.querySelector('.pool-audit')")
        text = browser.js("document.querySelector('.pool-audit').innerText")
        assert "lessons repeated across problems\t50.0%" in text and "0 / 1 / 1" in text
        labels = browser.js(
            "[...document.querySelectorAll('.pool-audit svg[role=img]')].map(s => s.getAttribute('aria-label'))"
        )
        assert labels == [
            "Lift per credited entry, sorted (95% interval)",
            "Retrievals (%) taken by the top entries (%)",
        ]
        assert not browser.errors(), browser.errors()
