"""The package version and the versions of what produced a result (recorded in every output's metadata)."""

from __future__ import annotations

import platform

import torch
import transformers

__version__ = "0.1.0"


def versions() -> dict[str, str]:
    """headscope, torch, transformers and Python versions, for an output's provenance."""
    return {"headscope": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}
