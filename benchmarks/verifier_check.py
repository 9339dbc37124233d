"""The verifier on real data: gold solutions must verify, perturbed answers must not.

* MATH500: the last \\boxed{} of each gold `solution` against its `answer` (goal: >= 99% score 1).
* GSM8K test: the gold rationale's `####` number against the answer (goal: >= 99.5% score 1).
* Both: answers perturbed (+1 on the first number, or a changed expression) score 0 (goal: >= 99%).

    python benchmarks/verifier_check.py [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from lanpo.answers import last_boxed
from lanpo.rewards import MathVerifier


def perturb(answer: str) -> str:
    """Change the first number by +1; answers without a number get '+1' appended."""
    match = re.search(r"\d+", answer)
    if match:
        return answer[:match.start()] + str(int(match.group()) + 1) + answer[match.end():]
    return f"{answer}+1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    args = parser.parse_args()
    data = Path(args.data_dir)
    report = {}
    with MathVerifier(extraction="boxed", time_limit=5.0) as verifier:
        rows = [json.loads(x) for x in (data / "math500" / "test.jsonl").read_text().splitlines()]
        start = time.perf_counter()
        gold_ok = verifier.score_texts([r["answer"] for r in rows], [r["solution"] for r in rows])
        perturbed = verifier.score([r["answer"] for r in rows], [perturb(last_boxed(r["solution"]) or "") for r in rows])
        report["math500"] = {"rows": len(rows), "gold_solution_verifies": sum(gold_ok) / len(rows),
                             "perturbed_rejected": 1 - sum(perturbed) / len(rows),
                             "failures": [r["unique_id"] for r, s in zip(rows, gold_ok) if not s][:10],
                             "seconds": round(time.perf_counter() - start, 1)}
    with MathVerifier(extraction="lenient") as verifier:
        rows = [json.loads(x) for x in (data / "gsm8k" / "test.jsonl").read_text().splitlines()]
        golds = [r["answer"].rsplit("####", 1)[1].strip() for r in rows]
        start = time.perf_counter()
        gold_ok = verifier.score_texts(golds, [r["answer"] for r in rows])
        perturbed = verifier.score(golds, [perturb(g.replace(",", "")) for g in golds])
        report["gsm8k_test"] = {"rows": len(rows), "gold_rationale_verifies": sum(gold_ok) / len(rows),
                                "perturbed_rejected": 1 - sum(perturbed) / len(rows),
                                "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
