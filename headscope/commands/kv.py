"""`headscope kv`: KV-cache bytes per token, per sequence and per batch for MHA / GQA / MQA layouts."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..artifacts import KV_CSV, KV_JSON, write_csv
from ..capacity.kv_bytes import (
    DTYPE_BITS,
    attention_shape,
    classic_rows,
    human_bytes,
    layouts,
    load_config,
    normalize_dtype,
)
from ..capacity.options import KvOptions
from ..errors import HeadscopeError
from ..io import atomic_write_text, prepare_out_dir, staged
from ..models.adapter import HeadModel
from ..options.cli import verb_parser
from ..provenance import config_fingerprint, provenance, shape_record

CSV_COLUMNS = KV_CSV.columns()
UNITS = "Units are binary: 1 KiB = 1024 bytes, 1 MiB = 1024 KiB, 1 GiB = 1024 MiB."


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "kv", KvOptions,
        help="KV-cache size of a model's MHA / GQA / MQA layouts, and of classic models",
        description="Bytes of KV cache per token, per sequence and per batch. MODEL is a built-in model "
                    "(minilm, smollm2; only its config is read), a model directory, a config.json, or a classic "
                    "config name (see --classic). " + UNITS,
    )
    p.set_defaults(func=run)


def _parse_kv_heads(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise HeadscopeError(f"--kv-heads must be comma-separated integers like 2,4; got {text!r}") from None


def _layout_table(rows: list[dict[str, Any]], seq: int, batch: int) -> list[str]:
    head = (f"{'layout':<7}{'kv heads':>9}{'group':>7}{'bytes/token':>14}{f'per seq ({seq} tok)':>22}"
            f"{f'batch of {batch}':>14}{'vs MHA':>8}")
    lines = [head]
    for r in rows:
        mark = " *" if r["is_model"] else "  "
        lines.append(f"{r['layout'] + mark:<7}{r['n_kv_heads']:>9}{r['group_size']:>7}"
                     f"{human_bytes(r['bytes_per_token']):>14}{human_bytes(r['bytes_per_sequence']):>22}"
                     f"{human_bytes(r['cache_bytes']):>14}{r['vs_mha']:>8.2f}")
    return lines


def _classic_table(rows: list[dict[str, Any]], seq: int, batch: int) -> list[str]:
    w = max(len(r["name"]) for r in rows) + 2
    k = max(len(r["key"]) for r in rows) + 2
    lines = [
        f"{'model':<{w}}{'key':<{k}}{'layers':>6}{'heads':>6}{'kv':>4}{'d_head':>7}  {'layout':<7}{'bytes/token':>12}"
        f"{f'per seq ({seq})':>17}{f'batch of {batch}':>14}"
    ]
    for r in rows:
        lines.append(
            f"{r['name']:<{w}}{r['key']:<{k}}{r['n_layers']:>6}{r['n_heads']:>6}{r['n_kv_heads']:>4}{r['d_head']:>7}  "
            f"{r['layout']:<7}{human_bytes(r['bytes_per_token']):>12}"
            f"{human_bytes(r['bytes_per_sequence']):>17}{human_bytes(r['cache_bytes']):>14}"
        )
    notes = [f"  {r['name']}: {r['note']}" for r in rows if r["note"]]
    windows = [f"  {r['name']}: {r['n_sliding_layers']} of {r['n_layers']} layers use a sliding window"
               for r in rows if r["n_sliding_layers"]]
    return lines + (["notes:"] + notes + windows if notes or windows else [])


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    dtype = normalize_dtype(args.cache_dtype)
    if args.model is None and not args.classic:
        raise HeadscopeError("give a MODEL (built-in name, model directory or config.json) or --classic")
    out = prepare_out_dir(args.out, args.force, [KV_CSV.name, KV_JSON.name]) if args.out else None
    bits = DTYPE_BITS[dtype]
    csv_rows: list[dict[str, Any]] = []
    model_info = None
    if args.model is not None:
        config = load_config(args.model)
        shape = attention_shape(config)
        # kv reads a config only: its provenance fingerprints the config (no weights are loaded).
        model_info = {"name": str(args.model), "model_type": shape.model_type,
                      "shape": shape_record(shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.d_head),
                      "config_sha256": config_fingerprint(config), "fingerprint": None}
        rows = layouts(shape, args.max_length, args.batch_size, dtype, _parse_kv_heads(args.kv_heads))
        print(f"{shape.name} ({shape.model_type}): {shape.n_layers} layers, {shape.n_heads} query heads, "
              f"{shape.n_kv_heads} KV heads ({shape.layout}), d_head {shape.d_head}; "
              f"cache dtype {dtype} ({bits} bits)")
        print("\n".join(_layout_table(rows, args.max_length, args.batch_size)))
        legend = ("layers x latent numbers x bytes (see the note)" if shape.latent is not None else
                  "2 (K,V) x layers x KV heads x d_head x bytes")
        print(f"* = the model's own layout; bytes/token = {legend}. " + UNITS)
        if shape.n_sliding_layers:
            windows = sorted({w for w in shape.windows if w is not None})
            print(f"{shape.n_sliding_layers} of {shape.n_layers} layers slide over {', '.join(map(str, windows))} "
                  f"tokens and hold at most that many: counted in the per-sequence totals; bytes/token is the cost "
                  f"before the windows fill.")
        if shape.note:
            print(f"note: {shape.note}")
        csv_rows += [{"source": "model", "note": shape.note, **r} for r in rows]
    if args.classic:
        rows = classic_rows(args.max_length, args.batch_size, dtype)
        if args.model is not None:
            print()
        print(f"Classic configs, own layout, {dtype}, {args.max_length} tokens per sequence, "
              f"batch of {args.batch_size}:")
        print("\n".join(_classic_table(rows, args.max_length, args.batch_size)))
        print(UNITS)
        csv_rows += [{"source": "classic", **r} for r in rows]
    if out is not None:
        prov = provenance("kv", options=args, model_info=model_info)
        with staged(out, args.force) as stage:  # both files appear together, or neither
            write_csv(stage, KV_CSV, csv_rows, CSV_COLUMNS)  # rows also hold `key` (classic configs): not a column
            atomic_write_text(stage / KV_JSON.name, json.dumps({"provenance": prov}, indent=1) + "\n")
        print(f"wrote {out / KV_CSV.name} and {out / KV_JSON.name}")
    return 0
