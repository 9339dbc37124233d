"""Privileged feedback: contexts that carry what the policy does not know, shown during training only.

* ``reference`` — the first part of the problem's worked solution, cut at its steps, at a hint level (1, 2, 3:
  a quarter, half, three quarters of the steps; never the last step): UFT, GHPO, QuestA;
* ``gold`` — the model's own attempt, the critique "the generated solution is incorrect, the ground truth is X"
  (or correct, where the verifier credits it), and a request to solve again: Critique-GRPO's ``simple_gt``;
* ``self-hint`` — the policy itself, shown the worked solution, writes a hint at a level; a hint that states the
  final answer in any form is dropped, one that does not parse falls back to ``reference`` (SAGE).

A problem's level moves across steps on a :class:`HintLadder` (SAGE's light variant), may escalate within a step
(:func:`lanpo.rollout.escalate_hints`) and may anneal to zero (UFT). Solutions and gold answers reach these
sources only, through :class:`PrivilegedKit`: the trainer takes the ``solution`` column out of the dataset before
TRL sees a row (:func:`take_references`), so no scratch row, stored attempt, summary or reward function reads one,
and a ``self`` run never builds these sources.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lanpo.data.loaders import Problem, problem_of
from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource, SourceKit
from lanpo.feedback.labels import ANSWER_STATEMENT, holds_code
from lanpo.feedback.reflection import ReflectionSource
from lanpo.plan import HINT_TOP, Attempts, FeedbackKind
from lanpo.prompts import (
    Messages,
    gold_messages,
    hinted_messages,
    is_code_problem,
    parse_hint,
    reference_messages,
    self_hint_messages,
)
from lanpo.verify.answers import mentions_answer
from lanpo.verify.code import fenced
from lanpo.verify.sandbox import CodeTests, GoldKind

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reference:
    """What a privileged source may know of a problem: its gold answer (and what kind: its data set's
    ``gold_kind``) and worked solution (None: none)."""

    answer: str
    solution: str | None = None
    gold_kind: GoldKind = "math"


def reference_of(problem: Problem) -> Reference:
    """A loaded problem's reference: its gold (and what kind) and worked solution."""
    return Reference(problem.answer, problem.solution, problem.gold_kind)


def take_references(dataset) -> tuple[Any, dict[str, Reference]]:
    """``dataset`` without its ``solution`` column, and every problem's :class:`Reference` by problem id (the id
    the rollout gives a row: its ``problem_id`` column, else a hash of its problem)."""
    if dataset is None:
        return None, {}
    has_solution = "solution" in dataset.column_names
    references = {}
    for row in dataset:
        pid, _ = problem_of(row)
        solution = row.get("solution") if has_solution else None
        solution = solution.strip() or None if isinstance(solution, str) else None
        references[pid] = Reference(str(row["answer"]), solution, row["gold_kind"])
    return (dataset.remove_columns("solution") if has_solution else dataset), references


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


# ---------------------------------------------------------------------------------------------------------------
# Solutions cut at their steps


def split_steps(solution: str) -> list[str]:
    """A worked solution's steps: its non-empty lines, or where it is one paragraph, its sentences (a full stop,
    question or exclamation mark followed by a space, never inside ``$...$`` math)."""
    lines = [line.strip() for line in solution.splitlines() if line.strip()]
    if len(lines) != 1:
        return lines
    text, steps, start, in_math = lines[0], [], 0, False
    for i, ch in enumerate(text):
        if ch == "$":
            in_math = not in_math
        elif ch in ".!?" and not in_math and i + 1 < len(text) and text[i + 1] == " ":
            steps.append(text[start : i + 1].strip())
            start = i + 1
    steps.append(text[start:].strip())
    return [step for step in steps if step]


def level_share(level: int, scale: float = 1.0) -> float:
    """The share of a solution's steps a hint level shows: level / (HINT_TOP + 1), times the anneal ``scale``."""
    return level / (HINT_TOP + 1) * scale


def solution_prefix(solution: str, share: float, problem: str | None = None) -> str | None:
    """The first ``round(share × steps)`` steps (half up), at most all but the last; None when that is none. For a
    code problem the steps are the solution's lines below what the problem already shows, indentation kept, in a
    fence."""
    code = problem is not None and is_code_problem(problem)
    steps = code_steps(problem, solution) if code else split_steps(solution)
    k = min(len(steps) - 1, int(len(steps) * share + 0.5))
    if k < 1:
        return None
    return fenced("\n".join(steps[:k])) if code else "\n".join(steps[:k])


def code_steps(problem: str, solution: str) -> list[str]:
    """A reference function's lines after those the problem states (its signature and docstring)."""
    shown = {line.strip() for line in problem.splitlines() if line.strip()}
    lines = [line.rstrip() for line in solution.splitlines() if line.strip()]
    start = 0
    while start < len(lines) and lines[start].strip() in shown:
        start += 1
    return lines[start:]


def reference_prompt(problem: str, solution: str | None, share: float) -> Messages | None:
    """The ``reference`` context: the problem and the first ``share`` of its solution's steps; None where the
    share holds no step (or there is no solution)."""
    prefix = solution_prefix(solution, share, problem) if solution else None
    return reference_messages(problem, prefix) if prefix else None


def judge_hint(text: str, answer: str, kind: GoldKind) -> tuple[str, str | None]:
    """What becomes of a hint the policy wrote: ``("used", hint)``, ``("unparsed", None)`` (the reference context
    stands in) or ``("states_answer", None)`` (dropped: the plain prompt)."""
    hint = parse_hint(text)
    if hint is None:
        return "unparsed", None
    return ("states_answer", None) if states_answer(hint, answer, kind) else ("used", hint)


def ground_truth(answer: str, kind: GoldKind) -> str:
    """The gold critique's statement of the truth: "the ground truth is X"; for a code problem (its gold a test
    suite), one of its tests."""
    if kind != "code":
        return f"the ground truth is {answer.strip()}"
    tests = CodeTests.from_gold(answer)
    if tests.cases:
        args, expected = tests.cases[0]
        return f"a test it must pass is: assert {tests.entry_point}({', '.join(map(repr, args))}) == {expected!r}"
    asserts = [line.strip() for line in tests.check.splitlines() if line.strip().startswith("assert ")]
    return f"a test it must pass is: {asserts[0]}" if asserts else "it must pass the problem's tests"


def states_answer(text: str, answer: str, kind: GoldKind) -> bool:
    """Whether ``text`` states ``answer`` in any form (``7`` as ``seven``, ``14/2``, ``\\frac{14}{2}``...), or
    states an answer at all ("the answer is", ``\\boxed``): the pool's lesson scrub. For a code problem (its gold
    a test suite), whether the hint holds code: a hint that writes the function gives the solution away."""
    if kind == "code":
        return holds_code(text, strict=True)
    return bool(ANSWER_STATEMENT.search(text)) or mentions_answer(text, answer)


# ---------------------------------------------------------------------------------------------------------------
# Hint levels across steps


@dataclass
class HintLadder:
    """Each problem's hint level across steps (SAGE's light variant): after a step in which at most ``up_at`` of
    its hinted rows were right it goes up one level, above ``down_at`` down one, within 1..HINT_TOP. ``adaptive``
    False keeps every problem at ``start``."""

    start: int = 1
    adaptive: bool = True
    up_at: float = 0.1
    down_at: float = 0.35
    levels: dict[str, int] = field(default_factory=dict)

    def level(self, problem_id: str) -> int:
        return self.levels.get(problem_id, self.start)

    def update(self, problem_id: str, accuracy: float) -> int:
        """Move ``problem_id`` by the accuracy of its hinted rows this step; returns its new level."""
        level = self.level(problem_id)
        if self.adaptive:
            if accuracy <= self.up_at:
                level = min(HINT_TOP, level + 1)
            elif accuracy > self.down_at:
                level = max(1, level - 1)
            self.levels[problem_id] = level
        return level

    def state_dict(self) -> dict:
        return {"levels": dict(self.levels)}

    def load_state_dict(self, state: Mapping) -> None:
        self.levels = {str(k): int(v) for k, v in (state.get("levels") or {}).items()}


@dataclass
class PrivilegedKit:
    """What the privileged sources hold, and only they: references by problem id, the hint ladder, the verifier
    (``right(references, texts, problems)``: which texts it credits) and the policy as a writer (``write(prompts)``:
    one text per prompt, for self-hints)."""

    references: Mapping[str, Reference]
    ladder: HintLadder
    right: Callable[[list[Reference], list[str], list[str]], list[bool]]
    write: Callable[[list[Messages]], list[str]] | None = None


def _level(kit: PrivilegedKit, request: FeedbackRequest) -> int:
    return request.level if request.level is not None else kit.ladder.level(request.problem_id)


def reference_context(kit: PrivilegedKit, request: FeedbackRequest, level: int) -> Feedback:
    """The ``reference`` context of a request at ``level``, or why there is none."""
    reference = kit.references.get(request.problem_id)
    if reference is None or not reference.solution:
        return Feedback(None, "no_solution")
    messages = reference_prompt(request.problem, reference.solution, level_share(level, request.scale))
    if messages is None:
        return Feedback(None, "annealed" if request.scale < 1.0 else "solution_too_short")
    return Feedback(messages, level=level)


class ReferenceSource(FeedbackSource):
    """``reference`` rows: the first part of the worked solution, at the problem's hint level."""

    kind = "reference"
    privileged = True
    leveled = True

    def __init__(self, kit: PrivilegedKit) -> None:
        self.kit = kit

    @classmethod
    def for_run(cls, kit: SourceKit) -> ReferenceSource:
        return cls(kit.privileged)

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        return [[reference_context(self.kit, r, _level(self.kit, r))] * r.rows for r in requests]


class GoldSource(ReflectionSource):
    """``gold`` rows: one of the group's own attempts (found as reflection finds them: ``reflection_source``), the
    verifier's verdict on it and the gold answer, then a request to solve again. No hint level."""

    kind = "gold"
    privileged = True

    def __init__(self, pool, mode: Attempts, kit: PrivilegedKit) -> None:
        super().__init__(pool, mode)
        self.kit = kit

    @classmethod
    def for_run(cls, kit: SourceKit) -> GoldSource:
        return cls(kit.pool, kit.args.attempts, kit.privileged)

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        shown: list[tuple[FeedbackRequest, str, Reference]] = []  # (request, attempt, reference) per row
        written: list[int | None] = []  # the step each shown attempt was written at
        missing: dict[int, str] = {}
        for n, request in enumerate(requests):
            reference = self.kit.references.get(request.problem_id)
            attempts = self.dated_attempts(request)
            if reference is None or not attempts:
                missing[n] = "no_answer" if reference is None else "no_attempt"
                continue
            shown += [(request, attempts[j % len(attempts)][0], reference) for j in range(request.rows)]
            written += [attempts[j % len(attempts)][1] for j in range(request.rows)]
        verdicts = iter(
            self.kit.right([a for _, _, a in shown], [t for _, t, _ in shown], [r.problem for r, _, _ in shown])
        )
        rows, steps = iter(shown), iter(written)
        built = []
        for n, request in enumerate(requests):
            if n in missing:
                built.append([Feedback(None, missing[n])] * request.rows)
                continue
            group = []
            for _ in range(request.rows):
                _, attempt, reference = next(rows)
                truth = ground_truth(reference.answer, reference.gold_kind)
                messages = gold_messages(request.problem, attempt, truth, next(verdicts))
                group.append(Feedback(messages, shown_step=next(steps)))
            built.append(group)
        return built


class SelfHintSource(FeedbackSource):
    """``self-hint`` rows: the policy writes one hint per group from the problem and its worked solution at the
    problem's level; every row of the group gets it. A hint stating the final answer is dropped (the rows fall back
    to the plain prompt); one that does not parse falls back to the ``reference`` context (both counted)."""

    kind = "self-hint"
    privileged = True
    collective = True
    leveled = True

    def __init__(self, kit: PrivilegedKit) -> None:
        if kit.write is None:
            raise ValueError("feedback_source self-hint needs the policy to write hints (PrivilegedKit.write).")
        self.kit = kit

    @classmethod
    def for_run(cls, kit: SourceKit) -> SelfHintSource:
        return cls(kit.privileged)

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        levels = [max(0, round(_level(self.kit, r) * r.scale)) for r in requests]
        references = [self.kit.references.get(r.problem_id) for r in requests]
        asked = [
            n for n, (ref, level) in enumerate(zip(references, levels)) if ref is not None and ref.solution and level
        ]
        prompts = [self_hint_messages(requests[n].problem, references[n].solution, levels[n]) for n in asked]
        written = dict(zip(asked, self.kit.write(prompts)))  # every process writes, with or without prompts
        built = []
        for n, request in enumerate(requests):
            built.append([self._context(request, references[n], levels[n], written.get(n), counts)] * request.rows)
        return built

    def _context(
        self, request: FeedbackRequest, reference: Reference | None, level: int, text: str | None, counts: Counter
    ) -> Feedback:
        if reference is None or not reference.solution:
            return Feedback(None, "no_solution")
        if level == 0:
            return Feedback(None, "annealed")
        counts["self_hint_written"] += 1
        outcome, hint = judge_hint(text or "", reference.answer, reference.gold_kind)
        if outcome == "unparsed":
            counts["self_hint_unparsed"] += 1
            return reference_context(self.kit, request, level)
        if outcome == "states_answer":
            counts["self_hint_states_answer"] += 1
            return Feedback(None, "hint_states_answer")
        return Feedback(hinted_messages(request.problem, hint), level=level)


def hint_reliance(plain: Sequence[float], hinted: Sequence[float]) -> float:
    """HiLL's hint reliance of one rollout y drawn under a hint h: mean per-token log π(y|x,h) minus mean per-token
    log π(y|x) (the no-hint negative log-likelihood minus the hinted one). Near 0, the policy would write y without
    the hint too: hinted success can transfer; large, y leans on the hint."""
    if not plain or len(plain) != len(hinted):
        raise ValueError("hint_reliance needs one value per token of both log-probabilities.")
    return sum(hinted) / len(hinted) - sum(plain) / len(plain)
