"""``metrics.jsonl``: the callback that appends every log line of a run to it (main process).

Apart from :mod:`lanpo.run.files`, which reads runs, holds their locks and writes their files without importing
transformers or torch (a process that holds a run's lock, or only reads a run, starts in a fraction of a second)."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import TrainerCallback


class MetricsFileCallback(TrainerCallback):
    """Append every log line to ``metrics.jsonl`` in the run directory (main process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")
