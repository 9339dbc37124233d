"""`lanpo report` on a large run: page size, time to write it, time for headless Chromium to open each tab.

A synthetic run (deterministic text): ``--entries`` pool entries over ``--problems`` problems, ``--attempts`` stored
attempts, ``--samples`` logged rollouts in groups of 8 (prompts ~300 words, completions ~250), ``--steps``
metric rows and a retrieval log. The report embeds at most lanpo.report.page.MAX_ENTRIES entries and MAX_GROUPS groups
and says so on the page; this measures what that costs.

    python benchmarks/report_scale.py [--entries 4000] [--samples 24000] [--out /tmp/report-scale]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

from lanpo.pool.store import Attempt, ExperiencePool, PoolEntry
from lanpo.report.page import write_report

WORDS = "add carry digit sum total apples borrow fraction ratio area prime divisor remainder".split()


def build(run: Path, entries: int, problems: int, attempts: int, samples: int, steps: int) -> None:
    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    run.mkdir(parents=True)
    with ExperiencePool(run / "pool.sqlite", cap_per_problem=entries, attempts_per_problem=attempts) as pool:
        for start in range(0, entries, 100):
            pool.add(
                [
                    PoolEntry(
                        f"p{i % problems}",
                        "Problem " + text(30),
                        text(120),
                        [text(15) for _ in range(3)],
                        [text(15) for _ in range(2)],
                        step=i * steps // entries,
                        correct=rng.random() < 0.5,
                        reward=1.0,
                    )
                    for i in range(start, min(start + 100, entries))
                ]
            )
        pool.add_attempts(
            [Attempt(f"p{i % problems}", "Problem", text(200), step=i * steps // attempts) for i in range(attempts)]
        )
    with (run / "metrics.jsonl").open("w") as f:
        for s in range(1, steps + 1):
            f.write(
                json.dumps(
                    {
                        "step": s,
                        "loss": rng.random(),
                        "reward/feedback/mean": rng.random(),
                        "reward/scratch/mean": rng.random(),
                        "accuracy/feedback/mean": rng.random(),
                        "accuracy/scratch/mean": rng.random(),
                        "kl": rng.random(),
                        "lanpo/pool_size": s * entries // steps,
                    }
                )
                + "\n"
            )
    with (run / "samples.jsonl").open("w") as f:
        for i in range(samples):
            feedback = i % 8 < 6
            f.write(
                json.dumps(
                    {
                        "step": i * steps // samples + 1,
                        "group": i // 8,
                        "problem": "Problem " + text(30),
                        "problem_id": f"p{(i // 8) % problems}",
                        "gold": "4",
                        "kind": "reflection" if feedback else "scratch",
                        "feedback": feedback,
                        "fallback": None,
                        "reward": float(rng.random() < 0.3),
                        "correct": rng.random() < 0.3,
                        "prompt": text(300),
                        "completion": text(250),
                        "retrieved": [],
                    }
                )
                + "\n"
            )
    with (run / "retrievals.jsonl").open("w") as f:
        for i in range(samples):
            f.write(
                json.dumps(
                    {
                        "step": i * steps // samples + 1,
                        "problem_id": f"p{i % problems}",
                        "retrieved": [{"entry_id": rng.randint(1, entries), "relevance": rng.random()}],
                    }
                )
                + "\n"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=4000)
    parser.add_argument("--problems", type=int, default=800)
    parser.add_argument("--attempts", type=int, default=3200)
    parser.add_argument("--samples", type=int, default=24000)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--out", default="/tmp/report-scale")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    run = out / "run"
    t0 = time.perf_counter()
    build(run, args.entries, args.problems, args.attempts, args.samples, args.steps)
    t1 = time.perf_counter()
    page = write_report([run])
    t2 = time.perf_counter()
    print(
        f"synthetic run: {args.entries} entries, {args.attempts} attempts, {args.samples} samples, "
        f"{args.steps} steps (built in {t1 - t0:.1f} s)"
    )
    print(f"report: {page.stat().st_size / 1e6:.1f} MB, written in {t2 - t1:.1f} s")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from browser import CHROMIUM, Browser  # the test suite's DevTools-protocol driver

    if CHROMIUM is None:
        print("no chromium: page times not measured")
        return
    with Browser() as browser:
        start = time.perf_counter()
        browser.open(page.as_uri())  # navigate, parse the embedded data, draw the curves
        print(f"open to curves drawn: {time.perf_counter() - start:.2f} s")
        for tab, ready in (("Pool", ".entry"), ("Rollouts", ".group"), ("Evaluation", ".card"), ("Curves", "svg")):
            start = time.perf_counter()
            browser.click("#tabs button", tab)
            browser.wait_for(f"document.body.dataset.tab === '{tab}' && document.querySelector('#main {ready}')")
            print(f"tab {tab}: {time.perf_counter() - start:.2f} s")
        browser.click("#tabs button", "Pool")
        start = time.perf_counter()
        browser.type(".pool-search", "p17 ")
        browser.wait_for("document.querySelector('.pager').textContent.includes(' shown')")
        shown = browser.js("document.querySelector('.pager').textContent").split(" shown")[0]
        print(f"pool search typed and filtered: {time.perf_counter() - start:.2f} s ({shown} entries shown)")
        print(f"errors on the page: {len(browser.errors())}")


if __name__ == "__main__":
    main()
