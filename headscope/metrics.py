"""Task metrics: what "quality" means for a model whose heads are gated, ablated or pruned.

- ``lm_loss``: next-token cross-entropy of a causal LM in nats per predicted token (lower is
  better; perplexity = exp(lm_loss), reported in ``details``).
- ``accuracy``: share of correctly classified passages for a sequence-classification model on
  labelled jsonl data (``text`` + ``label``).
- ``fidelity``: label-free, for encoders without a task head: how close the model's outputs stay
  to the unpruned model's on the same passages (a :class:`Reference`). The value is the mean over
  passages of the cosine between mean-pooled final hidden states (mean over real tokens, as
  sentence-transformers pools MiniLM); 1 = unchanged. ``details`` adds ``token_mse`` (mean squared
  difference of token representations per dimension) and ``token_cosine`` (mean per-token cosine).

Every metric is a ratio ``sum(num) / sum(den)`` over rows (passages), so one forward pass can
evaluate several gate settings at once with per-row gates ``[B, L, H]``: see :func:`row_metric`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .analyze import pad_id, prepare_tokens, resolve_max_length
from .data import TextSource, batches, read_jsonl
from .errors import HeadscopeError, did_you_mean
from .hooks import head_gates
from .models.adapter import HeadModel

log = logging.getLogger(__name__)

METRICS: dict[str, str] = {
    "lm_loss": "next-token cross-entropy, nats per predicted token (lower is better; perplexity = exp)",
    "accuracy": "share of passages whose predicted class equals the label (classification heads, labelled jsonl)",
    "fidelity": "mean cosine between mean-pooled final hidden states and the unpruned model's (1 = unchanged)",
}
HIGHER_IS_BETTER = {"lm_loss": False, "accuracy": True, "fidelity": True}
# Rows per lm-head call: the logits [rows, pos, vocab] of a 49k-word vocabulary are large.
_LOGIT_ROWS = 4


@dataclass
class MetricResult:
    """One metric value over a data set, and how many tokens it was computed on."""

    name: str
    value: float
    higher_is_better: bool
    n_tokens: int
    details: dict[str, float] = field(default_factory=dict)


@dataclass
class Prepared:
    """Token ids (and labels, for accuracy) ready to batch; `source` names where they came from."""

    ids: list[list[int]]
    source: str
    labels: list[int] | None = None
    max_length: int = 128

    @property
    def n_tokens(self) -> int:
        return sum(len(t) for t in self.ids)


@dataclass
class Reference:
    """The unpruned model's outputs per passage, computed once; fidelity compares against them."""

    pooled: torch.Tensor  # [passages, d_model] mean-pooled final hidden states, float32
    tokens: list[torch.Tensor]  # per passage [len, d_model] final hidden states
    lengths: list[int]
    fingerprint: int  # hash of the token ids, so a reference is never used with other data

    def check(self, prep: Prepared) -> None:
        """Raise when this reference was made from other passages than `prep`."""
        if _fingerprint(prep.ids) != self.fingerprint:
            raise HeadscopeError(
                f"the fidelity reference was made from other data ({len(self.lengths)} passages, "
                f"{sum(self.lengths)} tokens) than the data given ({len(prep.ids)} passages, {prep.n_tokens} "
                f"tokens); build it with make_reference(hm, data) on the same data and max_length"
            )


def _fingerprint(ids: list[list[int]]) -> int:
    return hash(tuple(tuple(t) for t in ids))


# --- model kinds ----------------------------------------------------------------------------
def has_classifier(hm: HeadModel) -> bool:
    """Whether the model carries a sequence-classification head (logits over labels)."""
    return type(hm.model).__name__.endswith("ForSequenceClassification")


def default_metric(hm: HeadModel, labelled: bool = False) -> str:
    """`lm_loss` for causal LMs, `accuracy` for classifiers with labelled data, else `fidelity`."""
    if has_classifier(hm) and labelled:
        return "accuracy"
    if hm.causal and hm.model.get_output_embeddings() is not None and not has_classifier(hm):
        return "lm_loss"
    return "fidelity"


def resolve_metric(hm: HeadModel, metric: str, labelled: bool) -> str:
    """Check a metric name against the model and data; 'auto' picks `default_metric`."""
    if metric == "auto":
        return default_metric(hm, labelled)
    if metric not in METRICS:
        raise HeadscopeError(f"unknown metric {metric!r}{did_you_mean(metric, METRICS)}; "
                             f"choose one of auto, {', '.join(METRICS)}")
    if metric == "lm_loss" and (not hm.causal or hm.model.get_output_embeddings() is None or has_classifier(hm)):
        raise HeadscopeError(f"metric 'lm_loss' needs a causal language model with an LM head; "
                             f"{hm.name} ({type(hm.model).__name__}) has none: use 'fidelity'")
    if metric == "accuracy":
        if not has_classifier(hm):
            raise HeadscopeError(f"metric 'accuracy' needs a sequence-classification model; "
                                 f"{hm.name} is a {type(hm.model).__name__}: use 'fidelity' or 'lm_loss'")
        if not labelled:
            raise HeadscopeError("metric 'accuracy' needs labelled data: a .jsonl file whose lines hold "
                                 "'text' and 'label', or a list of {'text': ..., 'label': ...} dicts")
    return metric


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
    """Texts and labels of a jsonl file whose lines hold `text` and `label`."""
    rows = read_jsonl(path, required=("text", "label"))
    if not rows:
        raise HeadscopeError(f"no labelled lines in {str(path)!r}")
    return [r["text"] for r in rows], [r["label"] for r in rows]


def is_labelled(data: Any) -> bool:
    """Whether `data` is labelled: a jsonl file whose first line has a `label`, or a list of dicts."""
    if isinstance(data, (str, Path)) and str(data).lower().endswith(".jsonl") and Path(data).exists():
        for line in Path(data).read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(obj, dict) and "label" in obj
        return False
    return isinstance(data, (list, tuple)) and bool(data) and isinstance(data[0], dict)


def prepare(hm: HeadModel, data: Any, metric: str = "auto", max_length: int | None = None,
            limit: int | None = None) -> tuple[Prepared, str]:
    """Tokenise `data` for a metric; returns the prepared passages and the resolved metric name."""
    labelled = is_labelled(data)
    metric = resolve_metric(hm, metric, labelled)
    max_len = resolve_max_length(hm, max_length)
    labels = None
    if metric == "accuracy":
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
        ids, _, _, _, _ = prepare_tokens(hm, TextSource(texts, source), max_len)
    else:
        if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
            data = [d.get("text", "") for d in data]
        if isinstance(data, (list, tuple)) and len(data) == 0:
            raise HeadscopeError("no data: the list of passages is empty")
        ids, source, _, _, _ = prepare_tokens(hm, data, max_len, limit)
    if metric == "lm_loss" and all(len(t) < 2 for t in ids):
        raise HeadscopeError("lm_loss needs passages of at least 2 tokens (one to read, one to predict)")
    return Prepared(ids, source, labels, max_len), metric


# --- per-row metric -------------------------------------------------------------------------
def final_hidden(hm: HeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states `[batch, pos, d_model]` of the base model (after its final norm, if any)."""
    out = hm.model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.last_hidden_state


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens (sentence-transformers' pooling): `[batch, d_model]`."""
    m = attention_mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def cosine64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine in float64, computed so that cosine(x, x) is exactly 1."""
    a, b = a.double(), b.double()
    # sqrt(|a|^2 |b|^2) rather than |a| |b|: for a == b the correctly rounded sqrt returns |a|^2 exactly.
    return (a * b).sum(-1) / torch.sqrt((a * a).sum(-1) * (b * b).sum(-1)).clamp_min(1e-300)


@dataclass
class RowMetric:
    """Per-row numerators and denominators (the metric is sum(num) / sum(den)), plus extras."""

    num: torch.Tensor  # [rows]
    den: torch.Tensor  # [rows]
    extra: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # name -> (num, den)


def _widen(t: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 for the softmax; float32/float64 stay as they are."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def lm_token_losses(hm: HeadModel, hidden: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sum of next-token cross-entropy and the number of predicted tokens."""
    head = hm.model.get_output_embeddings()
    sums, counts = [], []
    for s in range(0, hidden.shape[0], _LOGIT_ROWS):
        h = hidden[s:s + _LOGIT_ROWS, :-1]
        target = input_ids[s:s + _LOGIT_ROWS, 1:]
        keep = attention_mask[s:s + _LOGIT_ROWS, 1:].bool()  # right padding: target real => query real
        logits = _widen(head(h))
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none")
        ce = ce.view(target.shape) * keep
        sums.append(ce.sum(-1))
        counts.append(keep.sum(-1))
    return torch.cat(sums).double(), torch.cat(counts).double()


def row_metric(hm: HeadModel, metric: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               labels: torch.Tensor | None = None, ref_pooled: torch.Tensor | None = None,
               ref_tokens: torch.Tensor | None = None) -> RowMetric:
    """The metric of one batch, per row (differentiable; wrap in no_grad when not needed).

    Rows may repeat passages under different per-row gates: `labels`, `ref_pooled` [rows, d] and
    `ref_tokens` [rows, pos, d] must then be repeated the same way.
    """
    if metric == "lm_loss":
        hidden = final_hidden(hm, input_ids, attention_mask)
        num, den = lm_token_losses(hm, hidden, input_ids, attention_mask)
        return RowMetric(num, den)
    if metric == "accuracy":
        logits = hm.model(input_ids=input_ids, attention_mask=attention_mask).logits
        correct = (logits.argmax(-1) == labels).double()
        ce = F.cross_entropy(_widen(logits), labels, reduction="none").double()
        ones = torch.ones_like(correct)
        return RowMetric(correct, ones, {"cross_entropy": (ce, ones)})
    if metric == "fidelity":
        hidden = final_hidden(hm, input_ids, attention_mask)
        cos = cosine64(mean_pool(hidden, attention_mask), ref_pooled)
        ones = torch.ones_like(cos)
        extra: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if ref_tokens is not None:
            m = attention_mask.bool()
            diff = (hidden.double() - ref_tokens.double()) ** 2
            n_tok = m.sum(-1).double()
            extra["token_mse"] = ((diff.mean(-1) * m).sum(-1), n_tok)
            extra["token_cosine"] = ((cosine64(hidden, ref_tokens) * m).sum(-1), n_tok)
        return RowMetric(cos, ones, extra)
    raise HeadscopeError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def batch_targets(prep: Prepared, ref: Reference | None, index: list[int], width: int,
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


def repeat_rows(t: torch.Tensor | None, k: int) -> torch.Tensor | None:
    """`k` copies of a batch stacked block-wise: rows [copy 0 of all rows, copy 1, ...]."""
    if t is None or k == 1:
        return t
    return t.repeat(k, *([1] * (t.dim() - 1)))


# --- public API -----------------------------------------------------------------------------
def make_reference(hm: HeadModel, data: Any, *, max_length: int | None = None, batch_size: int = 16,
                   progress: bool = False) -> Reference:
    """Cache the unpruned model's final hidden states on `data`, for fidelity."""
    prep = data if isinstance(data, Prepared) else prepare(hm, data, "fidelity", max_length)[0]
    return _make_reference(hm, prep, batch_size, progress)


def _make_reference(hm: HeadModel, prep: Prepared, batch_size: int, progress: bool = False) -> Reference:
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
    return Reference(pooled, tokens, [len(t) for t in prep.ids], _fingerprint(prep.ids))


def finish(metric: str, totals: dict[str, list[float]], n_tokens: int) -> MetricResult:
    """Turn accumulated (num, den) sums into a MetricResult."""
    num, den = totals.pop("value")
    value = num / den if den else math.nan
    details = {k: (a / b if b else math.nan) for k, (a, b) in totals.items()}
    if metric == "lm_loss":
        details["perplexity"] = math.exp(value) if value < 700 else math.inf
        details["predicted_tokens"] = den
    return MetricResult(metric, float(value), HIGHER_IS_BETTER[metric], int(n_tokens), details)


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

    `data`: a path (.txt / .jsonl / .conllu), TextSource, list of strings, token-id lists, or
    (for accuracy) labelled jsonl / a list of {'text', 'label'} dicts. Fidelity compares against
    `reference` (the unpruned model's outputs, from :func:`make_reference`; built here when None).
    """
    if isinstance(data, Prepared):
        prep, metric = data, resolve_metric(hm, metric, data.labels is not None)
    else:
        prep, metric = prepare(hm, data, metric, max_length)
    return evaluate_prepared(hm, prep, metric, gates=gates, reference=reference, batch_size=batch_size,
                             progress=progress)


def evaluate_prepared(hm: HeadModel, prep: Prepared, metric: str, *, gates: torch.Tensor | None = None,
                      reference: Reference | None = None, batch_size: int = 16,
                      progress: bool = False) -> MetricResult:
    """`evaluate` on already tokenised passages."""
    if metric == "fidelity":
        if reference is None:
            reference = _make_reference(hm, prep, batch_size, progress)
        reference.check(prep)
    totals: dict[str, list[float]] = {"value": [0.0, 0.0]}
    bar = tqdm(total=len(prep.ids), desc=f"evaluate {metric}", unit="passage", disable=not progress, leave=False)
    gate_ctx = head_gates(hm, gates.to(hm.device)) if gates is not None else nullcontext()
    with torch.inference_mode(), gate_ctx:
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            tg = batch_targets(prep, reference if metric == "fidelity" else None, b.index, ids.shape[1], hm.device)
            rm = row_metric(hm, metric, ids, mask, **tg)
            accumulate(totals, rm)
            bar.update(len(b.index))
    bar.close()
    return finish(metric, totals, prep.n_tokens)


def accumulate(totals: dict[str, list[float]], rm: RowMetric, rows: slice | None = None) -> None:
    """Add a RowMetric's sums (optionally only `rows`) into `totals`."""
    sl = rows if rows is not None else slice(None)
    pairs = {"value": (rm.num, rm.den), **rm.extra}
    for k, (n, d) in pairs.items():
        t = totals.setdefault(k, [0.0, 0.0])
        t[0] += float(n[sl].detach().sum())
        t[1] += float(d[sl].detach().sum())


# --- word similarity ------------------------------------------------------------------------
WORDSIM = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}


def read_word_pairs(which: str = "wordsim353") -> list[tuple[str, str, float]]:
    """(word1, word2, human rating) pairs of wordsim353 or simlex999 from gensim's wheel."""
    if which not in WORDSIM:
        raise HeadscopeError(f"unknown word-similarity set {which!r}{did_you_mean(which, WORDSIM)}; "
                             f"choose one of {', '.join(WORDSIM)}")
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise HeadscopeError("wordsim353/simlex999 ship inside the gensim wheel: pip install gensim")
    path = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data" / WORDSIM[which]
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        a, b, score = line.split("\t")[:3]
        pairs.append((a.strip(), b.strip(), float(score)))
    return pairs


def wordsim_spearman(hm: HeadModel, which: str = "wordsim353", gates: torch.Tensor | None = None,
                     batch_size: int = 64) -> float:
    """Spearman correlation between human similarity ratings and the cosine of mean-pooled word embeddings."""
    from scipy.stats import spearmanr

    if hm.tokenizer is None:
        raise HeadscopeError("word similarity needs a model with a tokenizer")
    pairs = read_word_pairs(which)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    prep = Prepared([list(hm.tokenizer(w)["input_ids"]) for w in words], which)
    emb = torch.zeros(len(words), hm.d_model)
    gate_ctx = head_gates(hm, gates.to(hm.device)) if gates is not None else nullcontext()
    with torch.inference_mode(), gate_ctx:
        for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
            ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
            emb[b.index] = mean_pool(final_hidden(hm, ids, mask), mask).float().cpu()
    pos = {w: i for i, w in enumerate(words)}
    a = emb[[pos[p[0]] for p in pairs]]
    b = emb[[pos[p[1]] for p in pairs]]
    cos = cosine64(a, b).numpy()
    rho = spearmanr(cos, np.array([p[2] for p in pairs])).statistic
    return float(rho)


__all__ = [
    "METRICS", "MetricResult", "Reference", "default_metric", "evaluate", "make_reference",
    "row_metric", "wordsim_spearman", "read_word_pairs",
]
