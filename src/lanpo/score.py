"""The scoring route: the policy given a feedback context only *scores* the plain policy's own rollouts.

Every objective of the generated route trains on tokens sampled *under* the context. Here (``feedback_route score``)
every row of a group is GRPO's plain rollout y ~ π(·|x); a **teacher** (the start model, the live policy or an EMA of
it: ``score_teacher``) reads each chosen row under T(c, x), the prompt with that row's context c, in one no-grad
forward, and the per-token log-ratio becomes a dense term of the advantage (SDPO, OPSD; TRL's
``trl/experimental/sdpo`` computes the same quantity as a loss). Two forms (``score_form``):

* **additive**: Δ_t = clip(log π_T(y_t | c, x, y<t) − log π_old(y_t | x, y<t), ±clip), A_t = Â + λ·m·Δ_t with m the
  scored rows (failed ones by default). On-policy its gradient is λ times the gradient of TRL's
  ``compute_sampled_token_self_distillation_loss`` (``tests/test_score.py`` checks it).
* **contrastive** (RLCSD): e_t = log π_T(y_t | c) − log mean_k π_T(y_t | c̃_k) over wrong contexts c̃_k in the identical
  template (another problem's answer or solution from the batch), so the style any context induces cancels; the
  residual r_t = clip(β·λ·tanh(e_t/τ), ±0.5), kept where |r_t| > δ, is added to Â without flipping Â's sign.

The teacher's log-probabilities are computed when a generation ends (the trainer) and carried on the batch; Δ needs
π_old(y|x), which is the loss forward's own detached value (or TRL's old log-probabilities where it computed them), so
the advantages are rewritten inside the loss's forward (:func:`rewrite_advantages`), before TRL reads them. Contexts
are built here from what a row may be shown: its gold answer (``gold``), the first steps of its worked solution
(``reference``), a right rollout of its own group (``sibling``, which needs no gold), or what its own attempt did on
its problem's public examples (``execution``, code). Nothing here imports TRL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from lanpo.feedback.privileged import Reference, ground_truth, level_share, solution_prefix
from lanpo.plan import Scoring
from lanpo.prompts import Messages, clip, reference_messages, scoring_messages

# Keys the trainer adds to a generation batch for the loss (taken out of the dict TRL's loss reads).
TEACHER_LOGPS = "lanpo_teacher_logps"  # (N, T) log π_T(y_t | c, x) of scored rows, NaN elsewhere
WRONG_LOGPS = "lanpo_wrong_logps"  # (N, K, T) contrastive: under the K wrong contexts, NaN elsewhere
ANSWER_MASK = "lanpo_answer_mask"  # (N, T) bool: the tokens of a row's final answer (the leakage share)
KEYS = (TEACHER_LOGPS, WRONG_LOGPS, ANSWER_MASK)

# RLCSD's defaults (arXiv 2606.11709): temperature τ of the tanh, β, the kept-residual floor δ and its bound.
RLCSD_TAU, RLCSD_BETA, RLCSD_DELTA, RLCSD_BOUND = 0.03, 0.2, 0.02, 0.5


class TeacherContext(NamedTuple):
    """What a scored row is read under: its context, and the wrong ones in the identical template."""

    right: Messages
    wrong: tuple[Messages, ...] = ()


def shown_for(
    source: str, problem: str, reference: Reference | None, sibling: str | None, level: int, report: str | None = None
) -> str | None:
    """The part of a context that carries information (the answer statement, the solution prefix, the sibling's
    solution, the row's own execution report); None where the row has none to show. The rest of a context is the
    template (:func:`context_messages`)."""
    if source == "execution":
        return report
    if source == "gold":
        return ground_truth(reference.answer, reference.gold_kind) if reference is not None else None
    if source == "reference":
        if reference is None or not reference.solution:
            return None
        return solution_prefix(reference.solution, level_share(level), problem)
    if source == "sibling":
        return clip(sibling) if sibling else None
    raise ValueError(f"Scoring has no context source {source!r}.")


def context_messages(source: str, problem: str, shown: str) -> Messages:
    """The teacher's prompt T(c, x): ``shown`` in ``source``'s template after the problem, the solve instruction
    last (so the completion starts where the plain prompt's does: after the assistant's turn begins)."""
    if source == "reference":
        return reference_messages(problem, shown)
    return scoring_messages(source, problem, shown)


@dataclass
class ScoredRow:
    """One row of a generation batch as scoring sees it."""

    problem_id: str
    problem: str
    text: str
    right: bool
    reference: Reference | None  # gold answer and worked solution (None: the trainer has none for it)
    report: str | None = None  # execution: what this row's attempt did on its problem's public examples


def teacher_contexts(rows: Sequence[ScoredRow], g: int, scoring: Scoring) -> list[TeacherContext | None]:
    """Per row, what the teacher reads it under (None: the row is not scored, or has no context to show); under
    ``control``, a wrong context takes the right one's place.

    Scored: rows the verifier did not credit (``rows failed``), or all. A ``sibling`` context is the first right row of
    the same group other than the row itself. Wrong contexts (contrastive) show, in the identical template, what the
    next groups of the batch would show for their problems (skipping any that shows the same thing), and for a
    whole-number gold answer, where the batch has too few, the answer's neighbours: they differ from the right one
    only in the shown part."""
    shown: list[str | None] = []
    for s in range(0, len(rows), g):
        group = rows[s : s + g]
        for j, row in enumerate(group):
            sibling = next((r.text for k, r in enumerate(group) if k != j and r.right), None)
            shown.append(shown_for(scoring.source, row.problem, row.reference, sibling, scoring.level, row.report))
    groups = len(rows) // g
    out: list[TeacherContext | None] = []
    for i, row in enumerate(rows):
        if (scoring.failed_only and row.right) or shown[i] is None:
            out.append(None)
            continue
        wrong: list[Messages] = []
        wanted = scoring.wrong if scoring.contrastive else 1 if scoring.control else 0
        seen = {shown[i]}
        for step in range(1, groups if wanted else 1):
            other = shown[((i // g + step) % groups) * g + i % g]
            if other is not None and other not in seen:
                seen.add(other)
                wrong.append(context_messages(scoring.source, row.problem, other))
            if len(wrong) == wanted:
                break
        if scoring.source == "gold" and row.reference is not None:  # too few others: the answer's neighbours
            for answer in perturbed_answers(row.reference.answer):
                if len(wrong) >= wanted:
                    break
                wrong_gold = Reference(answer, gold_kind=row.reference.gold_kind)
                other = shown_for("gold", row.problem, wrong_gold, None, scoring.level)
                if other not in seen:
                    seen.add(other)
                    wrong.append(context_messages(scoring.source, row.problem, other))
        if wanted and not wrong:  # a batch of one problem, or nothing else to show: no contrast to draw
            out.append(None)
            continue
        right = context_messages(scoring.source, row.problem, shown[i])
        if scoring.control:  # the control reads the row under a wrong context (contrastive: against the right one)
            right, wrong = wrong[0], [right, *wrong[1:]]
        out.append(TeacherContext(right, tuple(wrong) if scoring.contrastive else ()))  # additive reads ``right`` only
    return out


def perturbed_answers(answer: str) -> list[str]:
    """Wrong answers in the form of a whole-number gold: its neighbours (+1, −1, +2, −2, +10, −10); none for any
    other gold (a wrong context then comes from another problem of the batch only)."""
    text = answer.strip().replace(",", "")
    if not text.lstrip("-").isdigit():
        return []
    value = int(text)
    return [str(value + k) for k in (1, -1, 2, -2, 10, -10)]


def answer_span(text: str, answer: str | None) -> tuple[int, int] | None:
    """The characters of ``text`` that state its final ``answer`` (its last occurrence); None without one."""
    if not answer:
        return None
    start = text.rfind(answer)
    return (start, start + len(answer)) if start >= 0 else None


def answer_token_mask(ids: Sequence[int], decode, span: tuple[int, int] | None) -> list[bool]:
    """Which of ``ids`` write the characters ``span`` of their decoded text (by bisection on decoded prefixes:
    about 2·log2(len) decodes a row)."""
    mask = [False] * len(ids)
    if span is None or not ids:
        return mask

    def first_reaching(chars: int) -> int:  # the first k whose prefix ids[:k+1] decodes to more than ``chars``
        lo, hi = 0, len(ids) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(decode(list(ids[: mid + 1]))) > chars:
                hi = mid
            else:
                lo = mid + 1
        return lo

    start, end = first_reaching(span[0]), first_reaching(span[1] - 1)
    for k in range(start, end + 1):
        mask[k] = True
    return mask


# ---------------------------------------------------------------------------------------------------------------
# The advantage


def additive_delta(teacher: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, bound: float) -> torch.Tensor:
    """Δ_t = clip(log π_T − log π_old, ±bound) on ``mask`` (scored rows' completion tokens), 0 elsewhere; no grad."""
    raw = (teacher.float() - old.detach().float()).clamp(-bound, bound)
    return torch.where(mask, raw, torch.zeros_like(raw)).detach()


def contrastive_residual(
    right: torch.Tensor, wrong: torch.Tensor, mask: torch.Tensor, coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLCSD's residual: e_t = log π_T(y_t|c) − log mean_k π_T(y_t|c̃_k) (wrong ``(N, K, T)``, NaN for a missing k),
    r_t = clip(β·λ·tanh(e_t/τ), ±0.5) where |r_t| > δ on ``mask``, else 0. Returns (r, e)."""
    finite = torch.isfinite(wrong)
    k = finite.sum(1).clamp(min=1)
    pooled = torch.logsumexp(torch.where(finite, wrong.float(), -math.inf), dim=1) - torch.log(k.float())
    e = right.float() - pooled
    r = (RLCSD_BETA * coef * torch.tanh(e / RLCSD_TAU)).clamp(-RLCSD_BOUND, RLCSD_BOUND)
    keep = mask & torch.isfinite(e) & (r.abs() > RLCSD_DELTA)
    return torch.where(keep, r, torch.zeros_like(r)).detach(), torch.where(keep, e, torch.zeros_like(e)).detach()


def sign_preserving(advantages: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """(N, T) Â + r, clamped so no token's advantage crosses zero against Â's sign (where Â is 0, r alone)."""
    base = advantages[:, None].expand_as(residual) if advantages.dim() == 1 else advantages
    total = base + residual
    total = torch.where(base > 0, total.clamp(min=0), total)
    return torch.where(base < 0, total.clamp(max=0), total)


class ScoreCapture(NamedTuple):
    """A micro-batch's scoring inputs, taken off the batch before TRL's loss reads it."""

    scoring: Scoring
    teacher: torch.Tensor  # (N, T)
    wrong: torch.Tensor | None  # (N, K, T)
    answer: torch.Tensor | None  # (N, T) bool


def capture(batch: dict[str, Any], scoring: Scoring | None) -> ScoreCapture | None:
    """The micro-batch's scoring inputs where its step scores rows; None where nothing is scored."""
    if scoring is None or batch.get(TEACHER_LOGPS) is None:
        return None
    return ScoreCapture(scoring, batch[TEACHER_LOGPS], batch.get(WRONG_LOGPS), batch.get(ANSWER_MASK))


def rewrite_advantages(inputs: dict, logps: torch.Tensor, scored: ScoreCapture) -> torch.Tensor:
    """Rewrite ``inputs["advantages"]`` to per-token ``(N, T)`` advantages from the loss forward's ``logps`` (π_old:
    TRL's old log-probabilities where present, else these, detached). Returns this micro-batch's sums for the step's
    metrics: (Σ signal, tokens scored, tokens at the bound, Σ|signal| on answer tokens, Σ|signal|, rows scored)."""
    old = inputs.get("old_per_token_logps")
    old = logps.detach() if old is None else old
    teacher = scored.teacher.to(logps.device)
    mask = inputs["completion_mask"].bool() & torch.isfinite(teacher)
    advantages = inputs["advantages"]
    base = advantages[:, None].expand_as(teacher) if advantages.dim() == 1 else advantages
    scoring = scored.scoring
    if not scoring.contrastive:
        signal = additive_delta(torch.nan_to_num(teacher), old, mask, scoring.clip)
        inputs["advantages"] = base + scoring.coef * signal
        bound = scoring.clip
    else:
        wrong = (
            scored.wrong.to(logps.device) if scored.wrong is not None else torch.full_like(teacher[:, None], math.nan)
        )
        signal, _ = contrastive_residual(teacher, wrong, mask, scoring.coef)
        inputs["advantages"] = sign_preserving(advantages, signal)
        bound = RLCSD_BOUND
    answer = scored.answer.to(mask.device).bool() & mask if scored.answer is not None else torch.zeros_like(mask)
    size = signal.abs()
    return torch.stack(
        [
            signal.sum(),
            mask.sum().float(),
            (mask & (size >= bound - 1e-6)).sum().float(),
            size[answer].sum(),
            size.sum(),
            mask.any(1).sum().float(),
        ]
    ).detach()


def score_metrics(totals: torch.Tensor) -> dict[str, float]:
    """A step's ``score/*`` values from :func:`rewrite_advantages`' sums over its micro-batches and processes."""
    signal, tokens, at_bound, answer, size, rows = (float(x) for x in totals)
    if tokens == 0:
        return {"score/rows": rows}
    return {
        "score/delta_mean": signal / tokens,
        "score/clip_fraction": at_bound / tokens,
        "score/answer_share": answer / size if size > 0 else 0.0,
        "score/rows": rows,
    }
