"""Exact activation patching of every head's output (its `z`, the head's slice of the output projection's input).

Denoising (the default) runs the corrupt text with one head's output taken from the clean run; noising runs the
clean text with one head's output from the corrupt run. At all positions (the default) or one position at a time.
The metric M is the mean over pairs of logit(answer) - logit(wrong) (`logit_diff`), p(answer) (`prob`) or
-log p(answer) (`loss`), read at the last position (the mask's on encoders). Each head's effect is

    effect = (M(base run, head patched) - M(base run)) / (M(clean) - M(corrupt))

with the base run the corrupt one (denoising: 1 = the head alone restores the clean metric) or the clean one
(noising: -1 = the head's corrupt output alone destroys it), TransformerLens's normalisation. Intervals: bootstrap
over pairs (headscope.uncertainty), each resample recomputing the ratio.

The scan is batched over heads: each forward stacks `copies` copies of a chunk of pairs, copy c patching job c
(one head, or one head at one position), so a full scan costs about heads / copies forwards per chunk.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...errors import HeadscopeError
from ...hooks import capture_head_outputs, on_head_outputs
from ...models.adapter import HeadModel
from ...models.dispatch import input_device
from ...uncertainty import Interval, IntervalSettings, PassageSums, bootstrap
from .pairs import PairBatch

METRICS = ("logit_diff", "prob", "loss")
DIRECTIONS = ("denoising", "noising")


@dataclass(frozen=True)
class Job:
    """One patch: layer, the head's index among the layer's kept heads, and a position (None: all)."""

    layer: int
    index: int
    position: int | None = None


def logits_at(hm: HeadModel, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The model's logits `[rows, vocab]` (float32) at each row's metric position."""
    if hm.output_embeddings is None:
        raise HeadscopeError(f"patching reads logits; {hm.name} ({type(hm.model).__name__}) has no LM head: load a "
                             f"causal LM or a masked-LM model (e.g. a *ForMaskedLM checkpoint)")
    dev = input_device(hm.model)
    kw: dict[str, Any] = {"use_cache": False} if hm.causal else {}
    out = hm.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), **kw)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[torch.arange(logits.shape[0], device=logits.device), position.to(logits.device)].float()


def metric_values(logits: torch.Tensor, answer: torch.Tensor, wrong: torch.Tensor, metric: str) -> torch.Tensor:
    """The metric of each row `[rows]` from its logits `[rows, vocab]`."""
    a, w = answer.to(logits.device)[:, None], wrong.to(logits.device)[:, None]
    if metric == "logit_diff":
        return (logits.gather(1, a) - logits.gather(1, w))[:, 0]
    logp = F.log_softmax(logits, dim=-1).gather(1, a)[:, 0]
    if metric == "prob":
        return logp.exp()
    if metric == "loss":
        return -logp
    raise HeadscopeError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def run_metric(hm: HeadModel, b: PairBatch, ids: torch.Tensor, metric: str) -> torch.Tensor:
    return metric_values(logits_at(hm, ids, b.mask, b.position), b.answer, b.wrong, metric)


def all_jobs(hm: HeadModel, width: int | None = None) -> list[Job]:
    """Every head (of every layer with heads), at all positions or (width given) at each position in turn."""
    heads = [(l, i) for l in range(hm.n_layers) for i in range(hm.heads_in_layer(l))]
    if width is None:
        return [Job(l, i) for l, i in heads]
    return [Job(l, i, p) for l, i in heads for p in range(width)]


def patched_forward(hm: HeadModel, b: PairBatch, base: torch.Tensor, source: dict[int, torch.Tensor],
                    jobs: list[Job], metric: str) -> torch.Tensor:
    """The metric `[len(jobs), pairs]` of the base ids with job c's head taken from `source` in copy c."""
    n = base.shape[0]
    layers = sorted({j.layer for j in jobs})

    def patch(layer: int, z: torch.Tensor) -> torch.Tensor:
        z = z.clone()
        for c, j in enumerate(jobs):
            if j.layer == layer:
                src = source[layer][:, :, j.index].to(z.device, z.dtype)
                at = slice(None) if j.position is None else slice(j.position, j.position + 1)
                z[c * n:(c + 1) * n, at, j.index] = src[:, at]
        return z

    copies = len(jobs)
    with torch.no_grad(), on_head_outputs(hm, patch, layers=layers), widened(hm, layers[0], n, copies):
        logits = logits_at(hm, base, b.mask, b.position.repeat(copies))
        return metric_values(logits, b.answer.repeat(copies), b.wrong.repeat(copies), metric).view(copies, n)


def _repeat(x: Any, n: int, copies: int) -> Any:
    """`x` with every batch-first tensor (2-D or more) of batch size n repeated `copies` times along the batch, in
    tuples and dicts too; 1-D tensors (cache positions, [pos]) are never batched."""
    if isinstance(x, torch.Tensor) and x.dim() > 1 and x.shape[0] == n:
        return x.repeat(copies, *([1] * (x.dim() - 1)))
    if isinstance(x, tuple):
        return tuple(_repeat(v, n, copies) for v in x)
    if isinstance(x, dict):
        return {k: _repeat(v, n, copies) for k, v in x.items()}
    return x


@contextmanager
def widened(hm: HeadModel, layer: int, n: int, copies: int) -> Iterator[None]:
    """Run the layers before `layer` once on the n rows, then widen the batch to `copies` x n rows at `layer`'s input
    and every later layer's other inputs (masks, position embeddings): the copies differ only from there on, so
    the layers before it are not computed `copies` times. A rotary table or mask of batch 1 broadcasts and is left
    as it is."""
    if copies == 1:
        yield
        return

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return _repeat(args, n, copies), _repeat(kwargs, n, copies)

    handles = [hm.layers[l].register_forward_pre_hook(hook, with_kwargs=True) for l in range(layer, hm.n_layers)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


@dataclass
class Runs:
    """Per-pair metric values: clean, corrupt `[pairs]` and patched `[pairs, *shape]` (NaN where no head)."""

    clean: np.ndarray
    corrupt: np.ndarray
    patched: np.ndarray
    direction: str
    forwards: int = 0

    @property
    def base(self) -> np.ndarray:
        return self.corrupt if self.direction == "denoising" else self.clean

    def sums(self) -> PassageSums:
        return PassageSums({"patched": self.patched, "base": self.base, "clean": self.clean,
                            "corrupt": self.corrupt})

    def effect(self, settings: IntervalSettings) -> Interval:
        """The normalised effect of every patch with its bootstrap interval over pairs."""
        extra = self.patched.ndim - 1
        if abs(float(np.mean(self.clean) - np.mean(self.corrupt))) < 1e-12:
            raise HeadscopeError("M(clean) equals M(corrupt) on these pairs: the effect's denominator is 0; the "
                                 "pairs do not change the metric")

        def stat(s: Any) -> np.ndarray:
            lift = lambda x: np.reshape(x, (*np.shape(x), *([1] * extra)))  # noqa: E731
            with np.errstate(invalid="ignore", divide="ignore"):
                return (s["patched"] - lift(s["base"])) / lift(s["clean"] - s["corrupt"])

        return bootstrap(self.sums(), stat, settings)


def base_and_source(b: PairBatch, direction: str) -> tuple[torch.Tensor, torch.Tensor]:
    if direction not in DIRECTIONS:
        raise HeadscopeError(f"unknown direction {direction!r}; choose one of {', '.join(DIRECTIONS)}")
    return (b.corrupt, b.clean) if direction == "denoising" else (b.clean, b.corrupt)


def capture(hm: HeadModel, b: PairBatch, ids: torch.Tensor, metric: str) -> tuple[dict[int, torch.Tensor],
                                                                                   torch.Tensor]:
    """Every layer's head outputs on `ids` and the metric there."""
    store: dict[int, torch.Tensor] = {}
    with torch.no_grad(), capture_head_outputs(hm, store):
        m = run_metric(hm, b, ids, metric)
    return store, m


@dataclass
class BaseRuns:
    """One chunk of pairs after its source and base runs: the base ids and each layer's head outputs on both."""

    rows: slice
    part: PairBatch
    base: torch.Tensor
    source: dict[int, torch.Tensor]
    base_z: dict[int, torch.Tensor]


def base_runs(hm: HeadModel, b: PairBatch, *, metric: str, direction: str, batch_size: int, clean: np.ndarray,
              corrupt: np.ndarray) -> Iterator[BaseRuns]:
    """For each chunk of `batch_size` pairs, its source and base runs (two forwards), their metrics written into
    `clean` and `corrupt` `[pairs]`."""
    for rows in chunks(len(b), batch_size):
        part = b.take(rows)
        base, src_ids = base_and_source(part, direction)
        source, m_src = capture(hm, part, src_ids, metric)
        base_z, m_base = capture(hm, part, base, metric)
        (clean if direction == "denoising" else corrupt)[rows] = m_src.double().cpu().numpy()
        (corrupt if direction == "denoising" else clean)[rows] = m_base.double().cpu().numpy()
        yield BaseRuns(rows, part, base, source, base_z)


def exact_scan(hm: HeadModel, b: PairBatch, *, metric: str = "logit_diff", direction: str = "denoising",
               positions: str = "all", batch_size: int = 16, copies: int = 16,
               progress: Callable[[int], None] | None = None) -> Runs:
    """Patch every head (positions 'all') or every head at every position ('each') of every pair."""
    width = int(b.mask.shape[1])
    jobs = all_jobs(hm, width if positions == "each" else None)
    shape = (hm.n_layers, hm.n_heads, width) if positions == "each" else (hm.n_layers, hm.n_heads)
    patched = np.full((len(b), *shape), np.nan)
    clean, corrupt = np.zeros(len(b)), np.zeros(len(b))
    kept = {l: hm.kept_heads(l) for l in range(hm.n_layers)}
    forwards = 0
    for run in base_runs(hm, b, metric=metric, direction=direction, batch_size=batch_size, clean=clean,
                         corrupt=corrupt):
        forwards += 2
        rows = run.rows
        for group in chunks(len(jobs), copies):
            vals = patched_forward(hm, run.part, run.base, run.source, jobs[group], metric).double().cpu().numpy()
            forwards += 1
            for c, j in enumerate(jobs[group]):
                at = (rows, j.layer, kept[j.layer][j.index]) + (() if j.position is None else (j.position,))
                patched[at] = vals[c]
            if progress:
                progress(group.stop - group.start)
    return Runs(clean, corrupt, patched, direction, forwards)


def naive_scan(hm: HeadModel, b: PairBatch, *, metric: str = "logit_diff") -> np.ndarray:
    """The per-head loop, one forward per head (denoising, all positions): the benchmark's baseline."""
    source, _ = capture(hm, b, b.clean, metric)
    out = np.full((len(b), hm.n_layers, hm.n_heads), np.nan)
    for j in all_jobs(hm):
        out[:, j.layer, hm.kept_heads(j.layer)[j.index]] = patched_forward(hm, b, b.corrupt, source, [j],
                                                                          metric)[0].double().cpu().numpy()
    return out
