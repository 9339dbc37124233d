"""The feedback sources a run can ask, by the row kind each fills: a new source is a module beside this one and one
line here, or :func:`register` from anywhere (which adds its kind to :data:`lanpo.plan.KINDS`, so that
``feedback_source <kind>`` gives it a group's feedback rows).

``feedback_source self`` asks LANPO's label-free sources (reflection, abstraction); each privileged source
(:mod:`lanpo.feedback.privileged`) is a ``feedback_source`` of its own, and a ``self`` run never builds one.
"""

from __future__ import annotations

from lanpo.feedback.abstraction import AbstractionSource
from lanpo.feedback.base import FeedbackSource, SourceKit
from lanpo.feedback.execution import ExecutionSource
from lanpo.feedback.privileged import GoldSource, ReferenceSource, SelfHintSource
from lanpo.feedback.reflection import ReflectionSource
from lanpo.plan import FeedbackKind, register_kind

# Asked in this order within a step (abstraction first: its retrieval does not wait for any generation).
SOURCES: dict[str, type[FeedbackSource]] = {
    AbstractionSource.kind: AbstractionSource,
    ReflectionSource.kind: ReflectionSource,
    ReferenceSource.kind: ReferenceSource,
    GoldSource.kind: GoldSource,
    SelfHintSource.kind: SelfHintSource,
    ExecutionSource.kind: ExecutionSource,
}


def register(source: type[FeedbackSource]) -> type[FeedbackSource]:
    """Add a feedback source, and its row kind to the plan's (:func:`lanpo.plan.register_kind`): ``feedback_source
    <its kind>`` then gives it every feedback row of a group. Usable as a class decorator."""
    if SOURCES.get(source.kind, source) is not source:
        raise ValueError(f"feedback kind {source.kind!r} has a source already: {SOURCES[source.kind].__name__}.")
    reads_attempts = issubclass(source, ReflectionSource)  # it shows the problem's own attempts as reflection does
    register_kind(FeedbackKind(source.kind, privileged=source.privileged, reads_attempts=reads_attempts))
    SOURCES[source.kind] = source
    return source


def make_sources(kit: SourceKit) -> dict[str, FeedbackSource]:
    """The sources a run asks, built for it, by the row kind each fills (``LanpoConfig.generated_kinds``:
    reflection and abstraction under ``feedback_source self``, else the one kind named; none when it only scores),
    in :data:`SOURCES`' order."""
    wanted = kit.args.generated_kinds
    return {kind: source.for_run(kit) for kind, source in SOURCES.items() if kind in wanted}
