"""The verifier on every public set in ../shared/data: right answers in model style are credited, wrong ones not.

For each gold answer (as lanpo's loaders read it), on every set (GSM8K train and test, MATH train, MATH500,
AIME24, AMC23):

* **right, in model style** (goal: >= 99% credited on every set): `\\boxed{gold}` (strict extraction),
  "the answer is $gold$." (lenient), numbers in scientific notation `a \\times 10^{b}` (strict), and the set's
  own worked solution where it has one (MATH500, AIME24: strict; GSM8K: lenient, its rationale ends in `#### N`);
* **perturbed** (goal: >= 99.5% rejected): a numeric gold + 1, else its first digit changed (or `+1` appended);
* **adversarial** (goal: 0 credited): hedges (several boxed values with the right one last, `right or wrong`,
  `wrong = right`, `right, wrong`, with a wrong value the gold lacks: repeats of the gold's own values are not
  hedges), and an echo of the problem statement under lenient extraction;
* **the classes of the third verifier round** (issue 36): right answers behind labels wider than one letter
  (`AB = g`, `f(2) = g`, `\\angle ABC = g`, `(x, y) = g`; golds that are equations or label-shaped excluded:
  there a label is a value), in consistent chains (`x = (g-1) + 1 = g`), repeated
  (`g, g`), grouped with LaTeX separators (`12,\\! 345`, `12{,}345`), and list golds boxed one value a box
  (goal: >= 99% credited); inconsistent chains (`x = g+1 = g`), a zero first group (`0,ggg` for a three-digit
  gold), and under lenient extraction a gold that is only a piece of an expression (`\\frac{g+1}{g}`,
  `(1+g)`) (goal: 0 credited);
* the slowest single call (goal: under the time limit + 0.5 s) and throughput on GSM8K-style answers
  (goal: >= 1,000 answers/s on 2 cores).

Prints a markdown table and a JSON report.

    python benchmarks/verifier_check.py [--data-dir ../shared/data] [--time-limit 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
from decimal import Decimal
from pathlib import Path

from lanpo.data.loaders import load_problems, read_rows
from lanpo.verify.answers import is_label, normalize_gold, split_values
from lanpo.verify.numerals import to_number
from lanpo.verify.rewards import MathVerifier

SETS = {  # name: (preset, split, file with worked solutions, its field, extraction for them)
    "gsm8k-train": ("gsm8k", "train", "gsm8k/train.jsonl", "answer", "lenient"),
    "gsm8k-test": ("gsm8k", "test", "gsm8k/test.jsonl", "answer", "lenient"),
    "math-train": ("math", "train", None, None, None),
    "math500": ("math500", "test", "math500/test.jsonl", "solution", "strict"),
    "aime24": ("aime24", "test", None, None, None),  # its solutions are forum posts, not model-style answers
    "amc23": ("amc23", "test", None, None, None),
}


def scientific(gold: str) -> str | None:
    """A numeric gold written as ``a \\times 10^{b}`` with the exact mantissa (None if not a finite decimal)."""
    value = to_number(gold)
    if value is None or value == 0:
        return None
    rest = value.denominator
    for prime in (2, 5):
        while rest % prime == 0:
            rest //= prime
    if rest != 1:  # 1/3 has no finite decimal mantissa
        return None
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    sign, digits, exponent = exact.normalize().as_tuple()
    if len(digits) > 30:
        return None
    mantissa = Decimal((sign, digits, -(len(digits) - 1)))
    return f"{mantissa} \\times 10^{{{exponent + len(digits) - 1}}}"


def perturb(gold: str) -> str:
    value = to_number(gold)
    if value is not None:
        value += 1
        return str(value.numerator) if value.denominator == 1 else f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
    match = re.search(r"\d", gold)
    if match:
        return gold[: match.start()] + str((int(match.group()) + 1) % 10) + gold[match.end() :]
    return f"{gold}+1"


LABELS = ["AB", "f(2)", "\\angle ABC", "S_{10}", "P(A)", "m"]


def grouped(value: int, separator: str) -> str:
    """``12345`` with its thousands written apart by ``separator`` (``,\\! ``, ``{,}``)."""
    text = f"{value:,}"
    return text.replace(",", separator)


def round_three(golds: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """The classes of issue 36 as (golds, completions) per class, from this set's own gold answers."""
    classes: dict[str, tuple[list[str], list[str]]] = {
        k: ([], []) for k in ("labels", "chains", "repeats", "grouped", "list_boxes", "bad_chains", "zero_group")
    }

    def add(name: str, gold: str, completion: str) -> None:
        classes[name][0].append(gold)
        classes[name][1].append(completion)

    for k, gold in enumerate(golds):
        value = to_number(gold)
        parts = [p for p in split_values(normalize_gold(gold)) if not is_label(p)]
        label = "(x, y)" if gold.strip().startswith("(") and "," in gold else LABELS[k % len(LABELS)]
        if "=" not in gold and not is_label(gold):  # an equation or a label-shaped gold keeps labels as values
            add("labels", gold, f"so \\boxed{{{label} = {gold}}}")
        if len(parts) == 1:
            add("repeats", gold, f"\\boxed{{{gold}, {gold}}}")
        if value is not None and value.denominator == 1:
            n = int(value)
            add("chains", gold, f"\\boxed{{x = {n - 1} + 1 = {n}}}")
            add("bad_chains", gold, f"\\boxed{{x = {n + 1} = {n}}}")
            if abs(n) >= 1000:
                for separator in (",\\! ", "{,}"):
                    add("grouped", gold, "\\boxed{" + grouped(n, separator) + "}")
            if 100 <= n <= 999:
                add("zero_group", gold, f"\\boxed{{0,{n}}}")
        every = split_values(normalize_gold(gold))
        if len(parts) > 1 and len(set(parts)) == len(parts) == len(every) and "=" not in gold:
            add("list_boxes", gold, " and ".join(f"\\boxed{{{p}}}" for p in parts))
    return classes


def outside(gold: str) -> str:
    """A wrong value that names something the gold lacks: ``perturb``, unless that only rearranges or repeats
    the gold's own values (``1,2`` → ``2,2``), then with ``+1`` on its last item."""
    wrong = perturb(gold)
    keys = lambda text: {to_number(p) if to_number(p) is not None else p for p in split_values(text)}  # noqa: E731
    return wrong if not keys(wrong) <= keys(gold) else wrong + "+1"


def rate(scores: list[float]) -> float:
    return sum(scores) / len(scores) if scores else float("nan")


def check_set(name: str, data_dir: Path, limit: float) -> dict:
    preset, split, solutions_file, field, solution_mode = SETS[name]
    problems = load_problems(preset, split=split, data_dir=data_dir)
    golds = [p.answer for p in problems]
    out: dict = {"rows": len(problems)}
    slowest = 0.0
    with (
        MathVerifier(time_limit=limit, extraction="strict") as strict,
        MathVerifier(time_limit=limit, extraction="lenient") as lenient,
    ):

        def timed(verifier, g, texts, problems_=None):
            nonlocal slowest
            scores = []
            for i in range(0, len(texts), 16):  # the slowest chunk's time bounds the slowest single answer in it
                start = time.perf_counter()
                scores += verifier.score_texts(
                    g[i : i + 16], texts[i : i + 16], problems_[i : i + 16] if problems_ else None
                )
                slowest = max(slowest, time.perf_counter() - start)
            return scores

        out["boxed"] = rate(timed(strict, golds, [f"So the final answer is \\boxed{{{g}}}." for g in golds]))
        out["answer_is"] = rate(timed(lenient, golds, [f"Therefore, the answer is ${g}$." for g in golds]))
        sci = [(g, scientific(g)) for g in golds]
        sci = [(g, s) for g, s in sci if s]
        out["scientific"] = rate(timed(strict, [g for g, _ in sci], [f"\\boxed{{{s}}}" for _, s in sci]))
        out["scientific_n"] = len(sci)
        if solutions_file:
            rows = [r for r in read_rows(data_dir / solutions_file) if isinstance(r, dict)]
            verifier = strict if solution_mode == "strict" else lenient
            with_solution = [(p.answer, r[field]) for p, r in zip(problems, rows) if r.get(field)]
            out["own_solution"] = rate(timed(verifier, [g for g, _ in with_solution], [s for _, s in with_solution]))
        out["perturbed_rejected"] = 1 - rate(timed(strict, golds, [f"\\boxed{{{perturb(g)}}}" for g in golds]))
        hedges = []
        for g in golds:
            wrong = outside(g)
            hedges += [
                f"\\boxed{{{wrong}}} or maybe \\boxed{{{g}}}",
                f"\\boxed{{{g} \\text{{ or }} {wrong}}}",
                f"\\boxed{{{wrong} = {g}}}",
                f"\\boxed{{{g}, {wrong}}}",
            ]
        out["hedges_credited"] = int(sum(timed(strict, [g for g in golds for _ in range(4)], hedges)))
        out["hedges"] = len(hedges)
        echo = timed(
            lenient,
            golds,
            [f"Let me restate the problem. {p.problem}" for p in problems],
            [p.problem for p in problems],
        )
        out["echo_credited"] = int(sum(echo))
        for name, (g, texts) in round_three(golds).items():
            scores = timed(strict, g, texts)
            out[f"r3_{name}"] = rate(scores) if name not in ("bad_chains", "zero_group") else int(sum(scores))
            out[f"r3_{name}_n"] = len(texts)
        numeric = [g for g in golds if (v := to_number(g)) is not None and v.denominator == 1 and abs(v) >= 2]
        pieces = [f"we get $\\frac{{{int(to_number(g)) + 1}}}{{{g}}}$" for g in numeric] + [
            f"we get $(1+{g})$" for g in numeric
        ]
        out["r3_pieces_credited"] = int(sum(timed(lenient, numeric * 2, pieces)))
        out["r3_pieces_n"] = len(pieces)
        out["timeouts"] = strict.stats["timeouts"] + lenient.stats["timeouts"]
    out["slowest_call_s"] = round(slowest, 3)
    return out


def throughput(data_dir: Path) -> dict:
    golds = [p.answer for p in load_problems("gsm8k", split="test", data_dir=data_dir)]
    texts = [f"... so she has {g} left. The answer is {g}." for g in golds] * 4
    with MathVerifier(extraction="lenient") as verifier:
        verifier.score(["1"], ["\\sqrt{1}"])  # workers started before the clock
        start = time.perf_counter()
        verifier.score_texts(golds * 4, texts)
        plain = len(texts) / (time.perf_counter() - start)
        latex = [f"\\boxed{{\\frac{{{g}}}{{1}} + 0}}" for g in golds]  # forces math-verify in the workers
        start = time.perf_counter()
        verifier.score_texts(golds, latex)
        through_math_verify = len(latex) / (time.perf_counter() - start)
    return {"gsm8k_style_answers_per_s": round(plain), "math_verify_answers_per_s": round(through_math_verify)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--sets", default=",".join(SETS))
    args = parser.parse_args()
    data = Path(args.data_dir)
    report = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "time_limit_s": args.time_limit, "sets": {}}
    for name in args.sets.split(","):
        report["sets"][name] = check_set(name, data, args.time_limit)
        print(name, json.dumps(report["sets"][name]), flush=True)
    report["throughput"] = throughput(data)
    pct = lambda x: "–" if x != x else f"{100 * x:.2f}%"  # noqa: E731
    lines = [
        '| set | rows | `\\boxed{}` | "the answer is" | scientific (n) | own solution | perturbed rejected | '
        "hedges credited | echoes credited | slowest 16 answers |",
        "|---" * 10 + "|",
    ]
    for name, r in report["sets"].items():
        lines.append(
            f"| {name} | {r['rows']} | {pct(r['boxed'])} | {pct(r['answer_is'])} | "
            f"{pct(r['scientific'])} ({r['scientific_n']}) | {pct(r.get('own_solution', float('nan')))} | "
            f"{pct(r['perturbed_rejected'])} | {r['hedges_credited']} / {r['hedges']} | "
            f"{r['echo_credited']} | {r['slowest_call_s']} s |"
        )
    print("\n".join(lines))
    lines = [
        "| set | labels | chains | repeats | grouped | list boxes | inconsistent chains credited | "
        "`0,ggg` credited | expression pieces credited (lenient) |",
        "|---" * 9 + "|",
    ]
    for name, r in report["sets"].items():
        cell = lambda k, r=r: f"{pct(r['r3_' + k])} ({r['r3_' + k + '_n']})"  # noqa: E731
        lines.append(
            f"| {name} | {cell('labels')} | {cell('chains')} | {cell('repeats')} | {cell('grouped')} | "
            f"{cell('list_boxes')} | {r['r3_bad_chains']} / {r['r3_bad_chains_n']} | "
            f"{r['r3_zero_group']} / {r['r3_zero_group_n']} | {r['r3_pieces_credited']} / "
            f"{r['r3_pieces_n']} |"
        )
    print("\n".join(lines))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
