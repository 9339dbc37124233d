"""Experience pool at scale: insert rate, retrieval top-8 latency, peak memory, for 10K / 100K / 1M entries.

Each size runs in a fresh subprocess (so peak RSS is that size's own). Synthetic entries mimic pool text:
templated math word problems plus principles drawn from a Zipf-distributed vocabulary of 20,000 words.

* insert: `ExperiencePool.add` in batches of 1,000 (one transaction each) with a `Retriever` subscribed, so the
  rate includes keeping the BM25 index up to date (and, separately, the SQLite store alone);
* retrieval: `Retriever.retrieve` (BM25 candidates, excluding the query's own problem, fetch from SQLite, bm25
  relevance, γ = 0, top-8) for 300 queries; p50 / p99 in ms;
* memory: peak resident set size of the process;
* rankings (``retrieval_rank``, lanpo.pool.worth): a tenth of the entries get worth records (1 to 12 uses each,
  lifts drawn from -1..1), then the same queries are retrieved under ``similarity``, ``simutil`` and ``lift``, one
  after another for each query (the same index, the same candidates), p50 / p99 in ms each, and each ranking's p99
  over similarity's.

    python benchmarks/pool_bench.py [--sizes 10000,100000,1000000]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def synthetic_entries(start: int, count: int, rng: random.Random, vocab: list[str], cum: list[float]):
    from lanpo.pool.store import PoolEntry

    names = ["Ava", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana"]
    items = ["apples", "pencils", "marbles", "books", "coins", "cards", "shells", "tiles"]
    out = []
    for i in range(start, start + count):
        words = rng.choices(vocab, cum_weights=cum, k=14)
        problem = (
            f"{rng.choice(names)} has {rng.randint(2, 99)} {rng.choice(items)} and {' '.join(words[:6])}. "
            f"How many {rng.choice(items)} {' '.join(words[6:9])}?"
        )
        out.append(
            PoolEntry(
                problem_id=f"p{i // 4}",
                problem=problem,
                flow_of_thought="set up then compute",
                principles=[" ".join(words[9:14]), " ".join(rng.choices(vocab, cum_weights=cum, k=6))],
                pitfalls=[" ".join(rng.choices(vocab, cum_weights=cum, k=6))],
                step=i // 1000,
            )
        )
    return out


def run_size(n: int, queries: int) -> dict:
    from lanpo.pool.retrieval import Retriever
    from lanpo.pool.store import ExperiencePool

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(20_000)]
    weights = list(itertools.accumulate(1.0 / (rank + 1) ** 1.07 for rank in range(len(vocab))))
    batch = 1000
    with tempfile.TemporaryDirectory() as tmp:
        store_only = ExperiencePool(Path(tmp) / "store.sqlite", cap_per_problem=32)
        probe = synthetic_entries(0, min(n, 20_000), rng, vocab, weights)
        start = time.perf_counter()
        for s in range(0, len(probe), batch):
            store_only.add(probe[s : s + batch])
        store_rate = len(probe) / (time.perf_counter() - start)
        store_only.close()
        del probe

        pool = ExperiencePool(Path(tmp) / "pool.sqlite", cap_per_problem=32)
        retriever = Retriever(pool, "bm25", gamma=0.0, top_k=8, candidates=8)
        elapsed = 0.0
        for s in range(0, n, batch):
            entries = synthetic_entries(s, min(batch, n - s), rng, vocab, weights)
            start = time.perf_counter()
            pool.add(entries)
            elapsed += time.perf_counter() - start
        insert_rate = n / elapsed
        qrng = random.Random(1)
        probes = synthetic_entries(n, queries, qrng, vocab, weights)
        latencies, search_only = [], []
        for e in probes:
            start = time.perf_counter()
            found = retriever.retrieve(f"p{qrng.randrange(n // 4)}", e.problem)
            latencies.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            retriever.index.search(e.problem, 8)
            search_only.append((time.perf_counter() - start) * 1000)
            assert len(found) <= 8
        latencies.sort()
        search_only.sort()
        rankings = time_rankings(pool, retriever, probes, n, random.Random(2))
        result = {
            "entries": len(pool),
            "insert_entries_per_s_with_index": round(insert_rate),
            "insert_entries_per_s_store_only": round(store_rate),
            "retrieve_top8_ms_p50": round(statistics.median(latencies), 2),
            "retrieve_top8_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
            "bm25_search_ms_p50": round(statistics.median(search_only), 2),
            "bm25_search_ms_p99": round(search_only[int(0.99 * (len(search_only) - 1))], 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "file_mb": round(sum(p.stat().st_size for p in Path(tmp).glob("pool.sqlite*")) / 2**20),
            **rankings,
        }
        pool.close()
        return result


def time_rankings(pool, retriever, probes, n: int, rng: random.Random) -> dict:
    """Retrieval latency under each ranking, the rankings taking turns query by query, after a tenth of the
    entries got worth records; each ranking's p99 over similarity's."""
    from lanpo.pool.store import StepWorth
    from lanpo.pool.worth import RANKINGS, Observation

    ids = [e.id for e in pool.iter_entries()]
    shown = rng.sample(ids, max(1, len(ids) // 10))
    for start in range(0, len(shown), 10_000):
        seen = [
            Observation(i, rng.choice((-1.0, -0.5, 0.0, 0.5, 1.0)), rng.random(), rng.random() < 0.3)
            for i in shown[start : start + 10_000]
            for _ in range(rng.randint(1, 12))
        ]
        pool.add_attempts([], StepWorth(1, seen, []))
    times: dict[str, list[float]] = {r: [] for r in RANKINGS}
    for e in probes:
        problem_id = f"p{rng.randrange(n // 4)}"
        for ranking in RANKINGS:  # the same query under each, in turn
            retriever.ranking = ranking
            start = time.perf_counter()
            retriever.retrieve(problem_id, e.problem)
            times[ranking].append((time.perf_counter() - start) * 1000)
    retriever.ranking = "similarity"
    p99 = {r: sorted(t)[int(0.99 * (len(t) - 1))] for r, t in times.items()}
    out = {"entries_with_worth": len(shown)}
    for ranking, t in times.items():
        out[f"{ranking}_top8_ms_p50"] = round(statistics.median(t), 2)
        out[f"{ranking}_top8_ms_p99"] = round(p99[ranking], 2)
        out[f"{ranking}_p99_over_similarity"] = round(p99[ranking] / p99["similarity"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one size in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_size(args.one, args.queries)))
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("goals: insert >= 5,000 entries/s; top-8 p99 <= 10 ms at 100K, <= 50 ms at 1M; peak memory <= 2 GB at 1M")
    for n in [int(x) for x in args.sizes.split(",")]:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--queries", str(args.queries)],
            capture_output=True,
            text=True,
            check=True,
        )
        print(json.dumps({"size": n, **json.loads(out.stdout.strip().splitlines()[-1])}))


if __name__ == "__main__":
    main()
