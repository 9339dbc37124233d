"""An incremental BM25 index over pool entries (Lucene BM25, bm25s's tokenizer), with exact MaxScore top-k.

``bm25s`` builds static indexes; the pool grows every step, so :class:`BM25Index` keeps incremental postings
and scores with bm25s's tokenizer and Lucene BM25 formula at query time (tests check that its scores equal
``bm25s.BM25(method="lucene")`` on the same corpus). Inserts and evictions update the index in place; nothing
is rebuilt per insert.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

import numpy as np

from lanpo.pool.store import PoolEntry


def entry_text(entry: PoolEntry) -> str:
    """What BM25 indexes: the entry's problem and its principles."""
    return entry.problem + "\n" + "\n".join(entry.principles)


def import_bm25s():
    """``import bm25s`` without letting JAX take the GPU. Where JAX is installed, bm25s runs a JAX top-k as it
    imports, and JAX's first use reserves 75% of the GPU's memory (``XLA_PYTHON_CLIENT_PREALLOCATE``): measured on
    an H100 with JAX installed, a ``lanpo train`` process of SmolLM2-135M held 62-65 GiB that way (1.6-5 GiB with
    preallocation off), and the next process on the GPU ran out of memory. lanpo never uses JAX, so preallocation is
    turned off here unless the user has set it."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import bm25s

    return bm25s


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
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    def view(self) -> np.ndarray:
        return self.data[: self.size]


class BM25Index:
    """Incremental Lucene BM25 (k1, b as in bm25s) keyed by pool entry id."""

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        bm25s = import_bm25s()
        self.k1 = k1
        self.b = b
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
        doc_index = (
            np.concatenate([np.full(len(t), first + i, dtype=np.int64) for i, t in enumerate(tokens)])
            if any(tokens)
            else np.zeros(0, dtype=np.int64)
        )
        term_ids = (
            np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
            if any(tokens)
            else np.zeros(0, dtype=np.int64)
        )
        lengths = np.array([len(t) for t in tokens], dtype=np.float32)
        # (term, doc) pairs with their counts, grouped by term
        pairs, tf = np.unique(term_ids * (1 << 32) + doc_index, return_counts=True)
        pair_terms = pairs >> 32
        pair_docs = pairs & ((1 << 32) - 1)
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
            self._min_len.data[seg_terms] = np.minimum(
                self._min_len.data[seg_terms], np.minimum.reduceat(lengths[pair_docs - first], starts)
            )
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
        counts = (
            np.bincount(pair_docs - first, minlength=len(entries))
            if len(pair_docs)
            else np.zeros(len(entries), dtype=np.int64)
        )
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
            self._df.data[self._doc_terms.data[offsets[doc] : offsets[doc + 1]]] -= 1
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
            new_docs = remap[d[live]].astype(np.int32)
            new_tfs = tfs.view()[live]
            docs.size = tfs.size = 0
            docs.extend(new_docs)
            tfs.extend(new_tfs)
        offsets = self._doc_offsets.view()
        terms = [self._doc_terms.data[offsets[i] : offsets[i + 1]] for i in keep]
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
        terms, tf = np.unique(
            np.asarray([t for t in ids if t < len(self._postings)], dtype=np.int64), return_counts=True
        )
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
        theta = -np.inf
        i = 0
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
