"""Running a command as a plain user would: root passes every permission check (its DAC override), so a test of
an unreadable file run as root must drop that override or it sees nothing (round three's rule)."""

from __future__ import annotations

import os
import shutil

import pytest


def as_user() -> list[str]:
    """The prefix that runs a command without root's DAC override (nothing when not root); skips the test where
    util-linux's setpriv is absent, since root would then read a mode-000 file and the refusal could not be seen."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is absent: root reads a mode-000 file, so the refusal cannot be seen")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
