"""Question 2's KV-cache table: kv.csv when `headscope kv` wrote one, else the same calculator run here."""

from __future__ import annotations

from typing import Any

from ..artifacts import KV_CSV
from ..capacity import kv_bytes as kvmod
from ..errors import HeadscopeError
from .sources import Part, Sources, clean

# The kv.csv columns the page shows, in this order; byte counts appear once each, in binary units
# (bytes_per_token and bytes_per_sequence become "per token" and "per sequence"), vs_mha as a ratio.
SHOWN = ("source", "name", "layout", "n_layers", "n_heads", "n_kv_heads", "d_head", "dtype", "per token",
         "seq_len", "per sequence", "vs MHA", "note")
SEQ_LEN, DTYPE = 4096, "bf16"  # what the table shows when it is computed here


def kv_view(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """kv.csv rows as the page shows them: SHOWN columns, each quantity once and formatted (sizes in binary
    units, the ratio to MHA as 0.33x), the model's own layout marked."""
    out = []
    for r in rows:
        v = {c: r.get(c) for c in SHOWN}
        v["per token"] = kvmod.human_bytes(r["bytes_per_token"])
        v["per sequence"] = kvmod.human_bytes(r["bytes_per_sequence"])
        ratio = r.get("vs_mha")
        v["vs MHA"] = f"{float(ratio):.2f}x" if isinstance(ratio, (int, float)) else ratio
        if r["is_model"] and r["source"] == "model":
            v["layout"] = f"{r['layout']} (this model)"
        out.append(v)
    return list(SHOWN), out


def computed_rows(meta: dict[str, Any], config: Any) -> list[dict[str, Any]]:
    """kv.csv's rows for this model (its layouts, then the classic configs), computed with
    headscope.capacity.kv_bytes."""
    cfg = config if config is not None else {
        "_name": meta.get("model", "model"), "model_type": meta.get("model_type", "model"),
        "num_hidden_layers": meta["n_layers"], "num_attention_heads": meta["n_heads"],
        "num_key_value_heads": meta["n_kv_heads"], "head_dim": meta["d_head"],
        "hidden_size": meta["n_heads"] * meta["d_head"]}
    # The model by its name (a built-in's config names its site-packages folder, which says nothing).
    name = meta.get("model")
    rows = [{"source": "model", **r, **({"name": str(name)} if name else {})}
            for r in kvmod.layouts(cfg, SEQ_LEN, 1, DTYPE)]
    return rows + [{"source": "classic", **r} for r in kvmod.classic_rows(SEQ_LEN, 1, DTYPE)]


def kv_part(src: Sources, meta: dict[str, Any], config: Any = None) -> Part:
    """The KV table and a sentence on this model's cache per token."""
    part = Part()
    t = src.csv(KV_CSV.name)
    if t is not None:
        for r in t.rows:
            r["is_model"] = str(r["is_model"]).lower() == "true"  # CSV holds True/False as text
        rows, source = t.rows, f"from {t.path.name} (headscope kv)"
    elif KV_CSV.name in src.problems or not all(isinstance(meta.get(k), int)
                                                 for k in ("n_layers", "n_heads", "n_kv_heads", "d_head")):
        part.missing["kv"] = src.note(KV_CSV.name)
        return part
    else:
        try:
            rows = [clean(r) for r in computed_rows(meta, config)]
        except HeadscopeError as e:
            # a config the calculator cannot read: say so, keep the page
            part.missing["kv"] = f"{src.note(KV_CSV.name)}; computing it here failed: {e}"
            return part
        source = f"computed here with headscope.capacity.kv_bytes ({DTYPE} cache, {SEQ_LEN}-token sequence, batch 1)"
    columns, shown = kv_view(rows)
    part.data["kv"] = {"columns": columns, "rows": shown, "source": source}
    mine = next((r for r, v in zip(rows, shown, strict=True) if "(this model)" in str(v["layout"])), None)
    n_kv, n_heads = meta.get("n_kv_heads"), meta.get("n_heads")
    if mine is not None and isinstance(n_kv, int) and isinstance(n_heads, int):
        s = (f"This model caches {mine['bytes_per_token'] / 1024:.1f} KiB of {mine['dtype']} keys and values per "
             f"token ({n_kv} KV heads for {n_heads} query heads")
        s += ", i.e. plain multi-head attention)." if n_kv == n_heads else \
            f"; as plain MHA it would need {n_heads // n_kv}x as much)."
        part.say("q2", s)
    return part
