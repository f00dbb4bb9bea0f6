"""The heads rows' role census: how many heads hold each role in BASE and in OTHER, with a paired interval on the
change (`roles:<role>` rows of the `heads` task).

The census is `roles`' (learned.roles): each role a per-head score that is a ratio of per-item sums, beside a
baseline, with the registry's rule (e.g. previous_token: mass at offset -1 >= 0.5 and >= 3 x a uniform head's).
Two passes give the scores, each over its own items:

- the text pass (analyze's statistics and the role masses) over the language-model row's held-out passages:
  previous_token, self, positional:-2/-3, sink, delimiter, broad, local, rare_word (and, on encoders, next_token,
  positional:+2/+3);
- the induction pass over repeated random token sequences: induction, duplicate_token.

A row's value in one model is the number of heads whose rule passes on the score's estimate over the row's items,
`roles`' `roles` and `uncertain_roles` columns together: the census before `roles` asks each score's bootstrap
bound to pass too. The bound would need a bootstrap inside every resample of the change's interval; the estimate
needs none, so a resample of the items (the same for both models: paired) recomputes both models' scores and
counts, and the change's interval is the bootstrap of that difference of counts. Both models run the same passes
on the same items; each pass runs once per model, whatever the number of rows reading it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..data import Tokens
from ..errors import HeadscopeError
from ..learned.roles import RoleThresholds, Thresholds
from ..learned.roles.catalogue import OFFSET_ROLES
from ..learned.roles.induction import INDUCTION_SCORES, induction_sums, repeated_sequences, special_frame
from ..learned.roles.registry import of_scope, role_name
from ..learned.roles.text import text_pass, text_sums
from ..models.adapter import HeadModel
from ..stats import COUNT
from ..table import head_name
from ..uncertainty import PassageSums, ratio

__all__ = ["REPEAT_LENGTH", "census_rows", "census_spec"]

# tokens per random sequence of the induction pass (roles' default), fewer when positions lack
REPEAT_LENGTH = 24
Sums = dict[str, np.ndarray]
AHEAD = {name for offset, name, _, _ in OFFSET_ROLES if offset > 0}  # a decoder's head never sees these keys


def _inputs(entry: Any) -> tuple[str, str | None]:
    """A role's score and baseline (None: a role without one, broad) as named in the passes' sums."""
    return entry.score, entry.baseline


def census_spec(causal: bool) -> list[tuple[Any, str]]:
    """(registration, pass) of each census role a compare row counts: the short-range plain roles scored by the text
    or induction pass (not the treebank's or coreference's, which need their own files), in registration order."""
    out = []
    for entry in of_scope("short"):
        if entry.family or entry.count is not None or (causal and entry.name in AHEAD):
            continue
        out.append((entry, "induction" if entry.score in INDUCTION_SCORES else "text"))
    return out


def compact(arrays: Mapping[str, np.ndarray]) -> Sums:
    """Per-item sums, an array that holds one value per item across every head (a count, a uniform head's mass)
    kept as `[items, 1, 1]`: the ratios broadcast it, and compare.json holds one number per item instead of one
    per head."""
    out: Sums = {}
    for k, v in arrays.items():
        v = np.asarray(v, float)
        flat = v.reshape(len(v), -1)
        same = flat.shape[1] > 0 and bool(np.all(flat == flat[:, :1]))
        out[k] = flat[:, :1].reshape(len(v), *([1] * (v.ndim - 1))) if same else v
    return out


def held(entry: Any, th: RoleThresholds, s: Mapping[str, np.ndarray]) -> np.ndarray:
    """Whether each head passes the role's rule on the ratios of sums `s` (`[..., L, H]` booleans; NaN scores
    fail)."""
    score_name, base_name = _inputs(entry)
    score = np.asarray(ratio(score_name, score_name + COUNT)(s), float)
    base = (np.broadcast_to(np.asarray(ratio(base_name, base_name + COUNT)(s), float), score.shape)
            if base_name else np.full_like(score, np.nan))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(np.asarray(entry.fn(score, base, th), float), nan=0.0).astype(bool)


def count_of(entry: Any, th: RoleThresholds) -> Callable[[Mapping[str, np.ndarray]], np.ndarray]:
    """The row's statistic: the number of heads holding the role, from the sums (`[L, H]` each, or `[B, L, H]`
    for B resamples at once: then `[B]` counts)."""
    def stat(s: Mapping[str, np.ndarray]) -> np.ndarray:
        return held(entry, th, s).sum(axis=(-2, -1)).astype(float)

    return stat


class CensusPasses:
    """The text and induction passes of each model, run once and shared by every census row."""

    def __init__(self, tokens: Tokens, data: Any, limit: int | None, sequences: int, length: int, seed: int,
                 batch_size: int) -> None:
        self.tokens, self.data, self.limit = tokens, data, limit
        self.sequences, self.length, self.seed, self.batch_size = sequences, length, seed, batch_size
        self.done: dict[int, dict[str, PassageSums]] = {}  # id(model) -> pass -> per-item sums

    def of(self, hm: HeadModel, which: str) -> PassageSums:
        if id(hm) not in self.done:
            self.done[id(hm)] = {"text": self._text(hm), "induction": induction_sums(
                hm, self.sequences, self.length, self.seed, self.batch_size)}
        return self.done[id(hm)][which]

    def _text(self, hm: HeadModel) -> PassageSums:
        stats, role_stats, _ = text_pass(hm, self.data, self.tokens.max_length, self.batch_size, self.limit, False)
        sums = text_sums(stats, role_stats)
        if sums is None:
            raise HeadscopeError(f"the role census's text pass kept no per-passage sums for {hm.name}")
        return sums


def repeat_length(hm: HeadModel) -> int:
    """The induction pass's sequence length: roles' 24, or what twice fits the model's positions."""
    prefix, suffix = special_frame(hm)
    room = ((hm.max_positions or 2 * REPEAT_LENGTH + len(prefix) + len(suffix)) - len(prefix) - len(suffix)) // 2
    return min(REPEAT_LENGTH, room)


def census_rows(hm: HeadModel, tokens: Tokens, data: Any, limit: int | None, sequences: int, seed: int,
                batch_size: int, make_row: Callable[..., Any]) -> list[Any]:
    """One `roles:<role>` row per census role (`census_spec`), built with `make_row(capability, metric,
    higher_is_better, statistic, items, run, describe, fingerprint, restore)` (the suite's Row). Raises
    HeadscopeError when the induction sequences cannot be built (a vocabulary or positions too small)."""
    length = repeat_length(hm)
    ids, _ = repeated_sequences(hm, sequences, length, seed)  # refused here, before any forward
    th = Thresholds()
    passes = CensusPasses(tokens, data, limit, sequences, length, seed, batch_size)
    items = {"text": tokens.ids, "induction": ids.tolist()}
    source = {"text": f"{tokens.source}: {len(tokens)} passages of up to {tokens.max_length} tokens",
              "induction": f"{sequences} random token sequences of {length} tokens, each repeated (seed {seed})"}
    rows = []
    for entry, which in census_spec(hm.causal):
        rows.append(_row(entry, which, th, passes, items[which], source[which], make_row))
    return rows


def _row(entry: Any, which: str, th: RoleThresholds, passes: CensusPasses, items: list[list[int]], source: str,
         make_row: Callable[..., Any]) -> Any:
    name = role_name(entry, None)
    keys = [k for n in _inputs(entry) if n for k in (n, n + COUNT)]
    heads: dict[str, list[str]] = {}
    describe: dict[str, Any] = {
        "what": f"heads holding the role {name} ({entry.help}) by roles' rule on the score's estimate over the "
                f"items (roles' roles + uncertain_roles columns)", "pass": which, "source": source,
        "score": entry.score, "baseline": entry.baseline,
        "thresholds": {t.name: th[t.name] for t in entry.thresholds}, "heads": heads}

    def run(hm: HeadModel) -> Sums:
        sums = passes.of(hm, which)
        got = compact({k: sums[k] for k in keys})
        on = held(entry, th, {k: v.sum(0) for k, v in got.items()})
        heads["base" if "base" not in heads else "other"] = [head_name(int(l), int(h)) for l, h in zip(*np.nonzero(on),
                                                                                                     strict=True)]
        return got

    def restore(earlier: dict[str, Any]) -> None:  # BASE reused (--base-from): its heads come with it
        heads["base"] = list((earlier.get("heads") or {}).get("base", []))

    digest = hashlib.sha256(f"{name}|{which}|{sorted(describe['thresholds'].items())}".encode())
    for seq in items:
        digest.update(np.asarray([len(seq), *seq], dtype=np.int64).tobytes())
    return make_row(capability=f"roles:{name}", metric="heads", higher=True, statistic=count_of(entry, th),
                    items=items, run=run, describe=describe, fingerprint=digest.hexdigest(), restore=restore)
