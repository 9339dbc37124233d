"""The one hand-off into TRL's loss forward, and the metrics lanpo logs from inside TRL's loss.

TRL's ``_compute_loss`` runs the policy's forward and reads its log-probabilities at once, so what lanpo does with
them (the strip family's weights on feedback rows, π_old and vLLM's correction taken from the loss forward under
``old_logps_from_loss``, the scoring route's teacher signal added to the advantages) has to happen inside that
forward. The trainer's ``_compute_loss`` arms the tap with a :class:`LossForward` for the micro-batch; its
``_get_per_token_logps_and_entropies`` hands the forward's result to :meth:`ForwardTap.on_forward`, which does each
part once and disarms it. Nothing else is parked between hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lanpo import loss, score
from lanpo.run.meter import StepMeter


class TrainLog:
    """Values logged into TRL's own per-step metrics (``metrics``: its ``_metrics["train"]``, which it averages and
    clears at each logging step), reduced over every process first."""

    SAMPLING = (  # TRL's sampling/* names of lanpo.loss.strip_vllm_correction's five values, and their reductions
        ("importance_sampling_ratio/min", torch.min),
        ("importance_sampling_ratio/mean", torch.mean),
        ("importance_sampling_ratio/max", torch.max),
        ("sampling_logp_difference/mean", torch.mean),
        ("sampling_logp_difference/max", torch.max),
    )

    def __init__(self, metrics: dict, reduce_sum: Callable, gather: Callable) -> None:
        self.metrics, self.reduce_sum, self.gather = metrics, reduce_sum, gather

    def add(self, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.metrics[key].append(value)

    def ratios(self, local: torch.Tensor | None, ratios: dict[str, tuple[int, int]]) -> None:
        """Each ``name: (i, j)`` logged as ``local[i] / local[j]``, both summed over every process (where the sum of
        ``local[j]`` is positive); nothing where ``local`` is None (the micro-batch had nothing to count)."""
        if local is None:
            return
        totals = self.reduce_sum(local)
        for name, (i, j) in ratios.items():
            if totals[j] > 0:
                self.metrics[name].append(float(totals[i] / totals[j]))

    def sampling(self, local: torch.Tensor, append: bool = False) -> None:
        """TRL's ``sampling/*`` values of this step, replaced by those of the correction applied
        (:func:`lanpo.loss.strip_vllm_correction`), over every process; appended where TRL's generation logged none
        (the correction computed in the loss)."""
        values = self.gather(local[None])
        finite = ~torch.isnan(values)
        for k, (name, op) in enumerate(self.SAMPLING):
            column = values[:, k][finite[:, k]]
            value = float(op(column)) if column.numel() else float("nan")
            if append:
                self.metrics[f"sampling/{name}"].append(value)
            elif self.metrics.get(f"sampling/{name}"):
                self.metrics[f"sampling/{name}"][-1] = value


@dataclass
class LossForward:
    """What the loss forward of one micro-batch must do with its log-probabilities before TRL's loss reads them."""

    capture: loss.LossCapture | None = None  # feedback rows: recorded, weighted (strip family), logged
    correct: dict | None = None  # old_logps_from_loss: the batch TRL's loss reads, its π_old and correction from here
    scored: tuple[dict, score.ScoreCapture] | None = None  # scoring route: the batch whose advantages take the signal


def loss_forward_of(inputs: dict, training: bool, old_from_loss: bool) -> tuple[dict, LossForward]:
    """The batch TRL's loss reads for a micro-batch (lanpo's keys taken out) and what its forward must do: the
    feedback rows' capture (:func:`lanpo.loss.capture`; None on a step without feedback: TRL's loss untouched), the
    vLLM correction from the forward (``old_from_loss``), the scoring route's signal."""
    capture = loss.capture(inputs)
    plan = loss.plan_of(inputs) if training else None
    scored = score.capture(inputs, plan.scoring) if plan is not None else None
    if scored is not None and capture is None:  # TRL's loss reads a copy: the buffered batch keeps its advantages
        inputs = {k: v for k, v in inputs.items() if k not in score.KEYS}
    read = inputs if capture is None else capture.inputs  # the dict TRL's loss reads
    forward = LossForward(capture, read if old_from_loss else None, (read, scored) if scored is not None else None)
    return read, forward


class ForwardTap:
    """The trainer's one slot into TRL's loss forward (see the module docstring)."""

    def __init__(
        self,
        log: TrainLog,
        meter: StepMeter,
        correction: Callable[[], loss.SamplingCorrection],
        strip_ratio_clip: float | None,
    ) -> None:
        self.log, self.meter, self.correction, self.strip_ratio_clip = log, meter, correction, strip_ratio_clip
        self.armed: LossForward | None = None

    @contextmanager
    def loss_forward(self, forward: LossForward) -> Iterator[None]:
        """Armed for the ``with`` block: TRL's loss of one micro-batch."""
        self.armed = forward
        try:
            yield
        finally:
            self.armed = None

    @property
    def capture(self) -> loss.LossCapture | None:
        """The feedback rows of the micro-batch whose loss is under way (None: none, or no loss under way)."""
        return self.armed.capture if self.armed is not None else None

    def on_forward(self, logps: torch.Tensor) -> None:
        """A forward's per-token log-probabilities: the loss's own (the first forward while armed) gets each part
        done once."""
        forward = self.armed
        if forward is None:
            return
        if forward.correct is not None:  # π_old and the vLLM correction from the loss forward
            self.correct_in_loss(forward.correct, logps.detach())
            forward.correct = None
        if forward.scored is not None:  # the teacher's signal joins the advantages
            target, scored = forward.scored
            forward.scored = None
            self.meter.score_sums += score.rewrite_advantages(target, logps.detach(), scored).cpu()
        capture = forward.capture
        if capture is not None and capture.logps is None:  # weights before TRL reads them
            loss.record_forward(capture, logps)
            if capture.context is not None:
                weights = loss.reweight(capture, self.strip_ratio_clip)  # (sum, tokens, clipped)
                self.log.ratios(weights, {"lanpo/strip_weight_mean": (0, 1), "lanpo/strip_weight_clipped": (2, 1)})
                self.log.ratios(loss.reliance_sums(capture), {"lanpo/hint_reliance": (0, 1)})

    def feedback_terms(self, capture: loss.LossCapture, kl: loss.KLSettings, shaping: float, scale) -> torch.Tensor:
        """LANPO's terms on a captured micro-batch after TRL's loss ran with β = 0 (:func:`lanpo.loss.feedback_terms`),
        with every row's KL logged as TRL logs it and split by kind."""
        terms, per_token_kl = loss.feedback_terms(capture, kl, shaping, scale)
        if per_token_kl is not None:
            sums = loss.kl_sums(per_token_kl, loss.completion_mask(capture.inputs), capture.feedback)
            self.log.ratios(sums, {"kl": (0, 1), "kl/scratch": (2, 3), "kl/feedback": (4, 5)})
        return terms

    def correct_in_loss(self, inputs: dict, old: torch.Tensor) -> None:
        """``old_logps_from_loss``: TRL's importance ratio from the loss forward's π_old, with the strip family's
        treatment of feedback rows (:func:`lanpo.loss.strip_vllm_correction`) and TRL's ``sampling/*`` metrics."""
        loss.correct_in_loss(inputs, old, self.correction())
        capture = self.capture
        if capture is not None and capture.plan.objective.strips_context:
            has_feedback = capture.feedback.to(old.device)
        else:
            has_feedback = torch.zeros(old.size(0), dtype=torch.bool, device=old.device)
        self.log.sampling(loss.strip_vllm_correction(inputs, has_feedback), append=True)
