"""The feedback sources a run can ask, by the row kind each fills: a new source is a module beside this one and one
line here (its kind in :data:`lanpo.plan.FEEDBACK_KINDS`, so that the group plan gives it rows)."""

from __future__ import annotations

from lanpo.feedback.abstraction import AbstractionSource
from lanpo.feedback.base import FeedbackSource, SourceKit
from lanpo.feedback.reflection import ReflectionSource

# Asked in this order within a step (abstraction first: its retrieval does not wait for any generation).
SOURCES: dict[str, type[FeedbackSource]] = {
    AbstractionSource.kind: AbstractionSource,
    ReflectionSource.kind: ReflectionSource,
}


def make_sources(kit: SourceKit) -> dict[str, FeedbackSource]:
    """Every source, built for a run, by the row kind it fills."""
    return {kind: source.for_run(kit) for kind, source in SOURCES.items()}
