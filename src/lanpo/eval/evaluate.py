"""Evaluation: sample k completions per problem, score them, report mean@k and pass@k.

Modes (LANPO's three inference settings):

* ``zero-shot`` — the plain prompt, no context (the test condition of the paper);
* ``retrieval`` — context from an experience pool: entries of *other* problems that pass the relevance
  filter, given as principles and pitfalls with the same abstraction prompt as training;
* ``self-correct`` — reward-agnostic reflection at test time: attempt, then ``rounds`` times critique the
  previous attempt (no grading shown) and write a new one; the last round's answer is scored;
* ``execution`` — code: as ``self-correct``, each round shown what running the last attempt on the examples its
  statement shows did (the public examples; the hidden tests stay the score).

The **privileged** modes are a lift probe, not a test: each shows the context a privileged feedback source gives in
training (:mod:`lanpo.feedback.privileged`), built from the problem's worked solution or gold answer, to measure how
much that context helps the model in context before any training pays for it:

* ``reference`` — the first part of the worked solution at ``hint_level``;
* ``gold`` — a zero-shot attempt, the critique "the generated solution is (in)correct, the ground truth is X",
  and a new attempt (the one scored);
* ``self-hint`` — the model writes one hint per problem from the solution (dropped if it states the answer: the
  plain prompt; unparseable: the reference context), then answers with it.

Their results say ``privileged: true``, their table rows are labelled, and ``lanpo compare`` leaves them out.

Every result file records the prompt, the decoding settings and the verifier settings next to the numbers,
and every completion is saved so results can be read, not just trusted.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lanpo.data.loaders import Problem
from lanpo.engine.generation import Sample, generate
from lanpo.feedback import build_abstraction_prompt, build_reflection_prompt
from lanpo.plan import PRIVILEGED_KINDS
from lanpo.pool.retrieval import LLMJudgeScorer, Retriever, make_scorer
from lanpo.pool.store import ExperiencePool, resolve_pool_path
from lanpo.prompts import CODE_HEADER, domain_of, is_code_problem, solve_messages
from lanpo.verify.answers import extract_answer
from lanpo.verify.code import CodeSettings, Verifier
from lanpo.verify.rewards import MathVerifier

logger = logging.getLogger(__name__)

TEST_MODES = ("zero-shot", "retrieval", "self-correct", "execution")
PRIVILEGED_MODES = PRIVILEGED_KINDS  # a probe of in-context lift, one mode a privileged kind: never a test score
MODES = TEST_MODES + PRIVILEGED_MODES


@dataclass
class EvalSettings:
    k: int = 4
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 512
    batch_size: int = 32
    extraction: str = "strict"
    verify_time_limit: float = 2.0
    rounds: int = 1  # self-correct: reflection rounds after the first attempt
    seed: int = 0
    hint_level: int = 1  # reference, self-hint: the hint level shown (1..3)
    hint_max_new_tokens: int = 128  # self-hint: most tokens of a hint
    code: CodeSettings = field(default_factory=CodeSettings)  # code problems: the sandbox's settings


# ---------------------------------------------------------------------------------------------------------------
# Metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k}).")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize_scores(scores: list[list[float]], samples: list[list[Sample]]) -> dict[str, float]:
    """mean@k with its standard error over problems, pass@1 and pass@k, mean length and truncation rate."""
    if not scores:
        raise ValueError("No problems were evaluated.")
    k = len(scores[0])
    per_problem = [sum(s) / len(s) for s in scores]
    mean = sum(per_problem) / len(per_problem)
    var = sum((x - mean) ** 2 for x in per_problem) / (len(per_problem) - 1) if len(per_problem) > 1 else 0.0
    flat = [s for row in samples for s in row]
    return {
        f"mean@{k}": mean,
        f"mean@{k}_stderr": math.sqrt(var / len(per_problem)),
        "pass@1": sum(pass_at_k(len(s), int(sum(s)), 1) for s in scores) / len(scores),
        f"pass@{k}": sum(pass_at_k(len(s), int(sum(s)), k) for s in scores) / len(scores),
        "mean_length": sum(s.num_tokens for s in flat) / len(flat),
        "truncation_rate": sum(s.truncated for s in flat) / len(flat),
        "problems": len(scores),
        "samples": len(flat),
    }


# ---------------------------------------------------------------------------------------------------------------
# Modes


@dataclass
class ModeResult:
    mode: str
    metrics: dict[str, float]
    records: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    samples: list[list[Sample]] | None = None  # zero-shot: the samples themselves (token ids: the transfer metric)


def _score(verifier: Verifier, problems: list[Problem], samples: list[list[Sample]]) -> list[list[float]]:
    k = len(samples[0])
    each = [p for p in problems for _ in range(k)]
    texts = [s.text for row in samples for s in row]
    flat = verifier.score_texts(
        [p.answer for p in each], texts, [p.problem for p in each], kinds=[p.gold_kind for p in each]
    )
    return [flat[i * k : (i + 1) * k] for i in range(len(problems))]


def _records(problems, prompts, samples, scores, extraction, extra=None) -> list[dict]:
    records = []
    for i, (problem, row, row_scores) in enumerate(zip(problems, samples, scores)):
        record = {
            "id": problem.id,
            "problem": problem.problem,
            "answer": problem.answer,
            "prompt": prompts[i][-1]["content"] if prompts[i] is not None else None,
            "completions": [
                {
                    "text": s.text,
                    "extracted": extract_answer(s.text, extraction, problem.problem),
                    "score": sc,
                    "tokens": s.num_tokens,
                    "truncated": s.truncated,
                }
                for s, sc in zip(row, row_scores)
            ],
        }
        if extra:
            record.update(extra[i])
        records.append(record)
    return records


def _sample(model, tokenizer, prompts, settings, progress: str) -> list[list[Sample]]:
    """``settings.k`` samples of every prompt with the settings' decoding."""
    return generate(
        model,
        tokenizer,
        prompts,
        n=settings.k,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size,
        progress=progress,
    )


def run_zero_shot(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    prompts = [solve_messages(p.problem) for p in problems]
    samples = _sample(model, tokenizer, prompts, settings, "zero-shot")
    scores = _score(verifier, problems, samples)
    return ModeResult(
        "zero-shot",
        summarize_scores(scores, samples),
        _records(problems, prompts, samples, scores, settings.extraction),
        samples=samples,
    )


# ---------------------------------------------------------------------------------------------------------------
# Context modes: retrieval-augmented and self-corrective
#
# * retrieval: each problem gets the abstraction prompt built from pool entries of *other* problems that pass
#   the same relevance filter as training (scorer, γ, top-k taken from the pool's run unless overridden). The
#   pool is opened read-only. Entries of the problem itself (same id, or the same text under another id) are
#   never shown. A problem with no entry passing γ is asked with the plain prompt (reported as context_rate).
# * self-correct: each of the k samples is a chain: a zero-shot attempt, then `rounds` times the reflection
#   prompt on the chain's latest attempt (never graded), and a new attempt. The last round's answer is scored;
#   every round's accuracy is reported.


def retrieval_setup(
    pool: str,
    scorer: str | None = None,
    gamma: float | None = None,
    top_k: int | None = None,
    candidates: int | None = None,
    model=None,
    tokenizer=None,
) -> dict:
    """Open ``pool`` read-only and build the retriever; unset settings come from the pool's run config."""
    path = resolve_pool_path(pool)
    run_config = {}
    config_file = path.parent / "config.json"
    if config_file.is_file():
        try:
            run_config = json.loads(config_file.read_text())
        except json.JSONDecodeError:
            run_config = {}
    scorer_name = scorer or run_config.get("relevance_scorer", "bm25")
    gamma = gamma if gamma is not None else run_config.get("relevance_threshold", 0.9)
    top_k = top_k or run_config.get("retrieval_top_k", 3)
    candidates = max(candidates or run_config.get("retrieval_candidates", 16), top_k)
    store = ExperiencePool(path, readonly=True)
    if scorer_name == "llm":
        judge = LLMJudgeScorer(model, tokenizer)  # the evaluated model judges, as the policy does in training
    else:
        judge = make_scorer(scorer_name, embedding_model=run_config.get("embedding_model"))
    ranking = run_config.get("retrieval_rank", "similarity")
    # the learned worth, without exploration: evaluation shows what the run found to help
    retriever = Retriever(store, judge, gamma=gamma, top_k=top_k, candidates=candidates, ranking=ranking, explore=False)
    describe = {
        "pool": str(path),
        "pool_entries": len(store),
        "ranking": ranking,
        "scorer": scorer_name,
        "gamma": gamma,
        "top_k": top_k,
        "candidates": candidates,
    }
    return {"retriever": retriever, "describe": describe}


def run_retrieval(
    model, tokenizer, problems, settings, verifier, retriever: Retriever = None, describe=None, **_
) -> ModeResult:
    if retriever is None:
        raise ValueError("The retrieval mode needs a pool (lanpo eval --pool RUN_OR_FILE).")
    before = retriever.stats.same_problem
    found = retriever.retrieve_many([(p.id, p.problem) for p in problems])
    self_excluded = retriever.stats.same_problem - before  # the problem itself under another id, restated or not
    prompts, extra = [], []
    with_context = 0
    for problem, hits in zip(problems, found):
        result = build_abstraction_prompt(problem.problem, [h.entry for h in hits], problem_id=problem.id)
        prompts.append(result.messages or solve_messages(problem.problem))
        with_context += result.messages is not None
        extra.append(
            {
                "context": result.messages is not None,
                "pool_entries": result.used_entries,
                "relevance": [round(h.relevance, 4) for h in hits],
            }
        )
    samples = _sample(model, tokenizer, prompts, settings, "retrieval")
    scores = _score(verifier, problems, samples)
    metrics = summarize_scores(scores, samples)
    metrics["context_rate"] = with_context / len(problems)
    info = {"retrieval": describe or {}, "same_problem_entries_excluded": self_excluded}
    return ModeResult(
        "retrieval", metrics, _records(problems, prompts, samples, scores, settings.extraction, extra), info
    )


def run_self_correct(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    def reflections(pairs: list[tuple[str, str]]) -> list:
        return [build_reflection_prompt(problem, [attempt]).messages for problem, attempt in pairs]

    return _correct("self-correct", reflections, model, tokenizer, problems, settings, verifier)


def run_execution(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    """``self-correct`` with a programmer's feedback: each round shows the last attempt and what running it on the
    examples its statement shows did (:mod:`lanpo.feedback.execution`; the hidden tests stay the score). A problem
    that shows no example gets a fresh attempt, counted in ``execution_fallbacks``."""
    from lanpo.feedback.execution import try_attempts

    def reports(pairs: list[tuple[str, str]]) -> list:
        run_code = verifier.code.sandbox.run_many if any(is_code_problem(p) for p, _ in pairs) else None
        return [t if isinstance(t, str) else t.messages for t in try_attempts(pairs, run_code, settings.extraction)]

    return _correct("execution", reports, model, tokenizer, problems, settings, verifier)


def _correct(mode, contexts_of, model, tokenizer, problems, settings, verifier) -> ModeResult:
    """Chains of attempts: a zero-shot attempt, then ``rounds`` times a new one under ``contexts_of``'s context for
    the last (its messages, else a reason: a fresh attempt, counted); the last round's answer is scored."""
    k = settings.k
    decoding = {
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_new_tokens": settings.max_new_tokens,
        "batch_size": settings.batch_size,
    }
    first = generate(
        model, tokenizer, [solve_messages(p.problem) for p in problems], n=k, progress=f"{mode} r0", **decoding
    )
    chains = [[[s] for s in row] for row in first]  # problem -> sample -> attempts
    per_round = [summarize_scores(_score(verifier, problems, first), first)[f"mean@{k}"]]
    last_prompts = None
    fallbacks = 0
    for r in range(settings.rounds):
        flat = [(i, j) for i in range(len(problems)) for j in range(k)]
        contexts = contexts_of([(problems[i].problem, chains[i][j][-1].text) for i, j in flat])
        built = [c if isinstance(c, list) else None for c in contexts]  # a reason instead: a fresh attempt
        fallbacks += sum(c is None for c in built)
        prompts = [c or solve_messages(problems[i].problem) for c, (i, _) in zip(built, flat)]
        new = generate(model, tokenizer, prompts, n=1, progress=f"{mode} r{r + 1}", **decoding)
        for (i, j), sample in zip(flat, new):
            chains[i][j].append(sample[0])
        latest = [[chain[-1] for chain in row] for row in chains]
        per_round.append(summarize_scores(_score(verifier, problems, latest), latest)[f"mean@{k}"])
        last_prompts = [prompts[i * k] for i in range(len(problems))]
    final = [[chain[-1] for chain in row] for row in chains]
    scores = _score(verifier, problems, final)
    metrics = summarize_scores(scores, final)
    for r, value in enumerate(per_round):
        metrics[f"mean@{k}_round{r}"] = value
    metrics["reflection_fallbacks" if mode == "self-correct" else f"{mode}_fallbacks"] = fallbacks
    extra = [{"rounds": [[{"text": s.text, "tokens": s.num_tokens} for s in chain] for chain in row]} for row in chains]
    prompts = last_prompts or [solve_messages(p.problem) for p in problems]
    return ModeResult(
        mode,
        metrics,
        _records(problems, prompts, final, scores, settings.extraction, extra),
        {"rounds": settings.rounds},
    )


# ---------------------------------------------------------------------------------------------------------------
# Privileged modes: the lift probe (training-only contexts, measured in context)


def _privileged(mode: str, metrics: dict, problems, prompts, samples, scores, settings, extra=None):
    """A privileged mode's result, marked as such wherever it is written."""
    records = _records(problems, prompts, samples, scores, settings.extraction, extra)
    level = {} if mode == "gold" else {"hint_level": settings.hint_level}  # gold shows the answer: no level
    return ModeResult(mode, metrics, records, {"privileged": True, **level})


def _reference_prompt(problem: Problem, level: int):
    from lanpo.feedback.privileged import level_share, reference_prompt

    return reference_prompt(problem.problem, problem.solution, level_share(level))


def run_reference(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    built = [_reference_prompt(p, settings.hint_level) for p in problems]
    prompts = [b or solve_messages(p.problem) for b, p in zip(built, problems)]
    samples = _sample(model, tokenizer, prompts, settings, "reference")
    scores = _score(verifier, problems, samples)
    metrics = summarize_scores(scores, samples)
    metrics["context_rate"] = sum(b is not None for b in built) / len(problems)
    return _privileged("reference", metrics, problems, prompts, samples, scores, settings)


def run_gold(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    from lanpo.feedback.privileged import ground_truth
    from lanpo.prompts import gold_messages

    k = settings.k
    first = _sample(model, tokenizer, [solve_messages(p.problem) for p in problems], settings, "gold r0")
    first_scores = _score(verifier, problems, first)
    prompts = [
        gold_messages(p.problem, s.text, ground_truth(p.answer, p.gold_kind), sc > 0.5)
        for p, row, row_scores in zip(problems, first, first_scores)
        for s, sc in zip(row, row_scores)
    ]
    decoding = {"temperature": settings.temperature, "top_p": settings.top_p}
    new = generate(
        model,
        tokenizer,
        prompts,
        n=1,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size,
        progress="gold r1",
        **decoding,
    )
    final = [[new[i * k + j][0] for j in range(k)] for i in range(len(problems))]
    scores = _score(verifier, problems, final)
    metrics = summarize_scores(scores, final)
    metrics[f"mean@{k}_round0"] = summarize_scores(first_scores, first)[f"mean@{k}"]
    shown = [prompts[i * k] for i in range(len(problems))]
    return _privileged("gold", metrics, problems, shown, final, scores, settings)


def run_self_hint(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    from lanpo.feedback.privileged import judge_hint
    from lanpo.prompts import hinted_messages, self_hint_messages, with_prefill

    asks = [self_hint_messages(p.problem, p.solution, settings.hint_level) if p.solution else None for p in problems]
    asked = [i for i, a in enumerate(asks) if a is not None]
    written = generate(
        model,
        tokenizer,
        [asks[i] for i in asked],
        n=1,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.hint_max_new_tokens,
        batch_size=settings.batch_size,
        progress="self-hint: hints",
    )
    hints = {i: with_prefill(asks[i], row[0].text) for i, row in zip(asked, written)}
    prompts, extra, counts = [], [], {"hints_used": 0, "unparsed": 0, "states_answer": 0, "no_solution": 0}
    for i, p in enumerate(problems):
        outcome, hint = judge_hint(hints[i], p.answer, p.gold_kind) if i in hints else ("no_solution", None)
        why, prompt = outcome, solve_messages(p.problem)  # no solution, or a hint that stated the answer
        if outcome == "unparsed":
            prompt = _reference_prompt(p, settings.hint_level) or prompt
        elif outcome == "used":
            why, prompt = "hints_used", hinted_messages(p.problem, hint)
        counts[why] += 1
        prompts.append(prompt)
        extra.append({"hint": hints.get(i), "hint_outcome": why})
    samples = _sample(model, tokenizer, prompts, settings, "self-hint")
    scores = _score(verifier, problems, samples)
    metrics = summarize_scores(scores, samples)
    metrics.update({f"hint_{k}_rate": v / len(problems) for k, v in counts.items()})
    return _privileged("self-hint", metrics, problems, prompts, samples, scores, settings, extra)


# ---------------------------------------------------------------------------------------------------------------
# Driver and reports


def example_prompt(mode: str, code: bool = False) -> str:
    problem = f"{CODE_HEADER}\n\n<function>" if code else "<problem>"
    return solve_messages(problem)[-1]["content"] if mode == "zero-shot" else mode


def evaluate(
    model, tokenizer, problems: list[Problem], settings: EvalSettings, modes=("zero-shot",), **mode_kwargs
) -> list[ModeResult]:
    """Run every requested mode on the same problems with the same decoding settings."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"Unknown mode(s) {unknown}; choose from {MODES}.")
    import torch

    runners = {
        "zero-shot": run_zero_shot,
        "retrieval": run_retrieval,
        "self-correct": run_self_correct,
        "execution": run_execution,
        "reference": run_reference,
        "gold": run_gold,
        "self-hint": run_self_hint,
    }
    results = []
    with Verifier(MathVerifier(settings.verify_time_limit, settings.extraction), settings.code) as verifier:
        if any(p.gold_kind == "code" for p in problems):
            verifier.start_code()  # the sandbox starts before any generation, or the evaluation stops here saying why
        for mode in modes:
            torch.manual_seed(settings.seed)
            start = time.perf_counter()
            result = runners[mode](model, tokenizer, problems, settings, verifier, **mode_kwargs)
            result.info["seconds"] = round(time.perf_counter() - start, 2)
            result.info["verifier"] = {
                "time_limit": settings.verify_time_limit,
                "extraction": settings.extraction,
                "stats": dict(verifier.stats),
            }
            results.append(result)
    return results


def write_results(results: list[ModeResult], out_dir: str | Path, header: dict) -> Path:
    """Write ``results.json``, ``results.md`` and one ``completions-<mode>.jsonl`` per mode into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    problem = next((r["problem"] for result in results for r in result.records if r.get("problem")), "")
    payload = {
        **header,
        "prompt": {
            "instruction": domain_of(problem).instruction,
            "zero_shot_example": example_prompt("zero-shot", is_code_problem(problem)),
        },
        "modes": {r.mode: {"metrics": r.metrics, **r.info} for r in results},
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    for r in results:
        with (out / f"completions-{r.mode}.jsonl").open("w") as handle:
            for record in r.records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out / "results.md").write_text(markdown_table(results, header))
    return out


def markdown_table(results: list[ModeResult], header: dict) -> str:
    k = header.get("settings", {}).get("k", "k")
    lines = [
        f"# Evaluation: {header.get('model', '?')} on {header.get('data', '?')}",
        "",
        f"Problems: {results[0].metrics['problems']}, samples per problem k={k}, "
        f"settings: `{json.dumps(header.get('settings', {}))}`",
        "",
        f"| mode | mean@{k} | ± s.e. | pass@1 | pass@{k} | mean length | truncated | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.metrics
        notes = []
        if r.info.get("privileged"):
            level = f", level {r.info['hint_level']}" if "hint_level" in r.info else ""  # gold has none
            notes.append(f"PRIVILEGED probe (training-only context{level}): not a test score")
        if "context_rate" in m:
            notes.append(f"context on {m['context_rate']:.0%} of problems")
        if "hint_hints_used_rate" in m:
            notes.append(
                f"hints used {m['hint_hints_used_rate']:.0%}, stated the answer {m['hint_states_answer_rate']:.0%}, "
                f"unparsed {m['hint_unparsed_rate']:.0%}"
            )
        rounds = [m[key] for key in sorted(m) if key.startswith(f"mean@{k}_round")]
        if rounds:
            notes.append("per round " + " → ".join(f"{x:.3f}" for x in rounds))
        label = f"{r.mode} (privileged)" if r.info.get("privileged") else r.mode
        lines.append(
            f"| {label} | {m[f'mean@{k}']:.3f} | {m[f'mean@{k}_stderr']:.3f} | {m['pass@1']:.3f} | "
            f"{m[f'pass@{k}']:.3f} | {m['mean_length']:.1f} | {m['truncation_rate']:.2f} | "
            f"{'; '.join(notes)} |"
        )
    verifier = results[0].info.get("verifier", {})
    lines += ["", f"Verifier: extraction `{verifier.get('extraction')}`, time limit {verifier.get('time_limit')} s."]
    return "\n".join(lines) + "\n"


def settings_dict(settings: EvalSettings) -> dict:
    return asdict(settings)
