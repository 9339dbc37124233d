"""LANPO's objective changes, by value on hand-made tensors, and the rollout plan as a pure function."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lanpo.objective import (
    LossScale,
    aggregate,
    feedback_kl,
    scratch_baseline_advantages,
    separate_advantages,
    sequence_strip_weights,
    shaped_policy_loss,
    strip_weights,
    trl_k3,
    weight_advantages,
)
from lanpo.plan import GroupPlan, plan_group
from lanpo.rollout import Row, choose_trials, make_rows

ONE = torch.tensor([1.0])


def col(*values: float) -> torch.Tensor:
    return torch.tensor(values).unsqueeze(1)  # one reward function


def test_separate_advantages_normalize_feedback_and_scratch_rows_apart_by_value():
    # two groups of 4: [scratch, scratch, feedback, feedback], [scratch, scratch, scratch, feedback]
    rewards = col(0.0, 1.0, 5.0, 7.0, 1.0, 2.0, 3.0, 9.0)
    feedback = [False, False, True, True, False, False, False, True]
    adv = separate_advantages(rewards, ONE, feedback, group_size=4, scale_rewards="group")
    s = 1 / (math.sqrt(0.5) + 1e-4)  # (x - mean) / (std + eps) for a pair differing by 1: std = sqrt(0.5)
    s2 = 1 / (math.sqrt(2.0) + 1e-4)  # pair differing by 2: std = sqrt(2)
    expected = torch.tensor([-0.5 * s, 0.5 * s, -1 * s2, 1 * s2, -1 / (1 + 1e-4), 0.0, 1 / (1 + 1e-4), 0.0])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_separate_advantages_batch_std_is_the_whole_batch_and_none_does_not_scale():
    rewards = col(0.0, 2.0, 1.0, 3.0, 0.0, 0.0, 4.0, 4.0)  # two groups: on 2 processes, one group each
    feedback = [False, False, True, True] * 2
    none = separate_advantages(rewards, ONE, feedback, group_size=4, scale_rewards="none")
    assert torch.equal(none, torch.tensor([-1.0, 1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]))
    batch = separate_advantages(rewards, ONE, feedback, group_size=4, scale_rewards="batch")
    assert torch.allclose(batch, none / (rewards.std() + 1e-4))  # the std of all 8 rows, not of one process's 4


def test_unscorable_rows_are_left_out_of_the_baseline_and_get_zero():
    nan = float("nan")
    rewards = col(1.0, 3.0, nan, 5.0)  # row 2: no reward function scored it
    adv = separate_advantages(rewards, ONE, [False, False, False, False], 4, "none")
    assert torch.allclose(adv, torch.tensor([-2.0, 0.0, 0.0, 2.0]))  # baseline 3 = mean of 1, 3, 5, not 2.25


def test_a_lone_row_of_its_kind_has_no_baseline():
    adv = separate_advantages(col(1.0, 0.0, 0.0, 5.0), ONE, [False, False, False, True], 4, "group")
    assert adv[3] == 0


def test_normalize_then_sum_normalizes_each_reward_within_the_subgroup_then_over_the_batch():
    rewards = torch.tensor([[0.0, 10.0], [1.0, 30.0], [2.0, 0.0], [4.0, 0.0]])
    adv = separate_advantages(
        rewards, torch.tensor([1.0, 1.0]), [False, False, True, True], 4, "group", "normalize_then_sum"
    )
    # scratch pair: each function (x - mean) / (std + eps); feedback pair: the second function is constant (0)
    first = torch.tensor([[-0.5, -10.0], [0.5, 10.0]]) / torch.tensor([[math.sqrt(0.5), math.sqrt(200)]]).add(1e-4)
    second = torch.tensor([[-1.0], [1.0]]) / (math.sqrt(2.0) + 1e-4)
    summed = torch.cat([first.sum(1), second.squeeze(1)])
    expected = (summed - summed.mean()) / (summed.std() + 1e-4)
    assert torch.allclose(adv, expected, atol=1e-5) and not torch.isnan(adv).any()


def test_strip_weights_are_the_clipped_probability_ratio_and_one_on_padding():
    plain = torch.log(torch.tensor([[0.2, 0.5, 0.9], [0.3, 0.3, 0.3]]))
    context = torch.log(torch.tensor([[0.4, 0.1, 0.9], [0.3, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    weights = strip_weights(plain, context, mask, clip=2.0)
    assert torch.allclose(weights, torch.tensor([[0.5, 2.0, 1.0], [1.0, 1.0, 1.0]]), atol=1e-6)
    assert torch.allclose(
        weight_advantages(torch.tensor([2.0, -1.0]), weights),
        torch.tensor([[1.0, 4.0, 2.0], [-1.0, -1.0, -1.0]]),
        atol=1e-6,
    )


def test_sequence_strip_weights_are_the_clipped_geometric_mean_of_the_row_and_one_elsewhere():
    plain = torch.log(torch.tensor([[0.2, 0.5, 0.9], [0.3, 0.3, 0.3], [0.9, 0.9, 0.9]]))
    context = torch.log(torch.tensor([[0.4, 0.1, 0.9], [0.3, 0.3, 0.3], [0.1, 0.1, 0.1]]))
    context[1] = float("nan")  # a scratch row
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    weights = sequence_strip_weights(plain, context, mask, clip=2.0)
    geometric = math.sqrt(0.5 * 5.0)  # ratios 0.5 and 5 over the row's two tokens
    assert torch.allclose(weights[0], torch.tensor([geometric, geometric, 1.0]), atol=1e-5)
    assert torch.equal(weights[1], torch.ones(3))
    assert torch.allclose(weights[2], torch.full((3,), 2.0))  # ratio 9 clipped at 2


def test_shaped_loss_is_minus_advantage_times_pi_over_pi_plus_gamma_and_its_gradient_is_the_shaped_one():
    probs = torch.tensor([[0.01, 0.5, 0.99]])
    logps = torch.log(probs).requires_grad_()
    loss = shaped_policy_loss(logps, torch.tensor([2.0]), gamma=0.1)
    assert torch.allclose(loss, -2.0 * probs / (probs + 0.1), atol=1e-6)
    loss.sum().backward()
    # d/dlogπ of −A·π/(π+γ) = −A·γπ/(π+γ)²: largest for improbable tokens relative to π, vanishing as π → 1
    assert torch.allclose(logps.grad, -2.0 * 0.1 * probs / (probs + 0.1) ** 2, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [0.5, 5.0, 30.0, 100.0, -100.0])
def test_feedback_kl_value_and_gradient_are_finite_and_follow_the_formula_for_any_r(dtype, r):
    logps = torch.tensor([-1.0 - max(r, 0.0)], dtype=dtype, requires_grad=True)
    ref = (logps.detach() + r).to(dtype)
    weight = torch.tensor([0.75], dtype=dtype)
    kl = feedback_kl(ref, logps, weight)
    kl.sum().backward()
    r_exact = float(ref.float() - logps.detach().float())
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 keeps 8 bits of mantissa
    assert torch.isfinite(kl).all() and torch.isfinite(logps.grad).all()
    assert float(kl.detach()) == pytest.approx(0.75 * 0.5 * r_exact**2, rel=tolerance)
    assert float(logps.grad) == pytest.approx(-0.75 * r_exact, rel=tolerance)


def test_trl_k3_with_bias_correction_loses_its_gradient_and_then_turns_nan_far_off_policy():
    """Why feedback rows need their own KL: TRL's expression, gradient −r analytically, is 0 at r = 30 and NaN at
    r = 100 in fp32; on-policy (r small) it agrees with feedback_kl's gradient."""
    grads = {}
    for r in (0.3, 30.0, 100.0):
        logps = torch.tensor([-120.0], requires_grad=True)
        old = logps.detach()
        k3 = trl_k3(logps.detach() + r, logps, torch.exp(logps - old))
        k3.sum().backward()
        grads[r] = float(logps.grad)
    assert grads[0.3] == pytest.approx(-0.3, rel=1e-3)
    assert grads[30.0] == 0.0 and math.isnan(grads[100.0])


def test_scratch_baseline_centres_feedback_rows_on_the_scratch_mean_by_value():
    rewards = col(0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    flags = [False, False, True, True, False, False, True, True]
    adv = scratch_baseline_advantages(rewards, ONE, flags, group_size=4, scale_rewards="group")
    group1_std = torch.tensor([0.0, 0.0, 1.0, 1.0]).std()
    # group 1: scratch rows agree (all 0): scratch advantages 0, right feedback rows +1 / group std
    assert torch.allclose(
        adv[:4], torch.tensor([0.0, 0.0, 1 / (group1_std + 1e-4), 1 / (group1_std + 1e-4)]), atol=1e-4
    )
    # group 2: scratch mean 0.5, scratch std of [1, 0]; feedback rows against 0.5 over the group's std
    scratch_std, group2_std = torch.tensor([1.0, 0.0]).std(), torch.tensor([1.0, 0.0, 1.0, 0.0]).std()
    expected = torch.tensor(
        [0.5 / (scratch_std + 1e-4), -0.5 / (scratch_std + 1e-4), 0.5 / (group2_std + 1e-4), -0.5 / (group2_std + 1e-4)]
    )
    assert torch.allclose(adv[4:], expected, atol=1e-4)
    unscaled = scratch_baseline_advantages(rewards, ONE, flags, group_size=4, scale_rewards="none")
    assert torch.allclose(unscaled, torch.tensor([0.0, 0.0, 1.0, 1.0, 0.5, -0.5, 0.5, -0.5]))


def test_scratch_baseline_gives_zero_where_no_scratch_row_was_scored():
    rewards = col(float("nan"), 1.0, 0.0, float("nan"))
    adv = scratch_baseline_advantages(rewards, ONE, [False, True, True, False], group_size=4)
    assert torch.equal(adv, torch.zeros(4))


@pytest.mark.parametrize(
    "loss_type,expected",
    [
        ("grpo", ((3 / 2 + 5 / 1) / 2) / 2),
        ("bnpo", (8 / 3) / 2),
        ("dr_grpo", 8 / (2 * 10) / 2),
        ("dapo", 8 / (12 / 2 * 2 / 4)),
        ("luspo", (3 + 5) / 2 / 2),
    ],
)
def test_aggregate_normalizes_a_micro_batch_as_trl_does(loss_type, expected):
    per_token = torch.tensor([[1.0, 2.0, 7.0], [5.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    scale = LossScale(
        loss_type,
        accumulation_steps=2,
        max_completion_length=10,
        num_items_in_batch=12,
        num_processes=2,
        steps_per_generation=4,
    )
    assert float(aggregate(per_token, mask, scale)) == pytest.approx(expected)


@pytest.mark.parametrize(
    "g,p,share,expected",
    [
        (8, 0.75, 0.5, (2, 3, 3)),
        (8, 0.0, 0.5, (8, 0, 0)),
        (8, 1.0, 1.0, (0, 8, 0)),
        (4, 0.5, 0.0, (2, 0, 2)),
        (16, 0.75, 0.5, (4, 6, 6)),
    ],
)
def test_group_plan_counts(g, p, share, expected):
    plan = plan_group(g, p, share)
    assert (plan.scratch, plan.rows_of("reflection"), plan.rows_of("abstraction")) == expected
    assert plan.feedback == sum(expected[1:]) and all(n > 0 for _, n in plan.kinds)  # a kind with no rows is left out


@given(
    counts=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    scratch=st.integers(0, 4),
    n=st.integers(0, 12),
)
def test_a_group_plan_of_any_kinds_gives_each_row_one_kind_and_shares_rows_like_itself(counts, scratch, n):
    kinds = tuple((f"kind-{k}", c) for k, c in enumerate(counts))
    plan = GroupPlan(scratch, kinds)
    rows = [plan.kind_of(j) for j in range(scratch + plan.feedback)]
    assert rows == ["scratch"] * scratch + [k for k, c in kinds for _ in range(c)]
    with pytest.raises(IndexError):
        plan.kind_of(scratch + plan.feedback)
    shared = plan.split(n)  # the unsolved trigger's share of n chosen rows
    assert len(shared) == n and shared == sorted(shared, key=[k for k, _ in kinds].index)
    assert plan.split(plan.feedback) == rows[scratch:]  # n = the plan's own rows: its own kinds
    for kind, count in kinds:
        assert abs(shared.count(kind) - n * count / plan.feedback) <= 1


@pytest.mark.parametrize("source", ["reference", "gold", "self-hint"])
def test_a_privileged_source_gets_every_feedback_row_of_its_kind(source):
    plan = plan_group(8, 0.75, 0.5, source)
    assert plan == GroupPlan(2, ((source, 6),))
    assert [plan.kind_of(j) for j in range(8)] == ["scratch"] * 2 + [source] * 6
    assert plan_group(8, 0.0, 0.5, source).feedback == 0


def test_rows_follow_the_plan_in_every_group_and_trials_alternate_right_and_wrong():
    inputs = [
        {"problem": f"q{i // 4}", "problem_id": f"p{i // 4}", "answer": "1", "gold_kind": "math"} for i in range(8)
    ]
    rows = make_rows(inputs, 4, GroupPlan(2, (("reflection", 1), ("abstraction", 1))))
    assert [r.kind for r in rows] == ["scratch", "scratch", "reflection", "abstraction"] * 2
    for r, text in zip(rows, ["a", "b", "c", "d", "e", "", "g", "h"]):
        r.text = text
    trials = choose_trials(
        rows, [1, 0, 0, 1, 0, 0, 0, 1], [True, False, False, True, False, False, False, True], g=4, budget=2, step=3
    )
    assert [(t.problem_id, t.completion, t.correct) for t in trials] == [
        ("p0", "a", True),
        ("p0", "b", False),
        ("p1", "h", True),
        ("p1", "e", False),
    ]
    assert all(isinstance(r, Row) for r in rows) and trials[0].rollout_id == "3:0:0"
