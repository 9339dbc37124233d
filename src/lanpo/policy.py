"""The policy under training, as lanpo's helpers reach it (the teacher, a step's bookkeeping, the pool writer).

The trainer builds one :class:`Policy`: the objects TRL's trainer holds in public attributes (the model, its frozen
reference, the accelerator, the tokenizer), read through ``host`` when asked (a distributed launch may wrap them
after the trainer is built), and TRL's private operations as plain callables the trainer binds (generation for
rollouts and summaries, per-token log-probabilities of a batch). No helper takes the trainer itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lanpo.engine.generation import chat_ids, length_limit
from lanpo.prompts import Messages, with_prefill
from lanpo.rollout import RolloutModel, Row
from lanpo.run.meter import StepMeter

Generate = Callable[[list[list[int]]], tuple[list[list[int]], list | None]]


def rollout_model(
    host, generate: Generate, tokenize: Callable, score: Callable[[list[Row]], list[bool]], meter: StepMeter
) -> RolloutModel:
    """The policy as the rollout calls it: ``generate`` (TRL's engine, late-bound: tests and subclasses swap it) at
    each length the run asks for (rollouts, summaries, feedback rows, or each row to its own limit in one call), each
    call counted as a round (:class:`StepMeter`). ``host`` is the trainer, read for its public settings (its
    tokenizer, its length limits: :func:`lanpo.engine.generation.length_limit`)."""
    args, counted, tokenizer = host.args, meter.counted, host.processing_class
    feedback_limit = args.feedback_max_completion_length or host.max_completion_length
    apart = feedback_limit != host.max_completion_length

    def limited(prompt_ids: list[list[int]], limits: list[int]):
        """One call, each row cut at its own limit (the first tokens of a longer sample are a sample at that
        limit): feedback rows with a limit of their own in the same call as the rest (``generation_rounds one``)."""
        with length_limit(host, max(limits, default=host.max_completion_length), keep_floor=True):
            completions, logprobs = generate(prompt_ids)
        completions = [c[:limit] for c, limit in zip(completions, limits)]
        if logprobs is not None:
            logprobs = [lp[:limit] if lp is not None else None for lp, limit in zip(logprobs, limits)]
        return completions, logprobs

    return RolloutModel(
        tokenize=tokenize,
        tokenize_summary=lambda messages: chat_ids(tokenizer, messages),
        generate_ids=counted(generate),
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        summary_ids=counted(length_limit(host, args.summary_max_length)(lambda ids: generate(ids)[0])),
        summary_max_length=args.summary_max_length,
        max_new_tokens=host.max_completion_length,
        stop_ids=frozenset(host.eos_token_ids),
        feedback_ids=counted(length_limit(host, feedback_limit, keep_floor=True)(generate)) if apart else None,
        feedback_max_new_tokens=feedback_limit if apart else None,
        limited_ids=counted(limited) if apart else None,
        score=score,
        collective=host.accelerator.num_processes > 1,
    )


@dataclass
class Policy:
    host: Any  # the trainer: only its public attributes are read (model, ref_model, accelerator, processing_class)
    rollout: RolloutModel  # generation, tokenization and decoding, as the rollout uses them
    # TRL's per-token log-probabilities: (model, input ids, attention mask, logits_to_keep, batch_size) -> (N, T)
    logps: Callable[..., torch.Tensor]

    @property
    def model(self):
        return self.host.model

    @property
    def ref_model(self):
        return self.host.ref_model

    @property
    def accelerator(self):
        return self.host.accelerator

    @property
    def tokenizer(self):
        return self.host.processing_class

    def decode(self, ids: list[int]) -> str:
        return self.rollout.decode(ids)

    def add_callback(self, callback) -> None:
        self.host.add_callback(callback)

    def write(self, prompts: list[Messages], max_new_tokens: int) -> list[str]:
        """The policy's replies to ``prompts`` (each a prefilled reply, continued), at most ``max_new_tokens`` each,
        in a call of their own (self-hints). Every process calls it (the generation pads to the widest process)."""
        with length_limit(self.host, max_new_tokens):
            completions, _ = self.rollout.generate_ids([chat_ids(self.tokenizer, m) for m in prompts])
        return [with_prefill(m, self.decode(c)) for m, c in zip(prompts, completions)]
