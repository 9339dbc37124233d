"""``LanpoTrainer``: TRL's ``GRPOTrainer`` with LANPO's rollouts, wired in through TRL's hooks and nothing else.

Each hook is a few lines that hand the step to a module of its own: the rollout and a batch's bookkeeping
(:mod:`lanpo.step`, :mod:`lanpo.rollout`), the pool's writes and pending summaries (:mod:`lanpo.run.pool_writer`),
the next step's batches (:mod:`lanpo.run.ahead`), what a step counts (:mod:`lanpo.run.meter`), the one hand-off
into TRL's loss forward (:mod:`lanpo.tap`), the loss on feedback rows (:mod:`lanpo.loss`), checkpoints
(:mod:`lanpo.run.checkpoints`). This module is the one place that reaches into TRL's own attributes; the helpers get
the policy through :class:`lanpo.policy.Policy`. With ``feedback_ratio=0`` and no summaries it is exactly TRL's
GRPO.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from lanpo import loss, objective, score, step
from lanpo.config import LanpoConfig
from lanpo.engine import vllm_cpu
from lanpo.engine.generation import left_pad, sample_with_logprobs
from lanpo.engine.logprobs import add_compact_heads
from lanpo.engine.models import thread_sizer
from lanpo.eval.during_training import TrainingEval, load_eval_problems
from lanpo.feedback.base import SourceKit
from lanpo.feedback.privileged import HintLadder, PrivilegedKit
from lanpo.feedback.registry import make_sources
from lanpo.plan import StepPlan
from lanpo.policy import Policy, rollout_model
from lanpo.pool.retrieval import LLMJudgeScorer, run_retriever
from lanpo.pool.store import POOL_FILENAME, ExperiencePool
from lanpo.prompts import Messages, solve_messages
from lanpo.run import checkpoints
from lanpo.run.console import use_step_lines
from lanpo.run.meter import StepMeter
from lanpo.run.metrics import real_prompts
from lanpo.run.metrics_file import MetricsFileCallback
from lanpo.run.pool_writer import PoolWriter
from lanpo.step import Generation, RunParts
from lanpo.tap import ForwardTap, TrainLog, loss_forward_of
from lanpo.teacher import Teacher
from lanpo.verify.code import Verifier, code_settings
from lanpo.verify.rewards import MathVerifier, make_accuracy_reward

logger = logging.getLogger(__name__)

__all__ = ["Generation", "LanpoTrainer"]


class LanpoTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with LANPO's language-guided rollouts and experience pool.

    Arguments are ``GRPOTrainer``'s, with ``args`` a :class:`LanpoConfig`; ``reward_funcs`` defaults to math
    accuracy on the dataset's answer column (``lanpo.data.loaders.with_answer_column``); ``pool`` defaults to
    ``<output_dir>/pool.sqlite`` on the main process.
    """

    _tag_names = ["trl", "grpo", "lanpo"]
    _name = "LANPO"

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: LanpoConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        pool: ExperiencePool | None = None,
        eval_problems: dict[str, list] | None = None,
    ) -> None:
        args = args if args is not None else LanpoConfig(output_dir="runs/lanpo")
        if not isinstance(args, LanpoConfig):
            raise TypeError(f"LanpoTrainer needs a LanpoConfig, got {type(args).__name__}.")
        train_dataset, self.references = step.training_data(args, train_dataset)  # checked before the model loads
        self.verifier = Verifier(MathVerifier(args.verify_time_limit, args.answer_extraction), code_settings(args))
        if train_dataset is not None and "code" in train_dataset["gold_kind"]:
            self.verifier.start_code()  # code problems: the sandbox starts now, or the run stops here saying why
        vllm_cpu.prepare(args)
        with warnings.catch_warnings():  # lanpo pins trl<2 and tests the rollout_func API it relies on
            warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental", category=UserWarning)
            super().__init__(
                model=model,
                reward_funcs=reward_funcs or [make_accuracy_reward(self.verifier)],
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                callbacks=callbacks,
                optimizers=optimizers,
                peft_config=peft_config,
                rollout_func=self._rollout,
            )
        vllm_cpu.use_reload_weights(self)
        self.meter = StepMeter()
        tokenize = lambda prompts: [list(ids) for ids in self._tokenize_prompts(prompts)[0]]  # noqa: E731
        generate = lambda ids: self._generate_ids(ids)  # noqa: E731 - late-bound: tests and subclasses swap it
        model_io = rollout_model(self, generate, tokenize, self.verifier.credits_rows, self.meter)
        self.policy = Policy(self, model_io, lambda *a, **k: self._get_per_token_logps_and_entropies(*a, **k)[0])
        run_code = lambda jobs: self.verifier.code.sandbox.run_many(jobs)  # noqa: E731 - the reward's own sandbox
        self.teacher = Teacher(self.policy, args.scoring, args, self.meter, run_code) if args.scoring else None
        heads = (self.model, self.ref_model, self.teacher.weights if self.teacher is not None else None)
        on = args.compact_logprob_head  # the LM head on completion tokens only (lanpo.engine.logprobs)
        self._head_request = add_compact_heads(heads, self.temperature, self._entropy_bonus_enabled) if on else None
        args.warn_if_old_logps_idle(self.use_vllm)
        use_step_lines(self)  # one short line a logging step; the full metrics go to metrics.jsonl
        one_cpu_process = self.accelerator.device.type == "cpu" and self.accelerator.num_processes == 1
        if one_cpu_process and not os.environ.get("OMP_NUM_THREADS"):
            self.add_callback(thread_sizer())
        self.run_dir = Path(args.output_dir)
        main = self.accelerator.is_main_process
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(args.to_json_string())
            self.add_callback(MetricsFileCallback(self.run_dir / "metrics.jsonl"))
        # every process keeps the same pool (entries gathered first): the main process's is the run's file
        self.pool = pool or ExperiencePool.for_run(args, self.run_dir / POOL_FILENAME if main else ":memory:")
        several = self.accelerator.num_processes > 1
        sync = (lambda n: max(gather_object([n]))) if several else None  # the LLM judge: same forwards on every rank
        self.retriever = run_retriever(args, self.pool, self.model, self.processing_class, sync)
        self.hint_ladder = HintLadder(args.hint_level, adaptive=args.adaptive_hints)
        kit = PrivilegedKit(self.references, self.hint_ladder, right=self.verifier.credits, write=self._write)
        privileged = kit if args.feedback_kind is not None else None
        kit = SourceKit(args, self.pool, self.retriever, self._judge_model, privileged=privileged, run_code=run_code)
        self.writer = PoolWriter(self.pool, self.meter, gather_object, self.accelerator.num_processes)
        reduce_sum = lambda t: self.accelerator.reduce(t, reduction="sum")  # noqa: E731
        self.train_log = TrainLog(self._metrics["train"], reduce_sum, self.accelerator.gather)
        correction = lambda: loss.SamplingCorrection(  # noqa: E731 - TRL's vLLM importance sampling settings
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )
        self.tap = ForwardTap(self.train_log, self.meter, correction, args.strip_ratio_clip)
        self.parts = RunParts.of(self, make_sources(kit))
        self._plan: StepPlan | None = None  # the plan of the step at hand, built when its generation starts
        self._generation: Generation | None = None  # the generation under way, inside TRL's hooks only
        self.last_generation: Generation | None = None  # the last finished one (tests, debugging)
        self._staging = False  # while a checkpoint is written, transformers writes it under RUN/.staging
        if args.eval_every:
            self.add_callback(
                TrainingEval(self, eval_problems or load_eval_problems(args.eval_benchmarks, args.eval_limit))
            )

    # -- generation: TRL's engines, as the rollout reaches them ----------------------------------------------------

    def _generate_ids(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list | None]:
        """One completion per row and the sampler's per-token log-probabilities (vLLM's, or recorded from
        transformers' ``generate``). Every process generates as many rows (padded with a filler prompt), since
        vLLM server mode slices results by process and ZeRO-3 / FSDP forwards are collective."""
        n = len(prompt_ids)
        width = max(gather_object([n])) if self.accelerator.num_processes > 1 else n
        if width == 0:
            return [], None
        prompt_ids = prompt_ids + (prompt_ids[:1] or self.policy.rollout.tokenize([solve_messages("1 + 1")])) * (
            width - n
        )
        if self.use_vllm or self.use_transformers_continuous_batching:
            completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, 1)
        else:  # TRL's transformers path, with the sampled tokens' log-probabilities recorded
            ids, mask = left_pad(prompt_ids, self._tokenizer.pad_token_id, self.accelerator.device)
            with (
                unwrap_model_for_generation(
                    self.model_wrapped,
                    self.accelerator,
                    gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                    generation_kwargs=self.generation_kwargs,
                    gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
                ) as model,
                torch.no_grad(),
                self._dist.summon_full_params(self.model_wrapped, recurse=False),
            ):
                completion_ids, logprobs = sample_with_logprobs(
                    model, ids, mask, self.generation_config, self.eos_token_ids
                )
        return [list(c) for c in completion_ids[:n]], logprobs[:n] if logprobs is not None else None

    def _write(self, prompts: list[Messages]) -> list[str]:
        """Self-hints: the policy's replies to ``prompts``, at most ``hint_max_length`` tokens each."""
        return self.policy.write(prompts, self.args.hint_max_length)

    def _plain_rollout(self, prompts: list, num_generations: int) -> dict[str, Any]:  # GRPO's, without rollout_func
        prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def _rollout(self, prompts: list, trainer=None) -> dict[str, Any]:
        """TRL's ``rollout_func``: one completion per row of ``prompts`` (G consecutive rows per problem)."""
        if not self.model.training:  # evaluation during training: plain prompts, like the test condition
            return self._plain_rollout(prompts, self.num_generations_eval or self.num_generations)
        generation = self._generation
        if generation is None or len(generation.inputs) != len(prompts) or len(prompts) % self.num_generations:
            raise RuntimeError("LanpoTrainer rollouts must come from its own _generate_and_score_completions.")
        return step.generate(
            self.parts, generation, prompts, lambda: self._plain_rollout(prompts, self.num_generations)
        )

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """Transformers' prefetch of one optimizer step's batches; where attempts are made ahead, the next step's
        batches are pulled too (same order, handed out at the next call) so this step can attempt their problems."""
        if not self.args.attempts_ahead:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = self.parts.batches.take(epoch_iterator, num_batches)
        return batches, self._get_num_items_in_batch(batches, device)

    def _get_train_sampler(self, dataset=None):
        return checkpoints.epoch_ordered(super()._get_train_sampler(dataset))  # a resume keeps the epochs' order

    @contextmanager
    def generation_model(self, engine: bool = False):
        """The policy to generate or judge with outside a rollout: with ``engine``, TRL's colocated vLLM engine
        synced to this step where there is one (evaluation; TRL's sync, so the next rollout does not sync again);
        else the full model (ZeRO-3 / FSDP gathered)."""
        args = self.args
        if engine and args.use_vllm and args.vllm_mode == "colocate" and not args.vllm_enable_sleep_mode:
            if self.state.global_step != self._last_loaded_step:
                self.vllm_generation.sync_weights()
                self._last_loaded_step = self.state.global_step
            yield self.vllm_generation.llm
            return
        gather = args.ds3_gather_for_generation
        with (
            unwrap_model_for_generation(self.model_wrapped, self.accelerator, gather_deepspeed3_params=gather) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            yield model

    @contextmanager
    def _judge_model(self):
        """The LLM relevance judge gets the full policy for the duration of a retrieval."""
        with self.generation_model() if isinstance(self.retriever.scorer, LLMJudgeScorer) else nullcontext() as model:
            if model is not None:
                self.retriever.scorer.model = model
            yield

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self.meter.timed("reward"):
            rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._generation is not None:
            self._generation.rewards_per_func = rewards  # gathered over processes, (N_global, n_funcs)
        return rewards

    def _generate_and_score_completions(self, inputs):
        generation = Generation(self._plan, inputs) if self.model.training else None
        self._generation = generation
        try:
            with (
                self.meter.timed("rollout_total"),
                self._old_pass_deferred(self.model.training and self._old_logps_from_loss()),
            ):
                output = super()._generate_and_score_completions(inputs)
                if generation is not None and generation.rows is not None:
                    self.after_rollouts(output, generation)
                    self.last_generation = generation
        finally:
            self._generation = None
        return output

    def after_rollouts(self, output: dict, generation: Generation) -> None:
        """What a generation batch leaves behind once TRL has scored it (:func:`lanpo.step.finish`); a subclass (or a
        test) may extend it."""
        step.finish(self.parts, output, generation, self.state.global_step)
        if self.log_completions:  # TRL's completions table logged feedback rows with their plain prompt
            contexts = [c for part in gather_object([[r.context for r in generation.rows]]) for c in part]
            real_prompts(self._logs["prompt"], contexts)

    def _old_logps_from_loss(self) -> bool:
        return self.args.old_logps_apply(self.use_vllm)  # π_old from the loss forward: TRL's old pass deferred

    @contextmanager
    def _old_pass_deferred(self, active: bool):
        """TRL's generation without its old log-probability pass and importance ratio (the loss computes both)."""
        was = self.vllm_importance_sampling_correction
        self.vllm_importance_sampling_correction = was and not active
        try:
            yield
        finally:
            self.vllm_importance_sampling_correction = was

    # -- the loss: TRL's, with LANPO's treatment of feedback rows (lanpo.loss) ------------------------------------

    def _prepare_inputs(self, generation_batch):
        """TRL's, with the step's plan built when a generation starts, and keep-mode micro-batches bucketed by
        prompt length where the plan says so (else TRL's shuffle and split: p_t = 0 stays GRPO)."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:  # TRL's rule
            self._plan = self.args.step_plan(self.state.global_step)
            if self._plan.bucket_by_prompt_length:
                batch = self._generate_and_score_completions(generation_batch)
                self._buffered_inputs = loss.bucket_by_prompt_length(batch, steps)
        if self._plan.bucket_by_prompt_length:
            return self._buffered_inputs[self._step % steps]
        return super()._prepare_inputs(generation_batch)

    def _compute_loss(self, model, inputs):
        training = self.model.training
        inputs, forward = loss_forward_of(inputs, training, training and self._old_logps_from_loss())
        capture = forward.capture
        if capture is None:  # no feedback planned this step: TRL's loss, untouched
            with self.tap.loss_forward(forward):
                return super()._compute_loss(model, inputs)
        beta, self.beta = self.beta, 0.0  # TRL's loss with β = 0: LANPO adds every row's KL itself
        try:
            with self.tap.loss_forward(forward):
                policy_loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        args = self.args
        kl = loss.KLSettings(beta, args.use_bias_correction_kl, args.importance_sampling_level == "sequence")
        processes, items = self.accelerator.num_processes, float(inputs["num_items_in_batch"])
        accumulation, width = self.current_gradient_accumulation_steps, self.max_completion_length
        scale = objective.LossScale(args.loss_type, accumulation, width, items, processes, args.steps_per_generation)
        return policy_loss + self.tap.feedback_terms(capture, kl, args.shaping_gamma, scale)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if self._head_request is not None:  # the model's forward never sees compute_entropy (TRL passes it by name)
            self._head_request.entropy = bool(kwargs.get("compute_entropy"))
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self.tap.on_forward(result[0])  # the loss's forward: lanpo's part before TRL reads it
        return result

    def training_step(self, model, inputs, num_items_in_batch):
        start, before = time.perf_counter(), self.meter.seconds["rollout_total"]
        result = super().training_step(model, inputs, num_items_in_batch)
        self.meter.seconds["update"] += time.perf_counter() - start - (self.meter.seconds["rollout_total"] - before)
        if self._step % self.current_gradient_accumulation_steps == 0:
            seconds, sums = self.meter.take_step()
            self.train_log.add(seconds)
            if self.args.scoring is not None:
                sums = self.accelerator.reduce(sums.to(self.accelerator.device), reduction="sum").cpu()
                self.train_log.add(score.score_metrics(sums))
        return result

    # -- checkpoints: complete or absent, with the pool and every process's pending summaries ---------------------

    def _get_output_dir(self, trial) -> str:
        run_dir = super()._get_output_dir(trial)
        return str(Path(run_dir) / checkpoints.STAGING) if self._staging else run_dir

    def _save_checkpoint(self, model, trial):
        run_dir = Path(self._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        with checkpoints.save_failures_named(run_dir, name):  # a full disk is named, the half-written save removed
            self._staging = True
            try:
                super()._save_checkpoint(model, trial)
            finally:
                self._staging = False
            staged = run_dir / checkpoints.STAGING / name
            staged.mkdir(parents=True, exist_ok=True)
            if self.accelerator.is_main_process:
                state = {"hint_ladder": self.hint_ladder.state_dict(), "transfer": self.parts.transfer.state_dict()}
                checkpoints.save_run_state(staged, self.pool, state, self.teacher, self.run_dir)
            rank, processes = self.accelerator.process_index, self.accelerator.num_processes
            checkpoints.write_state(staged, rank, processes, self.state.global_step, self.writer.pending)
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                checkpoints.commit(staged, run_dir / name, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        rank, processes = self.accelerator.process_index, self.accelerator.num_processes
        folder = Path(checkpoint)
        self.writer.pending, state = checkpoints.resume_run_state(
            folder, self.pool, rank, processes, self.run_dir, self.train_dataset
        )
        self.retriever.rebuild()
        self.hint_ladder.load_state_dict(state.get("hint_ladder", {}))
        if self.teacher is not None:
            self.teacher.load(folder)
        self.parts.transfer.load_state_dict(state.get("transfer", {}))
        entries, pending = len(self.pool), len(self.writer.pending)
        logger.info("Resumed the experience pool from %s (%d entries, %d pending summaries)", folder, entries, pending)

    def load_weights(self, checkpoint: str) -> None:  # a run killed before its final model: the last checkpoint's
        self._load_from_checkpoint(checkpoint)

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        self.writer.summarize_apart(self.policy.rollout)  # the last step's trials
        return result
