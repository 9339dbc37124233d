"""Whether the code sandbox can run here: bubblewrap installed (``make test`` installs it where apt-get can)."""

from __future__ import annotations

import shutil

import pytest

HAS_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(
    not HAS_BWRAP,
    reason="bubblewrap is not installed (make test installs it where apt-get can): the sandbox is not tested",
)
