"""``LANPO_BF16_MATMUL``, decoded once and without torch, so that every command that may run bf16 refuses a value it
does not know when it starts (before any model loads), on every CPU (:mod:`lanpo.engine.bf16_matmul` acts on it)."""

from __future__ import annotations

import os

ENV = "LANPO_BF16_MATMUL"  # "torch": keep torch's bf16 kernels where bf16 is emulated
CHOICES = {"": "lanpo's (the default)", "torch": "torch's own bf16 kernels", "fp32-accumulate": "lanpo's"}


def setting() -> str:
    """The variable's value, lower-cased: "" (unset), ``torch`` or ``fp32-accumulate``; anything else refused."""
    value = os.environ.get(ENV, "").strip().lower()
    if value not in CHOICES:
        raise ValueError(
            f"{ENV}={os.environ[ENV]!r}: say torch (torch's own bf16 kernels) or fp32-accumulate (lanpo's), or unset "
            "it."
        )
    return value
