"""Provenance: which verb, model, data, options and versions produced an output (one builder for every verb).

Every verb's JSON output carries `provenance(...)`; the report compares the records of the files it
reads and refuses to put one model's numbers beside another's.

The model fingerprint is cheap and deterministic, not a full weight hash: sha256 over the config
(sorted JSON, without keys that name paths or versions), then, for every parameter in name order,
its name, shape and dtype and the bytes of at most `SAMPLES` elements taken at evenly spaced flat
indices (always the first and the last). Two models differ in it unless they share the config, every
parameter's shape and the sampled values; a 135M-parameter model takes a few milliseconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .errors import HeadscopeError
from .models.dispatch import state_items
from .version import versions

__all__ = ["SAMPLES", "config_fingerprint", "data_fingerprint", "model_fingerprint", "model_record",
           "provenance", "same_model", "shape_record"]

SAMPLES = 256  # elements sampled per parameter tensor
# Config keys that change with where or how a model was saved, not with what it computes.
_VOLATILE = ("_name_or_path", "transformers_version", "_commit_hash", "torch_dtype", "dtype")


def config_fingerprint(config: Any) -> str:
    """sha256 of a config (a transformers config or a dict) as sorted JSON, without path/version keys."""
    d = config if isinstance(config, Mapping) else config.to_dict()
    d = {k: v for k, v in d.items() if k not in _VOLATILE}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def sample_indices(n: int, k: int = SAMPLES) -> torch.Tensor:
    """`min(k, n)` evenly spaced indices into n elements, first and last included, in exact integer
    arithmetic (a float32 linspace rounds indices past 2**24, e.g. to n itself for a 262k x 640 embedding)."""
    k = min(k, n)
    if k == 1:
        return torch.zeros(1, dtype=torch.long)
    return torch.arange(k, dtype=torch.long) * (n - 1) // (k - 1)


@torch.no_grad()
def model_fingerprint(model: torch.nn.Module, config: Any) -> str:
    """sha256 over the config fingerprint and every parameter's name, shape, dtype and sampled values."""
    h = hashlib.sha256(config_fingerprint(config).encode())
    for name, p in state_items(model):  # sorted by name; offloaded weights read one at a time
        flat = p.detach().reshape(-1)
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
        if flat.numel():
            idx = sample_indices(flat.numel())
            h.update(flat[idx.to(flat.device)].float().cpu().numpy().tobytes())
    return h.hexdigest()


def model_record(hm: Any) -> dict[str, Any]:
    """name, source, model_type, config and config+weights fingerprints of a loaded HeadModel."""
    return {"name": hm.name, "source": str(getattr(hm, "source", hm.name)), "model_type": hm.config.model_type,
            "shape": shape_record(hm.n_layers, hm.n_heads, hm.n_kv_heads, hm.d_head_record),
            # layers with no softmax heads (Qwen3.5's linear attention): every verb skipped them
            **({"layers_without_heads": hm.headless_layers} if getattr(hm, "headless_layers", None) else {}),
            "config_sha256": config_fingerprint(hm.config), "fingerprint": model_fingerprint(hm.model, hm.config)}


def shape_record(n_layers: int, n_heads: int, n_kv_heads: int, d_head: int | list[int]) -> dict[str, Any]:
    """The attention shape a record can be compared on when no weights were read (kv reads a config only);
    `d_head` one per layer where the layers differ (Gemma-4)."""
    return {"n_layers": int(n_layers), "n_heads": int(n_heads), "n_kv_heads": int(n_kv_heads),
            "d_head": [int(d) for d in d_head] if isinstance(d_head, list) else int(d_head)}


def data_fingerprint(data: Any) -> dict[str, Any]:
    """source, passages and the sha256 of the passages (texts joined by newlines, or token ids)."""
    if isinstance(data, (str, Path)):  # a labelled jsonl given by path: hash the file as it is
        raw = Path(data).read_bytes()
        return {"source": str(data), "passages": len(raw.splitlines()), "sha256": hashlib.sha256(raw).hexdigest()}
    texts = getattr(data, "texts", data)
    if isinstance(texts, Sequence) and texts and not isinstance(texts[0], str):
        blob, source = json.dumps([list(map(int, t)) for t in texts]).encode(), "token-ids"
    else:
        blob, source = "\n".join(texts).encode("utf-8"), "in-memory"
    return {"source": str(getattr(data, "source", source)), "passages": len(texts),
            "sha256": hashlib.sha256(blob).hexdigest()}


# Where and how loudly to write, not what was computed: left out so that the same run into another
# folder (or resumed with --force off) writes byte-identical files.
_NOT_OPTIONS = ("func", "verb", "out", "force", "verbose", "no_progress")


def _options(options: argparse.Namespace | Mapping[str, Any] | None) -> dict[str, Any]:
    d = vars(options) if isinstance(options, argparse.Namespace) else dict(options or {})
    d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
    return {k: (v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v))
            for k, v in sorted(d.items()) if k not in _NOT_OPTIONS and not callable(v)}


def provenance(verb: str, model: Any = None, data: Any = None,
               options: argparse.Namespace | Mapping[str, Any] | None = None,
               model_info: Mapping[str, Any] | None = None, heldout: Any = None) -> dict[str, Any]:
    """The provenance record every output JSON carries: verb, model, data, options, versions.

    `model` is a loaded HeadModel; `model_info` stands in for it where only a config is read (kv).
    `data` (and `heldout`, the evaluation passages of prune and gqa) is a TextSource, a list of passages
    or token-id lists, a labelled jsonl path, or a ready `data_fingerprint` dict.
    """
    rec: dict[str, Any] = {"verb": verb}
    rec["model"] = model_record(model) if model is not None else (dict(model_info) if model_info else None)
    for key, value in (("data", data), ("heldout", heldout)):
        if value is None or isinstance(value, Mapping):
            rec[key] = dict(value) if value else None
        else:
            rec[key] = data_fingerprint(value)
    rec["options"] = _options(options)
    rec["versions"] = versions()
    return rec


def same_model(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool | None:
    """Whether two provenance model records name the same model: weights fingerprints when both have
    one, else model type and attention shape (a config read as a file and one loaded by transformers
    differ in their default keys); None when either record is missing."""
    if not a or not b:
        return None
    if a.get("fingerprint") and b.get("fingerprint"):
        return a["fingerprint"] == b["fingerprint"]
    if a.get("shape") and b.get("shape"):
        return a["shape"] == b["shape"] and a.get("model_type") == b.get("model_type")
    return None


def read_provenance(json_path: Path) -> dict[str, Any] | None:
    """The provenance record in a verb's JSON (top level, or under meta for table JSONs), or None. A JSON that is
    a symlink leading out of its folder is not opened: a results folder cannot make headscope read elsewhere."""
    json_path = Path(json_path)
    try:
        json_path.resolve(strict=True).relative_to(json_path.parent.resolve(strict=True))
        data = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return None
    if not isinstance(data, dict):
        return None
    meta = data.get("meta")
    rec = data.get("provenance") or (meta.get("provenance") if isinstance(meta, dict) else None)
    return _well_formed(rec) if isinstance(rec, dict) else None


def _well_formed(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as its readers expect it: `model` and `options` objects (else None), a model `shape` of whole
    numbers (else dropped); an edited or foreign block reads as "not recorded", never as a crash."""
    rec = dict(rec)
    for key in ("model", "options"):
        if not isinstance(rec.get(key), dict):
            rec[key] = None
    shape = rec["model"].get("shape") if rec["model"] else None
    if shape is not None and not (isinstance(shape, dict) and {"n_layers", "n_heads"} <= set(shape) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in shape.values())):
        rec["model"] = {k: v for k, v in rec["model"].items() if k != "shape"}
    return rec


def recorded_for(path: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The JSON beside a verb's output file holding its provenance, and that record (None when the file is not a
    declared output, or nothing was recorded)."""
    # artifacts imports nothing of provenance: no cycle, loaded late
    from .artifacts import provenance_file

    path = Path(path)
    try:
        name = provenance_file(path.name)
    except HeadscopeError:  # a file of the user's own naming: no declared provenance
        return None
    if not name:
        return None
    rec = read_provenance(path.with_name(name))
    return (path.with_name(name), rec) if rec else None


def check_made_for(path: str | Path, hm: Any, option: str) -> None:
    """Refuse a file another verb wrote for another model than `hm` (weights fingerprint, else type and attention
    shape), naming both; a file without recorded provenance passes (its head grid is checked by its reader).
    `option`: the field that named the file (`scores`), which the CLI says as its flag."""

    found = recorded_for(path)
    if found is None:
        return
    where, rec = found
    theirs = rec.get("model")
    # no model recorded (or a record of another shape): nothing to compare
    if not isinstance(theirs, dict):
        return
    if same_model(theirs, model_record(hm)) is False:
        shape = theirs.get("shape")
        shape = shape if isinstance(shape, dict) else {}
        grid = f", {shape['n_layers']} x {shape['n_heads']} heads" if {"n_layers", "n_heads"} <= set(shape) else ""
        fp = str(theirs.get("fingerprint") or theirs.get("config_sha256") or "?")[:12]
        raise HeadscopeError(
            f"{option} {str(path)!r} was written for {theirs.get('name', '?')} (fingerprint {fp}{grid}; see "
            f"{where.name}), not "
            f"{hm.name} ({hm.n_layers} x {hm.n_heads} heads); rerun {rec.get('verb', 'analyze')} on this model",
            fields=(option,) if option.isidentifier() else ())
