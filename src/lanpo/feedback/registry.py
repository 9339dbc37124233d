"""The feedback sources a run can ask, by the row kind each fills: a new source is a module beside this one and one
line here (its kind in :data:`lanpo.plan.FEEDBACK_KINDS`, so that the group plan gives it rows).

``feedback_source self`` asks LANPO's label-free sources (reflection, abstraction); each privileged source
(:mod:`lanpo.feedback.privileged`) is a ``feedback_source`` of its own, and a ``self`` run never builds one.
"""

from __future__ import annotations

from lanpo.feedback.abstraction import AbstractionSource
from lanpo.feedback.base import FeedbackSource, SourceKit
from lanpo.feedback.privileged import GoldSource, ReferenceSource, SelfHintSource
from lanpo.feedback.reflection import ReflectionSource

# Asked in this order within a step (abstraction first: its retrieval does not wait for any generation).
SOURCES: dict[str, type[FeedbackSource]] = {
    AbstractionSource.kind: AbstractionSource,
    ReflectionSource.kind: ReflectionSource,
    ReferenceSource.kind: ReferenceSource,
    GoldSource.kind: GoldSource,
    SelfHintSource.kind: SelfHintSource,
}


def make_sources(kit: SourceKit) -> dict[str, FeedbackSource]:
    """The sources a run asks, built for it, by the row kind each fills: reflection and abstraction under
    ``feedback_source self``, else the one privileged source named."""
    chosen = kit.args.feedback_source
    if kit.args.feedback_route == "score":  # every row is a plain rollout: no source writes a context to generate under
        return {}
    kinds = [k for k, source in SOURCES.items() if not source.privileged] if chosen == "self" else [chosen]
    return {kind: SOURCES[kind].for_run(kit) for kind in kinds}
