"""`accelerate launch` of CPU processes for the multi-process tests."""

from __future__ import annotations

import sys

from lanpo.engine.vllm_cpu import free_port  # an unused port the OS picks: each launch rendezvous on its own


def accelerate_launch(processes: int, *mode: str) -> list[str]:
    """The command that starts ``processes`` processes under ``accelerate launch``, before the script and its
    arguments. ``mode``: the launch mode's flags; by default ``--multi_gpu``, which starts them through torchrun
    (gloo on a machine without GPUs; ``--cpu`` would start a single process)."""
    return [
        sys.executable, "-m", "accelerate.commands.launch", *(mode or ("--multi_gpu",)),
        "--main_process_port", str(free_port()), "--num_processes", str(processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
    ]  # fmt: skip
