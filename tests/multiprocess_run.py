"""Launched by test_trainer.py under `accelerate launch --num_processes 2 --cpu`: a LANPO run on two processes.

Each process writes its pool's digest; the test checks that every rank holds the same pool.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_trainer import make_trainer, stub_summaries  # noqa: E402


def main() -> None:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    trainer = make_trainer(model_dir, out, "run", max_steps=3, per_device_train_batch_size=4)
    stub_summaries(trainer)
    trainer.train()
    state = trainer.accelerator.state
    (out / f"rank{state.process_index}.json").write_text(json.dumps({
        "world_size": state.num_processes, "digest": trainer.pool.digest(), "entries": len(trainer.pool),
    }))


if __name__ == "__main__":
    main()
