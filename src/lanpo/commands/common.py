"""What the commands share beyond their command lines: the end of a distributed run, a folder name for a data spec."""

from __future__ import annotations

import sys


def slug(spec: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in spec)


def end_distributed() -> None:
    """After a run that went well (never after an error: its barrier could wait forever), destroy the process
    group: a gloo process that exits with it alive can abort in shutdown (SIGABRT) and fail a finished run.

    A colocated vLLM engine holds groups of its own on that process group: they go first, through vLLM, or its
    exit hook would destroy them after the group is gone and print a traceback at the end of a finished run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        vllm_state = sys.modules.get("vllm.distributed.parallel_state")
        if vllm_state is not None:
            vllm_state.destroy_model_parallel()
            vllm_state.destroy_distributed_environment()
        if dist.is_initialized():
            dist.destroy_process_group()
