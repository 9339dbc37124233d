"""Evaluation during training: held-out mean@k before the first step and every ``eval_every`` steps.

The metrics are logged as ``eval/<benchmark>/<mode>/mean@k`` (with ``_stderr``, ``pass@k`` and, for retrieval,
``context_rate``) through the trainer's callbacks, so they reach ``metrics.jsonl`` and every ``report_to`` target,
as TRL users expect from ``eval_strategy``. Modes: ``zero-shot`` (the test condition) and ``retrieval`` (the run's
own pool, through the training retriever). Sampling runs under a forked RNG, so a run with evaluation trains
exactly as one without. Every process evaluates the same problems (generation under ZeRO-3 / FSDP is collective).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from lanpo.data.loaders import Problem, default_split, load_problems, parse_builtin, split_specs
from lanpo.data.presets import HELD_OUT, training_split
from lanpo.eval.evaluate import EvalSettings, evaluate
from lanpo.verify.code import code_settings

logger = logging.getLogger(__name__)


def benchmark_name(spec: str) -> str:
    """A short metric name for a data spec: ``math500``, ``arith`` (builtin:arith?split=test), a file's stem."""
    base = spec.split("?")[0].removeprefix("builtin:")
    return Path(base).stem if ("/" in base or "." in base) else base


def held_out_benchmark(data: str, split: str | None = None) -> str | None:
    """The held-out problems of a training set, evaluated during training when ``eval_benchmarks`` names none:
    builtin:arith's test split (same levels and seed; disjoint from train by construction), GSM8K's test split,
    MATH500 for MATH. None when lanpo knows none (a file, a hub name, a test split trained on)."""
    if data.startswith("builtin:"):
        name, options = parse_builtin(data)
        if (split or options.get("split", "train")) == "test":
            return None
        kept = [f"{k}={v}" for k, v in options.items() if k not in ("split", "n")]
        return f"{name}?{'&'.join([*kept, 'split=test'])}"
    return HELD_OUT.get(data) if training_split(data, split) == "train" else None


def load_eval_problems(specs: str | None, limit: int | None, data_dir: str | None = None) -> dict[str, list[Problem]]:
    """The held-out problems of ``eval_benchmarks`` (comma-separated data specs), by metric name."""
    if not specs:
        raise ValueError(
            "eval_every > 0 needs eval_benchmarks (the held-out problems), e.g. math500 or builtin:arith?split=test."
        )
    problems = {}
    listed = split_specs(specs)
    for spec in listed:
        name = benchmark_name(spec)
        if name in problems:
            raise ValueError(
                f"eval_benchmarks: two of {listed} would log as eval/{name}/...; evaluate them in "
                "separate runs, or use data files with distinct names."
            )
        problems[name] = load_problems(spec, split=default_split(spec), limit=limit, data_dir=data_dir)
    return problems


def eval_settings(args, step: int) -> EvalSettings:
    """Evaluation during training's settings at optimizer step ``step``: the run's own decoding, extraction,
    verifier limits and code sandbox (:func:`lanpo.verify.code.code_settings`, as training's rewards use them)."""
    return EvalSettings(
        k=args.eval_k,
        temperature=args.temperature,
        max_new_tokens=args.max_completion_length,
        extraction=args.answer_extraction,
        verify_time_limit=args.verify_time_limit,
        seed=args.seed + step,
        code=code_settings(args),
    )


class TrainingEval(TrainerCallback):
    """Added by ``LanpoTrainer`` when ``eval_every > 0``."""

    def __init__(self, trainer, problems: dict[str, list[Problem]]) -> None:
        self.trainer = trainer
        self.problems = problems
        self.modes = trainer.args.eval_mode_list()

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self.run(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.eval_every == 0:
            self.run(state.global_step)

    def _transfer(self, results, problems, settings) -> float | None:
        """The scoring run's teacher-student gap on this evaluation's zero-shot rollouts
        (:func:`lanpo.eval.gate.transfer_gap`)."""
        from lanpo.eval.gate import transfer_gap

        trainer = self.trainer
        zero_shot = next((r for r in results if r.mode == "zero-shot" and r.samples), None)
        if zero_shot is None:
            return None
        policy = trainer.accelerator.unwrap_model(trainer.model)
        with trainer.teacher.model() as teacher:
            return transfer_gap(
                policy,
                trainer.accelerator.unwrap_model(teacher),
                trainer.processing_class,
                problems,
                zero_shot.samples,
                settings.temperature,
                settings.batch_size,
            )

    def run(self, step: int) -> dict[str, float]:
        from lanpo.engine.generation import is_vllm

        trainer = self.trainer
        args = self.trainer.args
        settings = eval_settings(args, step)
        metrics = {}
        start = time.perf_counter()
        retriever = trainer.retriever
        saved_stats = retriever.stats  # training's retrieval metrics stay training's
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        # the synced colocated vLLM engine where there is one (~5x transformers' generate on CPU: benchmarks/
        # generation_backends.py), else the full model
        with torch.random.fork_rng(devices=devices), trainer.generation_model(engine=True) as model:
            for name, problems in self.problems.items():
                results = evaluate(
                    model,
                    trainer.processing_class,
                    problems,
                    settings,
                    self.modes,
                    retriever=retriever,
                    describe={"pool": "this run's pool"},
                )
                transfer = self._transfer(results, problems, settings) if args.scoring is not None else None
                if transfer is not None:
                    metrics[f"eval/{name}/transfer_gold"] = transfer
                for result in results:
                    for key in (
                        f"mean@{args.eval_k}",
                        f"mean@{args.eval_k}_stderr",
                        f"pass@{args.eval_k}",
                        "context_rate",
                    ):
                        if key in result.metrics:
                            metrics[f"eval/{name}/{result.mode}/{key}"] = float(result.metrics[key])
        retriever.stats = saved_stats
        metrics["eval/seconds"] = time.perf_counter() - start
        logger.info(
            "Step %d evaluation (%s): %s",
            step,
            "vLLM" if is_vllm(model) else "transformers",
            ", ".join(f"{k} {v:.3f}" for k, v in metrics.items() if "stderr" not in k),
        )
        should_log = trainer.control.should_log  # logging resets it: the step's own log must still happen
        Trainer.log(trainer, metrics)  # transformers' log: straight to the callbacks, not merged with TRL's metrics
        trainer.control.should_log = should_log
        return metrics
