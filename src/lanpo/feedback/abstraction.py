"""Relevant abstraction: principles and pitfalls of pool entries of *other* problems (never their solutions or
final answers); the model first analyzes which apply, then solves. Lessons were scrubbed of their own problem's
answer, in every equivalent form, when they were summarized (:func:`lanpo.feedback.labels.clean_lessons`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource, SourceKit
from lanpo.feedback.labels import Context, clean_lessons, template_talks_about_labels
from lanpo.pool.retrieval import Retriever
from lanpo.pool.store import PoolEntry
from lanpo.prompts import abstraction_text, user


def build_abstraction_prompt(problem: str, entries: Sequence[PoolEntry], problem_id: str | None = None) -> Context:
    """The relevant-abstraction prompt: principles and pitfalls of entries from *other* problems.

    Entries of the same problem (``problem_id``) are skipped; lessons that state an answer or talk about grades
    are dropped (entries may come from old or imported pools). ``None`` when nothing usable remains.
    """
    lessons = []
    used = []
    dropped = Counter()
    for entry in entries:
        if problem_id is not None and entry.problem_id == problem_id:
            dropped["same_problem"] += 1
            continue
        principles, d1 = clean_lessons(entry.principles)
        pitfalls, d2 = clean_lessons(entry.pitfalls)
        dropped += d1 + d2
        if principles or pitfalls:
            lessons.append((principles, pitfalls))
            if entry.id is not None:
                used.append(entry.id)
    if not lessons:
        return Context(None, "no_relevant_entry" if not entries else "no_usable_lesson", [], dropped)
    text = abstraction_text(problem, lessons)
    if template_talks_about_labels(text, [problem, *(x for pair in lessons for part in pair for x in part)]):
        return Context(None, "label_talk_in_template", [], dropped)
    return Context(user(text), "", used, dropped)


class AbstractionSource(FeedbackSource):
    """Relevant-abstraction rows: one retrieval per group (candidates, relevance ≥ γ, top-k); every abstraction
    row of a group gets the same context. ``judge`` gives the LLM relevance judge the full policy while it runs."""

    kind = "abstraction"

    def __init__(self, retriever: Retriever, judge: Callable[[], AbstractContextManager] | None = None) -> None:
        self.retriever = retriever
        self.judge = judge

    @property
    def collective(self) -> bool:
        """Where the relevance scorer's work is collective (the LLM judge on several processes), every process asks
        once a step, with or without abstraction rows of its own."""
        return self.retriever.scorer.collective

    @classmethod
    def for_run(cls, kit: SourceKit) -> AbstractionSource:
        return cls(kit.retriever, kit.judge)

    def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
        with self.judge() if self.judge is not None else nullcontext():
            found = self.retriever.retrieve_many([(r.problem_id, r.problem) for r in requests])
        withheld = self.retriever.withheld or [False] * len(found)
        # a ranking that learns from each entry's rows shows one lesson a row, so each row credits one entry;
        # similarity shows the group's top_k together to every row (the paper's abstraction)
        apart = self.retriever.ranking != "similarity"
        built = []
        for request, hits, none_helps in zip(requests, found, withheld):
            if none_helps:  # candidates, but the ranking expects none of them to help: the rows go plain
                built.append([Feedback(None, "nothing_expected_to_help")] * request.rows)
            elif apart and hits:
                built.append([self._feedback(request, [hits[k % len(hits)]], counts) for k in range(request.rows)])
            else:
                built.append([self._feedback(request, hits, counts)] * request.rows)
        return built

    @staticmethod
    def _feedback(request: FeedbackRequest, hits: list, counts: Counter) -> Feedback:
        """The abstraction context showing ``hits`` (lessons it had to drop counted)."""
        context = build_abstraction_prompt(request.problem, [h.entry for h in hits], problem_id=request.problem_id)
        counts["lessons_dropped"] += sum(n for why, n in context.dropped_lessons.items() if why != "same_problem")
        shown = tuple({"entry_id": h.entry.id, "relevance": round(float(h.relevance), 4)} for h in hits)
        return Feedback(context.messages, context.reason, shown)
