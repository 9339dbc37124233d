"""LANPO's objective changes, by value on hand-made tensors, and the rollout plan as a pure function."""

from __future__ import annotations

import math

import pytest
import torch

from lanpo.objective import separate_advantages, strip_weights, weight_advantages
from lanpo.rollout import Row, choose_trials, make_rows, plan_group

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
    adv = separate_advantages(rewards, torch.tensor([1.0, 1.0]), [False, False, True, True], 4, "group",
                              "normalize_then_sum")
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
    assert torch.allclose(weight_advantages(torch.tensor([2.0, -1.0]), weights),
                          torch.tensor([[1.0, 4.0, 2.0], [-1.0, -1.0, -1.0]]), atol=1e-6)


@pytest.mark.parametrize("g,p,share,expected", [
    (8, 0.75, 0.5, (2, 3, 3)), (8, 0.0, 0.5, (8, 0, 0)), (8, 1.0, 1.0, (0, 8, 0)), (4, 0.5, 0.0, (2, 0, 2)),
    (16, 0.75, 0.5, (4, 6, 6)),
])
def test_group_plan_counts(g, p, share, expected):
    assert plan_group(g, p, share) == expected


def test_rows_follow_the_plan_in_every_group_and_trials_alternate_right_and_wrong():
    inputs = [{"problem": f"q{i // 4}", "problem_id": f"p{i // 4}", "answer": "1"} for i in range(8)]
    rows = make_rows(inputs, 4, (2, 1, 1))
    assert [r.kind for r in rows] == ["scratch", "scratch", "reflection", "abstraction"] * 2
    for r, text in zip(rows, ["a", "b", "c", "d", "e", "", "g", "h"]):
        r.text = text
    trials = choose_trials(rows, [1, 0, 0, 1, 0, 0, 0, 1], [True, False, False, True, False, False, False, True],
                           g=4, budget=2, step=3)
    assert [(t.problem_id, t.completion, t.correct) for t in trials] == [
        ("p0", "a", True), ("p0", "b", False), ("p1", "h", True), ("p1", "e", False)]
    assert all(isinstance(r, Row) for r in rows) and trials[0].rollout_id == "3:0:0"
