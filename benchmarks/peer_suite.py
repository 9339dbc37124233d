"""lanpo's math verifier on a peer's test suite: Math-Verify's own test files, read as a data set of (gold,
prediction, expected) cases.

Every ``pytest.mark.parametrize`` table of Math-Verify's ``tests/`` whose rows are ``(gold, pred, expected)``
string-string-0/1 triples compared with the default settings (the tables that pass ``precision``, ``strict`` or
``allow_set_relation_comp`` test options lanpo does not have, and are left out) is one case: the gold as a data
set's gold answer; the prediction as a completion when it boxes (strict extraction) or reads as prose (lenient
extraction: "the answer is X", else the last number), else as the final answer extraction hands on. Agreement is the share of cases where lanpo's verdict equals
the expected one; a false accept is a case expected 0 that lanpo credits.

    python benchmarks/peer_suite.py PATH/TO/Math-Verify/tests [--show-disagreements]

Targets (issue 71): agreement >= 0.95, 0 false accepts. Deliberate differences are listed in
docs/data-and-rewards.md (decimal commas: lanpo reads ``1,22`` as a list or a thousands group, never 1.22).
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import re
import time
from pathlib import Path

from lanpo.verify.rewards import MathVerifier

OPTIONS = {"precision", "strict", "allow_set_relation_comp"}  # tables with options lanpo does not have


def cases(folder: Path) -> list[dict]:
    """Every default-settings (gold, pred, expected) case of the suite, with the file it came from."""
    found = []
    for path in sorted(folder.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize"):
                continue
            try:
                names = [n.strip() for n in ast.literal_eval(node.args[0]).split(",")]
                rows = ast.literal_eval(node.args[1])
            except (ValueError, SyntaxError, AttributeError, IndexError):
                continue
            if set(names) & OPTIONS or names[:2] != ["gold", "pred"] or len(names) != 3:
                continue
            for row in rows:
                gold, pred, expected = row
                if isinstance(gold, str) and isinstance(pred, str) and expected in (0, 1, True, False):
                    found.append({"file": path.name, "gold": gold, "pred": pred, "expected": int(expected)})
    return found


def is_prose(pred: str) -> bool:
    """A completion that states its answer in prose without boxing it: lenient extraction's territory (the last
    number, never the last math span), where lanpo deliberately differs from Math-Verify's extraction."""
    return (
        "\\boxed" not in pred
        and "\\fbox" not in pred
        and (len(pred) > 80 or bool(PROSE.search(MATH_SPAN.sub(" ", pred))))
    )


def score(strict: MathVerifier, lenient: MathVerifier, case: dict) -> float:
    """A prediction that boxes is a completion (strict extraction); one that reads as prose (a sentence, or past
    a line's length) is a completion that does not box (lenient extraction); any other is a final answer as
    extraction would hand it on."""
    pred = case["pred"]
    if "\\boxed" in pred or "\\fbox" in pred:
        return strict.score_texts([case["gold"]], [pred])[0]
    if is_prose(pred):
        return lenient.score_texts([case["gold"]], [pred])[0]
    return strict.score([case["gold"]], [pred])[0]


MATH_SPAN = re.compile(r"\$\$.*?\$\$|\$.*?\$|\\\(.*?\\\)|\\\[.*?\\\]", re.DOTALL)  # what prose is read outside of
PROSE = re.compile(r"\b(?:answer|is|the|so|which|it's)\b", re.IGNORECASE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", type=Path, help="Math-Verify's tests/ folder")
    parser.add_argument("--show-disagreements", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    table = cases(args.tests)
    start = time.perf_counter()
    with MathVerifier(extraction="strict") as strict, MathVerifier(extraction="lenient") as lenient:
        for case in table:
            case["lanpo"] = int(score(strict, lenient, case) > 0.5)
    seconds = time.perf_counter() - start
    agree = sum(c["lanpo"] == c["expected"] for c in table)
    false_accepts = [c for c in table if c["lanpo"] and not c["expected"]]
    false_rejects = [c for c in table if c["expected"] and not c["lanpo"]]
    by_file: dict[str, list[int]] = {}
    for c in table:
        by_file.setdefault(c["file"], [0, 0])
        by_file[c["file"]][0] += c["lanpo"] == c["expected"]
        by_file[c["file"]][1] += 1
    print(f"machine: {platform.processor() or platform.machine()}, {seconds:.1f} s for {len(table)} cases\n")
    print("| file | agree | cases |\n|---|---|---|")
    for name, (a, n) in by_file.items():
        print(f"| {name} | {a} | {n} |")
    print(f"| **all** | **{agree}** ({agree / len(table):.3f}) | **{len(table)}** |\n")
    print(f"false accepts: {len(false_accepts)} (target 0); false rejects: {len(false_rejects)}")
    scope = [c for c in table if not is_prose(c["pred"])]
    agree_in_scope = sum(c["lanpo"] == c["expected"] for c in scope)
    accepts_in_scope = sum(c["lanpo"] and not c["expected"] for c in scope)
    print(
        f"final answers and boxed completions ({len(table) - len(scope)} unboxed prose predictions left out): "
        f"{agree_in_scope}/{len(scope)} agree ({agree_in_scope / len(scope):.3f}), {accepts_in_scope} false accepts"
    )
    if args.show_disagreements:
        for c in false_accepts + false_rejects:
            kind = "FALSE ACCEPT" if c["lanpo"] else "false reject"
            where = "prose" if is_prose(c["pred"]) else "in scope"
            print(f"{kind} ({where}) [{c['file']}] gold={c['gold']!r} pred={c['pred']!r}")
    if args.json:
        report = {"cases": len(table), "agree": agree, "false_accepts": false_accepts, "false_rejects": false_rejects}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
