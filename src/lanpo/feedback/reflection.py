"""Reward-agnostic reflection: the model's own earlier attempt(s) at the same problem, with no reward, no
correctness and no gold answer; it critiques them, then solves anew. The builder never receives the gold answer,
so no context can depend on it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource, SourceKit
from lanpo.feedback.labels import Context, template_talks_about_labels
from lanpo.plan import ATTEMPTS, Attempts
from lanpo.pool.store import ExperiencePool
from lanpo.prompts import clip, reflection_text, user


def build_reflection_prompt(problem: str, own_attempts: Sequence[str]) -> Context:
    """The reward-agnostic reflection prompt for ``problem`` given the model's own earlier attempt(s)."""
    attempts = [a for a in own_attempts if isinstance(a, str) and a.strip()]
    if not attempts:
        return Context(None, "no_attempt")
    text = reflection_text(problem, attempts)
    if template_talks_about_labels(text, [problem, *(clip(a) for a in attempts)]):
        return Context(None, "label_talk_in_template")
    return Context(user(text))


class ReflectionSource(FeedbackSource):
    """Reward-agnostic reflection rows: each shows one of the group's own attempts, ungraded.

    ``mode`` is ``reflection_source``: ``pool`` reflects on attempts stored in earlier steps, ``step`` on this
    step's scratch rollouts (the rollout asks again after generating them), ``auto`` on stored ones where the
    problem has some and on this step's otherwise; ``ahead`` as ``auto`` (the trainer stores attempts at the next
    step's problems a step early: :attr:`lanpo.rollout.StepContext.ahead`).
    """

    kind = "reflection"

    def __init__(self, pool: ExperiencePool, mode: Attempts = ATTEMPTS["auto"]) -> None:
        self.pool = pool
        self.mode = mode

    @classmethod
    def for_run(cls, kit: SourceKit) -> ReflectionSource:
        return cls(kit.pool, kit.args.attempts)

    def ready(self, request: FeedbackRequest) -> bool:
        if request.attempts is not None or not self.mode.this_step:
            return True
        return self.mode.stored and bool(self.pool.attempts(request.problem_id, limit=1))

    def own_attempts(self, request: FeedbackRequest) -> list[str]:
        """The group's own attempts handed over, else those stored for the problem, newest first (empty texts left
        out)."""
        return [text for text, _ in self.dated_attempts(request)]

    def dated_attempts(self, request: FeedbackRequest) -> list[tuple[str, int | None]]:
        """:meth:`own_attempts` with the step whose model wrote each (None where unknown: handed over without one)."""
        handed = [(a, request.step) for a in (request.attempts or ()) if a.strip()]
        return handed or [(a.text, a.step) for a in self.pool.attempts(request.problem_id) if a.text.strip()]

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        built = []
        for request in requests:
            attempts = self.dated_attempts(request)
            rows = []
            for j in range(request.rows):
                text, step = attempts[j % len(attempts)] if attempts else ("", None)
                context = build_reflection_prompt(request.problem, [text] if attempts else [])
                shown = step if context.messages is not None else None
                rows.append(Feedback(context.messages, context.reason, shown_step=shown))
            built.append(rows)
        return built
