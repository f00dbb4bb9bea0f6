"""Question 2's verbs as library functions: each takes what it works on (a config, a loaded model, a
checkpoint folder) and its Options, writes nothing, and returns a result the CLI saves and prints
(`headscope.options.Result`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..artifacts import KV_CSV, KV_JSON, write_csv
from ..io import atomic_write_text
from ..options import Result
from ..provenance import config_fingerprint, provenance, shape_record
from .conversions import ConversionResult, gqa, mla  # the conversions' verbs, in their own module
from .kv_bytes import DTYPE_BITS, attention_shape, classic_rows, human_bytes, layouts, load_config, normalize_dtype
from .kvcache_verb import KvcacheResult, kvcache  # noqa: F401  (the head-aware cache's verb, in its own module)
from .options import KvOptions
from .reports import KvRow
from .sweep_verb import SweepResult, sweep  # noqa: F401  (the sweep's verb, in its own module)

UNITS = "Units are binary: 1 KiB = 1024 bytes, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB."
KV_COLUMNS = KV_CSV.columns()


@dataclass
class KvResult(Result):
    """KV-cache bytes of a model's layouts and of the classic configs: kv.csv and kv.json."""

    rows: list[KvRow]
    printed: list[str]
    provenance: dict[str, Any]
    files = (KV_CSV.name, KV_JSON.name)

    def records(self) -> list[dict[str, Any]]:
        """kv.csv's rows as JSON objects, their keys in the order the calculator gave them."""
        return [r.to_json() for r in self.rows]

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.records())

    def write(self, folder: Path) -> None:
        write_csv(folder, KV_CSV, self.records(), KV_COLUMNS)  # rows also hold `key` (classic configs): not a column
        atomic_write_text(folder / KV_JSON.name, json.dumps({"provenance": self.provenance}, indent=1) + "\n")

    def lines(self) -> list[str]:
        return list(self.printed)


def kv(model: Any = None, options: KvOptions | None = None, **changes: Any) -> KvResult:
    """`headscope kv`: KV-cache bytes per token, per sequence and per batch.

    `model`: a built-in name, a model directory, a config.json (only the config is read), or None with
    `classic=True`. Keywords override single options: `kv("smollm2", max_length=8192)`.
    """
    opts = (options or KvOptions()).replace(**changes)
    if model is not None:
        opts = opts.replace(model=str(model))
    opts.validate()
    dtype = normalize_dtype(opts.cache_dtype)
    printed: list[str] = []
    rows: list[KvRow] = []
    model_info = None
    if opts.model is not None:
        config = load_config(opts.model)
        shape = attention_shape(config)
        # kv reads a config only: its provenance fingerprints the config (no weights are loaded).
        model_info = {"name": str(opts.model), "model_type": shape.model_type,
                      "shape": shape_record(shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.d_head),
                      "config_sha256": config_fingerprint(config), "fingerprint": None}
        found = [KvRow.from_json({"source": "model", "note": shape.note, **r})
                 for r in layouts(shape, opts.max_length, opts.batch_size, dtype, opts.kv_head_counts())]
        printed += _model_lines(shape, found, opts, dtype)
        rows += found
    if opts.classic:
        classic = [KvRow.from_json({"source": "classic", **r})
                   for r in classic_rows(opts.max_length, opts.batch_size, dtype)]
        if opts.model is not None:
            printed.append("")
        printed.append(f"Classic configs, own layout, {dtype}, {opts.max_length} tokens per sequence, "
                       f"batch of {opts.batch_size}:")
        printed += _classic_table(classic, opts.max_length, opts.batch_size) + [UNITS]
        rows += classic
    prov = provenance("kv", options=opts.with_only(), model_info=model_info)
    return KvResult(rows=rows, printed=printed, provenance=prov)


def _model_lines(shape: Any, rows: list[KvRow], opts: KvOptions, dtype: str) -> list[str]:
    out = [f"{shape.name} ({shape.model_type}): {shape.n_layers} layers, {shape.n_heads} query heads, "
           f"{shape.n_kv_heads} KV heads ({shape.layout}), d_head {shape.d_head}; "
           f"cache dtype {dtype} ({DTYPE_BITS[dtype]} bits)"]
    out += _layout_table(rows, opts.max_length, opts.batch_size)
    legend = ("layers x latent numbers x bytes (see the note)" if shape.latent is not None else
              "2 (K,V) x layers x KV heads x d_head x bytes")
    out.append(f"* = the model's own layout; bytes/token = {legend}. " + UNITS)
    if shape.n_sliding_layers:
        windows = sorted({w for w in shape.windows if w is not None})
        out.append(f"{shape.n_sliding_layers} of {shape.n_layers} layers slide over {', '.join(map(str, windows))} "
                   f"tokens and hold at most that many: counted in the per-sequence totals; bytes/token is the cost "
                   f"before the windows fill.")
    if shape.note:
        out.append(f"note: {shape.note}")
    return out


def _layout_table(rows: list[KvRow], seq: int, batch: int) -> list[str]:
    head = (f"{'layout':<7}{'kv heads':>9}{'group':>7}{'bytes/token':>14}{f'per seq ({seq} tok)':>22}"
            f"{f'batch of {batch}':>14}{'vs MHA':>8}")
    lines = [head]
    for r in rows:
        mark = " *" if r.is_model else "  "
        lines.append(f"{r.layout + mark:<7}{r.n_kv_heads:>9}{r.group_size:>7}"
                     f"{human_bytes(r.bytes_per_token):>14}{human_bytes(r.bytes_per_sequence):>22}"
                     f"{human_bytes(r.cache_bytes):>14}{r.vs_mha:>8.2f}")
    return lines


def _classic_table(rows: list[KvRow], seq: int, batch: int) -> list[str]:
    w = max(len(r.name) for r in rows) + 2
    k = max(len(r.key or "") for r in rows) + 2
    lines = [
        f"{'model':<{w}}{'key':<{k}}{'layers':>6}{'heads':>6}{'kv':>4}{'d_head':>7}  {'layout':<7}{'bytes/token':>12}"
        f"{f'per seq ({seq})':>17}{f'batch of {batch}':>14}"
    ]
    for r in rows:
        lines.append(
            f"{r.name:<{w}}{r.key or '':<{k}}{r.n_layers:>6}{r.n_heads:>6}{r.n_kv_heads:>4}{r.d_head:>7}  "
            f"{r.layout:<7}{human_bytes(r.bytes_per_token):>12}"
            f"{human_bytes(r.bytes_per_sequence):>17}{human_bytes(r.cache_bytes):>14}"
        )
    notes = [f"  {r.name}: {r.note}" for r in rows if r.note]
    windows = [f"  {r.name}: {r.n_sliding_layers} of {r.n_layers} layers use a sliding window"
               for r in rows if r.n_sliding_layers]
    return lines + (["notes:"] + notes + windows if notes or windows else [])

__all__ = ["ConversionResult", "KvResult", "gqa", "kv", "mla"]
