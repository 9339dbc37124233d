"""Each pool entry's worth (issue 90): the lift of the rows it was shown, RetroAgent's utility beside it, the
rankings that use them, and the records kept in the pool."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.pool.io import export_jsonl, import_jsonl
from lanpo.pool.store import ExperiencePool, PoolEntry, StepWorth
from lanpo.pool.worth import (
    MIN_USES,
    SIMUTIL_ALPHA,
    SIMUTIL_FLOOR,
    Observation,
    Worth,
    expected_to_help,
    fold,
    observations,
    rank,
    row_lifts,
    shown_metrics,
    simutil_score,
)
from lanpo.rollout import Row


def row(kind="scratch", entries=(), problem_id="p", context=True, gold="42"):
    shown = [{"entry_id": i, "relevance": 0.9} for i in entries]
    has = kind != "scratch" and context
    return Row(
        problem_id,
        "What is 40 + 2?",
        gold,
        kind=kind,
        context=[{"role": "user", "content": "c"}] if has else None,
        retrieved=shown,
    )


def test_the_lift_of_a_hand_built_group_is_its_reward_minus_the_scratch_mean():
    # a group of 4: two scratch rows (1, 0), an abstraction row (1) and a reflection row (0); then a group of 2 with
    # no scratch row
    rewards = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    scratch = [True, True, False, False, False, False]
    assert row_lifts(rewards, scratch, 4)[:4] == [0.5, -0.5, 0.5, -0.5]
    assert row_lifts(rewards, scratch, 4)[4:] == [None, None]


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.tuples(st.sampled_from(["scratch", "abstraction", "reflection"]), st.floats(0, 1)), min_size=2),
        min_size=1,
        max_size=4,
    ),
    shown=st.integers(1, 3),
)
def test_every_shown_entry_gets_its_rows_lift_and_groups_without_scratch_credit_nothing(groups, shown):
    size = max(len(g) for g in groups)
    rows, rewards = [], []
    for index, group in enumerate(groups):  # padded to one size with scratch rows of reward 0
        group = group + [("scratch", 0.0)] * (size - len(group))
        for kind, reward in group:
            rows.append(row(kind, entries=range(100 * index, 100 * index + shown), problem_id=f"p{index}"))
            rewards.append(reward)
    correct = [r >= 0.5 for r in rewards]
    entries, reflections = observations(rows, rewards, correct, size)
    lifts = row_lifts(rewards, [not r.has_feedback for r in rows], size)
    expected = [
        (i, lifts[n])
        for n, r in enumerate(rows)
        if r.kind == "abstraction"
        for i in [s["entry_id"] for s in r.retrieved]
    ]
    assert [(o.key, o.lift) for o in entries] == expected
    assert [o.key for o in reflections] == [r.problem_id for r in rows if r.kind == "reflection"]
    for start in range(0, len(rows), size):  # within a group, the scratch rows' lifts sum to zero
        plain = [lifts[i] for i in range(start, start + size) if not rows[i].has_feedback]
        assert not plain or math.isclose(sum(plain), 0.0, abs_tol=1e-9)


def test_a_row_that_fell_back_to_the_plain_prompt_credits_nothing():
    rows = [row(), row("abstraction", entries=[7], context=False), row("abstraction", entries=[8])]
    entries, _ = observations(rows, [0.0, 1.0, 1.0], [False, True, True], 3)
    assert [o.key for o in entries] == [8]


def test_simutil_is_retroagents_formula_on_hand_values():
    worth = Worth(uses=3, success_ema=0.7)  # count 4 (the 1 it is made with, and 3 uses)
    expected = 0.6 * 0.8 + 0.4 * (0.7 + 1.0 * math.sqrt(math.log(20) / 4))
    assert math.isclose(simutil_score(0.8, worth, 20), expected)
    fresh = Worth()  # never shown: u starts at 0.5, count 1
    assert math.isclose(simutil_score(0.5, fresh, 1), 0.6 * 0.5 + 0.4 * 0.5)
    assert SIMUTIL_ALPHA == 0.6 and SIMUTIL_FLOOR == 0.4
    # below the similarity floor an entry is no candidate; without exploration the bonus is gone
    ranked = rank("simutil", [(1, 0.39), (2, 0.9)], {2: worth}, 20, explore=True)
    assert [i for i, _ in ranked] == [2]
    assert math.isclose(rank("simutil", [(2, 0.9)], {2: worth}, 20, explore=False)[0][1], 0.6 * 0.9 + 0.4 * 0.7)


def test_the_utility_is_an_ema_of_success_from_one_half():
    worth = Worth()
    for success in (True, True, False):
        worth = worth.observe(None, float(success), success, step=1)
    assert math.isclose(worth.success_ema, ((0.5 * 0.95 + 0.05) * 0.95 + 0.05) * 0.95)
    assert worth.uses == 3 and worth.credited == 0 and worth.mean_lift == 0.0


def _simulate(ranking: str, seed: int, rounds: int = 60) -> tuple[dict, list[int]]:
    """Ten entries: 0-2 always help (lift +0.4), 3-5 always hurt (-0.4), the rest do nothing; the harmful ones are
    the most similar. Each round shows three rows one entry each (the ranking's top three) and credits them."""
    rng = random.Random(seed)
    effect = {i: 0.4 if i < 3 else -0.4 if i < 6 else 0.0 for i in range(10)}
    similarity = {i: 0.9 if 3 <= i < 6 else 0.6 for i in range(10)}
    records: dict = {}
    shown_late: list[int] = []
    for step in range(rounds):
        total = sum(w.uses for w in records.values()) + len(effect)
        ranked = rank(ranking, sorted(similarity.items()), records, total, explore=True)
        top = [i for i, _ in ranked[:3]]
        found = [Observation(i, effect[i] + rng.gauss(0, 0.3), 0.0, False) for i in top]
        records = fold(records, found, step)
        if step >= rounds - 10:
            shown_late += top
    return records, shown_late


@pytest.mark.parametrize("seed", range(3))
def test_lift_ranks_the_helpful_entries_first_and_stops_showing_the_harmful_ones_similarity_does_not(seed):
    records, late = _simulate("lift", seed)
    best = rank("lift", [(i, 0.6) for i in range(10)], records, 0, explore=False)
    assert {i for i, _ in best[:3]} == {0, 1, 2}
    assert not set(late) & {3, 4, 5}  # no longer shown
    order = [i for i, _ in best]
    assert all(records[i].mean_lift < 0 for i in (3, 4, 5))
    assert min(order.index(i) for i in (3, 4, 5)) > max(order.index(i) for i in (0, 1, 2))
    assert max(records[i].uses for i in (3, 4, 5)) <= MIN_USES  # found out within a bounded number of uses
    records, late = _simulate("similarity", seed)
    assert set(late) == {3, 4, 5}  # similarity shows the harmful entries to the end


def test_lift_falls_back_when_no_candidate_is_expected_to_help():
    harmful = {1: Worth(credited=20, uses=20, lift_sum=-8.0, lift_sq=3.4)}
    assert harmful[1].hurts
    assert rank("lift", [(1, 0.9)], harmful, 20, explore=True) == []
    assert not expected_to_help("lift", [])
    assert not expected_to_help("lift", [(2, -0.01)]) and expected_to_help("lift", [(2, 0.01)])


# -- the records in the pool ----------------------------------------------------------------------------------


def _pool_with_entries(path) -> tuple[ExperiencePool, list[int]]:
    pool = ExperiencePool(path, cap_per_problem=2)
    ids = pool.add([PoolEntry(f"q{i}", f"problem {i}", "plan", ["a principle"], ["a pitfall"]) for i in range(3)])
    return pool, ids


def test_a_steps_worth_is_written_with_its_attempts_and_an_evicted_entry_takes_its_record(tmp_path):
    pool, ids = _pool_with_entries(tmp_path / "pool.sqlite")
    taught = StepWorth(
        5,
        [Observation(ids[0], 0.5, 1.0, True), Observation(ids[0], -0.25, 0.0, False)],
        [Observation("q9", None, 1.0, True)],
    )
    pool.add_attempts([], taught)
    record = pool.entry_worth()[ids[0]]
    assert (record.uses, record.credited, record.lift_sum, record.lift_sq, record.last_step) == (2, 2, 0.25, 0.3125, 5)
    assert pool.reflection_worth() == {"q9": Worth().observe(None, 1.0, True, 5)}
    pool.add([PoolEntry("q0", "problem 0", "plan", ["b"], ["c"]) for _ in range(2)])  # q0 over its cap of 2
    assert ids[0] not in pool.entry_worth()
    pool.close()


def test_no_text_ever_enters_the_worth_tables(tmp_path):
    pool, ids = _pool_with_entries(tmp_path / "pool.sqlite")
    rows = [row(), row("abstraction", entries=[ids[1]]), row("reflection", problem_id="q1")]
    pool.add_attempts([], StepWorth(1, *observations(rows, [0.0, 1.0, 1.0], [False, True, True], 3)))
    conn = sqlite3.connect(tmp_path / "pool.sqlite")
    for table in ("entry_worth", "reflection_worth"):
        for values in conn.execute(f"SELECT * FROM {table}"):
            assert all(isinstance(v, int | float) for v in values[1:]), values
            assert values[0] in {ids[1], "q1"}  # the key: an entry id or a problem id, never a problem or a gold
    conn.close()
    pool.close()


def test_a_pool_made_before_the_worth_tables_opens_with_empty_statistics(tmp_path):
    path = tmp_path / "old.sqlite"
    pool, _ = _pool_with_entries(path)
    pool.close()
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE entry_worth; DROP TABLE reflection_worth;")
    conn.close()
    with ExperiencePool(path, readonly=True) as old:
        assert old.entry_worth() == {} and old.reflection_worth() == {} and old.total_counts() == 3.0
    with ExperiencePool(path) as old:  # opened for writing: the tables are made, empty
        assert old.entry_worth() == {}
        old.add_attempts([], StepWorth(1, [Observation(1, 0.1, 1.0, True)], []))
        assert old.entry_worth()[1].uses == 1


def test_export_and_import_carry_every_record(tmp_path):
    pool, ids = _pool_with_entries(tmp_path / "a.sqlite")
    pool.add_attempts([], StepWorth(3, [Observation(ids[2], 0.75, 1.0, True)], [Observation("q2", -0.5, 0.0, False)]))
    export_jsonl(pool, tmp_path / "a.jsonl")
    with ExperiencePool(tmp_path / "b.sqlite") as other:
        import_jsonl(other, tmp_path / "a.jsonl")
        moved = {e.problem_id: w for e in other.entries() if (w := other.entry_worth().get(e.id))}
        assert moved == {"q2": pool.entry_worth()[ids[2]]}
        assert other.reflection_worth() == pool.reflection_worth()
    pool.close()


@settings(max_examples=25, deadline=None)
@given(
    shown=st.lists(st.tuples(st.integers(0, 3), st.floats(-1, 1), st.booleans()), max_size=6),
    reflected=st.lists(st.tuples(st.sampled_from(["q0", "q1", "q9"]), st.floats(-1, 1), st.booleans()), max_size=4),
)
def test_the_pool_cli_carries_every_worth_record_through_export_and_import(tmp_path_factory, shown, reflected):
    from lanpo.cli import main

    tmp = tmp_path_factory.mktemp("cli")
    with ExperiencePool(tmp / "a.sqlite") as pool:
        ids = pool.add([PoolEntry(f"q{i}", f"problem {i}", "plan", ["a principle"], ["a pitfall"]) for i in range(4)])
        seen = [Observation(ids[i], lift, float(ok), ok) for i, lift, ok in shown]
        pool.add_attempts([], StepWorth(1, seen, [Observation(p, lift, float(ok), ok) for p, lift, ok in reflected]))
        digest = pool.digest()
    assert main(["pool", "export", str(tmp / "a.sqlite"), str(tmp / "a.jsonl")]) == 0
    assert main(["pool", "import", str(tmp / "b.sqlite"), str(tmp / "a.jsonl")]) == 0  # the CLI, not the API
    with ExperiencePool(tmp / "b.sqlite", readonly=True) as copy:
        assert copy.digest() == digest  # entries, attempts and both worth tables, numbers as stored


def test_an_export_of_reflection_records_alone_imports(tmp_path, capsys):
    from lanpo.cli import main

    worth = Worth().observe(-0.25, 0.0, False, 3)
    record = {"type": "reflection_worth", "problem_id": "q7", **dataclasses.asdict(worth)}
    (tmp_path / "r.jsonl").write_text(json.dumps(record) + "\n")
    assert main(["pool", "import", str(tmp_path / "b.sqlite"), str(tmp_path / "r.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["reflection_worth"] == 1
    with ExperiencePool(tmp_path / "b.sqlite", readonly=True) as pool:
        assert pool.reflection_worth() == {"q7": worth}


@pytest.mark.parametrize("bad", ['"worth": {"uses": "many"}', '"worth": {"lift_sum": NaN}', '"worth": {"uses": 1.5}'])
def test_an_export_with_a_malformed_record_is_refused_whole(tmp_path, bad):
    from lanpo.pool.store import PoolError

    line = (
        '{"type": "entry", "problem_id": "q", "problem": "p", "flow_of_thought": "f", "principles": [], "pitfalls": [], '
        + bad
        + "}"
    )
    (tmp_path / "x.jsonl").write_text(line + "\n")
    with ExperiencePool(tmp_path / "c.sqlite") as pool, pytest.raises(PoolError, match="worth field"):
        import_jsonl(pool, tmp_path / "x.jsonl")


# -- the rankings in the retriever, one lesson a row, eviction by worth -------------------------------------------


def _pool_for_retrieval(path):
    from lanpo.pool.store import PoolEntry

    pool = ExperiencePool(path)
    ids = pool.add(
        [
            PoolEntry(f"other{i}", "What is 30 + 6?", "plan", [f"add the tens first {i}"], ["carry the one"])
            for i in range(4)
        ]
    )
    return pool, ids


def test_the_lift_ranking_hides_an_entry_judged_harmful_and_withholds_when_none_is_expected_to_help(tmp_path):
    from lanpo.pool.retrieval import Retriever

    pool, ids = _pool_for_retrieval(tmp_path / "pool.sqlite")
    plain = Retriever(pool, "bm25", gamma=0.0, top_k=4, ranking="similarity")
    learned = Retriever(pool, "bm25", gamma=0.0, top_k=4, ranking="lift")
    query = [("q", "What is 30 + 5?")]
    assert {h.entry.id for h in learned.retrieve_many(query)[0]} == set(ids)  # nothing known: all explored
    harmful = [Observation(ids[0], -0.6, 0.0, False)] * (MIN_USES + 4)
    pool.add_attempts([], StepWorth(1, harmful, []))
    assert ids[0] not in {h.entry.id for h in learned.retrieve_many(query)[0]}
    assert ids[0] in {h.entry.id for h in plain.retrieve_many(query)[0]}  # similarity never learns it
    everyone = [Observation(i, -0.6, 0.0, False) for i in ids[1:] for _ in range(MIN_USES + 4)]
    pool.add_attempts([], StepWorth(2, everyone, []))
    assert learned.retrieve_many(query) == [[]] and learned.withheld == [True]
    pool.close()


def test_under_a_learned_ranking_each_abstraction_row_is_shown_one_lesson(tmp_path):
    from collections import Counter

    from lanpo.feedback.abstraction import AbstractionSource
    from lanpo.feedback.base import FeedbackRequest
    from lanpo.pool.retrieval import Retriever

    pool, ids = _pool_for_retrieval(tmp_path / "pool.sqlite")
    request = [FeedbackRequest("q", "What is 30 + 5?", rows=3)]
    apart = AbstractionSource(Retriever(pool, "bm25", gamma=0.0, top_k=3, ranking="simutil")).contexts(
        request, Counter()
    )
    assert [len(f.retrieved) for f in apart[0]] == [1, 1, 1]
    assert len({f.retrieved[0]["entry_id"] for f in apart[0]}) == 3  # three rows, three lessons
    together = AbstractionSource(Retriever(pool, "bm25", gamma=0.0, top_k=3)).contexts(request, Counter())
    assert [len(f.retrieved) for f in together[0]] == [3, 3, 3]  # the paper's: the group's top k to every row
    pool.close()


def test_eviction_by_worth_drops_what_does_not_help_before_the_young_and_never_what_helps_first(tmp_path):
    pool = ExperiencePool(tmp_path / "pool.sqlite", cap_per_problem=3, eviction="worth")
    ids = pool.add([PoolEntry("q", "p", "f", [f"lesson {i}"], []) for i in range(3)])
    judged = [Observation(ids[0], 0.5, 1.0, True), Observation(ids[1], -0.4, 0.0, False)] * MIN_USES
    pool.add_attempts([], StepWorth(1, judged, []))
    new = pool.add([PoolEntry("q", "p", "f", ["lesson 3"], [])])  # over the cap: the harmful one goes
    assert {e.id for e in pool.entries("q")} == {ids[0], ids[2], *new}
    newer = pool.add([PoolEntry("q", "p", "f", ["lesson 4"], [])])  # then the oldest too young to judge
    assert {e.id for e in pool.entries("q")} == {ids[0], *new, *newer}
    pool.close()
    oldest = ExperiencePool(tmp_path / "other.sqlite", cap_per_problem=1, total_cap=2)
    kept = [oldest.add([PoolEntry(f"p{i}", "x", "f", ["l"], [])])[0] for i in range(3)]
    assert [e.id for e in oldest.entries()] == kept[1:]  # the whole pool's cap: the oldest leaves
    oldest.close()


@pytest.mark.parametrize(
    "field, value", [("retrieval_rank", "popularity"), ("pool_eviction", "random"), ("pool_total_cap", -1)]
)
def test_the_worth_switches_refuse_what_they_do_not_know(tmp_path, field, value):
    from lanpo.config import LanpoConfig

    with pytest.raises(ValueError, match=field):
        LanpoConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **{field: value})


@pytest.mark.parametrize("ranking", ["lift", "simutil"])
def test_a_run_under_a_learned_ranking_credits_the_entries_it_showed_and_logs_their_worth(
    tiny_model_dir, tmp_path, ranking
):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_trainer import history, make_trainer, stub_summaries

    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=4, retrieval_rank=ranking)
    stub_summaries(trainer)
    trainer.train()
    logged = (trainer.run_dir / "retrievals.jsonl").read_text().splitlines()
    shown = {hit["entry_id"] for line in logged for hit in json.loads(line)["retrieved"]}
    records = trainer.pool.entry_worth()
    assert shown and set(records) <= shown and records  # every credited entry was shown
    assert sum(w.uses for w in records.values()) >= len(records)
    assert trainer.pool.reflection_worth()  # reflection rows are kept per problem
    assert history(trainer, "pool/worth/entries_judged")


@settings(max_examples=25, deadline=None)
@given(uses=st.lists(st.tuples(st.integers(0, 2 * MIN_USES), st.floats(-1, 1)), min_size=1, max_size=8))
def test_the_step_metrics_read_only_the_judged_and_shown_records_and_equal_a_reading_of_all(tmp_path_factory, uses):
    pool = ExperiencePool(tmp_path_factory.mktemp("m") / "pool.sqlite")
    ids = pool.add([PoolEntry(f"q{i}", "p", "f", [f"lesson {i}"], []) for i in range(len(uses))])
    seen = [Observation(i, lift, 0.0, False) for i, (n, lift) in zip(ids, uses) for _ in range(n)]
    pool.add_attempts([], StepWorth(1, seen, []))
    rows = [row("abstraction", entries=[ids[0], ids[-1]])]
    everything = pool.entry_worth()
    judged = [w for w in everything.values() if w.credited >= MIN_USES]
    assert pool.judged_worth(MIN_USES) == {i: w for i, w in everything.items() if w.credited >= MIN_USES}
    metrics = shown_metrics(pool, rows)
    assert metrics["pool/worth/entries_judged"] == len(judged)
    assert metrics["pool/worth/harmful"] == sum(w.hurts for w in judged)
    values = [everything.get(i, Worth()).mean_lift for i in (ids[0], ids[-1])]
    assert math.isclose(metrics["pool/worth/shown_mean_lift"], sum(values) / 2)
    pool.close()


@settings(max_examples=20, deadline=None)
@given(
    steps=st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 3)), min_size=1, max_size=12),
)
def test_the_kept_total_count_follows_every_write_of_this_and_other_connections(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("n") / "pool.sqlite"
    mine, other = ExperiencePool(path, cap_per_problem=2), ExperiencePool(path, cap_per_problem=2)
    for n, (by_other, add, uses) in enumerate(steps):
        writer = other if by_other else mine
        if add or not len(writer):
            writer.add([PoolEntry(f"q{n % 3}", "p", "f", [f"lesson {n}"], [])])  # evicts past 2 per problem
        else:
            target = writer.entries()[-1].id
            writer.add_attempts([], StepWorth(n, [Observation(target, 0.1, 1.0, True)] * uses, []))
        direct = sum(w.uses for w in mine.entry_worth().values()) + len(mine)
        assert mine.total_counts() == direct == other.total_counts()
    mine.close()
    other.close()
