"""Language feedback: the sources that turn a step's feedback rows into contexts, label-free by construction.

* :mod:`lanpo.feedback.reflection` — **reward-agnostic reflection**: the model's own earlier attempt(s) at the
  same problem, with no reward, no correctness and no gold answer; it critiques them, then solves anew.
* :mod:`lanpo.feedback.abstraction` — **relevant abstraction**: principles and pitfalls of pool entries of
  *other* problems (never their solutions or final answers); it first analyzes which apply, then solves.
* :mod:`lanpo.feedback.labels` — what no context may say (label talk), and the lesson scrub.
* :mod:`lanpo.feedback.base` — the interface a source implements; :mod:`lanpo.feedback.registry` — the sources.
"""

from lanpo.feedback.abstraction import AbstractionSource, build_abstraction_prompt
from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource, SourceKit
from lanpo.feedback.labels import ANSWER_STATEMENT, LABEL_TALK, LABEL_TALK_PATTERNS, Context, clean_lessons
from lanpo.feedback.reflection import ReflectionSource, build_reflection_prompt
from lanpo.feedback.registry import SOURCES, make_sources

__all__ = [
    "ANSWER_STATEMENT",
    "LABEL_TALK",
    "LABEL_TALK_PATTERNS",
    "SOURCES",
    "AbstractionSource",
    "Context",
    "Feedback",
    "FeedbackRequest",
    "FeedbackSource",
    "ReflectionSource",
    "SourceKit",
    "build_abstraction_prompt",
    "build_reflection_prompt",
    "clean_lessons",
    "make_sources",
]
