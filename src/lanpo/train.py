"""``lanpo train --config FILE.yaml [--field value ...]``: TrlParser-style, like TRL's own scripts.

Three dataclasses make the command line: :class:`TrainArguments` (data and run), TRL's ``ModelConfig``
(model, dtype, LoRA) and :class:`LanpoConfig` (every GRPO and LANPO knob). A YAML file sets any of their
fields; flags override it. With no config at all it trains the embedded default: SmolLM2-135M-Instruct on
``builtin:arith``, on CPU, with small groups and lengths. Every run directory gets the resolved config
(``config.yaml``, re-runnable with ``--config``), ``metrics.jsonl``, ``samples.jsonl``, the pool, checkpoints,
the final model and ``training_curves.png``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from .config import LanpoConfig, parse_command_line

logger = logging.getLogger(__name__)


@dataclass
class TrainArguments:
    data: str = field(default="builtin:arith", metadata={
        "help": "Training problems: builtin:arith[?levels=..&n=..], a preset (gsm8k, math, dapo-math-17k...), "
                "a .jsonl/.json/.parquet file, or a hub name."})
    data_dir: str | None = field(default=None, metadata={"help": "Read presets from local files here."})
    data_split: str | None = field(default=None, metadata={"help": "Split of the training data."})
    data_limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    problem_field: str | None = field(default=None, metadata={"help": "Field with the problem text."})
    answer_field: str | None = field(default=None, metadata={"help": "Field with the answer."})
    id_field: str | None = field(default=None, metadata={"help": "Field with a problem id."})
    problem_template: str | None = field(default=None, metadata={
        "help": "Build the problem from several fields, e.g. '{Body} {Question}' (case-insensitive names)."})
    answer_format: str | None = field(default=None, metadata={"help": "plain, gsm8k or boxed."})
    resume: str | None = field(default=None, metadata={
        "help": "Continue a run: a checkpoint directory, a run directory (its latest checkpoint), or 'latest' "
                "(the latest checkpoint in --output_dir). The pool, RNG states and step come back with it."})


# The embedded default: what `lanpo train` runs with no config (CPU-sized; any value can be overridden).
# Relevance: SmolLM2-135M's own Yes/No judgments barely vary (P(Yes) quantiles 0.45 / 0.61 / 0.72 at 10/50/90%
# on its own arithmetic summaries) and no scorer reaches the paper's γ = 0.9 on them, so the embedded default
# uses embedding cosine (median 0.37, 90th percentile 0.57 on the same pairs) with γ = 0.5.
EMBEDDED_DEFAULTS = {
    "model_name_or_path": "smollm2-135m",
    "data": "builtin:arith",
    "num_generations": 8,
    "per_device_train_batch_size": 8,  # one problem (a group of 8) per step: about 48 s a step on 2 CPU cores
    "gradient_accumulation_steps": 1,
    "max_completion_length": 96,
    "temperature": 0.7,
    "relevance_scorer": "embedding",
    "answer_extraction": "lenient",  # SmolLM2-135M rarely boxes its answer
    "relevance_threshold": 0.5,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "constant",
    "beta": 0.04,
    "max_steps": 30,
    "logging_steps": 1,
    "save_steps": 10,
    "gradient_checkpointing": False,
    "report_to": "none",
    "bf16": False,
    "seed": 0,
}


def parse(argv: list[str]):
    """Parse ``argv`` into (TrainArguments, ModelConfig, LanpoConfig) with the embedded defaults underneath."""
    from trl import ModelConfig

    defaults = dict(EMBEDDED_DEFAULTS, output_dir=f"runs/lanpo-{time.strftime('%Y%m%d-%H%M%S')}")
    train_args, model_args, config = parse_command_line((TrainArguments, ModelConfig, LanpoConfig), defaults, argv)
    if model_args.model_name_or_path is None:
        model_args.model_name_or_path = EMBEDDED_DEFAULTS["model_name_or_path"]
    return train_args, model_args, config


def resume_target(resume: str | None, output_dir: str) -> tuple[str | None, str]:
    """``(checkpoint, output_dir)`` for ``--resume``."""
    from transformers.trainer_utils import get_last_checkpoint

    if not resume:
        return None, output_dir
    path = Path(output_dir if resume == "latest" else resume)
    if path.name.startswith("checkpoint-") and path.is_dir():
        return str(path), str(path.parent)
    last = get_last_checkpoint(str(path)) if path.is_dir() else None
    if last is None:
        raise FileNotFoundError(f"--resume {resume}: no checkpoint-* directory in {path}.")
    return last, str(path)


def resolved_config(train_args, model_args, config) -> dict:
    """Every field of the three dataclasses with its value: a YAML that reproduces the run."""
    out = {}
    for obj in (train_args, model_args):
        out.update(asdict(obj))
    defaults = LanpoConfig.__dataclass_fields__
    for f in fields(config):
        if f.name in defaults and f.init and not f.name.startswith("_"):
            value = getattr(config, f.name)
            if hasattr(value, "value"):  # enums
                value = value.value
            if isinstance(value, (str, int, float, bool, type(None), list, dict)):
                out[f.name] = value
    return out


def run(argv: list[str]) -> Path:
    """Train; returns the run directory."""
    from trl import get_peft_config

    from .data import load_problems, to_prompt_dataset
    from .models import load_tokenizer, resolve_model_path
    from .runlog import plot_run, save_final_model
    from .trainer import LanpoTrainer

    train_args, model_args, config = parse(argv)  # validation happens here, before any model loads
    checkpoint, config.output_dir = resume_target(train_args.resume, config.output_dir)
    problems = load_problems(train_args.data, split=train_args.data_split, limit=train_args.data_limit,
                             data_dir=train_args.data_dir, problem_field=train_args.problem_field,
                             answer_field=train_args.answer_field, id_field=train_args.id_field,
                             problem_template=train_args.problem_template,
                             answer_format=train_args.answer_format)
    run_dir = Path(config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / ("config.yaml" if checkpoint is None else "config.resumed.yaml")).write_text(yaml.safe_dump(resolved_config(train_args, model_args, config),
                                                        sort_keys=False))
    model_path = resolve_model_path(model_args.model_name_or_path)
    if model_args.dtype and model_args.dtype != "auto":
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": model_args.dtype}
    elif config.bf16:
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": "bfloat16"}
    logger.info("Training %s on %d problems from %s; run directory %s", model_args.model_name_or_path,
                len(problems), train_args.data, run_dir)
    trainer = LanpoTrainer(model=model_path, args=config, train_dataset=to_prompt_dataset(problems),
                           processing_class=load_tokenizer(model_path), peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=checkpoint or config.resume_from_checkpoint)
    final = save_final_model(trainer, run_dir)
    if trainer.accelerator.is_main_process:
        plot_run(run_dir)
        logger.info("Done: final model in %s, curves in %s", final, run_dir / "training_curves.png")
    trainer.verifier.close()
    return run_dir
