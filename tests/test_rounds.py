"""One generation round a step (issue 104): every mode and source makes one call into the engine after the first
step, a row with nothing to show goes plain with its reason, feedback rows show what a step before wrote, and no
label reaches a context through the scores that trigger it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo import rollout
from lanpo.config import LanpoConfig
from lanpo.feedback.abstraction import AbstractionSource
from lanpo.feedback.execution import ExecutionSource
from lanpo.feedback.privileged import GoldSource, HintLadder, PrivilegedKit, Reference, ReferenceSource
from lanpo.feedback.reflection import ReflectionSource
from lanpo.pool.retrieval import Retriever
from lanpo.pool.store import Attempt, ExperiencePool, PoolEntry
from lanpo.summarize import Trial
from lanpo.verify.sandbox import Execution
from test_trainer import history, make_trainer, stub_summaries

G = 4
SUMMARY = [4, 5, 6]


class Engine:
    """A stub generation engine: records each call (a round) and answers every prompt with 20 tokens; a summary
    prompt ends at once."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []

    def __call__(self, ids):
        self.calls.append(ids)
        return [[90, 0] if p[:3] == SUMMARY else list(range(10, 30)) for p in ids], None


def stub_model(engine: Engine, right=lambda rows: [False] * len(rows)) -> rollout.RolloutModel:
    return rollout.RolloutModel(
        tokenize=lambda prompts: [[1, 2, 3, 7 + len(str(p))] for p in prompts],
        tokenize_summary=lambda messages: list(SUMMARY),
        generate_ids=engine,
        decode=lambda ids: " ".join(f"w{i}" for i in ids),
        summary_max_length=50,
        max_new_tokens=20,
        stop_ids=frozenset({0}),
        score=right,
    )


def problems(n: int) -> list[dict]:
    return [
        {"problem": f"What is {k} + 1?", "problem_id": f"p{k}", "answer": str(k + 1), "gold_kind": "math"}
        for k in range(n)
    ]


def sources_for(source: str, pool: ExperiencePool) -> dict:
    kit = PrivilegedKit(
        {f"p{k}": Reference(str(k + 1), f"Add 1 to {k}.\nSo {k + 1}.") for k in range(8)},
        HintLadder(2),
        right=lambda refs, texts, problems: [False] * len(texts),
    )
    if source == "self":
        return {
            "abstraction": AbstractionSource(Retriever(pool, "bm25", gamma=0.0)),
            "reflection": ReflectionSource(pool),
        }
    if source == "gold":
        return {"gold": GoldSource(pool, LanpoConfig(output_dir="unused", use_cpu=True).attempts, kit)}
    if source == "reference":
        return {"reference": ReferenceSource(kit)}
    raise ValueError(source)


def plan_for(source: str, trigger: str, ratio: float = 0.5):
    config = LanpoConfig(
        output_dir="unused",
        num_generations=G,
        per_device_train_batch_size=2 * G,
        feedback_ratio=ratio,
        feedback_source=source,
        feedback_trigger=trigger,
        feedback_trigger_pass_rate=0.5 if trigger == "unsolved" else 0.0,
        use_cpu=True,
    )
    return config.step_plan(3)


@settings(max_examples=40, deadline=None)
@given(
    source=st.sampled_from(["self", "gold", "reference"]),
    trigger=st.sampled_from(["always", "unsolved"]),
    stored=st.lists(st.booleans(), min_size=2, max_size=2),  # which of the two problems has an attempt stored
    pending=st.integers(0, 3),
    ahead=st.integers(0, 3),
)
def test_every_source_and_trigger_makes_one_call_and_a_row_with_nothing_to_show_goes_plain(
    source, trigger, stored, pending, ahead
):
    pool = ExperiencePool(":memory:")
    pool.add([PoolEntry("other", "What is 9 + 1?", "add", ["add one to the number"], ["do not subtract"])])
    pool.add_attempts(
        [Attempt(f"p{k}", f"What is {k} + 1?", f"my try at {k}", step=2) for k, has in enumerate(stored) if has]
    )
    engine = Engine()
    plan = plan_for(source, trigger)
    rows = rollout.make_rows([p for p in problems(2) for _ in range(G)], G, plan.group)
    trials = [Trial("p0", "What is 0 + 1?", f"try {k}", False, gold="1") for k in range(pending)]
    context = rollout.StepContext(
        plan,
        sources_for(source, pool),
        pending=list(trials),
        ahead=[rollout.Ahead("p7", "What is 7 + 1?", [1, 2, 3]) for _ in range(ahead)],
        earlier=lambda pid: [a.text for a in pool.attempts(pid)],
    )
    output, finished, carried = rollout.one_round_rollout(rows, [[1, 2, 3]] * len(rows), G, stub_model(engine), context)
    assert len(engine.calls) == 1  # one round: rows, summaries and attempts ahead together
    assert len(engine.calls[0]) == len(rows) + pending + ahead
    assert len(output["completion_ids"]) == len(rows) and all(r.completion_ids for r in rows)
    assert len(finished) == pending and not carried  # the stub's summaries end at once
    assert all(a.text for a in context.ahead)
    for s, has in zip(range(0, len(rows), G), stored):
        group = rows[s : s + G]
        if trigger == "unsolved" and not has:  # nothing to score: the group cannot be triggered
            assert all(r.kind == "scratch" and not r.has_feedback and r.triggered is False for r in group)
        for r in group:
            if r.kind in ("reflection", "gold") and not has:
                assert not r.has_feedback and r.fallback == "no_attempt"  # never waits for a second call
            if r.kind in ("reflection", "gold") and has:
                assert r.has_feedback and r.shown_step == 2 and "my try at" in r.context[-1]["content"]


def test_the_trigger_reads_the_stored_attempts_scores_and_no_score_reaches_a_context():
    """Two problems, two stored attempts each; pass rate 0.5 triggers a group at one right attempt or none. The
    contexts of a triggered group are the same whichever of its attempts the verifier credits: the scores decide
    the trigger only."""
    contexts = []
    for verdicts in (
        {"A0": True, "B0": False, "A1": False, "B1": False},
        {"A0": False, "B0": False, "A1": True, "B1": True},
    ):
        pool = ExperiencePool(":memory:")
        for k in (0, 1):
            pool.add_attempts([Attempt(f"p{k}", f"What is {k} + 1?", f"{name}{k}", step=1) for name in ("A", "B")])
        engine = Engine()
        plan = plan_for("self", "unsolved")
        rows = rollout.make_rows([p for p in problems(2) for _ in range(G)], G, plan.group)
        model = stub_model(engine, right=lambda probes, v=verdicts: [v[p.text] for p in probes])
        context = rollout.StepContext(
            plan, sources_for("self", pool), earlier=lambda pid, pool=pool: [a.text for a in pool.attempts(pid)]
        )
        rollout.one_round_rollout(rows, [[1, 2, 3]] * len(rows), G, model, context)
        assert len(engine.calls) == 1
        contexts.append([(r.kind, r.triggered, r.context) for r in rows])
    first, second = contexts
    assert [t for _, t, _ in first] == [True] * G + [True] * G  # 1 of 2 right, then 0 of 2: both at most 0.5
    assert [t for _, t, _ in second] == [True] * G + [False] * G  # problem 1: 2 of 2 right, not triggered
    assert first[:G] == second[:G]  # the same contexts whichever attempt was credited
    assert all(c is None or "True" not in str(c) and "right" not in str(c) for _, _, c in first)


@pytest.mark.parametrize(
    "settings_",
    [
        {},  # LANPO's defaults: reflection and abstraction, always
        {"feedback_trigger": "unsolved"},
        {"feedback_source": "gold", "summaries_per_group": 0},
        {"feedback_source": "reference", "summaries_per_group": 0},
        {"feedback_ratio": 0.0},  # p_t 0: the summaries ride with the plain rows
        {"feedback_max_completion_length": 11},  # feedback rows to their own limit, in the same call
    ],
    ids=["defaults", "unsolved", "gold", "reference", "p_t-0-summaries", "own-limit"],
)
def test_a_training_step_is_one_generation_round_in_every_mode(tiny_model_dir, tmp_path, settings_):
    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=3, **settings_)
    stub_summaries(trainer)
    calls = []
    original = trainer._generate_ids
    trainer._generate_ids = lambda ids: calls.append(trainer.state.global_step) or original(ids)
    trainer.train()
    assert history(trainer, "lanpo/generation_rounds") == [1.0, 1.0, 1.0]
    assert calls[:3] == [0, 1, 2] or (settings_.get("feedback_ratio") == 0.0 and calls[:2] == [1, 2])
    assert history(trainer, "lanpo/round1/rows")[-1] >= 8  # the step's rows, and what rides with them


def test_the_old_arrangement_stays_behind_its_switch(tiny_model_dir, tmp_path):
    """generation_rounds phased: a problem's first visit reflects on the step's own scratch rows, in a second call."""
    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=2, generation_rounds="phased", summaries_per_group=0)
    trainer.train()
    assert history(trainer, "lanpo/generation_rounds") == [2.0, 2.0]  # 2 problems a step, each on its first visit
    assert history(trainer, "lanpo/shown_attempt_age") == [0.0, 0.0]  # the step's own attempts


def test_execution_reports_are_built_from_the_attempt_stored_a_step_earlier():
    pool = ExperiencePool(":memory:")
    problem = (
        'Write the Python function below.\n\n```python\ndef f(x):\n    """Add one.\n\n    >>> f(1)\n    2\n    """\n```'
    )
    pool.add_attempts([Attempt("p0", problem, "```python\ndef f(x):\n    return x\n```", step=4)])
    ran = []

    def run_code(jobs):
        ran.extend(jobs)
        return [Execution("failed", 0, 1, calls=[{"value": "1", "raised": None}]) for _ in jobs]

    source = ExecutionSource(pool, run_code)
    config = LanpoConfig(
        output_dir="unused", num_generations=G, feedback_ratio=0.5, feedback_source="execution", use_cpu=True
    )
    plan = config.step_plan(5)
    rows = rollout.make_rows(
        [{"problem": problem, "problem_id": "p0", "answer": "x", "gold_kind": "math"}] * G, G, plan.group
    )
    engine = Engine()
    context = rollout.StepContext(plan, {"execution": source})
    rollout.one_round_rollout(rows, [[1, 2, 3]] * G, G, stub_model(engine), context)
    shown = [r for r in rows if r.has_feedback]
    assert len(engine.calls) == 1 and ran  # the report was run before the call, on the stored attempt
    assert shown and all(r.shown_step == 4 and "The problem shows 2" in r.context[-1]["content"] for r in shown)
    assert Counter(context.counts)["public_failed"] == 1
