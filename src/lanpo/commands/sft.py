"""The SFT seeding stage: supervised fine-tuning on ``lanpo sft-data`` examples with TRL's ``SFTTrainer``.

The examples (``lanpo.commands.sft_data``) teach LANPO's three skills with exactly the prompts training uses:
summarizing a trial, reflecting on an ungraded attempt, and solving with lessons of other problems.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from lanpo.commands.args import model_alias, parse_command_line
from lanpo.commands.common import end_distributed

logger = logging.getLogger(__name__)


def load_sft_dataset(path: str | Path):
    """The prompt/completion columns of an sft-data file as a ``datasets.Dataset`` (bad lines skipped)."""
    import datasets

    rows = []
    skipped = 0
    for line in Path(path).read_text().splitlines():
        try:
            ex = json.loads(line)
            if not (isinstance(ex["prompt"], list) and isinstance(ex["completion"], list) and ex["completion"]):
                raise ValueError
            rows.append({"prompt": ex["prompt"], "completion": ex["completion"]})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            skipped += 1
    if skipped:
        logger.warning("%s: skipped %d malformed lines", path, skipped)
    if not rows:
        raise ValueError(f"{path} holds no usable prompt/completion examples.")
    return datasets.Dataset.from_list(rows)


@dataclass
class SFTArguments:
    data: str | None = field(default=None, metadata={"help": "The JSONL file written by `lanpo sft-data`."})


SFT_DEFAULTS = {
    "model_name_or_path": "smollm2-135m",
    "num_train_epochs": 2,
    "per_device_train_batch_size": 8,
    "learning_rate": 2e-5,
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,  # below 1: a share of the steps
    "max_length": 1024,
    "logging_steps": 5,
    "save_strategy": "no",
    "report_to": "none",
    "gradient_checkpointing": False,
    "bf16": False,
    "seed": 0,
}


def run_sft(argv: list[str]) -> Path:
    """``lanpo sft --data FILE.jsonl --model M [SFTConfig fields...]``; returns the directory of the final model."""
    import torch
    from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

    from lanpo.engine.models import load_tokenizer, parse_dtype, prepare_emulated_bf16, resolve_model_path
    from lanpo.run.final import save_final_model
    from lanpo.run.metrics_file import MetricsFileCallback

    defaults = dict(SFT_DEFAULTS, output_dir=f"runs/sft-{time.strftime('%Y%m%d-%H%M%S')}")
    sft_args, model_args, config = parse_command_line((SFTArguments, ModelConfig, SFTConfig), defaults, argv)
    if not sft_args.data:
        raise ValueError("lanpo sft needs --data FILE.jsonl (made by `lanpo sft-data`).")
    dataset = load_sft_dataset(sft_args.data)
    model_path = resolve_model_path(model_args.model_name_or_path)
    if model_args.dtype and model_args.dtype != "auto":
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": model_args.dtype}
    logger.info("SFT of %s on %d examples from %s", model_args.model_name_or_path, len(dataset), sft_args.data)
    bf16_model = parse_dtype(model_args.dtype, "cpu") == torch.bfloat16
    prepare_emulated_bf16(config.bf16, False, "Set bf16 false.", bf16_model=bf16_model)
    # Prompt/completion rows: TRL computes the loss on the completion (the assistant turn) only.
    trainer = SFTTrainer(
        model=model_path,
        args=config,
        train_dataset=dataset,
        processing_class=load_tokenizer(model_path),
        peft_config=get_peft_config(model_args),
    )
    Path(config.output_dir).mkdir(parents=True, exist_ok=True)
    trainer.add_callback(MetricsFileCallback(Path(config.output_dir) / "metrics.jsonl"))
    trainer.train()
    final = save_final_model(trainer, config.output_dir)
    if trainer.accelerator.is_main_process:
        logger.info("SFT model saved to %s (train with: lanpo train --model_name_or_path %s)", final, final)
    return final


# -- the command line ----------------------------------------------------------------------------------------


def add_parser(sub, name: str, help: str) -> None:
    """Every field is TRL's parser's (SFTArguments, ModelConfig, SFTConfig): the rest of the command line goes there."""
    sub.add_parser(name, add_help=False, help=help).set_defaults(func=command, accepts_rest=True)


def command(args) -> int:
    run_sft(model_alias(getattr(args, "rest", [])))
    end_distributed()
    return 0
