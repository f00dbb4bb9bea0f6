"""Role scores with their intervals, and roles assigned only where the interval's conservative bound passes.

Every score of the text and induction passes is a ratio of per-passage (per-sequence) sums, so resampling
passages gives its bootstrap interval (`headscope.uncertainty`, BCa by default). For each role whose score
and baseline come from such a pass:

- `<score>_lo`, `<score>_hi`: the score's interval (roles.csv; its baseline's in roles.json);
- `held_share`: the share of bootstrap resamples in which the head passes the role's rule, score and baseline
  computed on the same resample (paired);
- the decision: a head *has* the role when its rule passes on the score's conservative bound (the lower bound
  when a higher score is better, the upper bound otherwise, e.g. `local`) against the baseline's estimate;
  a head whose point estimate passes but whose bound does not holds the role as *uncertain*.

The syntactic and coreference roles read accuracies (argmax hits / arcs or anaphors): their intervals resample
sentences (windows for coreference; fixed groups of consecutive ones past 512, a block bootstrap), against the
point estimate of their baseline (the best fixed offset; the better simple coreference rule). A role without
per-passage sums (a plug-in role scored elsewhere) is decided on its estimate; roles.json's `decided_on` says
which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...stats import COUNT
from ...table import head_name
from ...uncertainty import IntervalSettings, PassageSums, Statistic, interval_from, jackknife, replicates, split_half
from ...uncertainty import ratio as ratio_of
from .registry import ROLES, RoleThresholds, key, members, of_scope, role_name


def stacked(names: list[str]) -> Statistic:
    """The ratios sum(name) / sum(name|count) of `names`, stacked on a figure axis: `[*lead, F, L, H]`."""
    parts = [ratio_of(n, n + COUNT) for n in names]

    def stat(s: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.stack([p(s) for p in parts], axis=-3)

    return stat


@dataclass
class RoleIntervals:
    """What `role_intervals` found: bounds of every score and baseline, held shares, and the roles with them."""

    bounds: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # name -> (lo, hi)
    held_share: dict[str, np.ndarray] = field(default_factory=dict)  # role -> [L, H] share of resamples
    conservative: dict[str, np.ndarray] = field(default_factory=dict)  # score -> the bound its rule reads
    roles: set[str] = field(default_factory=set)  # roles decided on their bounds
    rows: dict[str, int] = field(default_factory=dict)  # score -> rows resampled (passages or sequences)

    def columns(self, names: list[str]) -> dict[str, np.ndarray]:
        """`<name>_lo`, `<name>_hi` for each of `names` that has bounds."""
        out: dict[str, np.ndarray] = {}
        for n in names:
            if n in self.bounds:
                out[f"{n}_lo"], out[f"{n}_hi"] = self.bounds[n]
        return out


def _needed(scope: str, sums: PassageSums) -> list[tuple[Any, str, str | None]]:
    """(registration, score, baseline) of each plain role whose score (and baseline) `sums` holds with counts."""
    have = {n for n in sums.names() if n + COUNT in sums}
    out = []
    for entry in of_scope(scope):
        if entry.family or entry.count is not None:
            continue
        for m in members(entry, {n: None for n in have}):
            score, base = key(entry.score, m), key(entry.baseline, m) if entry.baseline else None
            if score in have and (base is None or base in have):
                out.append((entry, score, base))
    return out


def scores_in(sums: PassageSums, scope: str = "short") -> list[str]:
    """The role scores `sums` holds with their counts (and baselines): the rankings a pass's stability reads."""
    return list(dict.fromkeys(score for _, score, _ in _needed(scope, sums)))


def role_intervals(groups: list[PassageSums], th: RoleThresholds, settings: IntervalSettings,
                   scope: str = "short") -> RoleIntervals:
    """Intervals, held shares and conservative bounds of every plain role whose inputs one of `groups` holds
    (each group: one pass's per-passage sums; resampled on its own rows)."""
    out = RoleIntervals()
    for sums in groups:
        roles = _needed(scope, sums)
        names = list(dict.fromkeys(n for _, s, b in roles for n in (s, b) if n is not None))
        if not names or sums.rows < 2:
            continue
        sub = sums.select([x for n in names for x in (n, n + COUNT)])
        stat = stacked(names)
        value = np.asarray(stat(sub.total()), float)
        reps = replicates(sub, stat, settings.B, settings.seed)  # [B, F, L, H]
        jack = jackknife(sub, stat) if settings.method == "bca" else None
        iv = interval_from(value, reps, jack, sub.rows, settings)
        at = {n: i for i, n in enumerate(names)}
        for n, i in at.items():
            out.bounds[n] = (iv.lo[i], iv.hi[i])
            out.rows[n] = sub.rows
        for entry, score, base in roles:
            s_reps = reps[:, at[score]]
            b_reps = reps[:, at[base]] if base else np.full_like(s_reps, np.nan)
            with np.errstate(invalid="ignore"):
                held = np.asarray(entry.fn(s_reps, b_reps, th), float).mean(0)
            out.held_share[role_name(entry, None)] = np.where(np.isnan(value[at[score]]), np.nan, held)
            out.conservative[score] = iv.lo[at[score]] if entry.higher_is_better else iv.hi[at[score]]
            out.roles.add(role_name(entry, None))
    return out


def figure_replicates(sums: PassageSums, stat: Statistic,
                      settings: IntervalSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A figure's value, bootstrap replicates `[B, ...]` and (for BCa) jackknife values over the rows of `sums`."""
    value = np.asarray(stat(sums.total()), float)
    if sums.rows < 2:
        return value, np.empty((0, *value.shape)), None
    reps = replicates(sums, stat, settings.B, settings.seed)
    return value, reps, jackknife(sums, stat) if settings.method == "bca" else None


def add_member(out: RoleIntervals, role: str, member: str | None, sums: PassageSums, stat: Statistic,
               baseline: np.ndarray, th: RoleThresholds, settings: IntervalSettings) -> tuple[np.ndarray, np.ndarray]:
    """One role (a family's member) decided on its bound: its score (`stat` of `sums`: per-sentence or per-window
    hits) gets an interval and a held share against the point `baseline`; returns the score's (lo, hi)."""
    entry = ROLES.get(role)
    score = key(entry.score, member)
    value, reps, jack = figure_replicates(sums, stat, settings)
    iv = interval_from(value, reps, jack, sums.rows, settings)
    out.bounds[score], out.rows[score] = (iv.lo, iv.hi), sums.rows
    name = role_name(entry, member)
    if len(reps):
        with np.errstate(invalid="ignore"):
            held = np.asarray(entry.fn(reps, np.broadcast_to(baseline, reps.shape), th), float).mean(0)
        out.held_share[name] = np.where(np.isnan(value), np.nan, held)
    out.conservative[score] = iv.lo if entry.higher_is_better else iv.hi
    out.roles.add(name)
    return iv.lo, iv.hi


def split_roles(point: Mapping[tuple[int, int], list[str]], sure: Mapping[tuple[int, int], list[str]],
                decided: set[str]) -> tuple[dict[tuple[int, int], list[str]], dict[tuple[int, int], list[str]]]:
    """Each head's assigned and uncertain roles: a role decided on its bounds is assigned where its point
    estimate and its bound both pass and uncertain where only the point estimate does; others as estimated."""
    assigned: dict[tuple[int, int], list[str]] = {}
    uncertain: dict[tuple[int, int], list[str]] = {}
    for head, names in point.items():
        ok = set(sure.get(head, []))
        for r in names:
            (assigned if r not in decided or r in ok else uncertain).setdefault(head, []).append(r)
    return assigned, uncertain


def stability_of(sums: PassageSums, scores: list[str], seed: int) -> dict[str, dict[str, Any]]:
    """Split-half stability of each score's ranking over heads (the scores `sums` holds with counts)."""
    out = {}
    for n in scores:
        if n in sums and n + COUNT in sums:
            out[n] = split_half(sums.select([n, n + COUNT]), ratio_of(n, n + COUNT), seed=seed).record()
    return out


def reached(stability: Mapping[str, Mapping[str, Any]], target: float) -> tuple[bool, dict[str, float]]:
    """Whether every score's Spearman-Brown reaches `target` (scores without a finite one are left out)."""
    got = {n: float(s["spearman_brown"]) for n, s in stability.items()
           if isinstance(s["spearman_brown"], float) and math.isfinite(s["spearman_brown"])}
    return bool(got) and all(v >= target for v in got.values()), got


def heads_map(held: Mapping[tuple[int, int], list[str]]) -> dict[str, list[str]]:
    """(layer, head) -> roles as roles.json writes it: `L3H7` -> roles."""
    return {head_name(*h): list(v) for h, v in sorted(held.items())}


__all__ = ["RoleIntervals", "add_member", "figure_replicates", "heads_map", "reached", "role_intervals",
           "scores_in", "split_roles", "stability_of", "stacked"]
