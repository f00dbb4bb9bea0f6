"""The per-item arrays that go beside compare.json, in compare_items.npz: those with more than one value per item.

compare.json keeps each row's per-item sums of both models. Most are one number per item (`nll` and `n` per passage,
`v` per pair or haystack) and stay there as JSON lists. The role census rows (`roles:<role>`) keep a sum per item and
head (`[items, layers, heads]`, or `[items, 1, 1]` for a sum the same on every head): written one number per line,
they made compare.json 11 MB on SmolLM2. Every array with more than one dimension is therefore written, as float64
(exact), to compare_items.npz under the key `<capability>/<base|other>/<sum>`; compare.json holds in its place a
reference naming the file, the key, the shape and the sha256 of the array's float64 bytes:

    "previous_token_score": {"in": "compare_items.npz", "key": "roles:previous_token/base/previous_token_score",
                             "shape": [32, 30, 9], "sha256": "..."}

A compare without such arrays writes no npz and the same compare.json as before it existed. `--base-from` reads a
reference back through `load` and checks its shape and digest, so an npz from another run is never taken for this
one's. The in-memory record (`CompareResult.record`, `per_item`) keeps every array: only the writing moves them.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import COMPARE_ITEMS_NPZ, COMPARE_JSON
from ..io import inside
from ..options import OptionError

__all__ = ["Reference", "load", "npz_bytes", "split"]

Reference = dict[str, Any]  # {"in", "key", "shape", "sha256"}
_REFERENCE_KEYS = ("in", "key", "shape", "sha256")


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr, dtype=np.float64).tobytes()).hexdigest()


def _reference(key: str, arr: np.ndarray) -> Reference:
    return {"in": COMPARE_ITEMS_NPZ.name, "key": key, "shape": list(arr.shape), "sha256": _digest(arr)}


def split(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """compare.json's object (`CompareRecord.to_json()`) with every per-item array of more than one dimension replaced
    by its reference, and those arrays (float64) by npz key. With none, `record` itself and {}: compare.json is then
    written exactly as before compare_items.npz existed."""
    arrays: dict[str, np.ndarray] = {}
    rows: dict[str, Any] = {}
    for capability, row in record["rows"].items():
        items: dict[str, dict[str, Any]] = {}
        for side, sums in row["items"].items():  # side: base, other
            items[side] = {}
            for name, values in sums.items():
                arr = np.asarray(values, dtype=np.float64)
                if arr.ndim > 1:
                    key = f"{capability}/{side}/{name}"
                    arrays[key] = arr
                    items[side][name] = _reference(key, arr)
                else:
                    items[side][name] = values
        rows[capability] = {**row, "items": items}
    if not arrays:
        return record, {}
    return {**record, "rows": rows}, arrays


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """compare_items.npz: one float64 array per key, deflated, with fixed zip timestamps (the same arrays give the same
    bytes)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key, arr in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w") as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arr, dtype=np.float64), allow_pickle=False)
    return buf.getvalue()


def _is_reference(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == set(_REFERENCE_KEYS) and value["in"] == COMPARE_ITEMS_NPZ.name
            and isinstance(value["key"], str) and isinstance(value["sha256"], str)
            and isinstance(value["shape"], list) and all(isinstance(n, int) for n in value["shape"]))


def load(folder: str | Path, value: Any, where: str) -> np.ndarray:
    """One per-item array of an earlier compare in `folder` (the `base_from` option): a JSON list as it stands, a
    reference read from compare_items.npz beside compare.json and checked against its shape and digest. `where`
    names the array in messages (`roles:induction's base sums`). Refused (an OptionError on base_from, one line)
    when the reference is malformed, the npz is missing or unreadable, or it does not hold the array named."""
    source = f"'{Path(folder) / COMPARE_JSON.name}'"
    if not isinstance(value, dict):
        return np.asarray(value, dtype=np.float64)
    if not _is_reference(value):
        raise _refused(f"{source} names {where} with a malformed reference ({value!r}); it needs "
                       f"{', '.join(_REFERENCE_KEYS)} (what headscope compare writes)")
    path = inside(folder, COMPARE_ITEMS_NPZ.name, source, "copy the compare folder whole, with its own files",
                  fields=("base_from",))
    if not path.is_file():
        raise _refused(f"{source} keeps {where} in {COMPARE_ITEMS_NPZ.name}, which '{folder}' lacks: copy the "
                       f"compare folder whole, or drop base_from to measure BASE again")
    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:  # our handle: closed when np.load fails
            arr = np.asarray(z[value["key"]], dtype=np.float64) if value["key"] in z.files else None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise _refused(f"'{path}' cannot be read ({type(e).__name__}: {e}): rerun the compare that wrote it, or "
                       f"drop base_from to measure BASE again") from None
    if arr is None or list(arr.shape) != value["shape"] or _digest(arr) != value["sha256"]:
        what = "holds no array" if arr is None else "holds another array under"
        raise _refused(f"'{path}' {what} {value['key']!r} ({where}, shape {value['shape']}, as {COMPARE_JSON.name} "
                       f"names it): the npz is another run's; rerun the compare that wrote the folder, or drop "
                       f"base_from to measure BASE again")
    return arr


def _refused(problem: str) -> OptionError:
    """A base_from folder whose arrays cannot be read back (the problem names base_from again: said as its flag)."""
    return OptionError("base_from", problem, also=("base_from",))
