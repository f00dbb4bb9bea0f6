"""The computational graph circuits are made of, in MIB's convention and native to the model's attention layout.

Senders write into the residual stream: the embeddings (`input`), every head (`L{l}H{h}`: W_O applied to its own
output) and every MLP (`MLP{l}`). Receivers read it: every head's query input (`L{l}H{h}.q`), every KV group's
key and value inputs (`L{l}G{g}.k`, `L{l}G{g}.v`: a group's keys and values are shared by its query heads, so
they are one receiver each; under MHA a group is one head), every MLP's input (`MLP{l}`) and the `logits`. A
receiver's input is the residual stream entering its norm, the sum of the outputs of every sender before it
(plus biases). An edge joins every sender to every receiver after it: heads of layer l feed layer l's MLP and
everything in later layers; MLP l feeds layers after l.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import HeadscopeError
from ...heads import Head, KVGroup
from ...models.residual import residual_layout


@dataclass(frozen=True)
class Receiver:
    """One receiver: its name, layer (n_layers for the logits), kind ("q", "k", "v", "mlp", "logits") and the
    query head it reads through (q: the head; k, v: the first head of the KV group; else -1)."""

    name: str
    layer: int
    kind: str
    head: int = -1


@dataclass
class Graph:
    """Senders and receivers in the order a forward pass computes them, and which edges exist."""

    n_layers: int
    senders: list[str]
    receivers: list[Receiver]
    head_sender: dict[tuple[int, int], int]  # (layer, head) -> sender index
    mlp_sender: dict[int, int]  # layer -> sender index
    edges: np.ndarray  # [senders, receivers] bool: the edge exists
    # q/k/v receiver index -> the projection module and the output channels it owns (HeadModel.head_channels),
    # looked up once: the adapter's lookups cost more than the forward's own work on small models
    channels: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    # [edges] sender index of each edge, edges in row-major order
    sender_of: np.ndarray = field(init=False)
    receiver_of: np.ndarray = field(init=False)  # [edges] receiver index

    def __post_init__(self) -> None:
        self.sender_of, self.receiver_of = (a.astype(np.int64) for a in np.nonzero(self.edges))

    @property
    def n_edges(self) -> int:
        return int(self.sender_of.size)

    def edge_names(self) -> list[tuple[str, str]]:
        return [(self.senders[s], self.receivers[r].name) for s, r in zip(self.sender_of, self.receiver_of,
                                                                           strict=True)]

    def receivers_at(self, layer: int, kinds: tuple[str, ...]) -> list[int]:
        """Indices of the receivers of `layer` of these kinds, in graph order."""
        return [i for i, r in enumerate(self.receivers) if r.layer == layer and r.kind in kinds]

    def mask(self, chosen: np.ndarray) -> np.ndarray:
        """`[senders, receivers]` bool from a bool `[edges]` choice."""
        out = np.zeros_like(self.edges)
        out[self.sender_of[chosen], self.receiver_of[chosen]] = True
        return out


def check_model(hm: Any) -> None:
    """Refuse, in one line, a model circuits cannot take: no LM head, a family that is not residual in, residual
    out, per-head Q/K/V channels it cannot read, or heads physically pruned."""
    if not hm.causal or hm.output_embeddings is None:
        raise HeadscopeError(f"circuits read next-token logits; {hm.name} ({type(hm.model).__name__}) is not a "
                             f"causal LM with an LM head")
    residual_layout(hm)
    why = hm.spec.refusal("qkv")
    if why:
        raise HeadscopeError(f"circuits read each head's Q/K/V channels; {hm.name} ({hm.spec.family} family): {why}")
    if hm.pruned or hm.headless_layers:
        raise HeadscopeError(f"{hm.name} has layers without all their heads (pruned or headless); circuits need "
                             f"every layer's full set of heads")


def build_graph(hm: Any) -> Graph:
    """The model's graph: senders, receivers and edges (every sender to every receiver after it)."""
    check_model(hm)
    L, H, G = hm.n_layers, hm.n_heads, hm.n_kv_heads
    # (layer, stage): stage 0 attention, 1 MLP, 2 the embeddings
    senders, at = ["input"], [(-1, 2)]
    head_sender, mlp_sender = {}, {}
    # reads: the (layer, stage) a receiver sits at; it reads senders strictly before
    receivers, reads = [], []
    for l in range(L):
        for h in range(H):
            head_sender[(l, h)] = len(senders)
            senders.append(Head(l, h).name)
            at.append((l, 0))
        mlp_sender[l] = len(senders)
        senders.append(f"MLP{l}")
        at.append((l, 1))
        receivers += [Receiver(f"{Head(l, h)}.q", l, "q", h) for h in range(H)]
        for kind in ("k", "v"):
            receivers += [Receiver(f"{KVGroup(l, g)}.{kind}", l, kind, g * (H // G)) for g in range(G)]
        receivers.append(Receiver(f"MLP{l}", l, "mlp"))
        reads += [(l, 0)] * (H + 2 * G) + [(l, 1)]
    receivers.append(Receiver("logits", L, "logits"))
    reads.append((L, 0))
    edges = np.array([[_before(s, r) for r in reads] for s in at], dtype=bool)
    channels = {i: hm.head_channels(r.layer, r.kind, r.head) for i, r in enumerate(receivers)
                if r.kind in ("q", "k", "v")}
    return Graph(L, senders, receivers, head_sender, mlp_sender, edges, channels)


def _before(sender: tuple[int, int], receiver: tuple[int, int]) -> bool:
    """Whether a sender at (layer, stage) writes before a receiver at (layer, stage) reads (the input first)."""
    if sender[0] == -1:
        return True
    return sender < receiver
