"""Privileged feedback sources (issue 52): worked solutions in the data, each source's context, the hint ladder,
escalation and anneal, reliance and transfer, the lift probe's labelling, and what must never see a solution."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.data.loaders import builtin_arith, gsm8k_rationale, load_problems, to_prompt_dataset
from lanpo.feedback.base import FeedbackRequest
from lanpo.feedback.privileged import (
    GoldSource,
    HintLadder,
    PrivilegedKit,
    Reference,
    ReferenceSource,
    SelfHintSource,
    hint_reliance,
    solution_prefix,
    split_steps,
    states_answer,
    take_references,
)
from lanpo.plan import ATTEMPTS, HINT_TOP
from lanpo.pool.store import ExperiencePool
from lanpo.prompts import SOLVE_INSTRUCTION
from lanpo.verify.answers import last_boxed
from lanpo.verify.numerals import word_number

SOLUTION = "We need the sum of 7 and 5.\nStart from 7 and count up 5: 7 + 5 = 12.\nSo the answer is \\boxed{12}."


def kit(references=None, write=None, right=None) -> PrivilegedKit:
    return PrivilegedKit(
        references if references is not None else {"p": Reference("12", SOLUTION)},
        HintLadder(),
        right=right or (lambda references, texts, problems: [r.answer in t for r, t in zip(references, texts)]),
        write=write,
    )


# -- worked solutions in the data -------------------------------------------------------------------------------


def test_builtin_arith_writes_a_stepwise_solution_ending_in_its_answer_at_every_level():
    for level in range(1, 6):
        problems = builtin_arith(str(level), n=40, split="train") + builtin_arith(str(level), n=20, split="test")
        for p in problems:
            steps = split_steps(p.solution)
            assert len(steps) >= 3, p  # at least two working steps before the answer line
            assert last_boxed(steps[-1]) == p.answer and not any(last_boxed(s) for s in steps[:-1])


def test_gsm8k_reads_its_rationale_without_calculator_annotations(shared_data):
    problems = load_problems("gsm8k", split="train", limit=20, data_dir=shared_data)
    first = problems[0]
    assert first.solution.startswith("Natalia sold 48/2 = 24 clips in May.")
    assert all("<<" not in p.solution and "####" not in p.solution for p in problems)
    assert gsm8k_rationale("a = <<1+1=2>>2\n#### 2") == "a = 2"
    assert gsm8k_rationale("no marker") is None


def test_math_style_and_local_files_read_a_solution_field(shared_data, tmp_path):
    math500 = load_problems("math500", limit=5, data_dir=shared_data)
    assert all(p.solution and "\\boxed" in p.solution for p in math500)
    rows = [
        {"q": "What is 2 + 2?", "a": "4", "worked": "2 + 2 = 4.\nSo 4."},
        {"q": "What is 3 + 3?", "a": "6"},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    mine = load_problems(str(path), problem_field="q", answer_field="a", solution_field="worked")
    assert [p.solution for p in mine] == ["2 + 2 = 4.\nSo 4.", None]
    assert load_problems(str(path), problem_field="q", answer_field="a")[0].solution is None


def test_the_trainer_takes_solutions_out_of_the_dataset_before_trl_sees_a_row():
    dataset = to_prompt_dataset(builtin_arith("1", n=4))
    assert "solution" in dataset.column_names
    stripped, references = take_references(dataset)
    assert "solution" not in stripped.column_names
    assert set(references) == set(dataset["problem_id"])
    assert all(r.solution and r.answer for r in references.values())


# -- contexts, against hand-written examples --------------------------------------------------------------------


def test_split_steps_cuts_lines_or_sentences_but_never_inside_math():
    assert split_steps("a\n\nb\n c ") == ["a", "b", "c"]
    assert split_steps("We have $x = 1. 5$ here. Then y is 2. So done!") == [
        "We have $x = 1. 5$ here.",
        "Then y is 2.",
        "So done!",
    ]
    assert split_steps("3.5 is the value.") == ["3.5 is the value."]


@pytest.mark.parametrize(
    "level,expected",
    [(1, "We need the sum of 7 and 5."), (2, "We need the sum of 7 and 5.\nStart from 7 and count up 5: 7 + 5 = 12.")],
)
def test_the_reference_context_is_the_solution_prefix_at_its_level(level, expected):
    [[feedback, again]] = ReferenceSource(kit()).contexts(
        [FeedbackRequest("p", "Compute 7 + 5.", 2, level=level)], Counter()
    )
    assert feedback == again and feedback.level == level
    assert feedback.messages[0]["content"] == (
        "Compute 7 + 5.\n\nThe following text is the beginning part of the answer, which you can refer to for "
        f"solving the problem:\n{expected}\n\n{SOLVE_INSTRUCTION}"
    )


def test_a_prefix_never_holds_the_last_step_and_anneals_to_nothing():
    assert solution_prefix(SOLUTION, 0.75) == solution_prefix(SOLUTION, 1.0)  # capped at all but the last
    assert solution_prefix(SOLUTION, 0.1) is None
    source = ReferenceSource(kit())
    [[annealed]] = source.contexts([FeedbackRequest("p", "x", 1, level=1, scale=0.2)], Counter())
    assert annealed.messages is None and annealed.reason == "annealed"
    [[missing]] = source.contexts([FeedbackRequest("q", "x", 1)], Counter())
    assert missing.messages is None and missing.reason == "no_solution"


def test_the_gold_context_shows_the_attempt_the_verdict_and_the_answer(tmp_path):
    source = GoldSource(ExperiencePool(":memory:"), ATTEMPTS["step"], kit())
    request = FeedbackRequest("p", "Compute 7 + 5.", 2, attempts=("It is 13.", "It is 12."))
    [[wrong, right]] = source.contexts([request], Counter())
    assert wrong.messages[0]["content"] == (
        "Problem:\nCompute 7 + 5.\n\nBelow is an earlier solution to this problem.\n\n### Earlier solution\n"
        "It is 13.\n\nCritique: The generated solution is incorrect, the ground truth is 12.\n\nSolve the problem "
        f"again from the start, writing a complete solution. {SOLVE_INSTRUCTION}"
    )
    assert "The generated solution is correct, the ground truth is 12." in right.messages[0]["content"]
    [[none]] = source.contexts([FeedbackRequest("p", "Compute 7 + 5.", 1, attempts=())], Counter())
    assert none.messages is None and none.reason == "no_attempt"


def test_self_hints_are_used_dropped_when_they_state_the_answer_and_fall_back_when_unparsed():
    written = iter(["Hint: count up from the larger number.", "Hint: the result is twelve.", "Hint: ??"])
    seen = []

    def write(prompts):
        seen.append(prompts)
        return [next(written) for _ in prompts]

    references = {pid: Reference("12", SOLUTION) for pid in "abc"}
    source = SelfHintSource(kit(references, write=write))
    counts = Counter()
    requests = [FeedbackRequest(pid, "Compute 7 + 5.", 1) for pid in "abc"]
    [[used], [dropped], [fallback]] = source.contexts(requests, counts)
    assert used.messages[0]["content"] == (
        f"Compute 7 + 5.\n\n## Hint.\ncount up from the larger number.\n\n{SOLVE_INSTRUCTION}"
    )
    assert seen[0][0][-1] == {"role": "assistant", "content": "Hint:"} and SOLUTION in seen[0][0][0]["content"]
    assert dropped.messages is None and dropped.reason == "hint_states_answer"
    assert "The following text is the beginning part of the answer" in fallback.messages[0]["content"]
    assert counts == Counter(self_hint_written=3, self_hint_states_answer=1, self_hint_unparsed=1)
    assert source.contexts([], Counter()) == [] and seen[-1] == []  # a process without groups writes too


# -- the answer check, both directions --------------------------------------------------------------------------

NUMBER_WORDS = {0: "zero", 3: "three", 7: "seven", 12: "twelve", 15: "fifteen", 20: "twenty", 40: "forty"}


@settings(max_examples=60, deadline=None)
@given(
    answer=st.integers(min_value=0, max_value=999),
    form=st.sampled_from(["digits", "decimal", "fraction", "latex", "word"]),
    before=st.sampled_from(["Try", "Remember that the total is", "Think of"]),
)
def test_a_hint_that_states_the_answer_in_any_form_is_dropped(answer, form, before):
    if form == "word" and answer not in NUMBER_WORDS:
        form = "digits"
    written = {
        "digits": str(answer),
        "decimal": f"{answer}.0",
        "fraction": f"{2 * answer}/2",
        "latex": f"\\frac{{{3 * answer}}}{{3}}",
        "word": NUMBER_WORDS.get(answer, ""),
    }[form]
    assert states_answer(f"{before} {written} here.", str(answer), "math")


@settings(max_examples=60, deadline=None)
@given(
    answer=st.integers(min_value=0, max_value=999),
    others=st.lists(st.integers(min_value=0, max_value=999), max_size=3),
    words=st.lists(st.sampled_from(["add", "the", "ones", "carry", "count", "up", "tens", "first"]), min_size=3),
)
def test_a_hint_free_of_the_answer_is_kept(answer, others, words):
    numbers = [n for n in others if n != answer and word_number(str(n)) != answer]
    hint = " ".join(words + [str(n) for n in numbers]) + "."
    assert not states_answer(hint, str(answer), "math")


# -- hint levels: the ladder, escalation, anneal ----------------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=1), max_size=20), st.integers(min_value=1, max_value=HINT_TOP))
def test_the_ladder_moves_up_after_failing_and_down_after_succeeding(accuracies, start):
    ladder = HintLadder(start=start)
    expected = start
    for accuracy in accuracies:
        expected = (
            min(HINT_TOP, expected + 1) if accuracy <= 0.1 else max(1, expected - 1) if accuracy > 0.35 else expected
        )
        assert ladder.update("p", accuracy) == expected == ladder.level("p")
    fixed = HintLadder(start=start, adaptive=False)
    for accuracy in accuracies:
        assert fixed.update("p", accuracy) == start
    restored = HintLadder(start=start)
    restored.load_state_dict(json.loads(json.dumps(ladder.state_dict())))
    assert restored.level("p") == ladder.level("p")


def test_the_hint_scale_anneals_linearly_to_zero(tmp_path):
    from lanpo.config import LanpoConfig

    args = LanpoConfig(output_dir=str(tmp_path), hint_anneal_steps=4, feedback_source="reference", use_cpu=True)
    assert [args.step_plan(s).hint_scale for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert LanpoConfig(output_dir=str(tmp_path), use_cpu=True).step_plan(3).hint_scale == 1.0


# -- reliance and transfer --------------------------------------------------------------------------------------


def test_reliance_is_the_mean_token_log_probability_gap_over_right_feedback_rows():
    from lanpo import loss
    from lanpo.plan import OBJECTIVES
    from lanpo.run.metrics import GroupOutcome, Transfer

    assert hint_reliance([-2.0, -4.0], [-1.0, -1.0]) == pytest.approx(2.0)
    nan = float("nan")
    capture = loss.LossCapture(
        plan=None,
        inputs={"completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])},
        feedback=torch.tensor([True, True, False, True]),
        context=torch.tensor([[-1.0, -1.0, nan], [-0.5, -0.5, -0.5], [nan, nan, nan], [-0.1, -0.1, nan]]),
        old=torch.tensor([[-2.0, -4.0, 0.0], [-1.0, -1.0, -1.0], [-9.0, 0.0, 0.0], [-5.0, -5.0, 0.0]]),
        correct=torch.tensor([True, True, True, False]),
    )
    sums = loss.reliance_sums(capture)
    # rows 0 and 1 are right feedback rows: (−1 − (−3)) and (−0.5 − (−1)); row 2 is scratch, row 3 wrong
    assert sums.tolist() == pytest.approx([2.0 + 0.5, 2.0])
    assert OBJECTIVES["keep"].keeps_context  # under keep the loss holds no pi(y|x): no reliance
    capture.context = None
    assert loss.reliance_sums(capture) is None

    transfer = Transfer()
    transfer.update(0, [GroupOutcome("a", False, True), GroupOutcome("b", True, True), GroupOutcome("c", False, False)])
    transfer.update(1, [GroupOutcome("a", False, True), GroupOutcome("c", False, True), GroupOutcome("b", False, True)])
    assert transfer.metrics() == {"lanpo/transfer": 0.0, "lanpo/transfer_problems": 2.0}  # a and c; b had scratch
    transfer.update(2, [GroupOutcome("a", True, False)])
    assert transfer.metrics() == {"lanpo/transfer": 0.5, "lanpo/transfer_problems": 2.0}
    again = Transfer()
    again.load_state_dict(json.loads(json.dumps(transfer.state_dict())))
    assert again.metrics() == transfer.metrics() and again.later_from_scratch == {"a": 2}


# -- training runs with each source -----------------------------------------------------------------------------

NEW_METRICS = ("lanpo/feedback_lift/{source}", "lanpo/transfer_problems")
LEVELED = ("hint/level_mean", "hint/accuracy/L2", "hint/rows/L2", "hint/escalated")  # every row escalated 1 -> 2


@pytest.mark.parametrize("mode", ["strip", "keep"])
@pytest.mark.parametrize("source", ["reference", "gold", "self-hint"])
def test_a_short_run_of_each_source_logs_finite_loss_and_its_metrics(tiny_model_dir, tmp_path, source, mode):
    from test_trainer import history, make_trainer, stub_summaries

    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        feedback_source=source,
        context_in_loss=mode,
        max_steps=2,
        hint_escalation=1,
        summaries_per_group=1,
    )
    stub_summaries(trainer)
    scored = []

    def right(rows):  # every hinted row fails, so escalation has work; scratch rows of group 0 succeed
        scored.append(len(rows))
        return [False] * len(rows)

    trainer.policy.rollout.score = right
    trainer.train()
    losses = history(trainer, "loss")
    assert losses and all(math.isfinite(x) for x in losses)
    logged = {k for h in trainer.state.log_history for k in h}
    assert f"lanpo/feedback_lift/{source}" in logged and "lanpo/feedback_share" in logged
    if source != "gold":
        assert set(LEVELED) <= logged
        assert history(trainer, "hint/escalated")[0] > 0  # the failed hinted rows went a level up
        assert history(trainer, "hint/level_mean")[0] > 1
    if mode == "strip":
        assert "lanpo/hint_reliance" in logged or "lanpo/feedback_lift" in logged
    if source == "self-hint":
        assert "hint/self_hint_written" in logged
    config = json.loads((Path(trainer.args.output_dir) / "config.json").read_text())
    assert config["feedback_source"] == source
    from lanpo.run.metrics import METRICS, metric_pattern

    assert all(metric_pattern(k) for k in logged if k.startswith(("lanpo/", "hint/"))), "documented in METRICS"
    assert METRICS


def test_no_solution_reaches_a_scratch_row_an_attempt_a_summary_or_the_reward(tiny_model_dir, tmp_path):
    from test_trainer import make_trainer, stub_summaries

    seen_kwargs = []

    def reward(completions, **kwargs):
        seen_kwargs.append(set(kwargs))
        return [float(len(str(c)) % 3) for c in completions]

    trainer = make_trainer(tiny_model_dir, tmp_path, feedback_source="reference", reward_funcs=[reward], max_steps=2)
    stub_summaries(trainer)
    references = dict(trainer.references)
    steps = {s for r in references.values() for s in split_steps(r.solution)}
    rows_seen, trials_seen = [], []
    after, add = trainer.after_rollouts, trainer.writer.add

    def capture(output, generation):
        rows_seen.extend(generation.rows)
        after(output, generation)

    def summaries(trials, texts):
        trials_seen.extend(trials)
        add(trials, texts)

    trainer.after_rollouts, trainer.writer.add = capture, summaries
    trainer.train()
    assert seen_kwargs and all("solution" not in k for k in seen_kwargs)
    scratch = [r for r in rows_seen if not r.has_feedback]
    hinted = [r for r in rows_seen if r.has_feedback]
    assert hinted and all(r.kind == "reference" for r in hinted)
    assert any(step in r.context[0]["content"] for r in hinted for step in steps)
    assert all(r.context is None for r in scratch)
    assert trials_seen


def test_rows_written_under_a_privileged_context_are_never_summarized_or_stored():
    from lanpo.rollout import Row, attempts_to_store, choose_trials

    rows = [Row("p", "Compute 7 + 5.", "12", "scratch", text="twelve")]
    rows += [
        Row("p", "Compute 7 + 5.", "12", kind, context=[{"role": "user", "content": "c"}], text=SOLUTION)
        for kind in ("reference", "gold", "self-hint")
    ]
    trials = choose_trials(rows, [1.0, 1.0, 0.0, 0.0], [True, True, False, False], 4, budget=4, step=0)
    assert [t.completion for t in trials] == ["twelve"]
    assert [a.text for a in attempts_to_store(rows, 0)] == ["twelve"]
    rows[1].kind = "reflection"  # a label-free feedback row may still be summarized
    assert len(choose_trials(rows, [1.0] * 4, [True] * 4, 4, budget=4, step=0)) == 2


def test_feedback_ratio_zero_with_a_privileged_source_is_exactly_trl_grpo(tiny_model_dir, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from lanpo.engine.models import load_tokenizer
    from test_trainer import common, history, length_reward, make_trainer

    grpo = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[length_reward],
        args=GRPOConfig(**common(tmp_path, "grpo", max_steps=2)),
        train_dataset=to_prompt_dataset(builtin_arith("1", n=8)).remove_columns("solution"),
        processing_class=load_tokenizer(str(tiny_model_dir)),
    )
    grpo.train()
    lanpo = make_trainer(
        tiny_model_dir, tmp_path, "lanpo", feedback_ratio=0.0, feedback_source="self-hint", summaries_per_group=0
    )
    lanpo.train()
    for (name, a), (_, b) in zip(grpo.model.named_parameters(), lanpo.model.named_parameters()):
        assert torch.equal(a, b), name
    assert history(grpo, "loss") == history(lanpo, "loss")


def test_reference_needs_solutions_and_says_how_to_get_them(tiny_model_dir, tmp_path):
    from lanpo.config import LanpoConfig
    from lanpo.engine.models import load_tokenizer
    from lanpo.trainer import LanpoTrainer
    from test_trainer import common

    dataset = to_prompt_dataset(builtin_arith("1", n=8)).remove_columns("solution")
    with pytest.raises(ValueError, match="solution_field"):
        LanpoTrainer(
            model=str(tiny_model_dir),
            args=LanpoConfig(**common(tmp_path), feedback_source="reference"),
            train_dataset=dataset,
            processing_class=load_tokenizer(str(tiny_model_dir)),
        )


@pytest.mark.parametrize("field,value", [("feedback_source", "teacher"), ("hint_level", 4), ("hint_escalation", -1)])
def test_bad_hint_settings_fail_before_any_model_loads(tmp_path, field, value):
    from lanpo.config import LanpoConfig

    with pytest.raises(ValueError, match=field):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, **{field: value})


def test_a_checkpoint_keeps_the_ladder_and_transfer(tiny_model_dir, tmp_path):
    from test_trainer import make_trainer

    first = make_trainer(
        tiny_model_dir, tmp_path, feedback_source="reference", max_steps=2, save_strategy="steps", save_steps=2
    )
    first.policy.rollout.score = lambda rows: [False] * len(rows)
    first.train()
    state = json.loads((tmp_path / "run" / "checkpoint-2" / "feedback_state.json").read_text())
    assert state["hint_ladder"]["levels"] == first.hint_ladder.levels and first.hint_ladder.levels
    resumed = make_trainer(tiny_model_dir, tmp_path, feedback_source="reference", max_steps=3)
    loaded, load = [], resumed.hint_ladder.load_state_dict
    resumed.hint_ladder.load_state_dict = lambda state: (loaded.append(dict(state["levels"])), load(state))
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert loaded == [first.hint_ladder.levels]


# -- the lift probe ---------------------------------------------------------------------------------------------


def test_privileged_modes_are_labelled_and_never_reach_a_comparison(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from lanpo.engine.models import load_tokenizer
    from lanpo.eval.evaluate import EvalSettings, evaluate, write_results
    from lanpo.report.compare import _evals

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    problems = builtin_arith("1", n=3, split="test")
    settings_ = EvalSettings(k=2, max_new_tokens=6, hint_level=2)
    results = evaluate(
        model, load_tokenizer(str(tiny_model_dir)), problems, settings_, ("zero-shot", "reference", "gold", "self-hint")
    )
    out = write_results(
        results, tmp_path / "run" / "eval-probe", {"model": "tiny", "data": "arith", "settings": {"k": 2}}
    )
    data = json.loads((out / "results.json").read_text())
    assert [m for m, r in data["modes"].items() if r.get("privileged")] == ["reference", "gold", "self-hint"]
    table = (out / "results.md").read_text()
    assert "| reference (privileged) |" in table and "not a test score" in table
    assert "| zero-shot |" in table
    assert set(_evals(tmp_path / "run")) == {"eval-probe/zero-shot"}
    zero_shot = [json.loads(x) for x in (out / "completions-zero-shot.jsonl").read_text().splitlines()]
    assert all(p.solution.splitlines()[0] not in r["prompt"] for p, r in zip(problems, zero_shot))
    reference = [json.loads(x) for x in (out / "completions-reference.jsonl").read_text().splitlines()]
    assert all(p.solution.splitlines()[0] in r["prompt"] for p, r in zip(problems, reference))


def test_evaluation_during_training_has_no_privileged_mode(tmp_path):
    from lanpo.config import EVAL_MODES, LanpoConfig

    assert not set(EVAL_MODES) & {"reference", "gold", "self-hint"}
    with pytest.raises(ValueError, match="eval_modes"):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, eval_modes="reference")
