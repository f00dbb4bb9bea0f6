"""BASE's measurements from an earlier comparison (`--base-from DIR`), so checking a second candidate against the same
BASE costs one model's forwards.

compare.json keeps each row's per-item sums of both models and a sha256 of the row's items (token ids, answers,
needle spans). A row's BASE side is taken from DIR only when DIR was measured on the same BASE weights (the
provenance fingerprint) and the row's items hash the same; any other row is measured again. JSON floats read back
exactly, and so do the float64 arrays compare_items.npz keeps beside compare.json (the role census's per-head sums,
`items`), so a reused row gives the same numbers as a fresh one.

A reused row whose arrays cannot be read back (compare_items.npz missing, unreadable, or another run's) is refused in
one line, before any forward, rather than measured again with a note: base_from asks to skip BASE's forwards, and a
folder missing half its files was copied or cleaned incompletely; measuring again would spend the minutes the user
asked to save and hide that, where the refusal names the file and the two ways on (copy the folder whole, or drop
base_from).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import COMPARE_JSON
from ..io import inside
from ..models.adapter import HeadModel
from ..options import OptionError
from .items import load


def read_base(folder: str | Path, base: HeadModel, fingerprint: str) -> dict[str, dict[str, Any]]:
    """The rows of an earlier compare.json in `folder` whose BASE was `base` (weights `fingerprint`): capability ->
    {"fingerprint", "metric", "items", ...}; refused (one line) when the file is missing or measured another BASE."""
    path = inside(folder, COMPARE_JSON.name, str(folder), "give the folder an earlier compare wrote",
                  fields=("base_from",))
    if not path.is_file():
        raise OptionError("base_from", f"'{folder}' holds no {COMPARE_JSON.name}: give the output folder of an "
                                       f"earlier headscope compare against the same BASE")
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise OptionError("base_from", f"'{path}' cannot be read as a compare.json ({type(e).__name__}: {e})") from None
    then = (rec.get("base") or {}) if isinstance(rec, dict) else {}
    if then.get("fingerprint") != fingerprint:
        raise OptionError("base_from", f"'{path}' measured another BASE ({then.get('name')!r}, weights "
                                       f"{str(then.get('fingerprint'))[:12]}) than {base.name} ({fingerprint[:12]})")
    rows = rec.get("rows") or {}
    return {name: r for name, r in rows.items() if isinstance(r, dict) and r.get("fingerprint") and r.get("items")}


def reused_items(earlier: dict[str, dict[str, Any]], capability: str, fingerprint: str, metric: str,
                 folder: str | Path) -> dict[str, np.ndarray] | None:
    """BASE's per-item sums of a row measured before on the same items (`folder`: where its compare.json is, for the
    arrays it keeps in compare_items.npz), or None."""
    r = earlier.get(capability)
    if r is None or r.get("fingerprint") != fingerprint or r.get("metric") != metric:
        return None
    return {k: load(folder, v, f"{capability}'s BASE sum {k}") for k, v in r["items"]["base"].items()}


__all__ = ["read_base", "reused_items"]
