"""A linear probe as the classification head of a model that has none.

Classification importance needs a classifier; MiniLM, SmolLM2 and most checkpoints have none. A probe
gives them one (Alain & Bengio 2016; the probing classifiers of Conneau et al. 2018): a multinomial
logistic regression on the model's frozen mean-pooled final hidden states (sentence-transformers'
pooling, also for decoders), fitted on a training share of the labelled data with every head on, then
held fixed. `ProbeForSequenceClassification` wraps the model with it, so the `accuracy` metric, every
importance criterion (its loss is the probe's cross-entropy) and `headscope tasks`' classification task
run on it unchanged. What a head's importance then measures: how much the probe's features need it.

The fit: features standardised on the training share, L2 penalty `l2` on the weights (not the bias),
full-batch L-BFGS in float64 to a gradient-norm tolerance (the problem is strictly convex, so the
optimum is unique and reproducible); the standardisation is folded back into one linear layer.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from ..data import TextSource, Tokens, batches, pad_id, prepare_tokens, resolve_max_length
from ..errors import HeadscopeError
from ..models.adapter import HeadModel
from .evaluate import read_labelled
from .metrics import final_hidden, mean_pool

log = logging.getLogger(__name__)

# on standardised features, per training passage (the loss is a mean)
DEFAULT_L2 = 1e-2
# the fit's stopping rule: every partial derivative of the objective below this
_GRAD_TOL = 1e-9
_RESTARTS = 5


class ProbeForSequenceClassification(nn.Module):
    """`model` with a fixed linear probe on its mean-pooled final hidden states: `.logits` over the labels.

    The wrapped model is shared, not copied: its config, base model and attention implementation are the
    wrapper's, so gates, hooks and the statistics kernel reach the same modules. (The class name ends in
    `ForSequenceClassification`, which is how headscope tells a classifier.)
    """

    def __init__(self, model: nn.Module, weight: torch.Tensor, bias: torch.Tensor, labels: list[str]) -> None:
        super().__init__()
        # a transformers model, used through its API (base_model, ...)
        self.wrapped: Any = model
        self.probe = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            self.probe.weight.copy_(weight)
            self.probe.bias.copy_(bias)
        self.probe.requires_grad_(False)
        self.labels = list(labels)

    @property
    def config(self) -> Any:
        return self.wrapped.config

    @property
    def base_model(self) -> nn.Module:
        return self.wrapped.base_model

    def set_attn_implementation(self, name: str) -> None:
        self.wrapped.set_attn_implementation(name)

    def get_input_embeddings(self) -> nn.Module:
        return self.wrapped.get_input_embeddings()

    def get_output_embeddings(self) -> None:
        return None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **kwargs: Any) -> SequenceClassifierOutput:
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        hidden = self.wrapped.base_model(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
        pooled = mean_pool(hidden, mask)
        # the probe sits on the input device; a dispatched model ends elsewhere
        w = self.probe.weight
        return SequenceClassifierOutput(logits=self.probe(pooled.to(device=w.device, dtype=w.dtype)))


@dataclass
class Probe:
    """A fitted probe: the wrapped model, the two shares of the data and how well the probe does on each."""

    hm: HeadModel  # the model with the probe as its classification head
    train: Tokens  # labelled passages the probe was fitted on
    test: Tokens  # held-out labelled passages (what importance is scored on)
    labels: list[str]  # class names, in class-id order
    train_accuracy: float
    test_accuracy: float
    l2: float

    def summary(self) -> dict[str, Any]:
        """What a verb records about the probe (in its JSON)."""
        return {"kind": "linear probe on mean-pooled final hidden states", "labels": self.labels,
                "train_passages": len(self.train), "test_passages": len(self.test), "l2": self.l2,
                "train_accuracy": self.train_accuracy, "test_accuracy": self.test_accuracy,
                "majority_share": majority_share(self.test.labels or [])}


def majority_share(labels: list[int]) -> float:
    """The accuracy of always answering the commonest class (a probe's floor)."""
    return max(labels.count(c) for c in set(labels)) / len(labels) if labels else float("nan")


@torch.no_grad()
def pooled_features(hm: HeadModel, prep: Tokens, batch_size: int = 16) -> torch.Tensor:
    """Mean-pooled final hidden states of every passage, `[passages, d_model]` float64 (data order)."""
    out = torch.zeros(len(prep.ids), hm.d_model, dtype=torch.float64)
    for b in batches(prep.ids, batch_size, pad_id=pad_id(hm)):
        ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
        out[b.index] = mean_pool(final_hidden(hm, ids, mask), mask).double().cpu()
    return out


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float = DEFAULT_L2,
                 max_iter: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression `logits = x @ W.T + b` minimising mean cross-entropy +
    l2/2 |W|^2 on standardised features; returns (W, b) for the raw features, float64."""
    if l2 <= 0:
        raise HeadscopeError(f"the probe's L2 penalty must be positive (it makes the fit unique); got {l2}")
    x = x.double()
    mu, sd = x.mean(0), x.std(0).clamp_min(1e-8)
    z = (x - mu) / sd
    w = torch.zeros(n_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, tolerance_grad=_GRAD_TOL, tolerance_change=1e-14,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(z @ w.T + b, y) + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        # L-BFGS may stop on a tiny loss change before the gradient is ~0
        for _ in range(_RESTARTS):
            opt.step(closure)
            closure()
            gw, gb = w.grad, b.grad  # set by closure()'s backward
            if gw is not None and gb is not None and max(gw.abs().max().item(), gb.abs().max().item()) < _GRAD_TOL:
                break
    w_raw = (w / sd).detach()
    return w_raw, (b - (w / sd) @ mu).detach()


def split_labelled(texts: list[str], labels: list[str], train_share: float, seed: int
                   ) -> tuple[list[int], list[int]]:
    """Indices of a stratified random split (per class, `train_share` of its passages for training)."""
    if not 0 < train_share < 1:
        raise HeadscopeError(f"the probe's training share must be between 0 and 1 (exclusive); got {train_share}")
    rng = random.Random(seed)
    train, test = [], []
    for c in sorted(set(labels)):
        idx = [i for i, lab in enumerate(labels) if lab == c]
        rng.shuffle(idx)
        k = round(len(idx) * train_share)
        if k < 1 or k >= len(idx):
            raise HeadscopeError(f"class {c!r} has {len(idx)} passage(s): too few to split into a training and a "
                                 f"test share at {train_share}; give at least 2 per class")
        train += idx[:k]
        test += idx[k:]
    return sorted(train), sorted(test)


def fit_probe(hm: HeadModel, data: Any = "polarity", *, train_share: float = 0.5, max_length: int | None = None,
              batch_size: int = 16, seed: int = 0, l2: float = DEFAULT_L2) -> Probe:
    """Fit a linear probe on `hm`'s frozen features over labelled `data` (a labelled built-in such as
    `polarity`, a jsonl with `text` and `label`, or a list of such dicts) and wrap `hm` with it."""
    if isinstance(data, (list, tuple)):
        bad = [i for i, d in enumerate(data) if not isinstance(d, dict) or "text" not in d or "label" not in d]
        if bad:
            raise HeadscopeError(f"labelled item {bad[0]} needs 'text' and 'label' keys")
        texts, raw, source = [d["text"] for d in data], [d["label"] for d in data], "in-memory"
    else:
        texts, raw = read_labelled(data)
        source = str(data)
    names = sorted({str(r) for r in raw})
    if len(names) < 2:
        raise HeadscopeError(f"a probe needs at least two classes; {source!r} has only {names}")
    raw = [str(r) for r in raw]
    tr, te = split_labelled(texts, raw, train_share, seed)
    max_len = resolve_max_length(hm, max_length)

    def tokens(idx: list[int], part: str) -> Tokens:
        return prepare_tokens(hm, TextSource([texts[i] for i in idx], f"{source}:{part}"), max_len,
                              labels=[names.index(raw[i]) for i in idx])

    train, test = tokens(tr, "probe-train"), tokens(te, "probe-test")
    if train.labels is None or test.labels is None:  # prepare_tokens keeps the labels of the passages it keeps
        raise HeadscopeError("the probe's passages lost their labels in tokenisation")
    train_labels, test_labels = train.labels, test.labels
    x_train = pooled_features(hm, train, batch_size)
    y_train = torch.tensor(train.labels)
    w, b = fit_logistic(x_train, y_train, len(names), l2)
    dtype = hm.dtype
    model = ProbeForSequenceClassification(hm.model, w.to(dtype), b.to(dtype), names)
    # only the probe: moving the wrapper would move (and undo the dispatch of) the model
    model.probe.to(hm.device)
    probed = HeadModel(model, hm.tokenizer, name=hm.name, source=hm.source)

    def acc(x: torch.Tensor, y: list[int]) -> float:
        return float(((x @ w.T + b).argmax(-1) == torch.tensor(y)).double().mean())

    result = Probe(probed, train, test, names, acc(x_train, train_labels),
                   acc(pooled_features(hm, test, batch_size), test_labels), l2)
    log.info("probe on %s: %d classes, train accuracy %.3f, test accuracy %.3f (majority %.3f)", source, len(names),
             result.train_accuracy, result.test_accuracy, majority_share(test_labels))
    return result


__all__ = ["DEFAULT_L2", "Probe", "ProbeForSequenceClassification", "fit_logistic", "fit_probe", "majority_share",
           "pooled_features", "split_labelled"]
