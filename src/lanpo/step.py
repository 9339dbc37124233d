"""One generation batch from its rollout to its records: what the trainer's hooks hand to each other, and what a
batch leaves behind once TRL has scored it.

:class:`Generation` is created where a batch's generation starts (TRL's ``_generate_and_score_completions``), filled
by the rollout (``rows``, ``ahead``) and the reward hook (``rewards_per_func``), and handed to :func:`finish`, which
regroups the advantages where ``advantage_grouping`` asks, marks the feedback rows for the loss (with π(y|x,c) where
they are trained on the plain prompt), has the teacher score the plain rows (scoring route), logs the step's lanpo
metrics, chooses the trials to summarize, stores the step's attempts and worth records, and appends the samples and
retrievals logs. The run's collaborators reach it through one :class:`RunParts`, built once by the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from lanpo import loss, objective, rollout
from lanpo.data.loaders import problem_of, with_answer_column
from lanpo.engine.generation import left_pad
from lanpo.feedback.execution import check_examples
from lanpo.feedback.privileged import HintLadder, Reference, check_references, take_references
from lanpo.plan import StepPlan
from lanpo.pool import worth
from lanpo.pool.retrieval import RetrievalStats, Retriever
from lanpo.pool.store import ExperiencePool, StepWorth
from lanpo.run.ahead import NextBatches, attempts_per_problem
from lanpo.run.files import write_retrievals, write_samples
from lanpo.run.meter import StepMeter
from lanpo.run.metrics import Transfer, group_outcomes, row_record, step_metrics
from lanpo.run.pool_writer import PoolWriter
from lanpo.tap import TrainLog


@dataclass
class Generation:
    """One generation batch on its way through TRL's hooks (see the module docstring); ``last_generation`` on the
    trainer keeps the last one for inspection."""

    plan: StepPlan
    inputs: list[dict]  # this process's rows of the batch, as TRL passes them (G consecutive rows a problem)
    rows: list[rollout.Row] | None = None
    rewards_per_func: torch.Tensor | None = None  # gathered over every process, (N_global, n_funcs)
    ahead: list[rollout.Ahead] = field(default_factory=list)  # attempts at the next step's problems, to store

    def local(self, tensor: torch.Tensor, process_index: int) -> torch.Tensor:
        """This process's rows of a tensor gathered over every process (TRL gathers in process order)."""
        n = len(self.inputs)
        return tensor[process_index * n : (process_index + 1) * n]


@dataclass
class RunParts:
    """What :func:`finish` works with: the run's settings and collaborators, built once by the trainer."""

    args: Any  # the run's LanpoConfig
    device: torch.device
    process_index: int
    processes: int
    is_main: bool
    gather: Callable[[list], list]  # accelerate's gather_object
    pool: ExperiencePool
    retriever: Retriever
    writer: PoolWriter
    meter: StepMeter
    log: TrainLog
    hint_ladder: HintLadder
    transfer: Transfer
    references: Mapping[str, Reference]
    reward_weights: torch.Tensor
    accuracy_index: int | None
    num_generations: int
    max_completion_length: int
    feedback_limit: int
    eos_token_ids: list[int]
    pad_token_id: int
    run_dir: Path
    # TRL's per-token log-probabilities of a batch (model, ids, mask, logits_to_keep, batch_size) under no grad
    forward_logps: Callable[..., torch.Tensor]
    model: rollout.RolloutModel  # the policy as the rollout reaches it
    sources: Mapping[str, Any]  # the feedback sources by row kind (lanpo.feedback.registry)
    batches: NextBatches  # the next step's batches, pulled early where attempts are made ahead
    use_vllm: bool  # vLLM samples (its log-probabilities are the rows'); else transformers' generation
    teacher: Any = None  # lanpo.teacher.Teacher of the scoring route (None: nothing is scored)

    def any_process(self, flag: bool) -> bool:
        return any(self.gather([flag])) if self.processes > 1 else flag

    @classmethod
    def of(cls, trainer, sources: Mapping[str, Any]) -> RunParts:
        """A trainer's parts, from its public attributes (the trainer builds them before this)."""
        args, accelerator, names = trainer.args, trainer.accelerator, trainer.reward_func_names
        return cls(
            args=args,
            device=accelerator.device,
            process_index=accelerator.process_index,
            processes=accelerator.num_processes,
            is_main=accelerator.is_main_process,
            gather=gather_object,
            pool=trainer.pool,
            retriever=trainer.retriever,
            writer=trainer.writer,
            meter=trainer.meter,
            log=trainer.train_log,
            hint_ladder=trainer.hint_ladder,
            transfer=Transfer(),
            references=trainer.references,
            reward_weights=trainer.reward_weights,
            accuracy_index=names.index("accuracy") if "accuracy" in names else None,
            num_generations=trainer.num_generations,
            max_completion_length=trainer.max_completion_length,
            feedback_limit=args.feedback_max_completion_length or trainer.max_completion_length,
            eos_token_ids=list(trainer.eos_token_ids),
            pad_token_id=trainer.processing_class.pad_token_id,
            run_dir=trainer.run_dir,
            forward_logps=lambda *a, **k: trainer.policy.logps(trainer.model, *a, **k),
            model=trainer.policy.rollout,
            sources=sources,
            batches=NextBatches(),
            use_vllm=trainer.use_vllm,
            teacher=trainer.teacher,
        )


def training_data(args, dataset) -> tuple[Any, dict[str, Reference]]:
    """The training dataset as TRL gets it (an ``answer`` and a ``gold_kind`` column; worked solutions taken out:
    only privileged feedback sources read them, never TRL's rewards) and every problem's :class:`Reference`;
    refused here, before the model loads, where the feedback source has nothing to read (no worked solution, no
    public example to run)."""
    dataset = with_answer_column(dataset) if dataset is not None else None
    dataset, references = take_references(dataset)
    check_references(args.feedback_kind, references)
    if args.runs_public_examples and dataset is not None:
        check_examples([problem_of(row)[1] for row in dataset])
    return dataset, references


def generate(parts: RunParts, generation: Generation, prompts: list, plain: Callable[[], dict]) -> dict[str, Any]:
    """The batch's rollout: one completion per row (G consecutive rows a problem), as TRL's ``rollout_func`` returns
    it. ``plain`` is TRL's own generation of the plain prompts (a step with no feedback row and no summary riding
    generates exactly GRPO's rows)."""
    plan, inputs, g, model, writer, meter = (
        generation.plan,
        generation.inputs,
        parts.num_generations,
        parts.model,
        parts.writer,
        parts.meter,
    )
    ride = plan.one_round and parts.any_process(bool(writer.pending))  # summaries ride with the plain rows
    if not plan.has_feedback and not ride:  # no feedback this step: exactly GRPO's generation
        generation.rows = rollout.make_rows(inputs, g)
        writer.summarize_apart(model)  # (phased) the summaries in a call of their own, under a forked RNG
        with meter.timed("generate"):
            output = plain()
        meter.add_round(output["completion_ids"])
        for row, ids, plain_ids in zip(generation.rows, output["completion_ids"], output["prompt_ids"]):
            row.completion_ids = list(ids)
            row.plain_ids = list(plain_ids)
            row.text = model.decode(ids)
        return output
    generation.rows = rollout.make_rows(inputs, g, plan.group if plan.has_feedback else None)
    per_problem = attempts_per_problem(plan, parts.args.attempts)
    context = rollout.StepContext(
        plan,
        parts.sources,
        pending=writer.ride(),
        timer=meter.seconds,
        counts=meter.counts,
        ahead=parts.batches.attempts(inputs, per_problem, parts.pool, model.tokenize) if per_problem else [],
        earlier=lambda problem_id: [a.text for a in parts.pool.attempts(problem_id)],
    )
    output, finished, carried = rollout.rollout_of(plan)(generation.rows, model.tokenize(prompts), g, model, context)
    generation.ahead = context.ahead
    meter.counts["ahead_attempts"] += len(context.ahead)
    writer.carry(carried)  # summaries that go on in the next call
    writer.add([t for t, _ in finished], [text for _, text in finished])  # every process: it gathers
    if not parts.use_vllm:  # TRL's transformers path has no sampler log-probabilities: rows keep them
        output["logprobs"] = None
    return output


def finish(parts: RunParts, output: dict, generation: Generation, step: int) -> None:
    """Everything a generation batch leaves behind once TRL has scored it (see the module docstring)."""
    args, rows, g, rank = parts.args, generation.rows, parts.num_generations, parts.process_index
    rewards_per_func = generation.rewards_per_func
    rewards, correct = (
        t.cpu()
        for t in objective.totals(generation.local(rewards_per_func, rank), parts.reward_weights, parts.accuracy_index)
    )
    grouping = args.grouping
    if not grouping.shared:  # on the whole (gathered) batch, as TRL normalizes
        flags = [f for part in parts.gather([[r.has_feedback for r in rows]]) for f in part]
        if grouping.by_kind:
            advantages = objective.separate_advantages(
                rewards_per_func, parts.reward_weights, flags, g, args.scale_rewards, args.multi_objective_aggregation
            )
        else:
            advantages = objective.scratch_baseline_advantages(
                rewards_per_func, parts.reward_weights, flags, g, args.scale_rewards
            )
        output["advantages"] = generation.local(advantages, rank).to(output["advantages"])
    plan = generation.plan
    loss.with_plan(output, plan, len(rows))
    if plan.scoring is not None:  # the teacher reads the plain rows under their contexts
        with parts.meter.timed("teacher"):
            unscored = parts.teacher.score_rows(output, rows, correct.tolist(), parts.references)
        parts.meter.counts["score_no_context"] += unscored
    if plan.has_feedback:  # the loss treats feedback rows (lanpo.loss)
        attach_feedback_inputs(parts, output, generation)
        if plan.objective.strips_context:  # hint reliance is measured on the right rows
            output[loss.CORRECT] = correct.to(parts.device)
        if plan.objective.strips_context and "importance_sampling_ratio" in output:
            has_feedback = torch.tensor([r.has_feedback for r in rows], device=output["advantages"].device)
            parts.log.sampling(loss.strip_vllm_correction(output, has_feedback))
    log_step_metrics(parts, generation, rewards, correct, step)
    trials = rollout.choose_trials(
        rows, rewards.tolist(), correct.tolist(), g, args.summaries_per_group, step, parts.process_index
    )
    # the step's attempts, and what its feedback rows taught about the entries and reflections they were shown
    # (lanpo.pool.worth), gathered from every process and written in one transaction
    taught = StepWorth(step, *worth.observations(rows, rewards.tolist(), correct.tolist(), g))
    parts.writer.store_step(rollout.attempts_to_store(rows, step, generation.ahead), taught)
    parts.writer.queue(trials)  # summarized in a later call (train() flushes the last ones)
    if parts.is_main:
        write_samples(
            parts.run_dir / "samples.jsonl", rows, rewards.tolist(), step, args.log_samples, g, correct.tolist()
        )
        write_retrievals(parts.run_dir / "retrievals.jsonl", rows, step, g)


def log_step_metrics(
    parts: RunParts, generation: Generation, rewards: torch.Tensor, correct: torch.Tensor, step: int
) -> None:
    """The step's lanpo metrics over every process's rows: feedback by kind, the pool, retrieval, summaries, the
    hint ladder's moves, transfer, the worth of what was shown, the generation rounds and how old the attempts
    shown were (``lanpo/shown_attempt_age``: steps between the model that wrote an attempt and the one shown it)."""
    g, rank = parts.num_generations, parts.process_index
    for row in generation.rows:
        limit = parts.feedback_limit if row.has_feedback else parts.max_completion_length
        row.truncated = len(row.completion_ids) >= limit and not set(row.completion_ids[-1:]) & set(parts.eos_token_ids)
    local = [
        row_record(r, rw, c, f"{rank}:{i // g}")
        for i, (r, rw, c) in enumerate(zip(generation.rows, rewards.tolist(), correct.tolist()))
    ]
    records = [x for part in parts.gather([local]) for x in part]
    move_on_ladder(parts.hint_ladder, records)
    parts.transfer.update(step, group_outcomes(records))
    counts, summaries, rounds = parts.meter.take_generation()
    values = step_metrics(
        records,
        generation.plan.feedback_ratio,
        parts.pool.stats(),
        parts.retriever.stats.as_metrics(),
        summaries,
        counts,
    )
    values.update(parts.transfer.metrics())
    values.update(worth.shown_metrics(parts.pool, generation.rows))  # this process's rows; the pool is every one's
    values.update(rounds)
    ages = [step - r.shown_step for r in generation.rows if r.has_feedback and r.shown_step is not None]
    if ages:
        values["lanpo/shown_attempt_age"] = sum(ages) / len(ages)
    parts.log.add(values)
    parts.retriever.stats = RetrievalStats()


def move_on_ladder(ladder: HintLadder, records: list) -> None:
    """Each problem that had hinted rows this step moves on the hint ladder by their accuracy (every process sees
    every group's records, so every process keeps the same ladder)."""
    by_problem: dict[str, list[bool]] = {}
    for x in records:
        if x.level is not None:
            by_problem.setdefault(x.problem_id, []).append(x.correct)
    for pid, right in by_problem.items():
        ladder.update(pid, sum(right) / len(right))


def attach_feedback_inputs(parts: RunParts, output: dict, generation: Generation) -> None:
    """Mark this step's feedback rows (``lanpo_has_feedback``) for the loss and, when they are trained on the plain
    prompt, add ``lanpo_context_logps``: π(y|x,c) per completion token of feedback rows (NaN elsewhere), from the
    sampler; rows a generate function returned no log-probabilities for get one no-grad forward."""
    rows = generation.rows
    device = parts.device
    output[loss.HAS_FEEDBACK] = torch.tensor([r.has_feedback for r in rows], device=device)
    if not generation.plan.objective.strips_context:
        return
    missing = [r.has_feedback and r.sampler_logps is None for r in rows]
    any_missing = parts.any_process(any(missing))  # every process takes part in the fallback forward
    completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
    width = completion_ids.size(1)
    logps = torch.full(completion_ids.shape, float("nan"), device=device)
    for i, row in enumerate(rows):
        if row.has_feedback and row.sampler_logps:
            values = torch.tensor([float("nan") if v is None else v for v in row.sampler_logps[:width]])
            logps[i, : len(values)] = values.to(device)
    if any_missing:
        ids, mask = left_pad(
            [r.context_ids if r.context_ids is not None else r.plain_ids for r in rows], parts.pad_token_id, device
        )
        with torch.no_grad():
            forward = parts.forward_logps(
                torch.cat([ids, completion_ids], 1),
                torch.cat([mask, completion_mask], 1),
                width,
                batch_size=parts.args.per_device_train_batch_size,
            )
        logps = torch.where(torch.tensor(missing, device=device)[:, None], forward, logps)
    output[loss.CONTEXT_LOGPS] = logps
