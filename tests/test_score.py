"""The scoring route (lanpo.score): the teacher's signal equals its formulas and TRL's self-distillation gradient,
carries no gradient, never crosses an advantage's sign where it should not, and in the trainer λ = 0 is GRPO bit for
bit, every form trains with finite losses, a frozen teacher stays frozen, and no context reaches a plain prompt."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo import score
from lanpo.config import LanpoConfig
from lanpo.feedback.privileged import Reference
from lanpo.plan import Scoring
from test_trainer import history, make_trainer

ADDITIVE = Scoring(source="gold", form="additive", teacher="initial", coef=0.7, clip=1.5, rows="all")


def scoring(**changes) -> Scoring:
    from dataclasses import replace

    return replace(ADDITIVE, **changes)


def batch(rows: int, width: int, seed: int, padding: str = "right", scored_rows: list[bool] | None = None):
    """A micro-batch as TRL's loss reads it: advantages, a completion mask padded on one side, old log-probs, and the
    teacher's log-probs (NaN on rows not scored)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    positions = torch.arange(width)[None, :]
    mask = positions < lengths[:, None] if padding == "right" else positions >= width - lengths[:, None]
    teacher = -torch.rand(rows, width, generator=g) * 4
    scored_rows = scored_rows if scored_rows is not None else [True] * rows
    teacher[~torch.tensor(scored_rows)] = math.nan
    return {
        "advantages": torch.randn(rows, generator=g),
        "completion_mask": mask.int(),
        "teacher": teacher,
        "old": -torch.rand(rows, width, generator=g) * 4,
        "wrong": -torch.rand(rows, 2, width, generator=g) * 4,
    }


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    width=st.integers(1, 9),
    seed=st.integers(0, 10_000),
    padding=st.sampled_from(["right", "left"]),
    scored=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_additive_advantages_equal_the_formula_on_any_shape_mask_and_padding(rows, width, seed, padding, scored):
    b = batch(rows, width, seed, padding, scored[:rows])
    inputs = {"advantages": b["advantages"].clone(), "completion_mask": b["completion_mask"]}
    capture = score.ScoreCapture(ADDITIVE, b["teacher"], None, None)
    sums = score.rewrite_advantages(inputs, b["old"], capture)
    got = inputs["advantages"]
    assert got.shape == (rows, width)
    for i in range(rows):
        for t in range(width):
            expected = float(b["advantages"][i])
            if scored[i] and b["completion_mask"][i, t]:
                delta = min(max(float(b["teacher"][i, t] - b["old"][i, t]), -ADDITIVE.clip), ADDITIVE.clip)
                expected += ADDITIVE.coef * delta
            assert math.isclose(float(got[i, t]), expected, rel_tol=1e-5, abs_tol=1e-6)
    tokens = int((b["completion_mask"].bool() & torch.tensor(scored[:rows])[:, None]).sum())
    assert int(sums[1]) == tokens and int(sums[5]) == sum(scored[:rows])


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(1, 9), seed=st.integers(0, 10_000), coef=st.floats(0.15, 2.0))
def test_contrastive_advantages_equal_rlcsd_and_never_flip_the_sign_of_a_nonzero_advantage(rows, width, seed, coef):
    b = batch(rows, width, seed)
    inputs = {"advantages": b["advantages"].clone(), "completion_mask": b["completion_mask"]}
    capture = score.ScoreCapture(scoring(form="contrastive", coef=coef), b["teacher"], b["wrong"], None)
    score.rewrite_advantages(inputs, b["old"], capture)
    got = inputs["advantages"]
    for i in range(rows):
        base = float(b["advantages"][i])
        for t in range(width):
            expected = base
            if b["completion_mask"][i, t]:
                wrong = [math.exp(float(b["wrong"][i, k, t])) for k in range(2)]
                e = float(b["teacher"][i, t]) - math.log(sum(wrong) / 2)
                r = max(-0.5, min(0.5, 0.2 * coef * math.tanh(e / 0.03)))
                if abs(r) > 0.02:
                    expected = base + r
                    expected = max(expected, 0.0) if base > 0 else min(expected, 0.0) if base < 0 else expected
            # float32 inputs, 1/τ = 33 amplifies their rounding inside the tanh: 1e-5 absolute
            assert math.isclose(float(got[i, t]), expected, rel_tol=1e-5, abs_tol=1e-5)
            assert float(got[i, t]) * base >= 0 or base == 0


def test_the_additive_gradient_is_lambda_times_trls_sampled_token_self_distillation_gradient():
    from trl.experimental.sdpo.loss_utils import compute_sampled_token_self_distillation_loss
    from trl.trainer.utils import selective_log_softmax

    torch.manual_seed(0)
    rows, width, vocab, coef = 3, 5, 11, 0.6
    teacher_logits = torch.randn(rows, width, vocab)
    ids = torch.randint(0, vocab, (rows, width))
    mask = torch.ones(rows, width)
    mask[0, 3:] = 0

    def gradient(loss_of):
        logits = torch.randn(rows, width, vocab, generator=torch.Generator().manual_seed(1)).requires_grad_()
        loss_of(logits).backward()
        return logits.grad

    def trl(logits):
        per_token = compute_sampled_token_self_distillation_loss(logits, teacher_logits, ids, distillation_alpha=1.0)
        return coef * (per_token * mask).sum() / mask.sum()

    def lanpo(logits):  # TRL's GRPO surrogate at ratio 1 (on-policy) with the rewritten advantages, Â = 0
        logps = selective_log_softmax(logits, ids)
        inputs = {"advantages": torch.zeros(rows), "completion_mask": mask}
        teacher = selective_log_softmax(teacher_logits, ids)
        capture = score.ScoreCapture(scoring(coef=coef, clip=1e9), teacher, None, None)
        score.rewrite_advantages(inputs, logps, capture)
        ratio = torch.exp(logps - logps.detach())
        return -(inputs["advantages"] * ratio * mask).sum() / mask.sum()

    torch.testing.assert_close(gradient(lanpo), gradient(trl), rtol=1e-5, atol=1e-7)


def test_the_teachers_signal_carries_no_gradient():
    b = batch(3, 4, 0)
    teacher = b["teacher"].nan_to_num().requires_grad_()
    old = b["old"].requires_grad_()
    assert not score.additive_delta(teacher, old, b["completion_mask"].bool(), 1.0).requires_grad
    r, e = score.contrastive_residual(teacher, b["wrong"].requires_grad_(), b["completion_mask"].bool(), 0.5)
    assert not r.requires_grad and not e.requires_grad


def rows_of(problems: list[tuple[str, str, str]], g: int, right: list[bool]) -> list[score.ScoredRow]:
    """Rows of len(problems) groups of g: (problem, answer, solution) each."""
    out = []
    for i, (problem, answer, solution) in enumerate(problems):
        for j in range(g):
            ok = right[i * g + j]
            out.append(score.ScoredRow(f"p{i}", problem, f"attempt {i}.{j}", ok, Reference(answer, solution)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    answers=st.lists(st.integers(0, 999).map(str), min_size=2, max_size=4, unique=True),
    source=st.sampled_from(["gold", "reference", "sibling"]),
    right=st.lists(st.booleans(), min_size=16, max_size=16),
    wrong=st.integers(1, 3),
)
def test_wrong_contexts_differ_from_the_right_one_only_in_what_they_show(answers, source, right, wrong):
    g = 4
    problems = [(f"What is {a} + 0?", a, f"Start from {a}.\nAdd zero.\nThe sum is {a}.") for a in answers]
    rows = rows_of(problems, g, right[: len(answers) * g])
    contexts = score.teacher_contexts(rows, g, scoring(source=source, form="contrastive", wrong=wrong, level=2))
    for i, (row, context) in enumerate(zip(rows, contexts)):
        group = rows[i - i % g : i - i % g + g]
        if source == "sibling" and not any(r.right for k, r in enumerate(group) if k != i % g):
            assert context is None  # no right sibling: nothing to show
            continue
        if context is None:
            continue
        right_text = context.right[-1]["content"]
        assert right_text.startswith(row.problem)
        assert 1 <= len(context.wrong) <= wrong
        for other in context.wrong:
            wrong_text = other[-1]["content"]
            assert wrong_text != right_text
            head = len(_common_prefix(right_text, wrong_text))
            tail = len(_common_prefix(right_text[::-1], wrong_text[::-1]))
            differs = right_text[head : len(right_text) - tail]
            shown = score.shown_for(source, row.problem, row.reference, _sibling(group, i % g), 2)
            assert differs in shown, (differs, shown)  # the difference lies inside the shown part


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _sibling(group, j):
    return next((r.text for k, r in enumerate(group) if k != j and r.right), None)


def test_scored_rows_are_the_failed_ones_by_default_and_a_sibling_is_never_the_row_itself():
    rows = rows_of([("1 + 1?", "2", "1 + 1 = 2"), ("2 + 2?", "4", "2 + 2 = 4")], 4, [True, False, False, True] * 2)
    failed = score.teacher_contexts(rows, 4, scoring(source="sibling", rows="failed"))
    assert [c is not None for c in failed] == [False, True, True, False] * 2
    for i, context in enumerate(failed):
        if context is not None:  # the first right row of the group that is not this one
            assert f"attempt {i // 4}.0" in context.right[-1]["content"]
    every = score.teacher_contexts(rows, 4, scoring(source="sibling", rows="all"))
    assert "attempt 0.3" in every[0].right[-1]["content"] and "attempt 0.0" in every[3].right[-1]["content"]
    gold = score.teacher_contexts(rows, 4, scoring(source="gold", rows="all"))
    assert "the ground truth is 2" in gold[0].right[-1]["content"]


def test_answer_tokens_are_the_ones_that_write_the_final_answer(tiny_model_dir):
    from lanpo.engine.models import load_tokenizer

    tok = load_tokenizer(str(tiny_model_dir))
    text = "First 3 + 4 = 7, so the answer is \\boxed{17} today"
    ids = tok.encode(text, add_special_tokens=False)
    decode = lambda part: tok.decode(part, skip_special_tokens=True)  # noqa: E731
    mask = score.answer_token_mask(ids, decode, score.answer_span(decode(ids), "17"))
    marked = [i for i, m in enumerate(mask) if m]
    assert marked == list(range(marked[0], marked[-1] + 1))  # one run of tokens
    assert "17" in decode([ids[i] for i in marked]) and "First" not in decode([ids[i] for i in marked])
    assert not any(score.answer_token_mask(ids, decode, None))


# ---------------------------------------------------------------------------------------------------------------
# In the trainer


def test_scoring_with_lambda_zero_is_exactly_grpo(tiny_model_dir, tmp_path):
    grpo = make_trainer(tiny_model_dir, tmp_path, "grpo", feedback_ratio=0.0, summaries_per_group=0, max_steps=2)
    grpo.train()
    scored = make_trainer(
        tiny_model_dir,
        tmp_path,
        "scored",
        feedback_route="score",
        feedback_source="gold",
        score_coef=0.0,
        summaries_per_group=0,
        max_steps=2,
    )
    scored.train()
    for (name, a), (_, b) in zip(grpo.model.named_parameters(), scored.model.named_parameters()):
        assert torch.equal(a, b), name
    assert history(grpo, "loss") == history(scored, "loss")


FORMS = {
    "additive-gold-initial": dict(feedback_source="gold"),
    "contrastive-reference": dict(feedback_source="reference", score_form="contrastive", hint_level=1),
    "additive-reference-control": dict(feedback_source="reference", score_context="control", hint_level=2),
    "additive-sibling-live": dict(feedback_source="sibling", score_teacher="live"),
    "additive-gold-ema-beta0": dict(feedback_source="gold", score_teacher="ema", beta=0.0, score_ema_rate=0.5),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_trains_with_finite_losses_and_scores_only_plain_rows(tiny_model_dir, tmp_path, form):
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        form,
        feedback_route="score",
        score_rows="all",
        summaries_per_group=1,
        max_steps=2,
        **FORMS[form],
    )
    teacher = trainer.teacher.weights if trainer.teacher.weights is not None else trainer.ref_model
    own_weights = trainer.args.score_teacher in ("initial", "ema")
    frozen = [p.detach().clone() for p in teacher.parameters()] if own_weights else None
    generated_from, generate = [], trainer._generate_single_turn

    def spy(prompt_ids, *args, **kwargs):  # every prompt the policy generates from (TRL's plain rollout path)
        generated_from.extend(trainer.processing_class.decode(ids) for ids in prompt_ids)
        return generate(prompt_ids, *args, **kwargs)

    trainer._generate_single_turn = spy
    trainer.train()
    assert generated_from
    losses = history(trainer, "loss")
    assert losses and all(math.isfinite(x) for x in losses)
    assert history(trainer, "score/rows") and max(history(trainer, "score/rows")) > 0
    assert all(math.isfinite(x) for x in history(trainer, "score/delta_mean"))
    assert history(trainer, "lanpo/feedback_share") == [0.0, 0.0]  # every row a plain rollout
    if frozen is not None:
        unchanged = all(torch.equal(a, b) for a, b in zip(frozen, teacher.parameters()))
        assert unchanged == (trainer.args.score_teacher == "initial"), "the start model never moves; an EMA does"
    # nothing the context shows reaches a prompt the policy samples from, or a logged sample's prompt
    run = Path(trainer.args.output_dir)
    prompts = generated_from + [json.loads(line)["prompt"] for line in (run / "samples.jsonl").read_text().splitlines()]
    for prompt in prompts:
        for marker in ("A note for solving it", "Below is a correct solution", "beginning part of the answer"):
            assert marker not in prompt


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(feedback_source="sibling"), "needs feedback_route score"),
        (dict(feedback_route="score", feedback_source="self"), "writes its contexts by generating"),
        (dict(feedback_route="both", feedback_source="sibling"), "sibling can only score"),
        (dict(feedback_route="score", feedback_source="gold", score_coef=-1.0), "score_coef"),
        (dict(feedback_route="score", feedback_source="gold", score_form="nope"), "score_form"),
    ],
)
def test_scoring_settings_that_cannot_work_are_refused_by_name(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        LanpoConfig(output_dir=str(tmp_path), num_generations=4, use_cpu=True, **fields)


def test_the_plan_decodes_the_route_once():
    plain = LanpoConfig(output_dir="unused", num_generations=4, use_cpu=True).step_plan(0)
    assert plain.scoring is None and plain.group.feedback == 3
    scored = LanpoConfig(
        output_dir="unused", num_generations=4, use_cpu=True, feedback_route="score", feedback_source="reference"
    ).step_plan(0)
    assert scored.scoring.source == "reference" and scored.group.feedback == 0 and not scored.has_feedback
    both = LanpoConfig(
        output_dir="unused", num_generations=4, use_cpu=True, feedback_route="both", feedback_source="gold"
    ).step_plan(0)
    assert both.scoring.source == "gold" and both.group.kinds == (("gold", 3),)


def test_a_batch_whose_problems_share_their_gold_contrasts_with_the_answers_neighbours():
    rows = rows_of([("3 + 4?", "7", "3 + 4 = 7"), ("2 + 5?", "7", "2 + 5 = 7")], 2, [False] * 4)
    contexts = score.teacher_contexts(rows, 2, scoring(source="gold", form="contrastive", wrong=2, rows="all"))
    for context in contexts:
        assert "the ground truth is 7." in context.right[-1]["content"]
        shown = [m[-1]["content"] for m in context.wrong]
        assert len(shown) == 2 and "the ground truth is 8." in shown[0] and "the ground truth is 6." in shown[1]
    assert score.perturbed_answers("1,000") == ["1001", "999", "1002", "998", "1010", "990"]
    assert score.perturbed_answers("3/4") == [] and score.perturbed_answers("x") == []


def test_the_control_reads_each_row_under_another_problems_context_in_the_same_template():
    rows = rows_of([("1 + 1?", "2", "1 + 1 = 2"), ("2 + 2?", "4", "2 + 2 = 4")], 4, [False] * 8)
    right = score.teacher_contexts(rows, 4, scoring(source="gold", rows="all"))
    control = score.teacher_contexts(rows, 4, scoring(source="gold", rows="all", control=True))
    for i in range(8):
        own, other = ("2", "4") if i < 4 else ("4", "2")
        assert f"the ground truth is {own}." in right[i].right[-1]["content"]
        assert f"the ground truth is {other}." in control[i].right[-1]["content"]
        swapped = control[i].right[-1]["content"].replace(f"is {other}.", f"is {own}.")
        assert swapped == right[i].right[-1]["content"]


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 4),
    g=st.integers(1, 4),
    source=st.sampled_from(["gold", "reference", "sibling"]),
    form=st.sampled_from(["additive", "contrastive"]),
    control=st.booleans(),
    wrong=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_a_rows_wrong_contexts_fit_what_its_form_reads(groups, g, source, form, control, wrong, seed):
    """The teacher allocates ``wrong`` slots a row under the contrastive form and none under the additive one (the
    additive control reads one context a row, as the arm it controls does): every row's contexts fit."""
    rng = random.Random(seed)
    problems = [(f"{a} + {a}?", str(2 * a), f"{a} + {a} = {2 * a}") for a in range(1, groups + 1)]
    rows = rows_of(problems, g, [rng.random() < 0.5 for _ in range(groups * g)])
    chosen = scoring(source=source, form=form, control=control, wrong=wrong, rows="all")
    for context in score.teacher_contexts(rows, g, chosen):
        if context is None:
            continue
        if form == "additive":
            assert context.wrong == ()
        else:
            assert 1 <= len(context.wrong) <= wrong


def test_a_teacher_prompt_ends_like_the_plain_prompt_so_the_first_completion_token_sits_alike(tiny_model_dir):
    """The completion's ids follow the context prompt's ids as sampled: the token boundary is the chat template's
    assistant header in both prompts, never a re-tokenized join."""
    from lanpo.engine.generation import chat_ids
    from lanpo.engine.models import load_tokenizer
    from lanpo.prompts import SOLVE_INSTRUCTION, solve_messages

    tok = load_tokenizer(str(tiny_model_dir))
    problem = "What is 12 + 30?"
    plain = chat_ids(tok, solve_messages(problem))
    for source, shown in (("gold", "the ground truth is 42"), ("reference", "12 + 30"), ("sibling", "It is 42.")):
        teacher = chat_ids(tok, score.context_messages(source, problem, shown))
        common = 0
        while common < min(len(plain), len(teacher)) and plain[-1 - common] == teacher[-1 - common]:
            common += 1
        suffix = tok.decode(plain[len(plain) - common :])
        header = tok.decode(plain)[tok.decode(plain).rindex(SOLVE_INSTRUCTION) + len(SOLVE_INSTRUCTION) :]
        assert header.strip() and suffix.endswith(header), (source, suffix, header)


def test_an_ema_teacher_resumes_from_its_checkpoint_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    import shutil

    ema = dict(feedback_route="score", feedback_source="gold", score_teacher="ema", score_ema_rate=0.5, beta=0.0)
    full = make_trainer(tiny_model_dir, tmp_path, "full", max_steps=4, save_strategy="steps", save_steps=2, **ema)
    full.train()
    checkpoint = Path(full.args.output_dir) / "checkpoint-2"
    assert (checkpoint / "ema_teacher.pt").is_file()
    shutil.copytree(checkpoint, tmp_path / "resumed" / "checkpoint-2")
    resumed = make_trainer(tiny_model_dir, tmp_path, "resumed", max_steps=4, save_strategy="steps", save_steps=2, **ema)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-2"))
    for (name, a), (_, b) in zip(full.teacher.weights.named_parameters(), resumed.teacher.weights.named_parameters()):
        assert torch.equal(a, b), name
    assert history(full, "loss") == history(resumed, "loss")


def test_a_data_file_made_for_trls_sdpo_gives_its_privileged_context_as_the_worked_solution(tmp_path):
    from lanpo.data.loaders import load_problems

    rows = [
        {"prompt": "What is 2 + 3?", "answer": "5", "privileged_context": "Two plus three.\\nIt is 5."},
        {"prompt": "What is 4 + 4?", "answer": "8"},
    ]
    path = tmp_path / "sdpo.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    problems = load_problems(str(path))
    assert problems[0].problem == "What is 2 + 3?" and problems[0].solution == "Two plus three.\\nIt is 5."
    assert problems[1].solution is None


def test_the_gates_auroc_counts_pairs_and_ties_and_within_groups_only_pairs_of_one_group():
    from lanpo.eval.gate import auroc, auroc_within

    assert auroc([0.9, 0.1, 0.5], [True, False, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0 and auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([1.0, 2.0], [True, True]) is None
    # inside each group the right row loses; across groups one of four pairs is won
    scores, labels, groups = [0.9, 0.95, 0.1, 0.2], [True, False, True, False], [0, 0, 1, 1]
    assert auroc(scores, labels) == 0.25 and auroc_within(scores, labels, groups) == (0.0, 2)


def test_the_gate_reads_every_rollout_under_each_context_and_its_control(tiny_model_dir, capsys):
    from lanpo.data.loaders import builtin_arith
    from lanpo.engine.generation import generate
    from lanpo.engine.models import load_model
    from lanpo.eval.gate import GateSettings, markdown, run_gate
    from lanpo.verify.rewards import get_verifier

    model, tokenizer = load_model(str(tiny_model_dir))
    problems = builtin_arith("1", n=3)
    settings = GateSettings(k=2, max_new_tokens=6, batch_size=4)
    rollouts, results, seconds = run_gate(
        model, tokenizer, problems, get_verifier(extraction="lenient"), ["gold", "reference"], settings, generate
    )
    assert len(rollouts) == 6 and set(seconds) == {"sampling", "plain_scoring"}
    assert [r.name for r in results] == ["gold", "gold control", "reference", "reference control"]
    assert results[0].rollouts == 6 and all(len(r.answer_mask) == len(r.token_ids) for r in rollouts)
    assert "| gold control |" in markdown(results, rollouts)
    shown = capsys.readouterr().err  # each reading pass shows its progress: a long gate is never silent
    for name in ("plain", "gold", "gold control", "reference", "reference control"):
        assert f"gate: reading {name}: 100%" in shown
