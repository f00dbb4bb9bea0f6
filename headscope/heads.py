"""A head and a KV group as values, and the one place their text names are written and read.

Inside the library a head is `Head(layer, head)` (a NamedTuple, so `l, h = head` and `(3, 5) == Head(3, 5)` keep
working) and a KV group is `KVGroup(layer, kv_head)`. Text exists only where files and people meet:
`str(Head(3, 5))` and `Head(3, 5).name` are `L3H5`, a KV group is `L3G1`, and heads patched together as one
sender are joined by '+' (`L17H4+L20H0`). Two ways back from text:

- `Head.parse` / `KVGroup.parse` read what a user typed (spaces around and any case allowed) and refuse anything
  else with one line naming the text and an example that works;
- `Head.read` / `KVGroup.read` / `split_heads` / `read_node` read names back from files headscope wrote: exactly
  the written form, else None, so that a reader can show an odd name as text instead of failing.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

from .errors import HeadscopeError

__all__ = ["Head", "KVGroup", "join_heads", "split_heads", "read_node"]

# At most 4 digits: every real layer or head index fits, and a name in a hostile file cannot place a node a million
# layers away in a report's figure (nor make int() read a huge number).
_INDEX = "([0-9]{1,4})"
_HEAD = re.compile(f"L{_INDEX}H{_INDEX}")
_GROUP = re.compile(f"L{_INDEX}G{_INDEX}")
_SEP = "+"  # between the heads of a sender patched as one


class Head(NamedTuple):
    """One attention head: its layer and its index among the layer's query heads (the original id)."""

    layer: int
    head: int

    @property
    def name(self) -> str:
        """The head as text: `L3H5`."""
        return f"L{self.layer}H{self.head}"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> Head:
        """A head a user wrote (`L3H5`, `l3h5`, spaces around allowed) -> `Head(3, 5)`; refused otherwise."""
        m = _HEAD.fullmatch(str(text).strip().upper())
        if m is None:
            raise HeadscopeError(f"cannot read head {text!r}; write heads as L<layer>H<head>, e.g. L3H7")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def read(cls, text: object) -> Head | None:
        """A head name as headscope writes it (`L3H5`, exactly) -> `Head(3, 5)`; None for anything else."""
        m = _HEAD.fullmatch(text) if isinstance(text, str) else None
        return cls(int(m.group(1)), int(m.group(2))) if m else None


class KVGroup(NamedTuple):
    """One KV head of a layer: the keys and values its group of query heads shares (GQA, MQA)."""

    layer: int
    kv_head: int

    @property
    def name(self) -> str:
        """The group as text: `L3G1`."""
        return f"L{self.layer}G{self.kv_head}"

    def __str__(self) -> str:
        return self.name

    def query_heads(self, group_size: int) -> list[Head]:
        """The query heads that read this group's keys and values (`group_size` query heads per KV head)."""
        first = self.kv_head * group_size
        return [Head(self.layer, h) for h in range(first, first + group_size)]

    @classmethod
    def parse(cls, text: str) -> KVGroup:
        """A KV group a user wrote (`L3G1`, any case, spaces around allowed) -> `KVGroup(3, 1)`; refused otherwise."""
        m = _GROUP.fullmatch(str(text).strip().upper())
        if m is None:
            raise HeadscopeError(f"cannot read KV group {text!r}; write KV groups as L<layer>G<kv_head>, e.g. L3G1")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def read(cls, text: object) -> KVGroup | None:
        """A KV group name as headscope writes it (`L3G1`, exactly) -> `KVGroup(3, 1)`; None for anything else."""
        m = _GROUP.fullmatch(text) if isinstance(text, str) else None
        return cls(int(m.group(1)), int(m.group(2))) if m else None


def join_heads(heads: Iterable[Head]) -> str:
    """Heads patched together as one sender, as text: `L17H4+L20H0` (one head alone: `L3H1`)."""
    return _SEP.join(Head(*h).name for h in heads)


def split_heads(text: object) -> tuple[Head, ...] | None:
    """`L17H4+L20H0` as written by `join_heads` -> its heads; None unless every part is a head name."""
    if not isinstance(text, str):
        return None
    heads = [Head.read(part) for part in text.split(_SEP)]
    return None if any(h is None for h in heads) else tuple(h for h in heads if h is not None)


def read_node(text: object) -> tuple[Head | KVGroup, str] | None:
    """A circuit node on a head (edges.csv): `L3H2` -> (Head(3, 2), ""), `L3H2.q` -> (Head(3, 2), "q"),
    `L3G1.k` -> (KVGroup(3, 1), "k"); None for other nodes (`input`, `MLP3`, `logits`) and odd names."""
    if not isinstance(text, str):
        return None
    name, dot, via = text.partition(".")
    if dot and via not in ("q", "k", "v"):
        return None
    unit = Head.read(name) or KVGroup.read(name)
    return None if unit is None else (unit, via)
