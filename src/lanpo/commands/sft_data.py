"""The SFT seeding data: examples of LANPO's three skills, made by a teacher (``lanpo sft-data``).

Skills (every prompt is exactly the one training uses, from ``lanpo.prompts`` / ``lanpo.feedback``):

* ``summarize`` — distill a trial into FLOW OF THOUGHT / PRINCIPLES / PITFALLS (kept when it parses and keeps
  a lesson after answers are scrubbed; stored in the canonical format the parser reads best);
* ``reflect`` — critique an earlier attempt shown without any grading, then solve anew (kept when the new
  answer verifies and the reply shows no label talk: rewards, gold or reference answers). Kept examples show a
  right attempt as often as the candidates did (:class:`ShownBalance`): a right attempt makes a verified
  reflection likelier, and a set skewed toward them would teach "the shown attempt is usually right";
* ``feedback`` — use principles and pitfalls of *other* problems: analyze which apply, then solve (kept when
  the answer verifies).

The teacher is any generate function: a local or hub model (``--teacher``; the policy itself included) or an
OpenAI-compatible endpoint (``--teacher-url``, e.g. a vLLM server). Each kept example is appended to the
output JSONL as it is made, and every processed (problem, skill) to a ``.progress.jsonl`` beside it, so an
interrupted build resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lanpo.commands.args import (
    at_least,
    backend_arg,
    data_field_args,
    extraction,
    extraction_arg,
    field_kwargs,
    model_path,
    new_path,
    skill_mix,
)
from lanpo.data.loaders import Problem
from lanpo.engine.generation import GenerateFn
from lanpo.feedback import LABEL_TALK, build_abstraction_prompt, build_reflection_prompt
from lanpo.pool.retrieval import Retriever
from lanpo.pool.store import ExperiencePool, PoolEntry
from lanpo.prompts import Messages, Summary, format_summary, is_prefilled, parse_summary, solve_messages, with_prefill
from lanpo.summarize import Trial, entry_from_summary, summary_prompt
from lanpo.verify.code import Verifier
from lanpo.verify.rewards import MathVerifier

logger = logging.getLogger(__name__)

SKILLS = ("summarize", "reflect", "feedback")


# ---------------------------------------------------------------------------------------------------------------
# Teachers


class EndpointTeacher:
    """An OpenAI-compatible ``/chat/completions`` endpoint as a generate function (requests run concurrently).

    Prefilled conversations are sent with vLLM's ``continue_final_message``; failed requests are retried
    ``retries`` times, then yield an empty reply (counted as dropped by the builder, never a crash).
    """

    def __init__(
        self,
        url: str,
        model: str,
        temperature: float = 0.7,
        max_tokens: int = 512,
        concurrency: int = 8,
        retries: int = 2,
        timeout: float = 120.0,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/chat/completions") else "/chat/completions")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.concurrency = concurrency
        self.retries = retries
        self.timeout = timeout
        self.api_key = api_key
        self.failures = 0

    def _one(self, messages: Messages) -> str:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if is_prefilled(messages):
            body.update(continue_final_message=True, add_generation_prompt=False)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(self.url, json.dumps(body).encode(), headers)
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    data = json.loads(response.read())
                text = data["choices"][0]["message"]["content"] or ""
                return with_prefill(messages, text)
            except (urllib.error.URLError, TimeoutError, KeyError, IndexError, json.JSONDecodeError, OSError) as e:
                if attempt == self.retries:
                    self.failures += 1
                    logger.warning("Teacher request failed (%s); the example is dropped", e)
                    return ""
                time.sleep(0.5 * 2**attempt)
        return ""

    def __call__(self, prompts: list[Messages]) -> list[str]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._one, prompts))


# ---------------------------------------------------------------------------------------------------------------
# The builder


BALANCE_REASON = "kept to the candidates' share of right shown attempts"


@dataclass
class ShownBalance:
    """Reflection examples by whether the attempt they show was right: among the candidates (every problem a
    reflection was asked for, its attempt chosen without regard to reward) and among the kept examples.

    Only a reflection whose answer verifies is kept, and one shown a right attempt verifies far more often (the
    model copies it), so unchecked the kept set shows right attempts well above the model's base rate: the reward
    would reach the policy by survivorship. :meth:`admits` keeps each kind to its share among the candidates so
    far: a kind is admitted while its kept count stays within the ceiling of that share of the kept total.
    """

    candidates: Counter = field(default_factory=Counter)  # True: the shown attempt was right
    kept: Counter = field(default_factory=Counter)

    def admits(self, right: bool) -> bool:
        total = sum(self.candidates.values())
        kept = sum(self.kept.values()) + 1
        return self.kept[right] + 1 <= -(-self.candidates[right] * kept // total) if total else True

    def as_dict(self) -> dict:
        def share(counts: Counter) -> float | None:
            return counts[True] / sum(counts.values()) if sum(counts.values()) else None

        return {
            "candidates": sum(self.candidates.values()),
            "candidates_right_share": share(self.candidates),
            "kept": sum(self.kept.values()),
            "kept_right_share": share(self.kept),
        }


@dataclass
class BuildReport:
    kept: Counter = field(default_factory=Counter)
    dropped: dict[str, Counter] = field(default_factory=lambda: {s: Counter() for s in SKILLS})
    shown: ShownBalance = field(default_factory=ShownBalance)
    written: int = 0  # examples this run wrote (kept counts those of earlier runs too)
    teacher_failures: int = 0  # (problem, skill) pairs the teacher gave no reply for: left to do on a resume

    def drop(self, skill: str, reason: str) -> None:
        self.dropped[skill][reason] += 1

    def as_dict(self) -> dict:
        return {
            "kept": dict(self.kept),
            "dropped": {s: dict(c) for s, c in self.dropped.items() if c},
            "reflect_shown_attempt": self.shown.as_dict(),
            "written_this_run": self.written,
            "teacher_failures": self.teacher_failures,
        }


# Drop reasons that say the teacher gave nothing, not that an example failed a check: such a (problem, skill) is
# not done, so a resume with the teacher back tries it again. Nor is one that waited for lessons of other problems.
NO_REPLY = "empty reply (teacher failure)"
NO_ATTEMPT = "teacher wrote no attempt"
TEACHER_FAILURES = (NO_REPLY, NO_ATTEMPT)
NOT_YET = "no lessons of other problems yet"


def resume_lines(path: Path) -> list[dict]:
    """The JSON objects of an output or progress file, for resuming: a torn or foreign line is skipped (a warning
    names the file and counts them); a file that is not UTF-8 text is refused by name."""
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): it is not a file sft-data wrote; "
            "move it away, or name another --out."
        ) from None
    rows = []
    skipped = 0
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("problem_id"), str) and row.get("skill") in SKILLS:
            rows.append(row)
        elif line.strip():
            skipped += 1
    if skipped:
        logger.warning("%s: %d line(s) that are not sft-data records were skipped", path, skipped)
    return rows


def _example(skill: str, problem: Problem, prompt: Messages, reply: str, teacher: str) -> dict:
    user_turns = [m for m in prompt if not (m is prompt[-1] and is_prefilled(prompt))]
    return {
        "prompt": user_turns,
        "completion": [{"role": "assistant", "content": reply}],
        "skill": skill,
        "problem_id": problem.id,
        "teacher": teacher,
    }


def build_sft_data(
    problems: Sequence[Problem],
    teacher: GenerateFn,
    out: str | Path,
    n: int = 3000,
    mix: Sequence[float] = (1 / 3, 1 / 3, 1 / 3),
    tries: int = 4,
    batch_size: int = 16,
    verifier: Verifier | MathVerifier | None = None,
    teacher_name: str = "teacher",
    seed: int = 0,
    progress: bool = True,
) -> BuildReport:
    """Build up to ``n`` examples split over the skills by ``mix``; append them to ``out`` (JSONL).

    Resumable: kept examples and processed (problem, skill) pairs found beside ``out`` are not redone.
    """
    if len(mix) != len(SKILLS) or any(m < 0 for m in mix) or not sum(mix):
        raise ValueError(f"mix needs {len(SKILLS)} non-negative shares for {SKILLS}, got {list(mix)}.")
    if tries < 1 or n < 1:
        raise ValueError("tries and n must be >= 1.")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress_file = out.with_name(out.name + ".progress.jsonl")
    quota = {s: round(n * m / sum(mix)) for s, m in zip(SKILLS, mix)}
    report = BuildReport()
    done = set()
    summaries = ExperiencePool()  # the summaries made so far feed the feedback skill
    for ex in resume_lines(out):
        report.kept[ex["skill"]] += 1
        if ex["skill"] == "reflect" and isinstance(ex.get("shown_attempt_right"), bool):
            report.shown.kept[ex["shown_attempt_right"]] += 1
        if ex["skill"] == "summarize":
            try:
                _add_summary_entry(summaries, ex)
            except (KeyError, IndexError, TypeError, AttributeError):
                pass  # an example we cannot read back still counts as kept; it only feeds no lesson
    for row in resume_lines(progress_file):
        done.add((row["problem_id"], row["skill"]))
        if isinstance(row.get("shown_right"), bool):
            report.shown.candidates[row["shown_right"]] += 1
        if row.get("status") == "dropped":
            report.drop(row["skill"], str(row.get("reason", "")))
    own_verifier = verifier is None
    verifier = verifier or Verifier(MathVerifier())  # code problems' tests run in the sandbox
    retriever = Retriever(summaries, "bm25", gamma=0.0, top_k=2, candidates=8)
    rng = random.Random(seed)
    order = list(problems)
    rng.shuffle(order)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=sum(quota.values()),
            initial=sum(min(report.kept[s], quota[s]) for s in SKILLS),
            desc="sft examples",
            unit="ex",
        )
    try:
        with out.open("a") as sink, progress_file.open("a") as log:

            def record(
                problem: Problem, skill: str, example: dict | None, reason: str = "", shown_right: bool | None = None
            ) -> None:
                if example is not None:
                    sink.write(json.dumps(example, ensure_ascii=False) + "\n")
                    report.kept[skill] += 1
                    report.written += 1
                    if bar is not None:
                        bar.update(1)
                elif reason in TEACHER_FAILURES or reason == NOT_YET:  # not done: a resume asks again
                    report.teacher_failures += reason in TEACHER_FAILURES
                    report.drop(skill, reason)
                    return
                else:
                    report.drop(skill, reason)
                row = {
                    "problem_id": problem.id,
                    "skill": skill,
                    "status": "kept" if example else "dropped",
                    "reason": reason,
                }
                if shown_right is not None:
                    row["shown_right"] = shown_right
                log.write(json.dumps(row) + "\n")
                sink.flush()
                log.flush()

            for start in range(0, len(order), batch_size):
                if all(report.kept[s] >= quota[s] for s in SKILLS):
                    break
                batch = order[start : start + batch_size]
                _build_batch(
                    batch, teacher, verifier, tries, quota, report, done, record, summaries, retriever, teacher_name
                )
    finally:
        if bar is not None:
            bar.close()
        if own_verifier:
            verifier.close()
    return report


def _add_summary_entry(pool: ExperiencePool, example: dict) -> None:
    """Put a kept summary back into the builder's pool when resuming (its problem is read off the prompt)."""
    parsed = parse_summary(example["completion"][0]["content"])
    match = re.search(r"Problem:\n(.*?)\n\nA solution attempt:", example["prompt"][0]["content"], re.DOTALL)
    if parsed is not None and match:
        pool.add(
            [
                PoolEntry(
                    problem_id=example["problem_id"],
                    problem=match.group(1),
                    flow_of_thought=parsed.flow_of_thought,
                    principles=parsed.principles,
                    pitfalls=parsed.pitfalls,
                )
            ]
        )


def _first_accepted(prompts: list[Messages], teacher: GenerateFn, tries: int, accept) -> list[tuple[str | None, str]]:
    """Ask the teacher ``tries`` times per prompt (one batch); the first reply ``accept`` takes wins.

    ``accept(i, reply)`` returns ``""`` to accept, else the reason to reject. Returns (reply, reason) per prompt.
    """
    if not prompts:
        return []
    replies = teacher([p for p in prompts for _ in range(tries)])
    results = []
    for i in range(len(prompts)):
        reason = "no reply"
        chosen = None
        for reply in replies[i * tries : (i + 1) * tries]:
            if not reply or not reply.strip():
                reason = NO_REPLY
                continue
            reason = accept(i, reply)
            if not reason:
                chosen = reply
                break
        results.append((chosen, reason))
    return results


def _build_batch(batch, teacher, verifier, tries, quota, report, done, record, summaries, retriever, teacher_name):
    # 1. attempts: the teacher solves each problem `tries` times; graded attempts feed the other skills
    replies = teacher([solve_messages(p.problem) for p in batch for _ in range(tries)])
    each = [p for p in batch for _ in range(tries)]
    scores = verifier.score_texts([p.answer for p in each], replies, kinds=[p.gold_kind for p in each])
    attempts = {
        p.id: [
            (r, s == 1.0) for r, s in zip(replies[i * tries : (i + 1) * tries], scores[i * tries :]) if r and r.strip()
        ]
        for i, p in enumerate(batch)
    }

    def want(skill: str, problem: Problem) -> bool:
        return report.kept[skill] < quota[skill] and (problem.id, skill) not in done

    def capped(skill: str, todo: list[Problem]) -> list[Problem]:
        return todo[: max(0, quota[skill] - report.kept[skill])]  # a batch never overshoots the skill's quota

    # 2. summarize: a right attempt and a wrong one alternate across problems; kept when it parses
    todo = capped("summarize", [p for p in batch if want("summarize", p) and attempts[p.id]])
    trials = []
    for k, p in enumerate(todo):
        right = [a for a in attempts[p.id] if a[1]]
        wrong = [a for a in attempts[p.id] if not a[1]]
        text, ok = (right or wrong)[0] if k % 2 == 0 else (wrong or right)[0]
        trials.append(Trial(p.id, p.problem, text, ok, gold=p.answer))
    prompts = [summary_prompt(t) for t in trials]
    parsed: dict[int, object] = {}

    def accept_summary(i: int, reply: str) -> str:
        stats = Counter()
        entry = entry_from_summary(trials[i], reply, stats)
        if entry is None:
            return "summary does not parse" if stats["parse_failed"] else "no lesson left after scrubbing answers"
        parsed[i] = entry
        return ""

    for i, (reply, reason) in enumerate(_first_accepted(prompts, teacher, tries, accept_summary)):
        p = todo[i]
        if reply is None:
            record(p, "summarize", None, reason)
            continue
        entry = parsed[i]
        canonical = format_summary(Summary(entry.flow_of_thought, entry.principles, entry.pitfalls))
        summaries.add([entry])
        record(p, "summarize", _example("summarize", p, prompts[i], canonical, teacher_name))
    for p in capped("summarize", [p for p in batch if want("summarize", p) and not attempts[p.id]]):
        record(p, "summarize", None, NO_ATTEMPT)

    # 3. reflect: on an attempt chosen without regard to its reward (choosing wrong ones would teach "a shown
    # attempt is usually wrong": the reward leaking through the data), shown ungraded
    todo = capped("reflect", [p for p in batch if want("reflect", p) and attempts[p.id]])
    prompts, shown_right = [], []
    for p in todo:
        choice = int(hashlib.sha1(p.id.encode()).hexdigest(), 16) % len(attempts[p.id])  # fixed per problem
        prompts.append(build_reflection_prompt(p.problem, [attempts[p.id][choice][0]]).messages)
        shown_right.append(attempts[p.id][choice][1])
    report.shown.candidates.update(shown_right)

    def balanced(i: int, example: dict) -> str:  # kept examples show right attempts at the candidates' rate
        if not report.shown.admits(shown_right[i]):
            return BALANCE_REASON
        report.shown.kept[shown_right[i]] += 1
        example["shown_attempt_right"] = shown_right[i]
        return ""

    _solve_skill(
        "reflect",
        todo,
        prompts,
        teacher,
        verifier,
        tries,
        record,
        teacher_name,
        check_labels=True,
        gate=balanced,
        shown_right=shown_right,
    )

    # 4. feedback: lessons of other problems (the summaries made so far), then solve
    todo = capped("feedback", [p for p in batch if want("feedback", p)])
    found = retriever.retrieve_many([(p.id, p.problem) for p in todo]) if todo else []
    usable, prompts = [], []
    for p, hits in zip(todo, found):
        result = build_abstraction_prompt(p.problem, [h.entry for h in hits], problem_id=p.id)
        if result.messages is None:
            record(p, "feedback", None, NOT_YET)
            continue
        usable.append(p)
        prompts.append(result.messages)
    _solve_skill("feedback", usable, prompts, teacher, verifier, tries, record, teacher_name, check_labels=False)


def _solve_skill(
    skill, problems, prompts, teacher, verifier, tries, record, teacher_name, check_labels, gate=None, shown_right=None
):
    """Solve each prompt (first verified reply of ``tries``); ``gate(i, example)`` may still refuse a verified
    example (returns the reason) or annotate it. ``shown_right`` (reflect) goes into the progress file, so a
    resumed build counts the candidates again."""

    def accept(i: int, reply: str) -> str:
        if check_labels and LABEL_TALK.search(reply):
            return "reply talks about rewards or reference answers"
        if verifier.score_texts([problems[i].answer], [reply], kinds=[problems[i].gold_kind])[0] != 1.0:
            return "answer did not verify"
        return ""

    for i, (reply, reason) in enumerate(_first_accepted(prompts, teacher, tries, accept)):
        p = problems[i]
        example = _example(skill, p, prompts[i], reply, teacher_name) if reply is not None else None
        if example is not None and gate is not None:
            reason = gate(i, example)
            example = None if reason else example
        record(p, skill, example, reason, shown_right=shown_right[i] if shown_right is not None else None)


# -- the command line ----------------------------------------------------------------------------------------


def add_parser(sub, name: str, help: str) -> None:
    p = sub.add_parser(
        name,
        help=help,
        description="Build chat-format examples of LANPO's three skills from problems in --data, "
        "with a teacher model; answers are kept only when they verify (rejection "
        "sampling), summaries only when they parse. Resumable.",
    )
    p.add_argument(
        "--teacher",
        default="smollm2-135m",
        help="teacher model: hub id, local dir, .gguf, smollm2-135m (the policy itself), or the model "
        "name served at --teacher-url",
    )
    p.add_argument("--teacher-url", help="OpenAI-compatible endpoint (e.g. http://localhost:8000/v1 of a vLLM server)")
    p.add_argument("--api-key", help="bearer token for --teacher-url")
    p.add_argument("--data", default="builtin:arith", help="problems to build examples from (any data spec)")
    data_field_args(p)
    p.add_argument("--limit", type=at_least(1), help="use only the first N problems")
    p.add_argument("--out", required=True, type=new_path("file"), help="output JSONL (appended to; resumable)")
    p.add_argument("--n", type=at_least(1), default=3000, help="examples to build in all (default 3000)")
    p.add_argument(
        "--mix", type=skill_mix, default=[1.0, 1.0, 1.0], help="shares of summarize,reflect,feedback (default 1,1,1)"
    )
    p.add_argument("--tries", type=at_least(1), default=4, help="teacher tries, then the example drops (default 4)")
    p.add_argument("--batch-size", type=at_least(1), default=16, help="problems per round (default 16)")
    p.add_argument("--temperature", type=at_least(0.0, float), default=0.7)
    p.add_argument("--max-new-tokens", type=at_least(1), default=384)
    extraction_arg(p)
    backend_arg(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=command)


def command(args) -> int:
    from lanpo.data.loaders import load_problems
    from lanpo.data.presets import training_split
    from lanpo.run.files import check_writable

    mix = args.mix
    problems = load_problems(
        args.data, split=training_split(args.data, args.split), limit=args.limit, **field_kwargs(args)
    )
    check_writable(Path(args.out).parent, "--out's folder")  # before the teacher loads
    for path in (Path(args.out), Path(args.out + ".progress.jsonl")):  # a file we cannot resume from: named now
        resume_lines(path)
    if args.teacher_url:
        teacher = EndpointTeacher(
            args.teacher_url,
            args.teacher,
            temperature=args.temperature,
            max_tokens=args.max_new_tokens,
            api_key=args.api_key,
        )
    else:
        import torch

        from lanpo.engine.generation import HFGenerator, load_for_generation

        torch.manual_seed(args.seed)
        model, tokenizer = load_for_generation(model_path(args.teacher), args.backend, seed=args.seed)
        teacher = HFGenerator(
            model, tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=32
        )
    with Verifier(MathVerifier(extraction=extraction(args.extraction, args.teacher))) as verifier:
        report = build_sft_data(
            problems,
            teacher,
            args.out,
            n=args.n,
            mix=mix,
            tries=args.tries,
            batch_size=args.batch_size,
            verifier=verifier,
            teacher_name=args.teacher,
            seed=args.seed,
        )
    summary = report.as_dict()
    Path(args.out + ".report.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"Examples: {args.out} (report: {args.out}.report.json)")
    if report.written == 0 and report.teacher_failures:
        where = args.teacher_url or args.teacher
        raise RuntimeError(
            f"the teacher ({where}) gave no reply for {report.teacher_failures} (problem, skill) pair(s) and no "
            "example was written; those pairs are not marked done: run the same command again once it answers."
        )
    return 0
