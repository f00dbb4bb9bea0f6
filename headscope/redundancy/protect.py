"""The heads a pruning curve never removes (`prune --protect ioi,retrieval`): before pruning, the heads that carry
each named capability are measured on the unpruned model, and the curve leaves them out of its order
(`curves.plans.candidate_units`).

- A causal task (`ioi`, `induction`, `greater-than` on decoders; `masked` on masked-LM encoders): the heads whose
  attribution-patching effect on the task's built-in pairs (`learned.causal.attribution`, denoising, logit
  difference) has its interval above 0, the rule `compare` finds a task's carriers by.
- `retrieval` (decoders): the retrieval heads of Wu et al. 2024 as `roles --long` finds them
  (`learned.longctx`), judged on the lower bound of the retrieval score's interval over the needle haystacks: the
  role's rule (score >= 0.1 and >= 3 x the uniform head's) must hold for the bound, not only for the estimate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import HeadscopeError, OptionError, did_you_mean, plural
from ..learned.causal.attribution import attribution_scan
from ..learned.causal.pairs import load_pairs
from ..learned.longctx import LongThresholds, long_roles
from ..learned.roles import ROLES
from ..models.adapter import HeadModel
from ..models.capabilities import why_not
from ..table import head_name
from ..uncertainty import IntervalSettings

log = logging.getLogger(__name__)

PAIR_TASKS = ("ioi", "induction", "greater-than", "masked")
CAPABILITIES = (*PAIR_TASKS, "retrieval")
FOR_DECODERS = ("ioi", "induction", "greater-than", "retrieval")
# built-in pairs per causal task (compare's --items default)
PAIRS = 32
# needle haystacks for retrieval (compare's --haystacks default)
HAYSTACKS = 8
# tokens per haystack (compare's --long default), capped at the model's positions
LENGTH = 512
# the shortest haystack the needle test builds (roles --long's lower bound)
SHORTEST = 64


def parse_protect(text: str) -> tuple[str, ...]:
    """--protect read: a comma-separated list of capabilities."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def check_names(names: tuple[str, ...]) -> None:
    """Refuse an unknown capability (with the closest name) or one named twice; needs no model."""
    for name in names:
        if name not in CAPABILITIES:
            raise OptionError("protect", f"names {name!r}, no capability{did_you_mean(name, CAPABILITIES)}; choose "
                                         f"from {', '.join(CAPABILITIES)}")
    if len(set(names)) != len(names):
        raise OptionError("protect", f"names a capability twice: {','.join(names)}")


def _length(hm: HeadModel) -> int:
    return min(LENGTH, hm.max_positions) if hm.max_positions is not None else LENGTH


def check_model(hm: HeadModel, names: tuple[str, ...]) -> None:
    """Refuse, before any forward, a capability `hm`'s family cannot be measured on (one line)."""
    for name in names:
        kind = "a decoder" if hm.causal else "an encoder"
        if (name in FOR_DECODERS) != hm.causal:
            fits = [c for c in CAPABILITIES if (c in FOR_DECODERS) == hm.causal]
            raise OptionError("protect", f"names {name!r}, which {hm.name} ({kind}) cannot do; {kind} protects "
                                         f"{', '.join(fits)}")
        if name in PAIR_TASKS:
            why = why_not(hm.spec, "patch", hm.config.model_type)
            if why is not None:
                raise OptionError("protect", f"names {name!r}: its heads are found by patching, which "
                                             f"{hm.config.model_type} cannot do: {why}")
            if hm.output_embeddings is None:
                raise OptionError("protect", f"names {name!r}: its pairs are read from logits and {hm.name} "
                                             f"({type(hm.model).__name__}) has no language-model head")
            if hm.tokenizer is None and name != "induction":
                raise OptionError("protect", f"names {name!r}: its pairs are text and {hm.name} has no tokenizer")
        if name == "retrieval":
            if hm.tokenizer is None or not getattr(hm.tokenizer, "is_fast", False):
                raise OptionError("protect", f"names 'retrieval': its needle haystacks are built from text and "
                                             f"{hm.name} has no fast tokenizer")
            if _length(hm) < SHORTEST:
                raise OptionError("protect", f"names 'retrieval': {hm.name}'s {hm.max_positions} positions hold no "
                                             f"needle haystack (at least {SHORTEST} tokens)")


@dataclass(frozen=True)
class ProtectedHead:
    """One head kept for one capability, with the figure that decided it and its interval."""

    layer: int
    head: int
    capability: str
    # causal tasks: the normalised patching effect; retrieval: the retrieval score
    effect: float
    lo: float
    hi: float

    @property
    def name(self) -> str:
        return head_name(self.layer, self.head)

    def record(self) -> dict[str, Any]:
        return {"head": self.name, "capability": self.capability, "effect": self.effect, "lo": self.lo,
                "hi": self.hi}


@dataclass
class Protection:
    """The heads kept out of a curve's order, each with its capability, and how every capability was measured."""

    heads: list[ProtectedHead] = field(default_factory=list)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # capability -> how it was measured
    seconds: float = 0.0

    def head_set(self) -> frozenset[tuple[int, int]]:
        """Every protected (layer, head), a head kept for several capabilities once."""
        return frozenset((p.layer, p.head) for p in self.heads)

    def by_capability(self) -> dict[str, list[ProtectedHead]]:
        return {c: [p for p in self.heads if p.capability == c] for c in self.settings}

    def record(self) -> dict[str, Any]:
        """prune.json's `protected`."""
        return {"heads": sorted(head_name(l, h) for l, h in self.head_set()),
                "by_capability": {c: [p.record() for p in got] for c, got in self.by_capability().items()},
                "settings": self.settings, "seconds": self.seconds}

    def line(self) -> str:
        """'protected 3 heads: L1H0, L0H0 (induction); L5H2 (retrieval)'."""
        parts = [(", ".join(p.name for p in got) or "none") + f" ({c})" for c, got in self.by_capability().items()]
        return f"protected {plural(len(self.head_set()), 'head')}: " + "; ".join(parts)


def find_protected(hm: HeadModel, names: tuple[str, ...], *, batch_size: int, intervals: IntervalSettings,
                   progress: bool = False) -> Protection:
    """The heads carrying each capability in `names`, measured on `hm` as it is (module docstring); the pairs and
    haystacks are drawn with `intervals.seed`."""
    check_model(hm, names)
    t0 = time.perf_counter()
    out = Protection()
    for name in names:
        if name == "retrieval":
            heads, how = _retrieval_heads(hm, intervals, progress)
        else:
            heads, how = _carriers(hm, name, batch_size, intervals)
        out.heads += heads
        out.settings[name] = how
        log.info("protect %s: %s", name, ", ".join(p.name for p in heads) or "no head")
    out.seconds = time.perf_counter() - t0
    return out


def _carriers(hm: HeadModel, task: str, batch_size: int,
              intervals: IntervalSettings) -> tuple[list[ProtectedHead], dict[str, Any]]:
    """The heads whose attribution effect on `task`'s built-in pairs has an interval above 0, largest first."""
    b = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, task=task, seed=intervals.seed, limit=PAIRS,
                   max_positions=hm.max_positions)
    if len(b) < 2:
        raise HeadscopeError(f"protect {task}: {hm.name}'s tokenizer holds {len(b)} of the task's pairs; an interval "
                             f"needs at least 2")
    how: dict[str, Any] = {"method": "attribution patching (denoising, logit difference); a head is kept when its "
                                     "effect's interval lies above 0", "source": b.source, "pairs": len(b),
                           "left_out": b.skipped, "seed": intervals.seed, "intervals": intervals.record()}
    runs = attribution_scan(hm, b, batch_size=batch_size)
    try:
        iv = runs.effect(intervals)
    except HeadscopeError as e:
        # the pairs do not move the metric: no head carries the task
        how["note"] = str(e)
        return [], how
    lo = np.nan_to_num(iv.lo, nan=-1.0)  # [layer, head]; NaN: a head already pruned
    heads = [ProtectedHead(int(l), int(h), task, float(iv.value[l, h]), float(iv.lo[l, h]), float(iv.hi[l, h]))
             for l, h in zip(*np.nonzero(lo > 0), strict=True)]
    return sorted(heads, key=lambda p: -p.effect), how


def _retrieval_heads(hm: HeadModel, intervals: IntervalSettings,
                     progress: bool) -> tuple[list[ProtectedHead], dict[str, Any]]:
    """Wu et al.'s retrieval heads whose score's lower bound passes the role's rule, highest score first."""
    length, th = _length(hm), LongThresholds()
    report = long_roles(hm, length, windows=0, haystacks=HAYSTACKS, seed=intervals.seed, intervals=intervals,
                        progress=progress)
    needles = report["needles"]
    how: dict[str, Any] = {"method": "retrieval score (Wu et al. 2024) over the needle haystacks the model answered; "
                                     "a head is kept when its interval's lower bound passes the retrieval role's rule",
                           "length": length, "haystacks": len(needles["haystacks"]), "answered": needles["succeeded"],
                           "threshold": th["retrieval_score"], "min_ratio": th["min_ratio"], "seed": intervals.seed,
                           "intervals": intervals.record()}
    bounds = report["uncertainty"]["bounds"].get("retrieval_score")
    # fewer than 2 answered haystacks: no interval, so no head is known to retrieve
    if bounds is None:
        how["note"] = f"{needles['succeeded']} of {len(needles['haystacks'])} haystacks answered: no interval"
        return [], how
    score = np.asarray(report["scores"]["retrieval_score"], float)
    lo, hi = np.asarray(bounds["lo"], float), np.asarray(bounds["hi"], float)
    baseline = np.asarray(report["baselines"]["retrieval_score_uniform"], float)
    with np.errstate(invalid="ignore"):
        held = np.asarray(ROLES.get("retrieval").fn(lo, baseline, th), bool)
    heads = [ProtectedHead(int(l), int(h), "retrieval", float(score[l, h]), float(lo[l, h]), float(hi[l, h]))
             for l, h in zip(*np.nonzero(held), strict=True)]
    return sorted(heads, key=lambda p: -p.effect), how


__all__ = ["CAPABILITIES", "Protection", "ProtectedHead", "check_model", "check_names", "find_protected",
           "parse_protect"]
