"""The report's "where these numbers come from" panel: each file's verb, model and data.

`mixing.check_one_model` has already refused files from another model. Files from the same model can
still come from different data (analyze on 8 passages, roles on 4): each file's data record is shown,
and files of one question that were computed on different passages are said up front, so no number
is read as if it came from data it did not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .sources import Part, Sources

__all__ = ["provenance_part", "data_label"]

COLUMNS = ["file", "verb", "model", "fingerprint", "data", "passages", "data sha256", "headscope"]


def data_label(data: Mapping[str, Any] | None) -> str:
    """`source, N passages` of a provenance data record, or `?`."""
    if not data:
        return "?"
    return f"{data.get('source', '?')}, {data.get('passages', '?')} passages"


def _row(name: str, path: Any, rec: Mapping[str, Any] | None) -> dict[str, Any]:
    if rec is None:
        return {"file": str(path), "verb": "?", "model": "(provenance not recorded)", "fingerprint": None,
                "data": None, "passages": None, "data sha256": None, "headscope": None}
    model = rec.get("model") or {}
    data = rec.get("data") or {}
    fp = model.get("fingerprint") or model.get("config_sha256")
    return {"file": str(path), "verb": rec.get("verb"), "model": model.get("name"),
            "fingerprint": str(fp)[:12] if fp else None, "data": data.get("source"),
            "passages": data.get("passages"), "data sha256": str(data["sha256"])[:12] if data.get("sha256") else None,
            "headscope": (rec.get("versions") or {}).get("headscope")}


def different_data(records: Mapping[str, Mapping[str, Any] | None], names: list[str]) -> str | None:
    """A sentence naming the files among `names` whose data records differ (by hash), or None."""
    seen = {n: rec["data"] for n in names if (rec := records.get(n)) and rec.get("data")}
    hashes = {d.get("sha256") for d in seen.values()}
    if len(hashes) < 2:
        return None
    listed = "; ".join(f"{n}: {data_label(d)} (sha256 {str(d.get('sha256'))[:12]})" for n, d in seen.items())
    return (f"these files were computed on different data, so their numbers describe different passages: "
            f"{listed}. Rerun them on one --data to compare them head for head.")


def provenance_part(src: Sources, records: Mapping[str, Mapping[str, Any] | None]) -> Part:
    """A panel listing every found file's provenance, and a problem line where data differ."""
    part = Part()
    rows = [_row(n, src.found[n], records.get(n)) for n in sorted(records)]
    if rows:
        part.panel("about", "Where these numbers come from", COLUMNS, rows,
                   text=["Each file the report read, with the verb, model and data that produced it "
                         "(from the provenance record in the verb's JSON)."])
    # Question 1's per-head tables are shown side by side on one grid: they must describe the same text.
    q1 = [n for n in records if n in ("heads.csv", "roles.csv")]
    why = different_data(records, q1)
    if why:
        part.data["data_mismatch"] = why
    return part
