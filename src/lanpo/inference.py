"""LANPO's context-using inference modes for ``lanpo eval``: retrieval-augmented and self-corrective.

* ``retrieval``: each problem gets the abstraction prompt built from pool entries of *other* problems that
  pass the same relevance filter as training (scorer, γ, top-k taken from the pool's run unless overridden).
  The pool is opened read-only. Entries of the problem itself (same id, or the same text under another id)
  are never shown. A problem with no entry passing γ is asked with the plain prompt (reported as
  ``context_rate``).
* ``self-correct``: reward-agnostic reflection at test time. Each of the k samples is a chain: a zero-shot
  attempt, then ``rounds`` times the reflection prompt on the chain's latest attempt (never graded), and a
  new attempt. The last round's answer is scored; every round's accuracy is reported.
"""

from __future__ import annotations

import json

from .evaluate import ModeResult, _records, _score, summarize_scores
from .feedback import build_abstraction_prompt, build_reflection_prompt
from .generation import generate
from .pool import ExperiencePool, resolve_pool_path
from .prompts import solve_messages
from .retrieval import LLMJudgeScorer, Retriever, make_scorer


def retrieval_setup(pool: str, scorer: str | None = None, gamma: float | None = None, top_k: int | None = None,
                    candidates: int | None = None, model=None, tokenizer=None) -> dict:
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
    retriever = Retriever(store, judge, gamma=gamma, top_k=top_k, candidates=candidates)
    describe = {"pool": str(path), "pool_entries": len(store), "scorer": scorer_name, "gamma": gamma,
                "top_k": top_k, "candidates": candidates}
    return {"retriever": retriever, "describe": describe}


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).lower() == " ".join(b.split()).lower()


def run_retrieval(model, tokenizer, problems, settings, verifier, retriever: Retriever = None, describe=None,
                  **_) -> ModeResult:
    if retriever is None:
        raise ValueError("The retrieval mode needs a pool (lanpo eval --pool RUN_OR_FILE).")
    found = retriever.retrieve_many([(p.id, p.problem) for p in problems])
    prompts, extra = [], []
    with_context = self_excluded = 0
    for problem, hits in zip(problems, found):
        entries = [h.entry for h in hits if not _same_text(h.entry.problem, problem.problem)]
        self_excluded += len(hits) - len(entries)
        result = build_abstraction_prompt(problem.problem, entries, gold=problem.answer, problem_id=problem.id)
        prompts.append(result.messages or solve_messages(problem.problem))
        with_context += result.messages is not None
        extra.append({"context": result.messages is not None, "pool_entries": result.used_entries,
                      "relevance": [round(h.relevance, 4) for h in hits]})
    samples = generate(model, tokenizer, prompts, n=settings.k, temperature=settings.temperature,
                       top_p=settings.top_p, max_new_tokens=settings.max_new_tokens,
                       batch_size=settings.batch_size, progress="retrieval")
    scores = _score(verifier, problems, samples)
    metrics = summarize_scores(scores, samples)
    metrics["context_rate"] = with_context / len(problems)
    info = {"retrieval": describe or {}, "same_text_entries_excluded": self_excluded}
    return ModeResult("retrieval", metrics, _records(problems, prompts, samples, scores, settings.extraction, extra),
                      info)


def run_self_correct(model, tokenizer, problems, settings, verifier, **_) -> ModeResult:
    k = settings.k
    decoding = {"temperature": settings.temperature, "top_p": settings.top_p,
                "max_new_tokens": settings.max_new_tokens, "batch_size": settings.batch_size}
    first = generate(model, tokenizer, [solve_messages(p.problem) for p in problems], n=k,
                     progress="self-correct r0", **decoding)
    chains = [[[s] for s in row] for row in first]  # problem -> sample -> attempts
    per_round = [summarize_scores(_score(verifier, problems, first), first)[f"mean@{k}"]]
    last_prompts = None
    for r in range(settings.rounds):
        flat = [(i, j) for i in range(len(problems)) for j in range(k)]
        prompts = [build_reflection_prompt(problems[i].problem, [chains[i][j][-1].text], gold=problems[i].answer)
                   for i, j in flat]
        new = generate(model, tokenizer, prompts, n=1, progress=f"self-correct r{r + 1}", **decoding)
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
    extra = [{"rounds": [[{"text": s.text, "tokens": s.num_tokens} for s in chain] for chain in row]}
             for row in chains]
    prompts = last_prompts or [solve_messages(p.problem) for p in problems]
    return ModeResult("self-correct", metrics,
                      _records(problems, prompts, final, scores, settings.extraction, extra),
                      {"rounds": settings.rounds})

