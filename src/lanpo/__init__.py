"""lanpo: LANPO (Language-And-Numerical Policy Optimization, arXiv 2510.16552) on top of TRL.

Importing ``lanpo`` is cheap; the heavy parts (torch, transformers, TRL) load when first used.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Problem": "data.loaders",
    "load_problems": "data.loaders",
    "load_model": "engine.models",
    "resolve_model_path": "engine.models",
    "MathVerifier": "verify.rewards",
    "extract_answer": "verify.answers",
    "make_accuracy_reward": "verify.rewards",
    "ExperiencePool": "pool.store",
    "PoolEntry": "pool.store",
    "build_reflection_prompt": "feedback",
    "build_abstraction_prompt": "feedback",
    "Retriever": "pool.retrieval",
    "LanpoConfig": "config",
    "LanpoTrainer": "trainer",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'lanpo' has no attribute {name!r}")


__all__ = ["__version__", *_EXPORTS]
