"""The end of a run: the final model (LoRA merged), its model card, and the push to the hub."""

from __future__ import annotations

from pathlib import Path


def save_final_model(trainer, out_dir: str | Path) -> Path:
    """``out_dir/final``: the trained model and tokenizer, through the trainer's own ``save_model`` (which
    gathers ZeRO-3 / FSDP shards); a LoRA run also keeps its adapter in ``final-adapter`` and saves the merged
    model in ``final``, ready to evaluate."""
    out_dir = Path(out_dir)
    final = out_dir / "final"
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):
        trainer.save_model(str(out_dir / "final-adapter"))
        if trainer.accelerator.is_main_process:
            model.merge_and_unload().save_pretrained(final)
            trainer.processing_class.save_pretrained(final)
    else:
        trainer.save_model(str(final))
    return final


CARD_FIELDS = (
    "data",
    "num_generations",
    "feedback_ratio",
    "feedback_schedule",
    "reflection_share",
    "reflection_source",
    "relevance_scorer",
    "relevance_threshold",
    "retrieval_top_k",
    "context_in_loss",
    "advantage_grouping",
    "beta",
    "learning_rate",
    "max_completion_length",
    "temperature",
    "answer_extraction",
    "seed",
)


def model_card(config: dict, problems: int, steps: int) -> str:
    """``final/README.md``: what the model is, the method, and the settings that made it."""
    rows = "\n".join(f"| `{k}` | `{config.get(k)}` |" for k in CARD_FIELDS if k in config)
    return f"""---
base_model: {config.get("model_name_or_path")}
library_name: transformers
tags: [lanpo, grpo, trl, reinforcement-learning, math]
---

# {config.get("model_name_or_path")} trained with LANPO

Trained with [lanpo](https://github.com/) for {steps} steps on {problems} problems: **LANPO** (Language-And-Numerical
Policy Optimization, [arXiv 2510.16552](https://arxiv.org/abs/2510.16552)), GRPO with a KL term whose rollout
groups are partly generated with language feedback from the policy's own experience pool (reward-agnostic
reflection on its earlier attempts, and principles and pitfalls of relevant other problems). A share p_t of each
group had feedback; the rest, like evaluation, started from scratch.

| setting | value |
|---|---|
{rows}

The full resolved configuration is the run's `config.yaml`. Evaluate zero-shot with `lanpo eval --model THIS_DIR`.
"""


def push_final_model(final: Path, repo_id: str, private: bool | None = None) -> None:
    """Upload ``final`` (model, tokenizer, model card) to the hub; a clear error when that is not possible."""
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(final), repo_id=repo_id, commit_message="lanpo: final model")
    except Exception as error:  # offline, no token, no rights: the model is safe on disk either way
        raise RuntimeError(
            f"Pushing {final} to the hub as {repo_id!r} failed ({type(error).__name__}: {error}). "
            f"The model is saved in {final}; push it later with `huggingface-cli upload`."
        ) from error
