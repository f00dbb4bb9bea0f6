"""The role registry: a role is one registration, and everything that names roles reads it.

A registration (`role(...)`, a decorator on the role's rule, in `catalogue.py`) holds the score the
role reads, its baseline, its thresholds with their defaults, its rule, its place in the census,
whether a higher score is better, and the roles.csv column it adds. The census and `decide`
(short range), `decide_long` and `long_roles` (long range), `merge_long`, roles.csv / roles.json and
the report all read it; nothing else spells a role's score or threshold.

A rule is a function of arrays, `rule(score, baseline, th) -> bool array` (`[n_layers, n_heads]`;
NaN baseline for a role without one), so the same rule applies to point estimates or to confidence
bounds. A *family* role stands for one
role per member: its names hold `{member}` (`syntax_{member}`), its heads are called `syntactic:det`.
A role with a `count` (arcs, anaphors) is judged only where that count is given and is at least
`th[min_count]` (or above 0 without one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ...artifacts import ROLES_CSV
from ...errors import HeadscopeError, did_you_mean
from ...registry import Entry, Registry
from ...table import head_name

# short: the census of `roles()`; long: `long_roles()` at --long N tokens
SCOPES = ("short", "long")
MEMBER = "{member}"

Rule = Callable[[np.ndarray, np.ndarray, "RoleThresholds"], np.ndarray]
Head = tuple[int, int]


@dataclass(frozen=True)
class Threshold:
    """One number of a decision rule: its name (a key of roles.json's `thresholds`), default and meaning."""

    name: str
    default: float
    meaning: str


class RoleRegistry(Registry[Rule]):
    """The roles, in registration order (the order a head's roles are listed in)."""

    def remove(self, name: str) -> None:
        """Withdraw a registration (a test's throwaway role, a plugin unloading)."""
        self.get(name)  # a clear error for an unknown name
        del self._entries[name]


ROLES = RoleRegistry("role")


def role(name: str, *, help: str, scope: str, order: int, score: str, baseline: str | None,
         thresholds: Sequence[Threshold], higher_is_better: bool = True, column: str | None = None,
         column_members: Sequence[str] = (), count: str | None = None, min_count: str | None = None,
         label: str | None = None, card: str | None = None) -> Callable[[Rule], Rule]:
    """Decorator: register `rule` as the decision rule of role `name`.

    `score`, `baseline` (None: the rule reads the score alone) and `count` name inputs of the rule
    (`{member}` in them makes a family); `thresholds` are the numbers the rule reads (`th.<name>`);
    `order` places the role in the census (ties by name); `column` is the roles.csv column the role
    adds (declare it in `headscope.artifacts.ROLES_CSV`; None when heads.csv's statistics hold the
    score), for a family one per `column_members`; `label` is the report's text, `card` the role's
    name for `--card-score` (long range)."""
    if scope not in SCOPES:
        raise HeadscopeError(f"role {name!r}: scope {scope!r} is not one of {', '.join(SCOPES)}")
    family = MEMBER in score
    for what, value in (("baseline", baseline), ("count", count), ("column", column)):
        if value is not None and (MEMBER in value) != family:
            raise HeadscopeError(f"role {name!r}: its {what} {value!r} and its score {score!r} must both name "
                                 f"{MEMBER} or neither")
    names = [t.name for t in thresholds]
    if min_count is not None and min_count not in names:
        raise HeadscopeError(f"role {name!r}: min_count {min_count!r} is not one of its thresholds {names}")
    declared = {t.name: t for e in of_scope(scope) for t in e.thresholds}
    for t in thresholds:
        if t.name in declared and declared[t.name].default != t.default:
            raise HeadscopeError(f"role {name!r}: threshold {t.name!r} defaults to {t.default}, but another "
                                 f"{scope}-range role declares {declared[t.name].default}")
    return ROLES.register(name, help=help, scope=scope, order=order, score=score, baseline=baseline,
                          thresholds=tuple(thresholds), higher_is_better=higher_is_better, column=column,
                          column_members=tuple(column_members), count=count, min_count=min_count,
                          label=label or name, card=card, family=family)


def of_scope(scope: str) -> list[Entry[Rule]]:
    """The roles of `scope`, in registration order."""
    return [ROLES.get(n) for n in ROLES if ROLES.get(n).scope == scope]


def key(template: str, member: str | None) -> str:
    """A family's input name for one member (`syntax_{member}`, `det` -> `syntax_det`); others as they are."""
    return template if member is None else template.replace(MEMBER, member)


def role_name(entry: Entry[Rule], member: str | None) -> str:
    """What a head holding the role is said to have: `sink`, or `syntactic:det` for a family member."""
    return entry.name if member is None else f"{entry.name}:{member}"


def resolve(name: str) -> tuple[Entry[Rule], str | None] | None:
    """The registration and family member behind a head's role name (`syntactic:det`), or None."""
    if name in ROLES:
        return ROLES.get(name), None
    base, _, member = name.partition(":")
    if member and base in ROLES and ROLES.get(base).family:
        return ROLES.get(base), member
    return None


def members(entry: Entry[Rule], inputs: Mapping[str, Any]) -> list[str | None]:
    """The members `inputs` hold every input of (score, baseline, count): [None] for a plain role."""
    def complete(m: str | None) -> bool:
        return all(t is None or key(t, m) in inputs for t in (entry.score, entry.baseline, entry.count))

    if not entry.family:
        return [None] if complete(None) else []
    head, _, tail = entry.score.partition(MEMBER)
    pattern = re.compile(f"{re.escape(head)}(.+?){re.escape(tail)}")
    found = [m.group(1) for k in inputs if (m := pattern.fullmatch(k))]
    return [m for m in found if complete(m)]


def judge(scope: str, inputs: Mapping[str, np.ndarray], th: "RoleThresholds") -> dict[Head, list[str]]:
    """(layer, head) -> the roles of `scope` whose rule it passes, in registration order (heads in order)."""
    held: dict[Head, list[str]] = {}
    for entry in of_scope(scope):
        for m in members(entry, inputs):
            score = np.asarray(inputs[key(entry.score, m)], float)
            # a role without a baseline (broad) gets NaN: every rule has one call shape
            base = np.asarray(inputs[key(entry.baseline, m)], float) if entry.baseline else np.full_like(score, np.nan)
            with np.errstate(invalid="ignore", divide="ignore"):
                ok = np.nan_to_num(entry.fn(score, base, th), nan=0).astype(bool)
                if entry.count is not None:
                    n = np.asarray(inputs[key(entry.count, m)], float)
                    ok &= n >= th[entry.min_count] if entry.min_count else n > 0
            for l, h in zip(*np.nonzero(ok), strict=True):
                held.setdefault((int(l), int(h)), []).append(role_name(entry, m))
    return dict(sorted(held.items()))


def census_of(held: Iterable[tuple[tuple[int, ...], Sequence[str]]],
              inputs: Mapping[str, np.ndarray]) -> dict[str, list[dict[str, Any]]]:
    """Role -> the heads holding it with their score and baseline, best first; roles in census order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for idx, names in held:
        for name in names:
            found = resolve(name)
            entry, m = found if found else (None, None)
            score_key = key(entry.score, m) if entry else None
            base_key = key(entry.baseline, m) if entry and entry.baseline else None
            score = float(inputs[score_key][idx]) if score_key is not None and score_key in inputs else math.nan
            base = float(inputs[base_key][idx]) if base_key is not None and base_key in inputs else None
            out.setdefault(name, []).append({"head": head_name(*idx), "score": score, "baseline": base})

    def rank(name: str) -> tuple[float, str]:
        found = resolve(name)
        return (found[0].order if found else math.inf, name)

    def best_first(name: str) -> bool:
        found = resolve(name)
        return found[0].higher_is_better if found else True

    return {r: sorted(v, key=lambda e: e["score"], reverse=best_first(r))
            for r, v in sorted(out.items(), key=lambda kv: rank(kv[0]))}


def role_columns(scope: str, present: Iterable[str] | None = None) -> list[str]:
    """The roles.csv columns the roles of `scope` add (those in `present`, if given), in the order
    `headscope.artifacts.ROLES_CSV` declares them (an undeclared one last)."""
    cols: list[str] = []
    for entry in of_scope(scope):
        if entry.column is not None:
            cols += [key(entry.column, m) for m in entry.column_members] if entry.family else [entry.column]
    if present is not None:
        have = set(present)
        cols = [c for c in cols if c in have]
    declared = ROLES_CSV.fields

    def place(col: str) -> int:
        return next((i for i, f in enumerate(declared) if f.matches(col)), len(declared))

    return sorted(dict.fromkeys(cols), key=place)


def report_scores(scope: str, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """roles.json's `scores` and `baselines`: every input but baselines and counts, then the baselines
    (a family's inputs are left out of both: they have their own section, e.g. `syntax`)."""
    entries = of_scope(scope)
    baselines = {e.baseline for e in entries if not e.family and e.baseline}
    counts = {e.count for e in entries if not e.family and e.count}
    family = [re.compile(re.escape(t).replace(re.escape(MEMBER), ".+"))
              for e in entries if e.family for t in (e.score, e.baseline, e.count) if t]

    def of_family(k: str) -> bool:
        return any(p.fullmatch(k) for p in family)

    scores = {k: v for k, v in inputs.items() if k not in baselines and k not in counts and not of_family(k)}
    return scores, {k: v for k, v in inputs.items() if k in baselines}


def role_for_score(score: str, scope: str = "short") -> Entry[Rule] | None:
    """The (plain) role of `scope` that reads `score`, or None (a statistic no role reads)."""
    return next((e for e in of_scope(scope) if not e.family and e.score == score), None)


def threshold_defaults(scope: str) -> dict[str, float]:
    """Every threshold the roles of `scope` read, with its default, in registration order."""
    out: dict[str, float] = {}
    for entry in of_scope(scope):
        for t in entry.thresholds:
            out.setdefault(t.name, t.default)
    return out


T = TypeVar("T", bound="RoleThresholds")


class RoleThresholds:
    """The thresholds of one scope's rules: every registered default, any of them overridden by name.

    Reads like a frozen dataclass (`th.min_ratio`, `th["min_ratio"]`); `as_dict()` is what roles.json
    writes. Defaults are read from the registry when asked for, so a role registered later has its own.
    """

    scope = "short"
    _values: dict[str, float]  # the overridden thresholds only

    def __init__(self, **values: float) -> None:
        known = threshold_defaults(self.scope)
        for name in values:
            if name not in known:
                raise HeadscopeError(f"unknown {self.scope}-range role threshold {name!r}{did_you_mean(name, known)}; "
                                     f"choose from {', '.join(known)}")
        object.__setattr__(self, "_values", dict(values))

    def as_dict(self) -> dict[str, float]:
        """Every threshold of the scope with its value (roles.json's `thresholds`)."""
        return {**threshold_defaults(self.scope), **self._values}

    def replace(self: T, **values: float) -> T:
        """A copy with `values` changed."""
        return type(self)(**{**self._values, **values})

    def __getitem__(self, name: str) -> float:
        values = self.as_dict()
        if name not in values:
            raise HeadscopeError(f"no {self.scope}-range role threshold {name!r}{did_you_mean(name, values)}")
        return values[name]

    def __getattr__(self, name: str) -> float:
        if name.startswith("_"):
            raise AttributeError(name)
        values = self.as_dict()
        if name not in values:
            raise AttributeError(f"{type(self).__name__} has no threshold {name!r}{did_you_mean(name, values)}")
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen; make a new one: {type(self).__name__}({name}=...)")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoleThresholds) and type(other) is type(self) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(self.as_dict().items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


class Thresholds(RoleThresholds):
    """Short-range decision rules (`roles()`): a head has a role when its score passes its rule."""

    scope = "short"


class LongThresholds(RoleThresholds):
    """Long-range decision rules (`long_roles()`): a head has a role when its score passes its rule."""

    scope = "long"
