"""Feedback contexts and the leakage guard; the summary parser under fuzzing."""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.audit import leakage_problems
from lanpo.feedback import build_abstraction_prompt, build_reflection_prompt, clean_lessons
from lanpo.pool.store import PoolEntry
from lanpo.prompts import format_summary, parse_summary
from lanpo.summarize import Trial, summarize_trials


def test_reflection_prompt_shows_the_attempt_and_nothing_about_its_grade():
    attempt = "3 + 4 = 8, so the answer is \\boxed{8}."
    text = build_reflection_prompt("What is 3 + 4?", [attempt]).messages[0]["content"]
    assert attempt in text and "\\boxed{}" in text
    assert not leakage_problems(text, "7", ["What is 3 + 4?", attempt])
    for word in ("reward", "correct", "wrong", "gold", "7"):
        assert word not in text.replace(attempt, "").replace("What is 3 + 4?", "").lower()


def test_reflection_keeps_what_the_model_itself_wrote():
    attempt = "I think the correct answer is 7. Reward me!"  # the model's own words may say anything
    assert attempt in build_reflection_prompt("What is 3 + 4?", [attempt]).messages[0]["content"]


def test_without_an_attempt_reflection_falls_back_with_a_reason_instead_of_raising():
    result = build_reflection_prompt("p", ["  ", ""])
    assert result.messages is None and result.reason == "no_attempt"


def test_no_builder_ever_receives_a_gold_answer():
    import inspect

    for builder in (build_reflection_prompt, build_abstraction_prompt):
        assert not any("gold" in name or "answer" in name for name in inspect.signature(builder).parameters)


def test_abstraction_uses_principles_and_pitfalls_only():
    entry = PoolEntry(
        problem_id="other",
        problem="What is 2 + 2?",
        flow_of_thought="add them up, get 4",
        principles=["line up the digits", "the answer is \\boxed{4}"],
        pitfalls=["forgetting to carry", "split into 9 cases here"],
        id=5,
    )
    result = build_abstraction_prompt("What is 5 + 4?", [entry], problem_id="mine")
    text = result.messages[0]["content"]
    assert "line up the digits" in text and "forgetting to carry" in text
    assert "What is 2 + 2?" not in text and "add them up" not in text  # no other problem, no raw solution
    assert "\\boxed{4}" not in text  # no final answers
    assert "split into 9 cases here" in text  # kept, whatever the current problem's gold: 9 would be a label leak
    assert result.dropped_lessons == {"states_an_answer": 1} and result.used_entries == [5]


def test_abstraction_skips_the_same_problem_and_falls_back_when_nothing_is_left():
    same = PoolEntry(problem_id="mine", problem="p", flow_of_thought="", principles=["x rule"], pitfalls=[])
    result = build_abstraction_prompt("p", [same], problem_id="mine")
    assert result.messages is None and result.reason == "no_usable_lesson" and result.dropped_lessons["same_problem"]
    assert build_abstraction_prompt("What is 4 + 5?", []).reason == "no_relevant_entry"


def test_lessons_are_scrubbed_of_their_own_answer_in_every_form_and_answer_only_lessons_go():
    lessons = [
        "the total is 14/2 here",
        "it equals seven",
        "count \uff17 items",
        "use \\frac{14}{2}",
        "the sum is 7.0",
        "add the tens first",
        "7",
        "x = 7",
        "there are 17 cases",
        "y = 42",
    ]
    kept, dropped = clean_lessons(lessons, ["7"])
    assert kept == ["add the tens first", "there are 17 cases"]
    assert dropped["states_its_answer"] == 7 and dropped["answer_only"] == 1  # "y = 42": only an answer


@pytest.mark.parametrize(
    "gold,lesson,states",
    [
        ("-3", "the result is minus 3", True),
        ("-3", "it comes out negative three", True),
        ("-3", "so it is - 3 in the end", True),
        ("\\frac{1}{2}", "use \\frac{1} {2} of it", True),
        ("3", "the result is minus 3", False),  # -3 is not 3
        ("-3", "take 5 - 3 apples", False),  # a difference, not -3
    ],
)
def test_scrub_reads_negative_numbers_in_words_and_spaced_forms(gold, lesson, states):
    kept, dropped = clean_lessons([lesson, "line up the digits"], [gold])
    assert (lesson not in kept) is states and "line up the digits" in kept


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(2, 40),
    st.integers(1, 5),
    st.sampled_from(["\\frac", "\\dfrac", "\\tfrac"]),
    st.sampled_from(["-", "\u2212"]),
    st.sampled_from(["it is {}", "x={}", "so the value is {} here", "{}", "y = {}."]),
    st.sampled_from(["{num}/{den}", "\\frac{{{num}}}{{{den}}}", "{value}"]),
)
def test_scrub_drops_negative_latex_fractions_that_state_the_gold(num, den, scale, frac, minus, template, gold_form):
    """Issue 50: with gold -1/2, "it is -\\frac{1}{2}", "x=-\\frac{1}{2}" and -\\frac{4}{2} for gold -2 were kept;
    a negative fraction in any LaTeX spelling that equals the gold is now dropped, and its positive twin (a
    different number) is kept."""
    from fractions import Fraction

    value = Fraction(num, den)
    gold = "-" + gold_form.format(num=num, den=den, value=float(value) if value.denominator in (1, 2, 4, 5) else "")
    if gold == "-":
        gold = f"-{num}/{den}"
    lesson = template.format(f"{minus}{frac}{{{num * scale}}}{{{den * scale}}}")
    positive = template.format(f"{frac}{{{num * scale}}}{{{den * scale}}}")
    kept, dropped = clean_lessons([lesson, positive, "line up the digits"], [gold])
    assert lesson not in kept, (gold, lesson)
    assert positive in kept or value == -value, (gold, positive)
    assert "line up the digits" in kept


# -- property test: whatever the model wrote and whatever other entries say, a context never leaks -----------------

words = st.text(alphabet=string.ascii_letters + string.digits + " +-=.,", min_size=0, max_size=60)


plain_words = st.text(alphabet=string.ascii_letters + " +-=.,", min_size=0, max_size=60)  # no digits
ANSWER_TALK = [
    "the answer is {gold}",
    "\\boxed{{{gold}}}",
    "so the final answer is {gold}.",
    "reward: 1",
    "the answer was correct",
    "gold answer here",
]


@settings(max_examples=200, deadline=None)
@given(
    gold=st.integers(min_value=0, max_value=999).map(str),
    attempt=words,
    lessons=st.lists(st.one_of(plain_words, st.sampled_from(ANSWER_TALK)), min_size=1, max_size=6),
)
def test_no_feedback_context_talks_about_grades_or_states_an_answer(gold, attempt, lessons):
    """Lessons of other problems that state an answer (here: the current problem's gold, the worst case) or talk
    about grades never reach an abstraction context; a reflection shows the attempt and nothing that grades it."""
    problem = "What is the value?"
    lessons = [x.format(gold=gold) for x in lessons]
    entries = [
        PoolEntry(problem_id=f"o{i}", problem="other", flow_of_thought="", principles=[x], pitfalls=[x])
        for i, x in enumerate(lessons)
    ]
    result = build_abstraction_prompt(problem, entries, problem_id="me")
    if result.messages is not None:
        text = result.messages[0]["content"]
        assert not leakage_problems(text, gold, [problem]), text
    context = build_reflection_prompt(problem, [attempt])
    if attempt.strip():
        assert not leakage_problems(context.messages[0]["content"], gold, [problem, attempt])
    else:
        assert context.messages is None


# -- the summary parser ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "FLOW OF THOUGHT: add then check.\nPRINCIPLES:\n- add the ones first\n- keep digits aligned\n"
        "PITFALLS:\n- no carry",
        "## Flow of Thought\nAdd.\n## Principles\n1. add the ones first\n2. keep digits aligned\n"
        "## Pitfalls\n* no carry",
        "**Flow of thought:** add\n**Key principles:**\n- add the ones first\n"
        "**Common pitfalls:**\n- forgetting the carry",
        "Principles: add the ones first.\nPitfalls: forgetting the carry.",
        '{"flow_of_thought": "add", "principles": ["add the ones first"], "pitfalls": ["no carry"]}',
        "Sure! Here is my summary.\n\nPRINCIPLES:\n- add the ones first\n\nMistakes to avoid:\n- no carry\n",
    ],
)
def test_parser_accepts_what_models_write(text):
    summary = parse_summary(text)
    assert summary is not None and summary.principles and "add the ones first" in " ".join(summary.principles)


@pytest.mark.parametrize(
    "text",
    ["", "   ", "The answer is 7.", "PRINCIPLES:\n\nPITFALLS:\n", "{not json", "[1,2]", "FLOW OF THOUGHT: just a plan"],
)
def test_parser_rejects_what_carries_no_lesson(text):
    assert parse_summary(text) is None


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=400))
def test_parser_never_crashes(text):
    result = parse_summary(text)
    assert result is None or (result.principles or result.pitfalls)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet=string.ascii_letters + " ", min_size=4, max_size=40).filter(lambda x: len(x.strip()) >= 3),
        min_size=1,
        max_size=5,
    ),
    st.lists(
        st.text(alphabet=string.ascii_letters + " ", min_size=4, max_size=40).filter(lambda x: len(x.strip()) >= 3),
        min_size=1,
        max_size=5,
    ),
)
def test_canonical_summaries_parse_back(principles, pitfalls):
    """Items of three or more characters (the parser's minimum) survive a round trip through the format."""
    from lanpo.prompts import Summary

    parsed = parse_summary(format_summary(Summary("a plan", principles, pitfalls)))
    assert parsed is not None
    assert parsed.principles == [p.strip() for p in principles]
    assert parsed.pitfalls == [p.strip() for p in pitfalls]


def test_summarize_counts_failures_and_scrubs_answers():
    from collections import Counter

    outputs = [
        "PRINCIPLES:\n- add ones first\n- the answer is 7\nPITFALLS:\n- forgetting to carry",
        "I cannot summarize this.",
        "PRINCIPLES:\n- it is 7\nPITFALLS:\n- 7",
    ]
    stats = Counter()
    trials = [Trial("a", "What is 3 + 4?", "3 + 4 = \\boxed{7}", True, gold="7") for _ in outputs]
    entries = summarize_trials(trials, lambda prompts: outputs[: len(prompts)], stats)
    assert len(entries) == 1 and entries[0].principles == ["add ones first"]
    assert stats["parse_failed"] == 1 and stats["empty_after_cleaning"] == 1 and stats["parsed"] == 1
    assert entries[0].correct is True and json.dumps(entries[0].to_dict())


def test_template_text_has_no_digits_that_could_collide_with_a_gold_answer():
    import re

    from lanpo.prompts import abstraction_text, reflection_text

    reflection = reflection_text("PROBLEM", ["ATTEMPT ONE", "ATTEMPT TWO", "ATTEMPT THREE"])
    abstraction = abstraction_text("PROBLEM", [(["RULE"], ["TRAP"])] * 3)
    assert not re.search(r"\d", reflection) and not re.search(r"\d", abstraction)


def test_summary_prompt_is_prefilled_and_the_reply_keeps_its_start(tiny_model):
    from lanpo.engine.generation import HFGenerator, chat_ids
    from lanpo.prompts import SUMMARY_PREFILL, summary_messages

    model, tokenizer = tiny_model
    messages = summary_messages("What is 1 + 1?", "1 + 1 = 2", True)
    rendered = tokenizer.decode(chat_ids(tokenizer, messages))
    assert rendered.rstrip().endswith(SUMMARY_PREFILL)  # generation continues the heading
    assert HFGenerator(model, tokenizer, max_new_tokens=4)([messages])[0].startswith(SUMMARY_PREFILL)


def test_real_gsm8k_contexts_show_no_gold_no_reward_and_only_lessons_of_other_problems(shared_data):
    from lanpo.data.loaders import load_problems

    problems = load_problems("gsm8k", data_dir=shared_data, limit=40)
    target, others = problems[0], problems[1:]
    off_by_one = int(float(target.answer)) + 1
    wrong = f"Let me compute step by step. The total is {off_by_one}. \\boxed{{{off_by_one}}}"
    reflection = build_reflection_prompt(target.problem, [wrong]).messages[0]["content"]
    assert wrong in reflection
    outside = reflection.replace(wrong, "").replace(target.problem, "")
    assert not re.search(rf"(?<!\d){re.escape(target.answer)}(?!\d)", outside)
    assert not re.search(r"reward|correct|gold|\u2713|\u2717", outside, re.IGNORECASE)

    entries = [
        PoolEntry(
            problem_id=p.id,
            problem=p.problem,
            flow_of_thought=f"solve it to get {p.answer}",
            principles=[f"principle of {p.id}", f"its answer is {p.answer}"],
            pitfalls=[f"pitfall of {p.id}"],
        )
        for p in others[:5]
    ]
    text = build_abstraction_prompt(target.problem, entries, problem_id=target.id).messages
    text = text[0]["content"]
    for p in others[:5]:
        assert f"principle of {p.id}" in text and f"pitfall of {p.id}" in text
        assert p.problem not in text and "solve it to get" not in text and f"its answer is {p.answer}" not in text
    assert not leakage_problems(text, target.answer, [target.problem])
