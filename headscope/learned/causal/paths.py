"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): how much of a head's effect travels along one path.

A path runs from a sender to a receiver: another, later head's queries, keys or values (via q, k, v), or
straight to the logits (via direct). A sender is one head, or a set of heads patched together (Wang et al.'s
classes of heads, e.g. every S-inhibition head at once). With denoising (the default) the corrupt run is the
base and the clean run the source; noising swaps them.

1. Sender step: the base run with the sender's output taken from the source run and every other head's output
   frozen at its base value; MLPs and norms recompute. The sender's change reaches later layers only through the
   residual stream and the MLPs, never through another head. The metric of this run is the direct path's.
2. Receiver step: the base run again, with only the receiver's query (or its KV group's keys or values) replaced
   by what the sender step computed there; everything from the receiver on recomputes.

The metric is normalised as activation patching's (`patching.Runs`): 1 = the path alone restores the clean metric.
Under GQA and MQA a receiver's keys and values are its KV group's: a K or V path reaches every query head of
the group. Both steps are batched like the exact scan: copy c of a chunk of pairs patches sender c (or path c),
and the layers before the first patched one run once (`patching.widened`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from ...errors import HeadscopeError
from ...heads import Head, join_heads
from ...hooks import on_head_outputs
from ...models.adapter import HeadModel
from ...models.capabilities import why_not
from ...uncertainty import IntervalSettings
from .pairs import PairBatch
from .patching import Runs, base_runs, chunks, logits_at, metric_values, widened

VIAS = ("q", "k", "v")
Sender = tuple[Head, ...]  # the heads patched together (each by its original id)


@dataclass(frozen=True)
class PathJob:
    """One path: a sender (heads patched together) to a receiver head's q, k or v, or (receiver None, via
    "direct") to the logits."""

    sender: Sender
    receiver: Head | None
    via: str

    @property
    def receiver_name(self) -> str:
        return "logits" if self.receiver is None else Head(*self.receiver).name


def sender_name(sender: Sender) -> str:
    """`L3H1`, or the heads of a set joined by '+': `L17H4+L20H0`."""
    return join_heads(sender)


def check_receivers(hm: HeadModel, want: int | list[Head]) -> None:
    """Refuse, before any scan, receivers this model cannot have: heads it lacks, or any receiver on a family
    without per-head Q/K/V channels (`want`: a count, or the heads named; 0 = the logits alone)."""
    why = why_not(hm.spec, "paths", hm.config.model_type)
    if want and why:
        raise HeadscopeError(f"paths to heads read each head's Q/K/V channels; {hm.name} ({hm.spec.family} family): "
                             f"{why}. Paths to the logits alone still work (paths 'logits')")
    for r in want if isinstance(want, list) else []:
        check_head(hm, r, "receiver")


def check_head(hm: HeadModel, head: Head, role: str) -> None:
    """Refuse a head the model does not have, naming what it has."""
    layer, h = head
    if not 0 <= layer < hm.n_layers or h not in hm.kept_heads(layer):
        has = f"layer {layer} has heads {hm.kept_heads(layer)}" if 0 <= layer < hm.n_layers else \
            f"it has layers 0-{hm.n_layers - 1}"
        raise HeadscopeError(f"{role} {Head(*head)} is not a head of {hm.name}: {has}")


def path_jobs(hm: HeadModel, receivers: list[Head], group: list[Head] | None = None) -> list[PathJob]:
    """Each sender to the logits, then each sender whose heads all lie in earlier layers to each receiver's q, k
    and v. Senders: every head alone, or (`group`) those heads together as one."""
    check_receivers(hm, receivers)
    for h in group or []:
        check_head(hm, h, "sender")
    senders: list[Sender] = [tuple(sorted(set(group)))] if group else \
        [(Head(l, h),) for l in range(hm.n_layers) for h in hm.kept_heads(l)]
    jobs = [PathJob(s, None, "direct") for s in senders]
    for r in receivers:
        jobs += [PathJob(s, r, via) for via in VIAS for s in senders if max(l for l, _ in s) < r[0]]
    return jobs


@dataclass
class PathRuns:
    """The metric per pair and path, with clean and corrupt, as `Runs` over `[pairs, paths]`."""

    jobs: list[PathJob]
    runs: Runs

    def rows(self, settings: IntervalSettings) -> list[dict[str, Any]]:
        """paths.csv's rows: sender, receiver, via and the normalised effect with its interval."""
        iv = self.runs.effect(settings)
        return [{"sender": sender_name(j.sender), "receiver": j.receiver_name, "via": j.via,
                 "effect": iv.value[i], "effect_lo": iv.lo[i], "effect_hi": iv.hi[i]}
                for i, j in enumerate(self.jobs)]


@contextmanager
def _record_projections(hm: HeadModel, layers: list[int], store: dict[nn.Module, torch.Tensor]) -> Iterator[None]:
    """Keep the output of every Q/K/V projection of `layers` (batch as run) in `store`, keyed by module."""

    def keep(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        store[module] = out.detach()

    handles = [m.register_forward_hook(keep) for l in layers for name, m in hm.projections(l).items() if name != "o"]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _sender_forward(hm: HeadModel, b: PairBatch, base: torch.Tensor, frozen: dict[int, torch.Tensor],
                    source: dict[int, torch.Tensor], senders: list[Sender], metric: str,
                    record: list[int]) -> tuple[torch.Tensor, dict[nn.Module, torch.Tensor]]:
    """Step 1 for each sender in its own copy: the metric `[copies, pairs]` and the Q/K/V projections' outputs
    `[copies * pairs, pos, width]` of the `record` layers."""
    n, copies = base.shape[0], len(senders)
    first = min(layer for s in senders for layer, _ in s)

    def freeze(layer: int, z: torch.Tensor) -> torch.Tensor:
        new = frozen[layer].to(z.device, z.dtype).repeat(copies, 1, 1, 1)
        for c, (l, h) in ((c, head) for c, s in enumerate(senders) for head in s):
            if l == layer:
                i = hm.kept_heads(l).index(h)
                new[c * n:(c + 1) * n, :, i] = source[l][:, :, i].to(z.device, z.dtype)
        return new

    recorded: dict[nn.Module, torch.Tensor] = {}
    later = [l for l in range(first, hm.n_layers) if hm.heads_in_layer(l)]
    with torch.no_grad(), on_head_outputs(hm, freeze, layers=later), widened(hm, first, n, copies), \
            _record_projections(hm, [l for l in record if l > first], recorded):
        logits = logits_at(hm, base, b.mask, b.position.repeat(copies))
        m = metric_values(logits, b.answer.repeat(copies), b.wrong.repeat(copies), metric).view(copies, n)
    return m, recorded


def _receiver_forward(hm: HeadModel, b: PairBatch, base: torch.Tensor, recorded: dict[nn.Module, torch.Tensor],
                      slot: dict[Sender, int], jobs: list[PathJob], metric: str) -> torch.Tensor:
    """Step 2 for each path in its own copy: the metric `[copies, pairs]` of the base run with the receiver's
    channels of its projection taken from the sender's copy of step 1."""
    n, copies = base.shape[0], len(jobs)
    edits: dict[nn.Module, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for c, j in enumerate(jobs):
        assert j.receiver is not None
        module, channels = hm.head_channels(j.receiver[0], j.via, j.receiver[1])
        s = slot[j.sender]
        value = recorded[module][s * n:(s + 1) * n][..., channels.to(recorded[module].device)]
        edits.setdefault(module, []).append((c, channels, value))

    def make_hook(module: nn.Module) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], torch.Tensor]:
        def hook(mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
            out = out.clone()
            for c, channels, value in edits[module]:
                out[c * n:(c + 1) * n, ..., channels.to(out.device)] = value.to(out.device, out.dtype)
            return out

        return hook

    first = min(j.receiver[0] for j in jobs if j.receiver is not None)
    handles = [m.register_forward_hook(make_hook(m)) for m in edits]
    try:
        with torch.no_grad(), widened(hm, first, n, copies):
            logits = logits_at(hm, base, b.mask, b.position.repeat(copies))
            return metric_values(logits, b.answer.repeat(copies), b.wrong.repeat(copies), metric).view(copies, n)
    finally:
        for h in handles:
            h.remove()


def path_scan(hm: HeadModel, b: PairBatch, receivers: list[Head], *, group: list[Head] | None = None,
              metric: str = "logit_diff", direction: str = "denoising", batch_size: int = 16, copies: int = 16,
              progress: Callable[[int], None] | None = None) -> PathRuns:
    """Each sender's direct path to the logits and its paths to each later receiver's q, k and v; senders: every
    head alone, or the heads of `group` together."""
    jobs = path_jobs(hm, receivers, group)
    index = {j: i for i, j in enumerate(jobs)}
    senders = [j.sender for j in jobs if j.receiver is None]
    record = sorted({r[0] for r in receivers})
    patched = np.full((len(b), len(jobs)), np.nan)
    clean, corrupt = np.zeros(len(b)), np.zeros(len(b))
    forwards = 0
    for run in base_runs(hm, b, metric=metric, direction=direction, batch_size=batch_size, clean=clean,
                         corrupt=corrupt):
        forwards += 2
        rows, part, base = run.rows, run.part, run.base
        for some in chunks(len(senders), copies):
            batch = senders[some]
            m, recorded = _sender_forward(hm, part, base, frozen=run.base_z, source=run.source, senders=batch,
                                          metric=metric, record=record)
            forwards += 1
            for c, s in enumerate(batch):
                patched[rows, index[PathJob(s, None, "direct")]] = m[c].double().cpu().numpy()
            in_batch = set(batch)
            to_receivers = [j for j in jobs if j.receiver is not None and j.sender in in_batch]
            slot = {s: c for c, s in enumerate(batch)}
            for g in chunks(len(to_receivers), copies):
                vals = _receiver_forward(hm, part, base, recorded, slot, to_receivers[g], metric)
                forwards += 1
                for c, j in enumerate(to_receivers[g]):
                    patched[rows, index[j]] = vals[c].double().cpu().numpy()
            if progress:
                progress(len(batch))
    return PathRuns(jobs, Runs(clean, corrupt, patched, direction, forwards))

