"""``LanpoTrainer``: TRL's ``GRPOTrainer`` with LANPO's rollouts, wired in through TRL's hooks.

The method lives one stage a module (``plan``, ``rollout``, ``loss``, ``objective``, ``run``); this class
connects them to TRL's ``rollout_func``, ``_generate_and_score_completions``, ``_calculate_rewards`` and
checkpoint hooks. With ``feedback_ratio=0`` it is exactly TRL's GRPO, even while the pool is built.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object, is_peft_model
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from lanpo import loss, objective, rollout, score
from lanpo.config import LanpoConfig
from lanpo.data.loaders import problem_of, with_answer_column
from lanpo.engine import vllm_cpu
from lanpo.engine.generation import chat_ids, left_pad, length_limit, sample_with_logprobs
from lanpo.engine.logprobs import HeadRequest, add_compact_lm_head
from lanpo.engine.models import CpuShare, follow_other_work
from lanpo.eval.during_training import TrainingEval, load_eval_problems
from lanpo.feedback.base import SourceKit
from lanpo.feedback.execution import check_examples
from lanpo.feedback.privileged import HintLadder, PrivilegedKit, take_references
from lanpo.feedback.registry import make_sources
from lanpo.plan import FeedbackKind, StepPlan
from lanpo.pool import worth
from lanpo.pool.retrieval import LLMJudgeScorer, RetrievalStats, Retriever, make_scorer
from lanpo.pool.store import POOL_FILENAME, ExperiencePool, StepWorth
from lanpo.prompts import Messages, solve_messages, with_prefill
from lanpo.run import checkpoints
from lanpo.run.console import use_step_lines
from lanpo.run.files import MetricsFileCallback, write_retrievals, write_samples
from lanpo.run.metrics import Transfer, group_outcomes, real_prompts, row_record, step_metrics, time_metrics
from lanpo.summarize import Trial, entry_from_summary, summarize_apart
from lanpo.teacher import Teacher
from lanpo.verify.code import Verifier, code_settings
from lanpo.verify.rewards import MathVerifier, make_accuracy_reward

logger = logging.getLogger(__name__)

FEEDBACK_STATE = "feedback_state.json"  # a checkpoint's hint ladder and transfer record


@dataclass
class Generation:
    """One generation batch on its way through TRL's hooks: created where the batch's generation starts
    (``_generate_and_score_completions``), filled by the rollout (``rows``, ``ahead``) and the reward hook
    (``rewards_per_func``), handed to every later stage, and gone when the generation ends (``last_generation``
    keeps the last one for inspection)."""

    plan: StepPlan
    inputs: list[dict]  # this process's rows of the batch, as TRL passes them (G consecutive rows a problem)
    rows: list[rollout.Row] | None = None
    rewards_per_func: torch.Tensor | None = None  # gathered over every process, (N_global, n_funcs)
    ahead: list[rollout.Ahead] = field(default_factory=list)  # attempts at the next step's problems, to store

    def local(self, tensor: torch.Tensor, process_index: int) -> torch.Tensor:
        """This process's rows of a tensor gathered over every process (TRL gathers in process order)."""
        n = len(self.inputs)
        return tensor[process_index * n : (process_index + 1) * n]


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
        train_dataset = with_answer_column(train_dataset) if train_dataset is not None else None
        # worked solutions leave the dataset here: only privileged feedback sources read them (never TRL's rewards)
        train_dataset, self.references = take_references(train_dataset)
        check_references(args.feedback_kind, self.references)  # before the model loads: nothing to read stops here
        if args.feedback_source == "execution" and train_dataset is not None:  # likewise: no example to run
            check_examples([problem_of(row)[1] for row in train_dataset])
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
        self.teacher = Teacher(self, args.scoring) if args.scoring is not None else None  # the scoring route's
        self._head_request = self._compact_heads() if args.compact_logprob_head else None
        if args.old_logps_from_loss and not self._old_logps_from_loss():
            logger.warning(
                "old_logps_from_loss has no effect here: %s",
                "TRL runs no old-policy pass without vLLM's importance correction"
                if not (self.use_vllm and args.vllm_importance_sampling_correction)
                else "an optimizer step falls between a generation and its loss (gradient_accumulation_steps is not "
                "a multiple of steps_per_generation x num_iterations), so pi_old needs its own pass",
            )
        use_step_lines(self)  # one short line a logging step; the full metrics go to metrics.jsonl
        one_cpu_process = self.accelerator.device.type == "cpu" and self.accelerator.num_processes == 1
        if one_cpu_process and not os.environ.get("OMP_NUM_THREADS"):
            self.add_callback(ThreadSizer())
        self.run_dir = Path(args.output_dir)
        main = self.accelerator.is_main_process
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(args.to_json_string())
            self.add_callback(MetricsFileCallback(self.run_dir / "metrics.jsonl"))
        # Every process keeps the same pool (entries are gathered before insertion); the main process's is
        # the run's file, the others live in memory.
        self.pool = pool or ExperiencePool(
            self.run_dir / POOL_FILENAME if main else ":memory:",
            cap_per_problem=args.pool_cap,
            attempts_per_problem=args.pool_attempts_cap,
            eviction=args.pool_eviction,
            total_cap=args.pool_total_cap,
        )
        scorer = make_scorer(args.relevance_scorer, self.model, self.processing_class, args.embedding_model)
        self.retriever = Retriever(
            self.pool,
            scorer,
            gamma=args.relevance_threshold,
            top_k=args.retrieval_top_k,
            candidates=args.retrieval_candidates,
            ranking=args.retrieval_rank,
        )
        if isinstance(scorer, LLMJudgeScorer) and self.accelerator.num_processes > 1:  # same forwards on every rank
            scorer.sync_batches = lambda n: max(gather_object([n]))
        self.hint_ladder = HintLadder(args.hint_level, adaptive=args.adaptive_hints)
        self.transfer = Transfer()
        privileged = None
        if args.feedback_kind is not None:
            privileged = PrivilegedKit(
                self.references,
                self.hint_ladder,
                right=lambda references, texts, problems: [
                    s > 0.5
                    for s in self.verifier.score_texts(
                        [r.answer for r in references], texts, problems, kinds=[r.gold_kind for r in references]
                    )
                ],
                write=self._write,
            )
        self.feedback_sources = make_sources(
            SourceKit(
                args,
                self.pool,
                self.retriever,
                self._judge_model,
                privileged=privileged,
                run_code=lambda jobs: self.verifier.code.sandbox.run_many(jobs),  # the reward's own sandbox
            )
        )
        self._accuracy_index = (
            self.reward_func_names.index("accuracy") if "accuracy" in self.reward_func_names else None
        )
        self.feedback_limit = args.feedback_max_completion_length or self.max_completion_length
        self._model_io = rollout.RolloutModel(
            tokenize=lambda prompts: [list(ids) for ids in self._tokenize_prompts(prompts)[0]],
            tokenize_summary=lambda messages: chat_ids(self.processing_class, messages),
            generate_ids=lambda ids: self._generate_ids(ids),  # late-bound: tests and subclasses may swap it
            decode=lambda ids: self.processing_class.decode(ids, skip_special_tokens=True),
            summary_ids=length_limit(self, args.summary_max_length)(lambda ids: self._generate_ids(ids)[0]),
            summary_max_length=args.summary_max_length,
            max_new_tokens=self.max_completion_length,
            stop_ids=frozenset(self.eos_token_ids),
            feedback_ids=length_limit(self, self.feedback_limit, keep_floor=True)(lambda ids: self._generate_ids(ids))
            if self.feedback_limit != self.max_completion_length
            else None,
            score=self._right,
            collective=self.accelerator.num_processes > 1,
        )
        self._plan: StepPlan | None = None  # the plan of the step at hand, built when its generation starts
        self._generation: Generation | None = None  # the generation under way, inside TRL's hooks only
        self.last_generation: Generation | None = None  # the last finished one (tests, debugging)
        self._capture: loss.LossCapture | None = None  # the micro-batch inside TRL's loss, on steps with feedback
        self._correct_at_forward: dict | None = None  # the micro-batch whose vLLM correction waits for the forward
        self._score_at_forward: tuple[dict, score.ScoreCapture] | None = None  # likewise, its scored advantages
        self._pending: list[Trial] = []  # trials whose summaries ride (or go on) in the next generation batch
        self._peeked: list = []  # reflection_source ahead: the batches of the next step, pulled a step early
        self._peeked_from = None  # the epoch iterator they came from
        self._handed: list = []  # reflection_source ahead: the batch this step's generation must come from
        self._timer, self._step_counts, self._summary_stats = Counter(), Counter(), Counter()
        self._score_sums = torch.zeros(6)  # this optimizer step's scoring sums (lanpo.score.rewrite_advantages)
        self._staging = False  # while a checkpoint is written, transformers writes it under RUN/.staging
        if args.eval_every:
            self.add_callback(
                TrainingEval(self, eval_problems or load_eval_problems(args.eval_benchmarks, args.eval_limit))
            )

    # -- generation ------------------------------------------------------------------------------------------

    def _generate_ids(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list | None]:
        """One completion per row and the sampler's per-token log-probabilities (vLLM's, or recorded from
        transformers' ``generate``). Every process generates as many rows (padded with a filler prompt), since
        vLLM server mode slices results by process and ZeRO-3 / FSDP forwards are collective."""
        n = len(prompt_ids)
        width = max(gather_object([n])) if self.accelerator.num_processes > 1 else n
        if width == 0:
            return [], None
        prompt_ids = prompt_ids + (prompt_ids[:1] or self._model_io.tokenize([solve_messages("1 + 1")])) * (width - n)
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
        """The policy's replies to ``prompts`` (a prefilled reply continued), at most ``hint_max_length`` tokens each:
        self-hints. Every process calls it (the generation pads to the widest process)."""
        with length_limit(self, self.args.hint_max_length):
            completions, _ = self._generate_ids([chat_ids(self.processing_class, m) for m in prompts])
        return [with_prefill(m, self._model_io.decode(c)) for m, c in zip(prompts, completions)]

    def _right(self, rows: list[rollout.Row]) -> list[bool]:
        """Which rows' answers the verifier credits (feedback_trigger unsolved decides on these)."""
        scores = self.verifier.score_texts(
            [r.gold for r in rows], [r.text for r in rows], [r.problem for r in rows], kinds=[r.gold_kind for r in rows]
        )
        return [score > 0.5 for score in scores]

    def _any_process(self, flag: bool) -> bool:
        return any(gather_object([flag])) if self.accelerator.num_processes > 1 else flag

    def _plain_rollout(self, prompts: list, num_generations: int) -> dict[str, Any]:
        """Exactly what GRPOTrainer does without a rollout_func."""
        prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)
        completion_ids, logprobs = self._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def _rollout(self, prompts: list, trainer=None) -> dict[str, Any]:
        """TRL's ``rollout_func``: one completion per row of ``prompts`` (G consecutive rows per problem)."""
        if not self.model.training:  # evaluation during training: plain prompts, like the test condition
            return self._plain_rollout(prompts, self.num_generations_eval or self.num_generations)
        g, generation = self.num_generations, self._generation
        if generation is None or len(generation.inputs) != len(prompts) or len(prompts) % g:
            raise RuntimeError("LanpoTrainer rollouts must come from its own _generate_and_score_completions.")
        plan, inputs = generation.plan, generation.inputs
        if not plan.has_feedback:  # no feedback this step: exactly GRPO's generation
            generation.rows = rollout.make_rows(inputs, g)
            self._summarize_pending_apart()
            start = time.perf_counter()
            output = self._plain_rollout(prompts, g)
            self._timer["generate"] += time.perf_counter() - start
            for row, ids, plain in zip(generation.rows, output["completion_ids"], output["prompt_ids"]):
                row.completion_ids = list(ids)
                row.plain_ids = list(plain)
                row.text = self._model_io.decode(ids)
            return output
        generation.rows = rollout.make_rows(inputs, g, plan.group)
        context = rollout.StepContext(
            plan,
            self.feedback_sources,
            pending=self._pending,
            timer=self._timer,
            counts=self._step_counts,
            ahead=self._attempts_ahead(generation) if plan.trigger == "always" else [],
        )
        self._pending = []
        generate = rollout.ROLLOUTS[plan.trigger]  # always: lanpo_rollout; unsolved: GRPO's rollout, then feedback
        output, finished, self._pending = generate(
            generation.rows, self._model_io.tokenize(prompts), g, self._model_io, context
        )
        generation.ahead = context.ahead
        self._step_counts["ahead_attempts"] += len(context.ahead)
        self._summary_stats["carried"] += len(self._pending)  # summaries that go on in the next batch
        self._add_summaries([t for t, _ in finished], [text for _, text in finished])  # every process: it gathers
        if not self.use_vllm:  # TRL's transformers path has no sampler log-probabilities: rows keep them
            output["logprobs"] = None
        return output

    def _get_train_sampler(self, dataset=None):
        return checkpoints.epoch_ordered(super()._get_train_sampler(dataset))  # a resume keeps the epochs' order

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """Transformers' prefetch of one optimizer step's batches; with ``reflection_source ahead`` it also pulls the
        next step's batches (same order, handed out at the next call) so this step can attempt their problems."""
        if not self.args.attempts.ahead:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._peeked_from is not epoch_iterator:  # a new epoch, or a resumed run: nothing pulled early
            self._peeked, self._peeked_from = [], epoch_iterator
        batches, self._peeked = self._peeked[:num_batches], self._peeked[num_batches:]
        batches += islice(epoch_iterator, num_batches - len(batches))
        self._peeked += islice(epoch_iterator, max(0, num_batches - len(self._peeked)))
        self._handed = batches[:1]
        return batches, self._get_num_items_in_batch(batches, device)

    def _attempts_ahead(self, generation: Generation) -> list[rollout.Ahead]:
        """``reflection_source ahead``: plain attempts at the problems of the next step that have none stored (nor
        rows in this step), as many per problem as this step's plan reflects on (its reflection rows, at most its
        scratch rows, at least one: a schedule's next p_t may differ, and a reflection cycles through what there
        is); none at the last step of an epoch (there is no next batch to pull).

        What the peek assumes, and checks: TRL generates a step's rows from the first batch transformers hands out
        for that step (``get_batch_samples``), so the next step generates from the first batch pulled ahead. A
        generation from any other batch (a TRL that buffers otherwise) attempts nothing ahead, said once."""
        if not self.args.attempts.ahead or not self._peeked:
            return []
        handed = [problem_of(item)[0] for batch in self._handed for item in batch]
        if handed != [problem_of(item)[0] for item in generation.inputs]:
            if not getattr(self, "_warned_ahead", False):
                logger.warning(
                    "reflection_source ahead: this generation did not come from the step's first batch, so the "
                    "batch pulled ahead may not be the next generation's; nothing is attempted ahead."
                )
                self._warned_ahead = True
            return []
        plan = generation.plan
        per_problem = min(plan.group.rows_of("reflection"), max(1, plan.group.scratch))
        seen = {problem_of(item)[0] for item in generation.inputs}  # this step's own attempts are stored anyway
        wanted = []
        for item in self._peeked[0] if per_problem else []:
            problem_id, problem = problem_of(item)
            if problem_id in seen:  # G rows a problem: asked once
                continue
            seen.add(problem_id)
            if not self.pool.attempts(problem_id, limit=1):
                wanted.append((problem_id, problem, item["prompt"]))
        prompts = self._model_io.tokenize([prompt for _, _, prompt in wanted]) if wanted else []
        return [
            rollout.Ahead(problem_id, problem, ids)
            for (problem_id, problem, _), ids in zip(wanted, prompts)
            for _ in range(per_problem)
        ]

    @contextmanager
    def _judge_model(self):
        """Give the LLM relevance judge the full policy (ZeRO-3 / FSDP gathered) for the duration of a retrieval."""
        if not isinstance(self.retriever.scorer, LLMJudgeScorer):
            yield
            return
        with (
            unwrap_model_for_generation(
                self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
            ) as model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            self.retriever.scorer.model = model
            yield

    def _summarize_pending_apart(self) -> None:
        """Pending summaries in a generation of their own under a forked RNG (so p_t = 0 stays exactly GRPO)."""
        pending, self._pending = self._pending, []
        if self._any_process(bool(pending)):  # every process takes part in the generation and the gather
            start = time.perf_counter()
            with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
                texts = summarize_apart(self._model_io, pending)
            self._timer["summarize"] += time.perf_counter() - start
            self._add_summaries(pending, texts)

    def _add_summaries(self, trials: list[Trial], texts: list[str]) -> None:
        start = time.perf_counter()
        stats = Counter(requested=len(trials))
        entries = [e for e in (entry_from_summary(t, text, stats) for t, text in zip(trials, texts)) if e]
        for batch in gather_object([entries]):  # same entries, same order, on every process
            self.pool.add(batch)
        self._summary_stats.update(stats)
        self._timer["summarize"] += time.perf_counter() - start

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        start = time.perf_counter()
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._timer["reward"] += time.perf_counter() - start
        if self._generation is not None:
            self._generation.rewards_per_func = rewards  # gathered over processes, (N_global, n_funcs)
        return rewards

    def _generate_and_score_completions(self, inputs):
        generation = Generation(self._plan, inputs) if self.model.training else None
        start = time.perf_counter()
        self._generation = generation
        try:
            with self._old_pass_deferred(self.model.training and self._old_logps_from_loss()):
                output = super()._generate_and_score_completions(inputs)
        finally:
            self._generation = None
        if generation is not None and generation.rows is not None:
            self._after_rollouts(output, generation)
            self.last_generation = generation
        self._timer["rollout_total"] += time.perf_counter() - start
        return output

    def _old_logps_from_loss(self) -> bool:
        """``old_logps_from_loss`` applies: vLLM's correction is on and no optimizer step falls between a generation
        and its loss, so π_old is the loss forward's own (detached) value."""
        args = self.args
        every = args.steps_per_generation * self.num_iterations
        on = args.old_logps_from_loss and self.use_vllm and args.vllm_importance_sampling_correction
        return on and args.gradient_accumulation_steps % every == 0

    @contextmanager
    def _old_pass_deferred(self, active: bool):
        """TRL's generation without its old log-probability pass and importance ratio (the loss computes both:
        :func:`lanpo.loss.correct_in_loss`)."""
        if not active:
            yield
            return
        self.vllm_importance_sampling_correction = False
        try:
            yield
        finally:
            self.vllm_importance_sampling_correction = True

    def _after_rollouts(self, output: dict, generation: Generation) -> None:
        rows, rewards_per_func, rank = generation.rows, generation.rewards_per_func, self.accelerator.process_index
        step = self.state.global_step
        g = self.num_generations
        rewards, correct = (
            t.cpu()
            for t in objective.totals(
                generation.local(rewards_per_func, rank), self.reward_weights, self._accuracy_index
            )
        )
        grouping = self.args.grouping
        if not grouping.shared:  # on the whole (gathered) batch, as TRL normalizes
            flags = [f for part in gather_object([[r.has_feedback for r in rows]]) for f in part]
            if grouping.by_kind:
                advantages = objective.separate_advantages(
                    rewards_per_func,
                    self.reward_weights,
                    flags,
                    g,
                    self.args.scale_rewards,
                    self.args.multi_objective_aggregation,
                )
            else:
                advantages = objective.scratch_baseline_advantages(
                    rewards_per_func, self.reward_weights, flags, g, self.args.scale_rewards
                )
            output["advantages"] = generation.local(advantages, rank).to(output["advantages"])
        plan = generation.plan
        loss.with_plan(output, plan, len(rows))
        if plan.scoring is not None:  # the teacher reads the plain rows under their contexts
            start = time.perf_counter()
            unscored = self.teacher.score_rows(output, rows, correct.tolist(), self.references)
            self._step_counts["score_no_context"] += unscored
            self._timer["teacher"] += time.perf_counter() - start
        if plan.has_feedback:  # the loss treats feedback rows (lanpo.loss)
            self._attach_feedback_inputs(output, generation)
            if plan.objective.strips_context:  # hint reliance is measured on the right rows
                output[loss.CORRECT] = correct.to(self.accelerator.device)
            if plan.objective.strips_context and "importance_sampling_ratio" in output:
                has_feedback = torch.tensor([r.has_feedback for r in rows], device=output["advantages"].device)
                self._log_sampling(loss.strip_vllm_correction(output, has_feedback))
        self._log_step_metrics(generation, rewards, correct)
        if self.log_completions:  # TRL's completions table logged feedback rows with their plain prompt
            real_prompts(self._logs["prompt"], [c for part in gather_object([[r.context for r in rows]]) for c in part])
        trials = rollout.choose_trials(
            rows,
            rewards.tolist(),
            correct.tolist(),
            g,
            self.args.summaries_per_group,
            step,
            self.accelerator.process_index,
        )
        # the step's attempts, and what its feedback rows taught about the entries and reflections they were shown
        # (lanpo.pool.worth), gathered from every process and written in one transaction
        taught = StepWorth(step, *worth.observations(rows, rewards.tolist(), correct.tolist(), g))
        for batch, seen in gather_object([(rollout.attempts_to_store(rows, step, generation.ahead), taught)]):
            self.pool.add_attempts(batch, seen)
        self._pending += trials  # summarized at the next rollout (train() flushes the last ones)
        if self.accelerator.is_main_process:
            write_samples(
                self.run_dir / "samples.jsonl", rows, rewards.tolist(), step, self.args.log_samples, g, correct.tolist()
            )
            write_retrievals(self.run_dir / "retrievals.jsonl", rows, step, g)

    def _log_step_metrics(self, generation: Generation, rewards: torch.Tensor, correct: torch.Tensor) -> None:
        g = self.num_generations
        rank = self.accelerator.process_index
        for row in generation.rows:
            limit = self.feedback_limit if row.has_feedback else self.max_completion_length
            row.truncated = len(row.completion_ids) >= limit and not set(row.completion_ids[-1:]) & set(
                self.eos_token_ids
            )
        local = [
            row_record(r, rw, c, f"{rank}:{i // g}")
            for i, (r, rw, c) in enumerate(zip(generation.rows, rewards.tolist(), correct.tolist()))
        ]
        records = [x for part in gather_object([local]) for x in part]
        self._move_on_ladder(records)
        self.transfer.update(self.state.global_step, group_outcomes(records))
        values = step_metrics(
            records,
            generation.plan.feedback_ratio,
            self.pool.stats(),
            self.retriever.stats.as_metrics(),
            self._summary_stats,
            self._step_counts,
        )
        values.update(self.transfer.metrics())
        values.update(worth.shown_metrics(self.pool, generation.rows))  # this process's rows; the pool is every one's
        for key, value in values.items():
            self._metrics["train"][key].append(value)
        self.retriever.stats = RetrievalStats()
        self._summary_stats = Counter()
        self._step_counts = Counter()

    def _move_on_ladder(self, records: list) -> None:
        """Each problem that had hinted rows this step moves on the hint ladder by their accuracy (every process
        sees every group's records, so every process keeps the same ladder)."""
        by_problem: dict[str, list[bool]] = {}
        for x in records:
            if x.level is not None:
                by_problem.setdefault(x.problem_id, []).append(x.correct)
        for pid, right in by_problem.items():
            self.hint_ladder.update(pid, sum(right) / len(right))

    def _attach_feedback_inputs(self, output: dict, generation: Generation) -> None:
        """Mark this step's feedback rows (``lanpo_has_feedback``) for the loss and, when they are trained on the
        plain prompt, add ``lanpo_context_logps``: π(y|x,c) per completion token of feedback rows (NaN elsewhere),
        from the sampler; rows a generate function returned no log-probabilities for get one no-grad forward."""
        rows = generation.rows
        device = self.accelerator.device
        output[loss.HAS_FEEDBACK] = torch.tensor([r.has_feedback for r in rows], device=device)
        if not generation.plan.objective.strips_context:
            return
        missing = [r.has_feedback and r.sampler_logps is None for r in rows]
        any_missing = self._any_process(any(missing))  # every process takes part in the fallback forward
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        width = completion_ids.size(1)
        logps = torch.full(completion_ids.shape, float("nan"), device=device)
        for i, row in enumerate(rows):
            if row.has_feedback and row.sampler_logps:
                values = torch.tensor([float("nan") if v is None else v for v in row.sampler_logps[:width]])
                logps[i, : len(values)] = values.to(device)
        if any_missing:
            ids, mask = left_pad(
                [r.context_ids if r.context_ids is not None else r.plain_ids for r in rows],
                self.processing_class.pad_token_id,
                device,
            )
            with torch.no_grad():
                forward, _, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([ids, completion_ids], 1),
                    torch.cat([mask, completion_mask], 1),
                    width,
                    batch_size=self.args.per_device_train_batch_size,
                )
            logps = torch.where(torch.tensor(missing, device=device)[:, None], forward, logps)
        output[loss.CONTEXT_LOGPS] = logps

    def _log_sampling(self, local: torch.Tensor, append: bool = False) -> None:
        """TRL's ``sampling/*`` values of this step, replaced by those of the correction applied
        (:func:`lanpo.loss.strip_vllm_correction`), over every process; appended where TRL's generation logged none
        (the correction computed in the loss)."""
        metrics = self._metrics["train"]
        values = self.accelerator.gather(local[None])
        finite = ~torch.isnan(values)
        reduce = [torch.min, torch.mean, torch.max, torch.mean, torch.max]
        names = [
            "importance_sampling_ratio/min",
            "importance_sampling_ratio/mean",
            "importance_sampling_ratio/max",
            "sampling_logp_difference/mean",
            "sampling_logp_difference/max",
        ]
        for k, (name, op) in enumerate(zip(names, reduce)):
            column = values[:, k][finite[:, k]]
            value = float(op(column)) if column.numel() else float("nan")
            if append:
                metrics[f"sampling/{name}"].append(value)
            elif metrics.get(f"sampling/{name}"):
                metrics[f"sampling/{name}"][-1] = value

    # -- the loss: TRL's, with LANPO's treatment of feedback rows (lanpo.loss) --------------------------------

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
        capture = loss.capture(inputs)
        plan = loss.plan_of(inputs) if self.model.training else None
        scored = score.capture(inputs, plan.scoring) if plan is not None else None
        if scored is not None and capture is None:  # TRL's loss reads a copy: the buffered batch keeps its advantages
            inputs = {k: v for k, v in inputs.items() if k not in score.KEYS}
        if scored is not None:
            self._score_at_forward = (inputs if capture is None else capture.inputs, scored)
        if self.model.training and self._old_logps_from_loss():  # its generation ran without TRL's old pass
            self._correct_at_forward = inputs if capture is None else capture.inputs  # the dict TRL's loss reads
        if capture is None:
            return super()._compute_loss(model, inputs)  # no feedback planned this step: TRL's loss, untouched
        with self._loss_without_kl(capture):
            policy_loss = super()._compute_loss(model, capture.inputs)
        kl = loss.KLSettings(
            beta=self.beta,
            bias_corrected=self.args.use_bias_correction_kl,
            sequence_level=self.args.importance_sampling_level == "sequence",
        )
        scale = objective.LossScale(
            self.args.loss_type,
            self.current_gradient_accumulation_steps,
            self.max_completion_length,
            float(capture.inputs["num_items_in_batch"]),
            self.accelerator.num_processes,
            self.args.steps_per_generation,
        )
        terms, per_token_kl = loss.feedback_terms(capture, kl, self.args.shaping_gamma, scale)
        if per_token_kl is not None:
            kl = loss.kl_sums(per_token_kl, loss.completion_mask(capture.inputs), capture.feedback)
            self._log_ratios(kl, {"kl": (0, 1), "kl/scratch": (2, 3), "kl/feedback": (4, 5)})  # kl: as TRL logs it
        return policy_loss + terms

    @contextmanager
    def _loss_without_kl(self, capture: loss.LossCapture):
        """TRL's loss over a captured micro-batch with β = 0: LANPO adds every row's KL itself."""
        beta = self.beta
        self._capture = capture
        self.beta = 0.0
        try:
            yield
        finally:
            self._capture = None
            self.beta = beta

    def _compact_heads(self) -> HeadRequest | None:
        """``logprob_head="compact"``: the policy's and the reference model's log-probabilities from the completion
        tokens alone (:mod:`lanpo.engine.logprobs`), patched over TRL's fused head where TRL patched it."""
        request = HeadRequest(entropy_grad=self._entropy_bonus_enabled)
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model
        models = (policy, self.ref_model, self.teacher.weights if self.teacher is not None else None)
        patched = [add_compact_lm_head(m, self.temperature, request) for m in models if m is not None]
        return request if all(patched) else None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        if self._head_request is not None:  # the model's forward never sees compute_entropy (TRL passes it by name)
            self._head_request.entropy = bool(kwargs.get("compute_entropy"))
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._correct_at_forward is not None:  # the loss's forward: π_old and the vLLM correction from it
            self._correct_in_loss(self._correct_at_forward, result[0].detach())
            self._correct_at_forward = None
        if self._score_at_forward is not None:  # the loss's forward: the teacher's signal joins the advantages
            target, scored = self._score_at_forward
            self._score_at_forward = None
            self._score_sums += score.rewrite_advantages(target, result[0].detach(), scored).cpu()
        capture = self._capture
        if capture is not None and capture.logps is None:  # the loss's forward: weights before TRL reads them
            loss.record_forward(capture, result[0])
            if capture.context is not None:
                weights = loss.reweight(capture, self.args.strip_ratio_clip)  # (sum, tokens, clipped)
                strip = {"lanpo/strip_weight_mean": (0, 1), "lanpo/strip_weight_clipped": (2, 1)}
                self._log_ratios(weights, strip)
                self._log_ratios(loss.reliance_sums(capture), {"lanpo/hint_reliance": (0, 1)})
        return result

    def _correct_in_loss(self, inputs: dict, old: torch.Tensor) -> None:
        """``old_logps_from_loss``: TRL's importance ratio from the loss forward's π_old, with the strip family's
        treatment of feedback rows (:func:`lanpo.loss.strip_vllm_correction`) and TRL's ``sampling/*`` metrics."""
        correction = loss.SamplingCorrection(
            self.vllm_importance_sampling_mode,
            self.vllm_importance_sampling_clip_min,
            self.vllm_importance_sampling_clip_max,
        )
        loss.correct_in_loss(inputs, old, correction)
        capture = self._capture
        if capture is not None and capture.plan.objective.strips_context:
            has_feedback = capture.feedback.to(old.device)
        else:
            has_feedback = torch.zeros(old.size(0), dtype=torch.bool, device=old.device)
        self._log_sampling(loss.strip_vllm_correction(inputs, has_feedback), append=True)

    def _log_ratios(self, local: torch.Tensor | None, ratios: dict[str, tuple[int, int]]) -> None:
        """Each ``name: (i, j)`` logged as ``local[i] / local[j]``, both summed over every process (where the sum
        of ``local[j]`` is positive); nothing where ``local`` is None (the micro-batch had nothing to count)."""
        if local is None:
            return
        totals = self.accelerator.reduce(local, reduction="sum")
        for name, (i, j) in ratios.items():
            if totals[j] > 0:
                self._metrics["train"][name].append(float(totals[i] / totals[j]))

    def training_step(self, model, inputs, num_items_in_batch):
        start = time.perf_counter()
        rollout_before = self._timer["rollout_total"]
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._timer["update"] += time.perf_counter() - start - (self._timer["rollout_total"] - rollout_before)
        if self._step % self.current_gradient_accumulation_steps == 0:
            for key, value in time_metrics(self._timer).items():
                self._metrics["train"][key].append(value)
            self._timer = Counter()
            if self.args.scoring is not None:
                totals = self.accelerator.reduce(self._score_sums.to(self.accelerator.device), reduction="sum")
                for key, value in score.score_metrics(totals.cpu()).items():
                    self._metrics["train"][key].append(value)
                self._score_sums = torch.zeros(6)
        return loss

    # -- checkpoints: complete or absent, with the pool and every process's pending summaries ---------------

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
                self.pool.backup(staged / POOL_FILENAME)
                checkpoints.write_json(
                    staged / FEEDBACK_STATE,
                    {"hint_ladder": self.hint_ladder.state_dict(), "transfer": self.transfer.state_dict()},
                )
                if self.teacher is not None:  # an EMA teacher's own weights
                    self.teacher.save(staged)
                if (self.run_dir / "config.yaml").is_file():  # what this checkpoint was trained with
                    shutil.copyfile(self.run_dir / "config.yaml", staged / "config.yaml")
            checkpoints.write_state(
                staged,
                self.accelerator.process_index,
                self.accelerator.num_processes,
                self.state.global_step,
                self._pending,
            )
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                checkpoints.commit(staged, run_dir / name, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        pending = checkpoints.restore(
            Path(checkpoint), self.pool, self.accelerator.process_index, self.accelerator.num_processes, self.run_dir
        )
        golds = {problem_of(row)[0]: str(row["answer"]) for row in self.train_dataset} if pending else {}
        self._pending, dropped = checkpoints.with_golds(pending, golds)
        if dropped:
            logger.warning(
                "%d pending summaries of %s dropped: their problems are not in this run's data, so their lessons "
                "could not be scrubbed of the answer.",
                dropped,
                checkpoint,
            )
        self.retriever.rebuild()
        state = checkpoints.read_json(Path(checkpoint) / FEEDBACK_STATE)  # absent in checkpoints of older runs
        self.hint_ladder.load_state_dict(state.get("hint_ladder", {}))
        if self.teacher is not None:
            self.teacher.load(Path(checkpoint))
        self.transfer.load_state_dict(state.get("transfer", {}))
        logger.info(
            "Resumed the experience pool from %s (%d entries, %d pending summaries)",
            checkpoint,
            len(self.pool),
            len(self._pending),
        )

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        self._summarize_pending_apart()  # the last step's trials
        return result


def check_references(kind: FeedbackKind | None, references: dict) -> None:
    """A ``feedback_source`` whose kind reads worked solutions (reference, self-hint) has some, warned about where
    many lack one (their rows fall back to the plain prompt, counted as no_solution)."""
    if kind is None or not kind.reads_solutions or not references:
        return
    source = kind.name
    with_solution = sum(1 for r in references.values() if r.solution)
    if not with_solution:
        raise ValueError(
            f"feedback_source {source} shows parts of worked solutions, and none of the {len(references)} training "
            "problems has one: use data with solutions (builtin:arith, gsm8k, a file with a solution field; "
            "--solution_field NAME), or feedback_source gold or self."
        )
    if with_solution < len(references):
        logger.warning(
            "feedback_source %s: %d of %d training problems have no worked solution; their feedback rows get the "
            "plain prompt (lanpo/fallback/no_solution).",
            source,
            len(references) - with_solution,
            len(references),
        )


class ThreadSizer(TrainerCallback):
    """Between optimizer steps, re-size torch's CPU threads to the cores other work left idle during the step
    (:func:`lanpo.engine.models.follow_other_work`): a laptop is always shared, and a thread on a core another
    process holds stalls every parallel region. Only for one CPU process without ``OMP_NUM_THREADS``."""

    def __init__(self) -> None:
        self.share: CpuShare | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.share = CpuShare()

    def on_step_end(self, args, state, control, **kwargs):
        if self.share is not None:
            follow_other_work(self.share)
