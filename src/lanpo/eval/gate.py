"""The scoring gate: before paying for a grid, does a context tell the plain policy's right rollouts from its wrong
ones when it only scores them? (``lanpo gate``; measure before you pay, like the lift probe.)

The model samples k plain rollouts a problem; the verifier scores them. Each rollout is then read by the same model
(the start model: ``score_teacher initial``) under each context, and under a **control**: the same template showing
another problem's answer, solution or right rollout (:func:`lanpo.score.teacher_contexts`' wrong context). Per
rollout, Δ̄ is the mean over its tokens of log π(y_t | c, x) − log π(y_t | x). Per context the gate reports the AUROC
of Δ̄ against the reward, over all rollouts and within groups that have both outcomes (the only comparison GRPO's
group baseline leaves to a dense signal); Δ̄'s mean on right and on wrong rollouts; the share of |Δ| that falls on
the tokens writing the final answer (where a context that states the answer leaks it, and no reasoning is taught);
and the seconds the scoring took. A context whose AUROC does not beat its control's has no information for the
scoring route to pass on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lanpo.engine.generation import chat_ids, left_pad
from lanpo.feedback.privileged import ground_truth, reference_of
from lanpo.plan import Scoring
from lanpo.prompts import Messages, solve_messages
from lanpo.score import ScoredRow, answer_span, answer_token_mask, context_messages, teacher_contexts
from lanpo.verify.answers import find_answer


@dataclass
class Rollout:
    problem_index: int
    problem_id: str
    problem: str
    text: str
    token_ids: tuple[int, ...]
    right: bool
    answer_mask: list[bool] = field(default_factory=list)


@dataclass
class ContextResult:
    """One context's (or its control's) numbers over the gate's rollouts."""

    name: str
    rollouts: int  # rollouts that had this context to be read under
    auroc: float | None  # Δ̄ against the reward, pooled (None: one outcome only)
    auroc_within: float | None  # over pairs (right, wrong) of the same group
    pairs_within: int
    delta_right: float | None
    delta_wrong: float | None
    answer_share: float | None  # Σ|Δ| on answer tokens / Σ|Δ|
    seconds: float


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """P(a positive's score > a negative's), ties counting half (Mann-Whitney); None without both classes."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def auroc_within(scores: Sequence[float], labels: Sequence[bool], groups: Sequence[int]) -> tuple[float | None, int]:
    """The AUROC over (right, wrong) pairs of the same group, and how many such pairs there are."""
    wins = pairs = 0.0
    by_group: dict[int, list[int]] = {}
    for i, gid in enumerate(groups):
        by_group.setdefault(gid, []).append(i)
    for members in by_group.values():
        for p in (i for i in members if labels[i]):
            for n in (i for i in members if not labels[i]):
                wins += (scores[p] > scores[n]) + 0.5 * (scores[p] == scores[n])
                pairs += 1
    return (wins / pairs if pairs else None), int(pairs)


def completion_logps(
    model,
    prompts: list[list[int]],
    completions: list[Sequence[int]],
    pad_id: int,
    temperature: float,
    batch_size: int,
    progress: str | None = None,
) -> list[torch.Tensor]:
    """Per row, log π(y_t | prompt, y<t) of each completion token (logits / temperature, as training scores them),
    rows batched by length (left-padded prompts, right-padded completions). ``progress`` names a bar over the rows."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: -(len(prompts[i]) + len(completions[i])))
    out: list[torch.Tensor | None] = [None] * len(prompts)
    bar = tqdm(total=len(order), desc=progress, unit="row", disable=progress is None)
    with torch.no_grad(), bar:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            ids, mask = left_pad([prompts[i] for i in rows], pad_id, device)
            width = max(len(completions[i]) for i in rows)
            comp = torch.full((len(rows), width), pad_id, device=device)
            comp_mask = torch.zeros((len(rows), width), dtype=mask.dtype, device=device)
            for r, i in enumerate(rows):
                comp[r, : len(completions[i])] = torch.tensor(list(completions[i]), device=device)
                comp_mask[r, : len(completions[i])] = 1
            logits = model(  # the head on the completion's positions only (and the prompt's last)
                input_ids=torch.cat([ids, comp], 1),
                attention_mask=torch.cat([mask, comp_mask], 1),
                logits_to_keep=width + 1,
            ).logits
            logits = logits[:, :-1].float() / temperature
            logps = torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)
            for r, i in enumerate(rows):
                out[i] = logps[r, : len(completions[i])].cpu()
            bar.update(len(rows))
    return out  # type: ignore[return-value]


def score_under(
    model,
    tokenizer,
    rollouts: list[Rollout],
    contexts: list[Messages | None],
    plain: list[torch.Tensor],
    settings,
    progress: str | None = None,
) -> tuple[list[int], list[torch.Tensor]]:
    """Δ per token for the rollouts that have a context: (their indices, Δ = log π(y|c,x) − log π(y|x))."""
    picked = [i for i, c in enumerate(contexts) if c is not None and rollouts[i].token_ids]
    teacher = completion_logps(
        model,
        [chat_ids(tokenizer, contexts[i]) for i in picked],
        [rollouts[i].token_ids for i in picked],
        tokenizer.pad_token_id,
        settings.temperature,
        settings.batch_size,
        progress,
    )
    return picked, [t - plain[i] for i, t in zip(picked, teacher)]


def summarize(name: str, rollouts: list[Rollout], picked: list[int], deltas: list[torch.Tensor], seconds: float):
    means = [float(d.mean()) for d in deltas]
    labels = [rollouts[i].right for i in picked]
    groups = [rollouts[i].problem_index for i in picked]
    within, pairs = auroc_within(means, labels, groups)
    right = [m for m, y in zip(means, labels) if y]
    wrong = [m for m, y in zip(means, labels) if not y]
    total = sum(float(d.abs().sum()) for d in deltas)
    on_answer = sum(
        float(d.abs()[torch.tensor(rollouts[i].answer_mask[: len(d)], dtype=torch.bool)].sum())
        for i, d in zip(picked, deltas)
        if any(rollouts[i].answer_mask)
    )
    return ContextResult(
        name=name,
        rollouts=len(picked),
        auroc=auroc(means, labels),
        auroc_within=within,
        pairs_within=pairs,
        delta_right=sum(right) / len(right) if right else None,
        delta_wrong=sum(wrong) / len(wrong) if wrong else None,
        answer_share=on_answer / total if total > 0 else None,
        seconds=seconds,
    )


def transfer_gap(policy, teacher, tokenizer, problems, samples, temperature: float, batch_size: int) -> float | None:
    """The teacher-student gap on held-out plain rollouts: the mean over rollouts of Δ̄ = mean_t log π_T(y_t | gold
    context, x) − log π(y_t | x). It shrinks as the plain policy absorbs what the gold context knows (logged as
    ``eval/<benchmark>/transfer_gold`` at each evaluation of a scoring run). None without rollouts."""
    rows = [(p, s) for p, row in zip(problems, samples) for s in row if s.token_ids]
    if not rows:
        return None
    completions = [s.token_ids for _, s in rows]
    pad = tokenizer.pad_token_id
    plain = completion_logps(
        policy,
        [chat_ids(tokenizer, solve_messages(p.problem)) for p, _ in rows],
        completions,
        pad,
        temperature,
        batch_size,
    )
    gold = [context_messages("gold", p.problem, ground_truth(p.answer, p.gold_kind)) for p, _ in rows]
    hinted = completion_logps(
        teacher, [chat_ids(tokenizer, m) for m in gold], completions, pad, temperature, batch_size
    )
    return sum(float((t - q).mean()) for t, q in zip(hinted, plain)) / len(rows)


@dataclass
class GateSettings:
    k: int = 8
    temperature: float = 0.7
    max_new_tokens: int = 96
    batch_size: int = 32
    extraction: str = "lenient"
    level: int = 2  # reference: the hint level shown


def run_gate(model, tokenizer, problems, verifier, sources: Sequence[str], settings: GateSettings, generate):
    """Sample, verify, and score every rollout under each source's context and its control. ``generate`` is
    :func:`lanpo.engine.generation.generate` (or a stand-in with its signature). Returns (rollouts, results, seconds
    of sampling and of the plain scoring pass; each result holds its own context's scoring seconds)."""
    start = time.perf_counter()
    samples = generate(
        model,
        tokenizer,
        [solve_messages(p.problem) for p in problems],
        n=settings.k,
        temperature=settings.temperature,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size,
        progress="gate: sampling",
    )
    rollouts = []
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    for index, (problem, row) in enumerate(zip(problems, samples)):
        n = len(row)
        scores = verifier.score_texts(
            [problem.answer] * n, [s.text for s in row], [problem.problem] * n, kinds=[problem.gold_kind] * n
        )
        for sample, reward in zip(row, scores):
            found, _ = find_answer(sample.text, settings.extraction, problem.problem)
            mask = answer_token_mask(sample.token_ids, decode, answer_span(sample.text, found))
            rollouts.append(
                Rollout(index, problem.id, problem.problem, sample.text, sample.token_ids, reward > 0.5, mask)
            )
    sampling_seconds = time.perf_counter() - start
    start = time.perf_counter()
    plain = completion_logps(
        model,
        [chat_ids(tokenizer, solve_messages(r.problem)) for r in rollouts],
        [r.token_ids for r in rollouts],
        tokenizer.pad_token_id,
        settings.temperature,
        settings.batch_size,
        "gate: reading plain",
    )
    plain_seconds = time.perf_counter() - start
    seen = [
        ScoredRow(
            r.problem_id,
            r.problem,
            r.text,
            r.right,
            reference_of(problems[r.problem_index]),
        )
        for r in rollouts
    ]
    results = []
    for source in sources:
        scoring = Scoring(  # one wrong context a row: the control; initial: the model read is the one sampled
            source=source,
            form="contrastive",
            teacher="initial",
            coef=1.0,
            clip=1.0,
            rows="all",
            level=settings.level,
            wrong=1,
        )
        contexts = teacher_contexts(seen, settings.k, scoring)
        for name, chosen in (
            (source, [c.right if c else None for c in contexts]),
            (f"{source} control", [c.wrong[0] if c else None for c in contexts]),
        ):
            start = time.perf_counter()
            picked, deltas = score_under(model, tokenizer, rollouts, chosen, plain, settings, f"gate: reading {name}")
            results.append(summarize(name, rollouts, picked, deltas, time.perf_counter() - start))
    return rollouts, results, {"sampling": sampling_seconds, "plain_scoring": plain_seconds}


def markdown(results: list[ContextResult], rollouts: list[Rollout]) -> str:
    def f(x, digits=3):
        return "—" if x is None else f"{x:.{digits}f}"

    right = sum(r.right for r in rollouts)
    lines = [
        f"{len(rollouts)} rollouts, {right} right ({right / max(1, len(rollouts)):.3f}).",
        "",
        "| context | rollouts | AUROC | AUROC within groups (pairs) | mean Δ right | mean Δ wrong | answer-token share of |Δ| | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.rollouts} | {f(r.auroc)} | {f(r.auroc_within)} ({r.pairs_within}) | {f(r.delta_right)} | "
            f"{f(r.delta_wrong)} | {f(r.answer_share)} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)
