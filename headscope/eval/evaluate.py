"""Running a task metric over data: preparing the passages (and labels), the unpruned model's reference
outputs, and the evaluation loop, for any metric registered in `headscope.eval.metrics.METRICS`.

`evaluate(hm, data)` is the one call: it tokenises `data` for the metric (`prepare`), builds the
reference when the metric compares against one, and sums each batch's per-row metric under optional
head gates. Stages that evaluate many gate settings on the same passages prepare once and call
`evaluate_prepared`.
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import torch
from tqdm.auto import tqdm

from ..data import (
    LABELLED,
    TextSource,
    Tokens,
    batches,
    labelled_builtin,
    pad_id,
    prepare_tokens,
    read_jsonl,
    read_texts,
    resolve_max_length,
)
from ..errors import HeadscopeError, did_you_mean
from ..hooks import head_gates
from ..models.adapter import HeadModel
from ..uncertainty import Accumulator, Interval, IntervalSettings, PassageSums, bootstrap, ratio
from .metrics import METRICS, RowMetric, final_hidden, mean_pool, resolve_metric, row_metric

log = logging.getLogger(__name__)


@dataclass
class MetricResult:
    """One metric value over a data set, how many tokens it was computed on, and (from `evaluate_prepared`)
    its per-passage numerators and denominators, `passages["num"]`, `passages["den"]` `[passages]`, so the
    value (sum(num) / sum(den)) has a bootstrap interval and can be compared passage by passage."""

    name: str
    value: float
    higher_is_better: bool
    n_tokens: int
    details: dict[str, float] = field(default_factory=dict)
    passages: PassageSums | None = field(default=None, repr=False)

    def interval(self, settings: IntervalSettings | None = None) -> Interval:
        """The value with its bootstrap interval over the passages (needs `passages`)."""
        if self.passages is None:
            raise ValueError("this result holds no per-passage sums; compute it with evaluate_prepared")
        return bootstrap(self.passages, ratio("num", "den"), settings)


@dataclass
class Reference:
    """The unpruned model's outputs per passage, computed once; fidelity compares against them."""

    # [passages, d_model] mean-pooled final hidden states, float32
    pooled: torch.Tensor
    tokens: list[torch.Tensor]  # per passage [len, d_model] final hidden states
    lengths: list[int]
    # hash of the token ids, so a reference is never used with other data
    fingerprint: int

    def check(self, prep: Tokens) -> None:
        """Raise when this reference was made from other passages than `prep`."""
        if ids_fingerprint(prep.ids) != self.fingerprint:
            raise HeadscopeError(
                f"the fidelity reference was made from other data ({len(self.lengths)} passages, "
                f"{sum(self.lengths)} tokens) than the data given ({len(prep.ids)} passages, {prep.n_tokens} "
                f"tokens); build it with make_reference(hm, data) on the same data and max_length"
            )


def ids_fingerprint(ids: list[list[int]]) -> int:
    return hash(tuple(tuple(t) for t in ids))


# --- data -----------------------------------------------------------------------------------
def _label_id(hm: HeadModel, label: Any, where: str) -> int:
    n = int(getattr(hm.config, "num_labels", 0) or 0)
    if isinstance(label, bool) or not isinstance(label, (int, str)):
        raise HeadscopeError(f"{where}: label {label!r} must be an integer class id or a label name")
    if isinstance(label, str):
        names = {str(k): int(v) for k, v in (getattr(hm.config, "label2id", None) or {}).items()}
        if label.isdigit():
            label = int(label)
        elif label in names:
            return names[label]
        else:
            raise HeadscopeError(f"{where}: label {label!r} is not one of the model's labels "
                                 f"{sorted(names)}{did_you_mean(label, names)}")
    if not 0 <= label < max(n, 1):
        raise HeadscopeError(f"{where}: label {label} is outside the model's classes 0..{n - 1}")
    return int(label)


def read_labelled(path: str | Path) -> tuple[list[str], list[Any]]:
    """Texts and labels of a labelled built-in set (`polarity`) or of a jsonl file whose lines hold `text`
    and `label`."""
    if isinstance(path, str) and path in LABELLED:
        texts, labels, _ = labelled_builtin(path)
        return texts, labels
    rows = read_jsonl(path, required=("text", "label"))
    if not rows:
        raise HeadscopeError(f"no labelled lines in {str(path)!r}")
    return [r["text"] for r in rows], [r["label"] for r in rows]


def is_labelled(data: Any) -> bool:
    """Whether `data` is labelled: a labelled built-in set (`polarity`), a jsonl file whose first line has a
    `label`, or a list of dicts."""
    if isinstance(data, str) and data in LABELLED:
        return True
    if isinstance(data, (str, Path)) and str(data).lower().endswith(".jsonl") and Path(data).exists():
        try:
            text = Path(data).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):  # read_jsonl names the problem when the data is read
            return False
        for line in text.splitlines():
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(obj, dict) and "label" in obj
        return False
    return isinstance(data, (list, tuple)) and bool(data) and isinstance(data[0], dict)


def read_task_data(data: str | Path | None, limit: int | None = None) -> TextSource | str | Path:
    """What a verb that measures a metric reads: the passages `read_texts` resolves (a built-in name or a
    file, first `limit`), or the path itself for a labelled jsonl file (its labels are read by `prepare`).

    The passages are read either way, so bad data fails before a model loads.
    """
    source = read_texts(data, limit)
    return data if data is not None and is_labelled(data) else source


def prepare(hm: HeadModel, data: Any, metric: str = "auto", max_length: int | None = None,
            limit: int | None = None) -> tuple[Tokens, str]:
    """Tokenise `data` for a metric; returns the prepared passages (with labels when the metric needs
    them) and the resolved metric name."""
    labelled = is_labelled(data)
    metric = resolve_metric(hm, metric, labelled)
    entry = METRICS.get(metric)
    max_len = resolve_max_length(hm, max_length)
    if entry.needs_labels:
        if isinstance(data, (str, Path)):
            texts, raw = read_labelled(data)
            where, source = str(data), str(data)
        else:
            bad = [i for i, d in enumerate(data) if not isinstance(d, dict) or "text" not in d or "label" not in d]
            if bad:
                raise HeadscopeError(f"labelled item {bad[0]} needs 'text' and 'label' keys")
            texts, raw, where, source = [d["text"] for d in data], [d["label"] for d in data], "item", "in-memory"
        texts, raw = texts[:limit], raw[:limit]
        labels = [_label_id(hm, lab, f"{where} (passage {i})") for i, lab in enumerate(raw)]
        tokens = prepare_tokens(hm, TextSource(texts, source), max_len, labels=labels)
    else:
        if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
            data = [d.get("text", "") for d in data]
        if isinstance(data, (list, tuple)) and len(data) == 0:
            raise HeadscopeError("no data: the list of passages is empty")
        tokens = prepare_tokens(hm, data, max_len, limit)
    if all(len(t) < entry.min_tokens for t in tokens.ids):
        raise HeadscopeError(f"{metric} needs passages of at least {entry.min_tokens} tokens; "
                             f"every passage here is shorter")
    return tokens, metric


# --- batches --------------------------------------------------------------------------------
def batch_targets(prep: Tokens, ref: Reference | None, index: list[int], width: int,
                  device: torch.device) -> dict[str, torch.Tensor | None]:
    """Labels / reference rows for the passages `index` of a batch padded to `width` tokens."""
    out: dict[str, torch.Tensor | None] = {"labels": None, "ref_pooled": None, "ref_tokens": None}
    if prep.labels is not None:
        out["labels"] = torch.tensor([prep.labels[i] for i in index], device=device)
    if ref is not None:
        out["ref_pooled"] = ref.pooled[index].to(device)
        toks = torch.zeros(len(index), width, ref.pooled.shape[1], dtype=ref.tokens[0].dtype)
        for r, i in enumerate(index):
            toks[r, : ref.lengths[i]] = ref.tokens[i]
        out["ref_tokens"] = toks.to(device)
    return out


@overload
def repeat_rows(t: torch.Tensor, k: int) -> torch.Tensor: ...
@overload
def repeat_rows(t: None, k: int) -> None: ...
def repeat_rows(t: torch.Tensor | None, k: int) -> torch.Tensor | None:
    """`k` copies of a batch stacked block-wise: rows [copy 0 of all rows, copy 1, ...]."""
    if t is None or k == 1:
        return t
    return t.repeat(k, *([1] * (t.dim() - 1)))


# --- public API -----------------------------------------------------------------------------
def make_reference(hm: HeadModel, data: Any, *, max_length: int | None = None, batch_size: int = 16,
                   progress: bool = False) -> Reference:
    """Cache the unpruned model's final hidden states on `data`, for fidelity."""
    prep = data if isinstance(data, Tokens) else prepare(hm, data, "fidelity", max_length)[0]
    n = len(prep.ids)
    pooled = torch.zeros(n, hm.d_model)
    tokens: list[torch.Tensor] = [torch.empty(0)] * n
    bar = tqdm(total=n, desc="reference", unit="passage", disable=not progress, leave=False)
    with torch.inference_mode():
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            hidden = final_hidden(hm, ids, mask).float().cpu()
            p = mean_pool(hidden, mask.cpu())
            for r, i in enumerate(b.index):
                pooled[i] = p[r]
                tokens[i] = hidden[r, : len(prep.ids[i])].clone()
            bar.update(len(b.index))
    bar.close()
    return Reference(pooled, tokens, [len(t) for t in prep.ids], ids_fingerprint(prep.ids))


def finish(metric: str, totals: dict[str, list[float]], n_tokens: int) -> MetricResult:
    """Turn accumulated (num, den) sums into a MetricResult."""
    entry = METRICS.get(metric)
    num, den = totals.pop("value")
    value = num / den if den else math.nan
    details = {k: (a / b if b else math.nan) for k, (a, b) in totals.items()}
    details.update(entry.details(num, den))
    return MetricResult(metric, float(value), entry.higher_is_better, int(n_tokens), details)


def evaluate(
    hm: HeadModel,
    data: Any,
    metric: str = "auto",
    *,
    gates: torch.Tensor | None = None,
    reference: Reference | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
    progress: bool = False,
) -> MetricResult:
    """The task metric of `hm` on `data`, optionally with head gates `[L, H]` applied.

    `data`: a path (.txt / .jsonl / .conllu) or built-in name, TextSource, list of strings, token-id
    lists, prepared `Tokens`, or (for accuracy) labelled jsonl / a list of {'text', 'label'} dicts.
    Fidelity compares against `reference` (the unpruned model's outputs, from :func:`make_reference`;
    built here when None).
    """
    if isinstance(data, Tokens):
        prep, metric = data, resolve_metric(hm, metric, data.labels is not None)
    else:
        prep, metric = prepare(hm, data, metric, max_length)
    return evaluate_prepared(hm, prep, metric, gates=gates, reference=reference, batch_size=batch_size,
                             progress=progress)


def evaluate_prepared(hm: HeadModel, prep: Tokens, metric: str, *, gates: torch.Tensor | None = None,
                      reference: Reference | None = None, batch_size: int = 16,
                      progress: bool = False) -> MetricResult:
    """`evaluate` on already tokenised passages."""
    needs_reference = METRICS.get(metric).needs_reference
    if needs_reference:
        if reference is None:
            reference = make_reference(hm, prep, batch_size=batch_size, progress=progress)
        reference.check(prep)
    totals: dict[str, list[float]] = {"value": [0.0, 0.0]}
    per = Accumulator(len(prep.ids))
    per.declare("num", ())
    per.declare("den", ())
    bar = tqdm(total=len(prep.ids), desc=f"evaluate {metric}", unit="passage", disable=not progress, leave=False)
    gate_ctx = head_gates(hm, gates.to(hm.device)) if gates is not None else nullcontext()
    with torch.inference_mode(), gate_ctx:
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            tg = batch_targets(prep, reference if needs_reference else None, b.index, ids.shape[1], hm.device)
            rm = row_metric(hm, metric, ids, mask, **tg)
            accumulate(totals, rm)
            per.add("num", b.index, rm.num.detach().double().cpu().numpy())
            per.add("den", b.index, rm.den.detach().double().cpu().numpy())
            bar.update(len(b.index))
    bar.close()
    result = finish(metric, totals, prep.n_tokens)
    result.passages = per.result()
    return result


def accumulate(totals: dict[str, list[float]], rm: RowMetric, rows: slice | None = None) -> None:
    """Add a RowMetric's sums (optionally only `rows`) into `totals`."""
    sl = rows if rows is not None else slice(None)
    pairs = {"value": (rm.num, rm.den), **rm.extra}
    for k, (n, d) in pairs.items():
        t = totals.setdefault(k, [0.0, 0.0])
        t[0] += float(n[sl].detach().sum())
        t[1] += float(d[sl].detach().sum())


__all__ = [
    "MetricResult", "Reference", "accumulate", "batch_targets", "evaluate", "evaluate_prepared", "finish",
    "is_labelled", "make_reference", "prepare", "read_labelled", "read_task_data", "repeat_rows",
]
