"""The report's guard against mixing models: every file it reads is checked against one model.

Each verb's JSON records the model that produced its files (`headscope.provenance`). The reference is
the model given to the report (its fingerprint), else the first file that records one. A file from
another model stops the report with an error naming both; nothing on the page is then labelled "this
model" unless it is. Files written before provenance was recorded are checked on what they hold (kv.csv's
own layout rows against the model's shape) and listed as "provenance not recorded".
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

from ..artifacts import ARTIFACTS, KV_CSV, provenance_file
from ..errors import HeadscopeError
from ..provenance import read_provenance, same_model
from .sources import READABLE, Sources

log = logging.getLogger(__name__)

__all__ = ["check_one_model", "read_provenance"]


def _label(rec: dict[str, Any] | None) -> str:
    m = (rec or {}).get("model") or {}
    fp = m.get("fingerprint") or m.get("config_sha256") or "?"
    return f"{m.get('name', '?')} (fingerprint {str(fp)[:12]})"


def _kv_rows_shape(path: Path) -> dict[str, int] | None:
    """The shape of kv.csv's own-layout row (legacy files without kv.json), or None."""
    try:
        with path.open(encoding="utf-8") as f:
            for r in csv.DictReader(f):
                if r.get("source") == "model" and str(r.get("is_model")).lower() == "true":
                    return {k: int(r[k]) for k in ("n_layers", "n_heads", "n_kv_heads", "d_head")}
    except (OSError, ValueError, KeyError):
        return None
    return None


def check_one_model(src: Sources, reference: dict[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    """Refuse files made from another model than `reference` (a provenance model record; None = the first
    file's); return each found file's provenance record (None where none was recorded)."""
    records: dict[str, dict[str, Any] | None] = {}
    for name, path in src.found.items():
        if ARTIFACTS[name].kind not in READABLE:
            continue
        pj = provenance_file(name)
        records[name] = read_provenance(path.with_name(pj)) if pj else None
    ref = reference
    ref_from = "the model given to the report"
    if ref is None:
        first = next(((n, r) for n, r in records.items() if r and r.get("model")), None)
        if first is not None:
            ref, ref_from = first[1]["model"], str(src.found[first[0]])
    if ref is None:
        return records
    wrong = [(n, r) for n, r in records.items() if r and same_model(r.get("model"), ref) is False]
    kv = src.found.get(KV_CSV.name)
    if kv is not None and records.get(KV_CSV.name) is None and ref.get("shape"):
        shape = _kv_rows_shape(kv)
        if shape is not None and shape != ref["shape"]:
            raise HeadscopeError(
                f"{kv} describes a model of {shape['n_layers']} layers x {shape['n_heads']} heads "
                f"({shape['n_kv_heads']} KV), not {ref.get('name')} ({ref['shape']['n_layers']} x "
                f"{ref['shape']['n_heads']}, {ref['shape']['n_kv_heads']} KV); the report does not mix models: "
                f"rerun kv on {ref.get('name')} or drop that folder from from_dirs", fields=("from_dirs",))
    if wrong:
        listed = "; ".join(f"{src.found[n]} is from {_label(r)}" for n, r in wrong)
        raise HeadscopeError(
            f"files from another model: {listed}; the report is for {_label({'model': ref})} (from {ref_from}). "
            f"The report does not mix models: give folders (from_dirs) made from one model, or report each "
            f"model into its own folder (out)", fields=("from_dirs", "out"))
    unknown = [n for n, r in records.items() if r is None and provenance_file(n)]
    if unknown:
        log.warning("no provenance recorded for %s (written before headscope recorded it); rerun their verbs "
                    "to check they match the model", ", ".join(str(src.found[n]) for n in unknown))
    return records
