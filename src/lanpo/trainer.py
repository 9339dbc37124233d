"""``LanpoTrainer``: GRPO whose rollout groups are partly generated with language feedback.

Per group of G rollouts of one problem (``LanpoConfig.group_plan``):

1. **scratch** rollouts get the plain prompt;
2. **abstraction** rollouts get principles and pitfalls of pool entries of *other* problems that pass the
   relevance filter γ (``feedback.build_abstraction_prompt``); no entry passes → plain prompt (counted);
3. **reflection** rollouts get the model's own earlier attempt at the same problem, ungraded
   (``feedback.build_reflection_prompt``): this step's scratch rollouts (``reflection_source="step"``, a
   second generation phase) or attempts stored in earlier steps (``"pool"``); none → plain prompt (counted).

Rewards, advantages and the GRPO + KL loss are TRL's. After the rewards, the summary budget's trials are
distilled by the policy into pool entries: their summary prompts ride along in the next step's first
generation batch (no extra sequential generation), or, on steps without feedback, run apart under a forked
RNG. So with ``feedback_ratio=0`` rollouts, advantages and loss are exactly TRL's GRPO, even while the pool
is being built.

Hooks into TRL: ``rollout_func`` (generation), ``_generate_and_score_completions`` (to see the batch's rows
and post-process advantages), ``_calculate_rewards`` (to read rewards), ``_save_checkpoint`` and
``_load_optimizer_and_scheduler`` (pool state in checkpoints, as TRL does for its own extra state).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models.utils import unwrap_model_for_generation

from .config import LanpoConfig
from .feedback import build_abstraction_prompt, build_reflection_prompt
from .generation import chat_ids
from .pool import POOL_FILENAME, Attempt, ExperiencePool
from .prompts import Messages, clip, solve_messages, with_prefill
from .retrieval import LLMJudgeScorer, RetrievalStats, Retriever, make_scorer
from .rewards import MathVerifier, make_accuracy_reward
from .summarize import Trial, entry_from_summary, summary_prompt

logger = logging.getLogger(__name__)
# rollout_func is "experimental" in TRL 1.x; lanpo pins trl<2 and tests the API it relies on, so the warning
# TRL prints on every trainer would only be noise for lanpo users.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

STATE_FILE = "lanpo_state.json"
FEEDBACK_KINDS = ("reflection", "abstraction")


@dataclass
class Row:
    """What lanpo knows about one rollout row of the current generation batch."""

    problem_id: str
    problem: str
    gold: str
    kind: str = "scratch"  # scratch | reflection | abstraction (what the plan asked for)
    context: Messages | None = None  # the feedback prompt actually used (None: plain prompt)
    completion_ids: list[int] = field(default_factory=list)
    text: str = ""
    plain_ids: list[int] = field(default_factory=list)
    context_ids: list[int] | None = None

    @property
    def has_feedback(self) -> bool:
        return self.context is not None


def _problem_of(row: dict) -> tuple[str, str]:
    """``(problem_id, problem)`` of a dataset row: its own columns, else derived from the prompt."""
    problem = row.get("problem")
    if not problem:
        prompt = row["prompt"]
        problem = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    problem_id = row.get("problem_id") or "h-" + hashlib.sha1(problem.encode()).hexdigest()[:12]
    return str(problem_id), str(problem)


class MetricsFileCallback(TrainerCallback):
    """Append every log line to ``metrics.jsonl`` in the run directory (main process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")


class LanpoTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` with LANPO's language-guided rollouts and experience pool.

    Args:
        model: as for ``GRPOTrainer`` (a hub id, a local path, or a loaded model).
        reward_funcs: defaults to math accuracy on the dataset's ``answer`` column (``lanpo.rewards``).
        args: a :class:`LanpoConfig`.
        train_dataset: rows with ``prompt`` (chat messages) and ``answer``; ``problem_id`` and ``problem``
            are used when present (``lanpo.data.to_prompt_dataset`` makes such rows).
        pool: an :class:`ExperiencePool` to use (default: ``<output_dir>/pool.sqlite`` on the main process).
    """

    _tag_names = ["trl", "grpo", "lanpo"]
    _name = "LANPO"

    def __init__(self, model, reward_funcs=None, args: LanpoConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, callbacks=None, optimizers=(None, None),
                 peft_config=None, pool: ExperiencePool | None = None) -> None:
        if args is None:
            args = LanpoConfig(output_dir="runs/lanpo")
        if not isinstance(args, LanpoConfig):
            raise TypeError(f"LanpoTrainer needs a LanpoConfig, got {type(args).__name__}.")
        if train_dataset is not None and "answer" not in train_dataset.column_names:
            raise ValueError("The training dataset needs an 'answer' column (see lanpo.data.to_prompt_dataset).")
        self.verifier = MathVerifier(args.verify_time_limit, args.answer_extraction)
        if reward_funcs is None:
            reward_funcs = [make_accuracy_reward(self.verifier)]
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks,
                         optimizers=optimizers, peft_config=peft_config, rollout_func=self._rollout)
        self.run_dir = Path(args.output_dir)
        main = self.accelerator.is_main_process
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(args.to_json_string())
            self.add_callback(MetricsFileCallback(self.run_dir / "metrics.jsonl"))
        # Every process keeps the same pool (entries are gathered before insertion); the main process's is
        # the run's file, the others live in memory.
        self.pool = pool or ExperiencePool(self.run_dir / POOL_FILENAME if main else ":memory:",
                                           cap_per_problem=args.pool_cap, attempts_per_problem=args.pool_attempts_cap)
        if args.relevance_scorer == "llm":
            scorer = LLMJudgeScorer(self.model, self.processing_class)  # model swapped for the full one at use
        else:
            scorer = make_scorer(args.relevance_scorer, embedding_model=args.embedding_model)
        self.retriever = Retriever(self.pool, scorer, gamma=args.relevance_threshold, top_k=args.retrieval_top_k,
                                   candidates=args.retrieval_candidates)
        # TRL 1.9 generates with GRPOTrainer's own G per call; later releases take num_generations per call,
        # which is what lets vLLM server mode treat every row's prompt as its own.
        self._per_call_generations = "num_generations" in inspect.signature(self._generate_single_turn).parameters
        if not self._per_call_generations and args.use_vllm and args.vllm_mode == "server" and args.feedback_ratio:
            raise ValueError("LANPO with vLLM server mode needs a TRL whose GRPOTrainer._generate_single_turn takes "
                             "num_generations (trl 1.16 does; 1.9 does not): upgrade TRL, or use vllm_mode=colocate.")
        self._accuracy_index = self.reward_func_names.index("accuracy") if "accuracy" in self.reward_func_names \
            else None
        self._pending: list[Trial] = []  # trials whose summaries ride along in the next generation batch
        self._rows: list[Row] | None = None
        self._batch_inputs: list[dict] | None = None
        self._rewards_per_func: torch.Tensor | None = None
        self._timer: Counter = Counter()
        self._step_counts: Counter = Counter()
        self._summary_stats: Counter = Counter()

    # -----------------------------------------------------------------------------------------------------------
    # Generation

    @contextmanager
    def _full_model(self):
        """The unwrapped policy with full parameters (DeepSpeed ZeRO-3 / FSDP gathered), for local forwards."""
        with (unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation) as model,
              torch.no_grad(), self._dist.summon_full_params(self.model_wrapped, recurse=False)):
            yield model

    def _tokenize(self, prompts: list[Messages]) -> list[list[int]]:
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        return [list(ids) for ids in prompt_ids]

    def _generate_single(self, prompt_ids, images, multimodal_fields, num_generations: int):
        if self._per_call_generations:
            return self._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)
        return self._generate_single_turn(prompt_ids, images, multimodal_fields)

    def _generate_ids(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], list | None]:
        """One completion per row (rows have different prompts: one generation each, also under vLLM)."""
        if not prompt_ids:
            return [], None
        completion_ids, logprobs = self._generate_single(prompt_ids, None, {}, 1)
        return [list(c) for c in completion_ids], logprobs

    def _decode(self, ids: list[int]) -> str:
        return self.processing_class.decode(ids, skip_special_tokens=True)

    def _rollout(self, prompts: list, trainer=None) -> dict[str, Any]:
        """TRL's ``rollout_func``: one completion per row of ``prompts`` (G consecutive rows per problem)."""
        if not self.model.training:  # evaluation during training: plain prompts, like the test condition
            return self._plain_rollout(prompts, self.num_generations_eval or self.num_generations)
        g = self.num_generations
        inputs = self._batch_inputs
        if inputs is None or len(inputs) != len(prompts) or len(prompts) % g:
            raise RuntimeError("LanpoTrainer rollouts must come from its own _generate_and_score_completions.")
        rows = []
        for row in inputs:
            pid, problem = _problem_of(row)
            rows.append(Row(pid, problem, str(row["answer"])))
        n_scratch, n_reflection, n_abstraction = self.args.group_plan(self.state.global_step)
        self._rows = rows
        if n_reflection == 0 and n_abstraction == 0:
            self._summarize_pending_apart()
            start = time.perf_counter()
            output = self._plain_rollout(prompts, g)
            self._timer["generate"] += time.perf_counter() - start
            for row, ids, plain in zip(rows, output["completion_ids"], output["prompt_ids"]):
                row.completion_ids, row.plain_ids, row.text = list(ids), list(plain), self._decode(ids)
            return output
        for start in range(0, len(rows), g):
            for j, row in enumerate(rows[start:start + g]):
                row.kind = "scratch" if j < n_scratch else "reflection" if j < n_scratch + n_reflection \
                    else "abstraction"
        return self._lanpo_rollout(prompts, rows)

    def _plain_rollout(self, prompts: list, num_generations: int) -> dict[str, Any]:
        """Exactly what GRPOTrainer does without a rollout_func."""
        prompt_ids, images, multimodal_fields = self._tokenize_prompts(prompts)
        completion_ids, logprobs = self._generate_single(prompt_ids, images, multimodal_fields, num_generations)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def _lanpo_rollout(self, prompts: list, rows: list[Row]) -> dict[str, Any]:
        g = self.num_generations
        start = time.perf_counter()
        # Relevant abstraction: one retrieval per group that has abstraction rows.
        groups = list(range(0, len(rows), g))
        need = [s for s in groups if any(r.kind == "abstraction" for r in rows[s:s + g])]
        if need:
            with self._judge_model():
                found = self.retriever.retrieve_many([(rows[s].problem_id, rows[s].problem) for s in need])
            for s, hits in zip(need, found):
                result = build_abstraction_prompt(rows[s].problem, [h.entry for h in hits], gold=rows[s].gold,
                                                  problem_id=rows[s].problem_id)
                self._step_counts["lessons_dropped"] += result.dropped_lessons
                for row in rows[s:s + g]:
                    if row.kind == "abstraction":
                        row.context = result.messages
        plain_ids = self._tokenize(prompts)
        for row, ids in zip(rows, plain_ids):
            row.plain_ids = ids
        self._timer["retrieve"] += time.perf_counter() - start

        # Reflection on attempts stored in earlier steps: the context is known now, so those rows join phase A.
        from_step = self.args.reflection_source == "step"
        if not from_step:
            for s in groups:
                self._reflect_on(rows[s:s + g], [])

        # Phase A: scratch and abstraction rows (and pool reflection), plus last step's summary prompts.
        phase_a = [i for i, r in enumerate(rows) if r.kind != "reflection" or not from_step]
        pending, self._pending = self._pending, []
        self._tokenize_contexts([rows[i] for i in phase_a])
        batch_ids = [rows[i].context_ids or rows[i].plain_ids for i in phase_a]
        summary_prompts = [summary_prompt(t) for t in pending]
        summary_ids = [chat_ids(self.processing_class, p) for p in summary_prompts]
        start = time.perf_counter()
        completions, logprobs_a = self._generate_ids(batch_ids + summary_ids)
        elapsed = time.perf_counter() - start
        rollout_tokens = sum(len(c) for c in completions[:len(phase_a)])
        summary_tokens = sum(len(c) for c in completions[len(phase_a):])
        share = summary_tokens / max(1, rollout_tokens + summary_tokens)
        self._timer["generate"] += elapsed * (1 - share)
        self._timer["summarize"] += elapsed * share  # token-share estimate: summaries ride in this batch
        logprobs: dict[int, Any] = {}
        for k, i in enumerate(phase_a):
            rows[i].completion_ids = completions[k]
            rows[i].text = self._decode(completions[k])
            if logprobs_a is not None:
                logprobs[i] = logprobs_a[k]
        if pending:
            start = time.perf_counter()
            self._add_summaries(pending, [with_prefill(p, self._decode(c))
                                          for p, c in zip(summary_prompts, completions[len(phase_a):])])
            self._timer["summarize"] += time.perf_counter() - start

        # Phase B: reward-agnostic reflection on this step's scratch attempts at the same problem.
        phase_b = [i for i, r in enumerate(rows) if r.kind == "reflection" and from_step]
        if phase_b:
            start = time.perf_counter()
            for s in groups:
                group = rows[s:s + g]
                self._reflect_on(group, [r.text for r in group if r.kind == "scratch" and r.text.strip()])
            self._tokenize_contexts([rows[i] for i in phase_b])
            self._timer["retrieve"] += time.perf_counter() - start
            start = time.perf_counter()
            completions, logprobs_b = self._generate_ids([rows[i].context_ids or rows[i].plain_ids for i in phase_b])
            self._timer["generate"] += time.perf_counter() - start
            for k, i in enumerate(phase_b):
                rows[i].completion_ids = completions[k]
                rows[i].text = self._decode(completions[k])
                if logprobs_b is not None:
                    logprobs[i] = logprobs_b[k]

        keep = self.args.context_in_loss == "keep"
        return {
            "prompt_ids": [(r.context_ids if keep and r.context_ids is not None else r.plain_ids) for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [logprobs[i] for i in range(len(rows))] if logprobs else None,
            "lanpo_kind": [r.kind if r.has_feedback else "scratch" for r in rows],
        }

    def _reflect_on(self, group: list[Row], attempts: list[str]) -> None:
        """Give the group's reflection rows their contexts: ``attempts``, else attempts stored in the pool."""
        reflecting = [r for r in group if r.kind == "reflection"]
        if not reflecting:
            return
        if not attempts:
            attempts = [a.text for a in self.pool.attempts(group[0].problem_id) if a.text.strip()]
        for j, row in enumerate(reflecting):
            if attempts:
                row.context = build_reflection_prompt(row.problem, [attempts[j % len(attempts)]], gold=row.gold)

    def _tokenize_contexts(self, rows: list[Row]) -> None:
        with_context = [r for r in rows if r.context is not None]
        for row, ids in zip(with_context, self._tokenize([r.context for r in with_context]) if with_context else []):
            row.context_ids = ids

    @contextmanager
    def _judge_model(self):
        """Give the LLM relevance judge the full policy for the duration of a retrieval."""
        scorer = self.retriever.scorer
        if not isinstance(scorer, LLMJudgeScorer):
            yield
            return
        with self._full_model() as model:
            scorer.model = model
            yield

    # -----------------------------------------------------------------------------------------------------------
    # Scoring and post-processing

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards  # gathered over processes, (N_global, n_funcs)
        return rewards

    def _generate_and_score_completions(self, inputs):
        self._batch_inputs = inputs
        self._rows = None
        start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        if self.model.training and self._rows is not None:
            self._after_rollouts(output)
        self._timer["rollout_total"] += time.perf_counter() - start
        return output

    def _local_rewards(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This process's rows: total reward (weighted sum, as TRL computes it) and correctness."""
        n = len(self._rows)
        rpf = self._rewards_per_func
        local = rpf[self.accelerator.process_index * n:(self.accelerator.process_index + 1) * n]
        total = (local * self.reward_weights.to(local.device).unsqueeze(0)).nansum(dim=1)
        if self._accuracy_index is not None:
            correct = torch.nan_to_num(local[:, self._accuracy_index], nan=0.0) > 0.5
        else:
            correct = total > 0
        return total.cpu(), correct.cpu()

    def _after_rollouts(self, output: dict) -> None:
        rows = self._rows
        rewards, correct = self._local_rewards()
        if self.args.advantage_grouping == "separate":
            output["advantages"] = self._separate_advantages(rewards, output["advantages"])
        if self.args.context_in_loss == "strip" and any(r.has_feedback for r in rows):
            output["advantages"] = self._strip_weights(output)
        self._log_step_metrics(rewards, correct)
        trials = self._choose_trials(rewards, correct)
        attempts = [Attempt(r.problem_id, r.problem, clip(r.text), step=self.state.global_step)
                    for r in rows if r.kind == "scratch" and not r.has_feedback and r.text.strip()]
        for batch in gather_object([attempts]):
            self.pool.add_attempts(batch)
        # Summarized at the next rollout: riding along in its first generation batch on a LANPO step, or in a
        # generation of their own under a forked RNG on a plain (p_t = 0) step; train() flushes the last ones.
        self._pending = trials
        self._write_samples(rewards)

    def _separate_advantages(self, rewards: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
        """Normalize feedback and scratch rollouts of each group apart (``advantage_grouping="separate"``)."""
        g = self.num_generations
        out = torch.zeros_like(advantages)
        scale = self.args.scale_rewards
        batch_std = rewards.std() if rewards.numel() > 1 else torch.tensor(0.0)
        for s in range(0, len(self._rows), g):
            for with_feedback in (False, True):
                idx = [s + j for j, r in enumerate(self._rows[s:s + g]) if r.has_feedback == with_feedback]
                if len(idx) < 2:
                    continue  # a single rollout has no baseline: advantage 0
                sub = rewards[idx]
                adv = sub - sub.mean()
                if scale == "group":
                    adv = adv / (sub.std() + 1e-4)
                elif scale == "batch":
                    adv = adv / (batch_std + 1e-4)
                out[idx] = adv.to(out.dtype).to(out.device)
        return out

    def _strip_weights(self, output: dict) -> torch.Tensor:
        """Per-token importance weights π(y|x)/π(y|x,c), truncated, folded into the advantages (strip mode).

        The loss sees the plain prompt x; the rollout was sampled under x plus the feedback c. Scaling a
        token's advantage by a positive weight scales its clipped-surrogate term by the same weight.
        """
        rows = self._rows
        device = self.accelerator.device
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        logits_to_keep = completion_ids.size(1)
        pad = self.processing_class.pad_token_id

        def forward(prompt_lists: list[list[int]]) -> torch.Tensor:
            width = max(len(p) for p in prompt_lists)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_lists], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_lists], device=device)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, torch.cat([ids, completion_ids], 1), torch.cat([mask, completion_mask], 1),
                    logits_to_keep, batch_size=self.args.per_device_train_batch_size)
            return logps

        # Every process runs the same forwards (collective-safe under FSDP / ZeRO-3): all rows, with rows
        # without feedback "conditioned" on their plain prompt (weight exactly 1).
        with_context = forward([r.context_ids if r.context_ids is not None else r.plain_ids for r in rows])
        if output.get("sampling_per_token_logps") is not None:  # vLLM: it sampled under the context
            with_context = torch.where(torch.tensor([r.has_feedback for r in rows], device=device)[:, None],
                                       output["sampling_per_token_logps"], with_context)
            if "importance_sampling_ratio" in output:  # TRL's own vLLM correction would mask these rows
                ratio = output["importance_sampling_ratio"]
                has = torch.tensor([r.has_feedback for r in rows], device=device)[:, None]
                output["importance_sampling_ratio"] = torch.where(has, torch.ones_like(ratio), ratio)
        plain = output.get("old_per_token_logps")
        if plain is None:
            plain = forward([r.plain_ids for r in rows])
        weights = torch.exp((plain - with_context).clamp(max=20)).clamp(max=self.args.strip_ratio_clip)
        weights = weights * completion_mask + (1 - completion_mask)
        self._step_counts["strip_weight_sum"] += float((weights * completion_mask).sum())
        self._step_counts["strip_weight_tokens"] += float(completion_mask.sum())
        advantages = output["advantages"]
        return advantages.unsqueeze(1) * weights if advantages.dim() == 1 else advantages * weights

    def _choose_trials(self, rewards: torch.Tensor, correct: torch.Tensor) -> list[Trial]:
        """Per group, up to ``summaries_per_group`` trials: alternate right and wrong ones when both exist."""
        budget = self.args.summaries_per_group
        if budget == 0:
            return []
        g = self.num_generations
        trials = []
        for s in range(0, len(self._rows), g):
            idx = [i for i in range(s, s + g) if self._rows[i].text.strip()]
            right = [i for i in idx if correct[i]]
            wrong = [i for i in idx if not correct[i]]
            order = [x for pair in zip(right, wrong) for x in pair] + right[len(wrong):] + wrong[len(right):]
            for i in order[:budget]:
                r = self._rows[i]
                trials.append(Trial(r.problem_id, r.problem, r.text, bool(correct[i]), gold=r.gold,
                                    reward=float(rewards[i]), step=self.state.global_step,
                                    rollout_id=f"{self.state.global_step}:{self.accelerator.process_index}:{i}"))
        return trials

    def _summarize_pending_apart(self) -> None:
        """Summarize pending trials in a generation of their own, under a forked RNG.

        Used on steps without feedback, so that a ``feedback_ratio=0`` run stays exactly GRPO while it
        builds its pool, and at the end of training.
        """
        pending, self._pending = self._pending, []
        if not pending:
            return
        start = time.perf_counter()
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        prompts = [summary_prompt(t) for t in pending]
        with torch.random.fork_rng(devices=devices):
            completions, _ = self._generate_ids([chat_ids(self.processing_class, p) for p in prompts])
        self._add_summaries(pending, [with_prefill(p, self._decode(c)) for p, c in zip(prompts, completions)])
        self._timer["summarize"] += time.perf_counter() - start

    def _add_summaries(self, trials: list[Trial], texts: list[str]) -> None:
        stats = Counter()
        entries = [entry_from_summary(t, text, stats) for t, text in zip(trials, texts)]
        stats["requested"] += len(trials)
        entries = [e for e in entries if e is not None]
        for batch in gather_object([entries]):  # same entries, same order, on every process
            self.pool.add(batch)
        for key, value in stats.items():
            self._summary_stats[key] += value

    # -----------------------------------------------------------------------------------------------------------
    # Metrics, samples, timing

    def _log_step_metrics(self, rewards: torch.Tensor, correct: torch.Tensor) -> None:
        rows = self._rows
        local = [(r.kind, r.has_feedback, float(rw), bool(c),
                  len(r.context_ids) - len(r.plain_ids) if r.context_ids is not None else 0)
                 for r, rw, c in zip(rows, rewards, correct)]
        everything = [x for part in gather_object([local]) for x in part]
        metrics = self._metrics["train"]
        planned = [x for x in everything if x[0] in FEEDBACK_KINDS]
        with_feedback = [x for x in everything if x[1]]
        metrics["lanpo/feedback_ratio"].append(self.args.feedback_ratio_at(self.state.global_step))
        metrics["lanpo/feedback_share"].append(len(with_feedback) / len(everything))
        metrics["lanpo/fallback_share"].append(
            sum(not x[1] for x in planned) / len(planned) if planned else 0.0)
        if with_feedback:
            metrics["lanpo/feedback_tokens_per_prompt"].append(sum(x[4] for x in with_feedback) / len(with_feedback))
        groups = {"feedback": with_feedback, "scratch": [x for x in everything if not x[1]],
                  "reflection": [x for x in with_feedback if x[0] == "reflection"],
                  "abstraction": [x for x in with_feedback if x[0] == "abstraction"]}
        for name, part in groups.items():
            if part:
                metrics[f"reward/{name}/mean"].append(sum(x[2] for x in part) / len(part))
                metrics[f"accuracy/{name}/mean"].append(sum(x[3] for x in part) / len(part))
        stats = self.pool.stats()
        metrics["lanpo/pool_size"].append(float(stats["entries"]))
        metrics["lanpo/pool_problems"].append(float(stats["problems"]))
        for key, value in self.retriever.stats.as_metrics().items():
            metrics[key].append(value)
        self.retriever.stats = RetrievalStats()  # per step
        s = self._summary_stats
        if s["requested"]:
            metrics["summaries/requested"].append(float(s["requested"]))
            metrics["summaries/parse_failures"].append(float(s["parse_failed"]))
            metrics["summaries/parse_rate"].append((s["requested"] - s["parse_failed"]) / s["requested"])
            metrics["summaries/added"].append(float(s["parsed"]))
        self._summary_stats = Counter()
        if self._step_counts["strip_weight_tokens"]:
            metrics["lanpo/strip_weight_mean"].append(
                self._step_counts["strip_weight_sum"] / self._step_counts["strip_weight_tokens"])
        metrics["lanpo/lessons_dropped"].append(float(self._step_counts["lessons_dropped"]))
        self._step_counts = Counter()

    def training_step(self, model, inputs, num_items_in_batch):
        start, rollout_before = time.perf_counter(), self._timer["rollout_total"]
        loss = super().training_step(model, inputs, num_items_in_batch)
        rollout = self._timer["rollout_total"] - rollout_before
        self._timer["update"] += time.perf_counter() - start - rollout
        if self._step % self.current_gradient_accumulation_steps == 0:
            t = self._timer
            other = t["rollout_total"] - t["generate"] - t["summarize"] - t["retrieve"]
            for key in ("generate", "summarize", "retrieve", "update"):
                self._metrics["train"][f"time/{key}"].append(t[key])
            self._metrics["train"]["time/score"].append(max(0.0, other))
            self._timer = Counter()
        return loss

    def _write_samples(self, rewards: torch.Tensor) -> None:
        if not self.accelerator.is_main_process or self.args.log_samples <= 0:
            return
        g = self.num_generations
        # one row of each kind first, then the rest, so feedback prompts are always represented
        order = sorted(range(len(self._rows)), key=lambda i: (i % g != 0 and not self._rows[i].has_feedback, i))
        with (self.run_dir / "samples.jsonl").open("a") as handle:
            for i in order[:self.args.log_samples]:
                r = self._rows[i]
                handle.write(json.dumps({
                    "step": self.state.global_step, "problem_id": r.problem_id, "kind": r.kind,
                    "feedback": r.has_feedback, "prompt": (r.context or solve_messages(r.problem))[-1]["content"],
                    "completion": r.text, "reward": float(rewards[i]), "gold": r.gold,
                }, ensure_ascii=False) + "\n")

    # -----------------------------------------------------------------------------------------------------------
    # Checkpoints: the pool and pending summaries travel with every checkpoint

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.accelerator.is_main_process:
            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self.pool.backup(folder / POOL_FILENAME)
            state = {"pending": [asdict(t) for t in self._pending], "step": self.state.global_step}
            (folder / STATE_FILE).write_text(json.dumps(state))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        folder = Path(checkpoint)
        if not (folder / POOL_FILENAME).is_file():
            raise FileNotFoundError(f"{checkpoint} has no {POOL_FILENAME}: it was not written by LanpoTrainer, "
                                    "so the experience pool cannot be resumed.")
        self.pool.restore_from(folder / POOL_FILENAME)
        self.retriever.rebuild()
        state = json.loads((folder / STATE_FILE).read_text()) if (folder / STATE_FILE).is_file() else {}
        self._pending = [Trial(**t) for t in state.get("pending", [])]
        logger.info("Resumed the experience pool from %s (%d entries, %d pending summaries)", checkpoint,
                    len(self.pool), len(self._pending))

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        self._summarize_pending_apart()  # the last step's trials
        return result
