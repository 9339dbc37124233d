"""``make demo``: the main job on the embedded default (SmolLM2-135M-Instruct + builtin:arith, CPU)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(["eval", "--model", "smollm2-135m", "--data", "builtin:arith?split=test", "--limit", "48",
                   "--k", "2", "--max-new-tokens", "160", "--out", "runs/demo-eval"]))
