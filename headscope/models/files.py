"""Checks of a model folder's files before transformers reads them: a damaged file is a user's error, named."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ..errors import HeadscopeError


def check_safetensors(path: Path) -> None:
    """Refuse a .safetensors file whose header does not parse or whose tensors run past its end (a truncated
    copy or download), naming the file and its sizes; reads the header only."""
    size = path.stat().st_size
    redo = "copy or save it again (save_pretrained), or give another model"
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                raise ValueError(f"its header claims {n:,} bytes")
            header = json.loads(f.read(n))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise HeadscopeError(f"{str(path)!r} is not a readable safetensors file ({size:,} bytes; {e}); "
                             f"{redo}") from None
    if 8 + n + end > size:
        raise HeadscopeError(f"{str(path)!r} is truncated: it holds {size:,} bytes but its tensors need "
                             f"{8 + n + end:,}; {redo}")


def check_weight_files(folder: Path) -> None:
    """Every .safetensors file of a model folder checked (see `check_safetensors`)."""
    for f in sorted(folder.glob("*.safetensors")):
        check_safetensors(f)


def check_head_geometry(config: dict[str, Any], name: str) -> None:
    """Refuse a config whose attention heads do not divide its hidden size (and which gives no head_dim),
    before a model is built from it."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    d, h = text.get("hidden_size"), text.get("num_attention_heads")
    if not isinstance(d, int) or not isinstance(h, int) or text.get("head_dim") is not None:
        return
    if h < 1:
        raise HeadscopeError(f"{name!r}: num_attention_heads is {h} in its config.json; it must be at least 1")
    if d % h:
        divisors = [k for k in range(1, min(d, 64) + 1) if d % k == 0]
        raise HeadscopeError(f"{name!r}: hidden_size {d} is not divisible by num_attention_heads {h} and the config "
                             f"gives no head_dim; use a head count that divides it (e.g. "
                             f"{', '.join(map(str, divisors[-4:]))}) or add head_dim")
