"""Task metrics: what "quality" means for a model whose heads are gated, ablated or pruned.

Every metric is an entry of the registry `METRICS`, registered by `register_metric` beside its row
function together with everything a stage needs to know about it (direction, the loss importance
gradients follow, the loss pruning recovery trains on, how the relative drop is read, ...), so no
stage branches on a metric's name. The built-in ones:

- ``lm_loss``: next-token cross-entropy of a causal LM in nats per predicted token (lower is
  better; perplexity = exp(lm_loss), reported in ``details``), computed by `headscope.eval.lm`.
- ``accuracy``: share of correctly classified passages for a sequence-classification model on
  labelled jsonl data (``text`` + ``label``).
- ``fidelity``: label-free, for encoders without a task head: how close the model's outputs stay
  to the unpruned model's on the same passages (a `Reference`, see `evaluate`). The value is the mean over
  passages of the cosine between mean-pooled final hidden states (mean over real tokens, as
  sentence-transformers pools MiniLM); 1 = unchanged. ``details`` adds ``token_mse`` (mean squared
  difference of token representations per dimension) and ``token_cosine`` (mean per-token cosine).

`metric="auto"` picks the first registered metric the model and data can use; `fidelity`, which
every model can use, is registered last as the fallback.

Every metric is a ratio ``sum(num) / sum(den)`` over rows (passages), so one forward pass can
evaluate several gate settings at once with per-row gates ``[B, L, H]``: see :func:`row_metric`.
Running a metric over data (preparing passages and labels, the reference, the loop) is
`headscope.eval.evaluate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import HeadscopeError, did_you_mean
from ..models.adapter import HeadModel
from ..registry import Registry
from .lm import distillation_loss, nll_sums, perplexity

# Rows per lm-head call: the logits [rows, pos, vocab] of a 49k-word vocabulary are large.
_LOGIT_ROWS = 4


@dataclass
class RowMetric:
    """Per-row numerators and denominators (the metric is sum(num) / sum(den)), plus extras."""

    num: torch.Tensor  # [rows]
    den: torch.Tensor  # [rows]
    extra: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)  # name -> (num, den)


# A row function: (hm, input_ids, attention_mask, labels=, ref_pooled=, ref_tokens=) -> RowMetric.
RowFn = Callable[..., RowMetric]
# The differentiable per-row loss (lower = better) a metric's gradients follow: RowMetric -> (sums, terms).
LossFn = Callable[[RowMetric], tuple[torch.Tensor, torch.Tensor]]
# Recovery's training loss: (student, teacher, input_ids, attention_mask, targets) -> scalar.
RecoveryLossFn = Callable[[HeadModel, HeadModel, torch.Tensor, torch.Tensor, dict[str, Any]], torch.Tensor]

METRICS: Registry[RowFn] = Registry("metric")


def register_metric(
    name: str,
    *,
    help: str,
    higher_is_better: bool,
    usable: Callable[[HeadModel, bool], str | None],
    loss: LossFn,
    recovery_loss: RecoveryLossFn,
    needs_labels: bool = False,
    needs_reference: bool = False,
    min_tokens: int = 1,
    probe_loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    details: Callable[[float, float], dict[str, float]] | None = None,
    drop: Callable[[float, float], float] | None = None,
    derived: dict[str, Callable[[float], float]] | None = None,
    max_drop: float | None = None,
) -> Callable[[RowFn], RowFn]:
    """Decorator: register a row function as metric `name`, with every field a stage reads.

    - `usable(hm, labelled)`: why the model/data cannot use the metric (a message), or None.
    - `loss(row_metric)`: differentiable per-row loss sums and term counts, lower = better
      (importance gradients and integrated gradients follow it).
    - `recovery_loss(student, teacher, ids, mask, targets)`: what pruning recovery trains on.
    - `needs_labels` / `needs_reference`: labelled data / the unpruned model's outputs (a Reference).
    - `min_tokens`: shortest passage that counts. `probe_loss`: a surrogate for gradients when `loss`
      is minimised at the reference (its gradient there vanishes). `details(num, den)`: extra
      figures for `MetricResult.details`. `drop(base, value)`: the relative drop (default: relative
      change, signed so that worse is positive). `derived`: per-value columns, e.g. perplexity.
      `max_drop`: the largest relative drop a bounded metric can show (None: unbounded); a target
      drop at or above it is refused, since no pruning could ever exceed it.
    """

    def default_drop(base: float, value: float) -> float:
        change = base - value if higher_is_better else value - base
        return change / abs(base) if base else change

    return METRICS.register(
        name, help=help, higher_is_better=higher_is_better, usable=usable, loss=loss,
        recovery_loss=recovery_loss, needs_labels=needs_labels, needs_reference=needs_reference,
        min_tokens=min_tokens, probe_loss=probe_loss, details=details or (lambda num, den: {}),
        drop=drop or default_drop, derived=dict(derived or {}), max_drop=max_drop)


# --- model kinds ----------------------------------------------------------------------------
def has_classifier(hm: HeadModel) -> bool:
    """Whether the model carries a sequence-classification head (logits over labels)."""
    return type(hm.model).__name__.endswith("ForSequenceClassification")


def has_lm_head(hm: HeadModel) -> bool:
    """Whether the model is a causal LM with an LM head (next-token logits)."""
    return hm.causal and hm.output_embeddings is not None and not has_classifier(hm)


def default_metric(hm: HeadModel, labelled: bool = False) -> str:
    """The first registered metric the model and data can use (`lm_loss` for causal LMs, `accuracy`
    for classifiers with labelled data, else `fidelity`)."""
    for name in METRICS:
        if METRICS.get(name).usable(hm, labelled) is None:
            return name
    raise HeadscopeError(f"no metric fits {hm.name}; registered: {', '.join(METRICS)}")


def resolve_metric(hm: HeadModel, metric: str, labelled: bool) -> str:
    """Check a metric name against the model and data; 'auto' picks `default_metric`."""
    if metric == "auto":
        return default_metric(hm, labelled)
    if metric not in METRICS:
        raise HeadscopeError(f"unknown metric {metric!r}{did_you_mean(metric, METRICS)}; "
                             f"choose one of auto, {', '.join(METRICS)}")
    problem = METRICS.get(metric).usable(hm, labelled)
    if problem is not None:
        raise HeadscopeError(problem)
    return metric


# --- per-row metric -------------------------------------------------------------------------
def final_hidden(hm: HeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states `[batch, pos, d_model]` of the base model (after its final norm, if any)."""
    out = hm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
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


def _widen(t: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 for the softmax; float32/float64 stay as they are."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def lm_token_losses(hm: HeadModel, hidden: torch.Tensor, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sum of next-token cross-entropy and the number of predicted tokens (`eval.lm.nll_sums`,
    with the LM head applied to a few rows at a time)."""
    head = hm.output_embeddings
    if head is None:
        raise HeadscopeError(f"{hm.name} has no LM head: next-token losses need a causal LM")
    sums, counts = [], []
    for s in range(0, hidden.shape[0], _LOGIT_ROWS):
        rows = slice(s, s + _LOGIT_ROWS)
        n, c = nll_sums(head(hidden[rows]), input_ids[rows], attention_mask[rows])
        sums.append(n)
        counts.append(c)
    return torch.cat(sums), torch.cat(counts)


def row_metric(hm: HeadModel, metric: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
               labels: torch.Tensor | None = None, ref_pooled: torch.Tensor | None = None,
               ref_tokens: torch.Tensor | None = None) -> RowMetric:
    """The metric of one batch, per row (differentiable; wrap in no_grad when not needed).

    Rows may repeat passages under different per-row gates: `labels`, `ref_pooled` [rows, d] and
    `ref_tokens` [rows, pos, d] must then be repeated the same way.
    """
    return METRICS.get(metric).fn(hm, input_ids, attention_mask, labels=labels, ref_pooled=ref_pooled,
                                  ref_tokens=ref_tokens)


# --- lm_loss ----------------------------------------------------------------------------------
def _lm_usable(hm: HeadModel, labelled: bool) -> str | None:
    if has_lm_head(hm):
        return None
    return (f"metric 'lm_loss' needs a causal language model with an LM head; "
            f"{hm.name} ({type(hm.model).__name__}) has none: use 'fidelity'")


def _distill_lm(student: HeadModel, teacher: HeadModel, ids: torch.Tensor, mask: torch.Tensor,
                targets: dict[str, Any]) -> torch.Tensor:
    """Recovery for LMs: `eval.lm.distillation_loss` from the unpruned model's next-token distributions."""
    with torch.no_grad():
        teacher_logits = teacher.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    student_logits = student.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return distillation_loss(student_logits, teacher_logits, mask)


@register_metric(
    "lm_loss", help="next-token cross-entropy, nats per predicted token (lower is better; perplexity = exp)",
    higher_is_better=False, usable=_lm_usable, min_tokens=2,
    loss=lambda rm: (rm.num, rm.den), recovery_loss=_distill_lm,
    details=lambda num, den: {"perplexity": perplexity(num, den), "predicted_tokens": den},
    drop=lambda base, value: math.exp(min(value - base, 700.0)) - 1.0,  # the perplexity increase
    derived={"perplexity": math.exp})
def lm_loss(hm: HeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
            labels: torch.Tensor | None = None, ref_pooled: torch.Tensor | None = None,
            ref_tokens: torch.Tensor | None = None) -> RowMetric:
    """Per row: summed next-token cross-entropy over the predicted tokens, and their number."""
    hidden = final_hidden(hm, input_ids, attention_mask)
    num, den = lm_token_losses(hm, hidden, input_ids, attention_mask)
    return RowMetric(num, den)


# --- accuracy ---------------------------------------------------------------------------------
def _accuracy_usable(hm: HeadModel, labelled: bool) -> str | None:
    if not has_classifier(hm):
        return (f"metric 'accuracy' needs a sequence-classification model; "
                f"{hm.name} is a {type(hm.model).__name__}: use 'fidelity' or 'lm_loss'")
    if not labelled:
        return ("metric 'accuracy' needs labelled data: a .jsonl file whose lines hold "
                "'text' and 'label', or a list of {'text': ..., 'label': ...} dicts")
    return None


def _classifier_ce(rm: RowMetric) -> tuple[torch.Tensor, torch.Tensor]:
    return rm.extra["cross_entropy"]


def _recover_classifier(student: HeadModel, teacher: HeadModel, ids: torch.Tensor, mask: torch.Tensor,
                        targets: dict[str, Any]) -> torch.Tensor:
    """Recovery for classifiers: cross-entropy on the labels."""
    n, d = _classifier_ce(accuracy(student, ids, mask, **targets))
    return n.sum() / d.sum()


@register_metric(
    "accuracy",
    help="share of passages whose predicted class equals the label (classification heads, labelled jsonl)",
    higher_is_better=True, usable=_accuracy_usable, needs_labels=True, max_drop=1.0,  # accuracy falls to 0 at worst
    loss=_classifier_ce, recovery_loss=_recover_classifier)
def accuracy(hm: HeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
             labels: torch.Tensor | None = None, ref_pooled: torch.Tensor | None = None,
             ref_tokens: torch.Tensor | None = None) -> RowMetric:
    """Per row: 1 when the predicted class is the label; `cross_entropy` on the label as an extra."""
    if labels is None:
        raise HeadscopeError("the accuracy metric needs labels (labelled data)")
    logits = hm.model(input_ids=input_ids, attention_mask=attention_mask).logits
    correct = (logits.argmax(-1) == labels).double()
    ce = F.cross_entropy(_widen(logits), labels, reduction="none").double()
    ones = torch.ones_like(correct)
    return RowMetric(correct, ones, {"cross_entropy": (ce, ones)})


# --- fidelity ---------------------------------------------------------------------------------
def _fidelity_probe_loss(hm: HeadModel, ids: torch.Tensor, mask: torch.Tensor, ref_pooled: torch.Tensor,
                         probe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss-Newton surrogate of 1 - cosine for gradients at the reference: <P u, e> / |r| per row.

    1 - cos(e, r) is minimised at the unpruned gates, so its gradient there is exactly zero. With a
    fixed random probe u ~ N(0, I) per passage, e the mean-pooled embedding, r the reference one and P
    the projection orthogonal to r: E[(dL/dg)^2] = |P de/dg|^2 / |r|^2, twice the second-order
    prediction of the cosine loss when a gate moves by one.
    """
    e = mean_pool(final_hidden(hm, ids, mask), mask)
    r_hat = ref_pooled / ref_pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    v = probe - (probe * r_hat).sum(-1, keepdim=True) * r_hat  # orthogonal to the reference
    val = (v * e).sum(-1) / ref_pooled.norm(dim=-1).clamp_min(1e-12)
    return val.double(), torch.ones_like(val, dtype=torch.float64)


def _distill_hidden(student: HeadModel, teacher: HeadModel, ids: torch.Tensor, mask: torch.Tensor,
                    targets: dict[str, Any]) -> torch.Tensor:
    """Recovery for encoders: token-representation MSE + (1 - cosine) of the pooled output, against
    the unpruned model's hidden states (the reference in `targets`)."""
    rm = fidelity(student, ids, mask, **targets)
    n, d = rm.extra["token_mse"]
    return n.sum() / d.sum() + (1.0 - rm.num.mean())


@register_metric(
    "fidelity",
    help="mean cosine between mean-pooled final hidden states and the unpruned model's (1 = unchanged)",
    higher_is_better=True, usable=lambda hm, labelled: None, needs_reference=True,
    max_drop=2.0,  # a cosine falls from 1 to -1 at worst
    loss=lambda rm: (1.0 - rm.num, rm.den), probe_loss=_fidelity_probe_loss, recovery_loss=_distill_hidden)
def fidelity(hm: HeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
             labels: torch.Tensor | None = None, ref_pooled: torch.Tensor | None = None,
             ref_tokens: torch.Tensor | None = None) -> RowMetric:
    """Per row: cosine of the mean-pooled output to the reference's; token MSE and cosine as extras
    when `ref_tokens` is given."""
    if ref_pooled is None:
        raise HeadscopeError("the fidelity metric needs the unpruned model's pooled outputs (ref_pooled)")
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


__all__ = [
    "METRICS", "RowMetric", "accuracy", "cosine64", "default_metric", "fidelity", "final_hidden", "has_classifier",
    "has_lm_head", "lm_loss", "lm_token_losses", "mean_pool", "register_metric", "resolve_metric", "row_metric",
]
