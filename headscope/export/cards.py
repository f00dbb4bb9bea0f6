"""Head cards: per-head long-range scores in the formats KV-compression code reads.

- `retrieval-head`: the file the Retrieval Head and HeadKV code read, `{"<layer>-<head>": [score per test]}`
  (one JSON object on one line).
- `duo`: DuoAttention's pattern directory, which kvpress's `DuoAttentionPress` reads too:
  `full_attention_heads.tsv` (`np.savetxt`, tab-separated, `[num_hidden_layers, num_key_value_heads]`, values in
  [0, 1], higher = keep the full KV cache) and `config.json` with `sink_size` and `recent_size` (the tokens a
  streaming head keeps). A KV head's score is the largest of its query heads' (`kvcache`'s rule,
  `capacity.kvcache.choice.kv_head_scores`: the KV head must stay full if any query head reading it needs the
  whole context), then min-max scaled over all KV heads of the model, so the order of the heads (all that
  DuoAttentionPress's `head_compression_ratio` and kvcache's `--keep-full` use) is kept; an unscored head (NaN)
  gets 0; when every KV head scores the same, all get 1.

Every card records how far its ranking can be trusted (`headscope.learned.longctx.confidence.card_record`: the
split-half stability of the ranking, whether it is stable, how many haystacks and windows it came from): in
`config.json` for `duo` (beside `sink_size` and `recent_size`, under `headscope`), in `<card>.config.json`
beside a `retrieval-head` file (whose readers take every key of the card itself as a head)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..capacity.kvcache.choice import kv_head_scores
from ..capacity.reports import KvcacheReport
from ..errors import HeadscopeError, OptionError
from ..io import atomic_dir, atomic_write_text
from ..learned.longctx.confidence import card_record
from ..learned.roles.registry import of_scope

# --card-score name -> the long-range score it holds (the role registry's `card` names).
CARD_SCORES = {e.card: e.score for e in of_scope("long") if e.card is not None}
CARD_FORMATS = ("retrieval-head", "duo")
DUO_PATTERN = "full_attention_heads.tsv"
DUO_CONFIG = "config.json"
# what a streaming head keeps: kvcache's --sink and --window defaults
DUO_SINK, DUO_RECENT = 4, 256


def head_card(report: dict[str, Any], score: str = "retrieval") -> tuple[dict[str, list[float]], str]:
    """The Retrieval Head / HeadKV head-score file: {"<layer>-<head>": [score per test]} and a note.

    `report` is roles.json's `long_context` (`headscope.learned.longctx.long_roles`). For `retrieval`
    the lists hold one score per haystack the model answered (Wu et al. keep only those); when it
    answered none they hold every haystack's score, and the note says so. Other scores are one
    number per head (a list of one).
    """
    if score not in CARD_SCORES:
        raise OptionError("card_score", f"{score!r} is not one of {', '.join(CARD_SCORES)}")
    note = ""
    if score == "retrieval":
        needles = report.get("needles")
        if not needles:
            raise HeadscopeError("the retrieval card needs needle prompts (haystacks=1 or more)",
                                 fields=("haystacks",))
        stack = np.asarray(needles["per_haystack"], float)  # [haystack, layer, head]
        ok = [i for i, r in enumerate(needles["haystacks"]) if r["succeeded"]]
        if not ok:
            ok = list(range(len(stack)))
            note = (f"the model answered none of the {len(stack)} haystacks; the card holds every haystack's score "
                    f"(Wu et al. keep only answered ones)")
        values = stack[ok]
    else:
        key = CARD_SCORES[score]
        if key not in report["scores"]:
            raise OptionError("card_score", f"{score} needs the long-text windows (long_windows=1 or more)",
                              also=("long_windows",))
        values = np.asarray(report["scores"][key], float)[None]
    _, L, H = values.shape
    card = {f"{l}-{h}": [float(x) for x in values[:, l, h]] for l in range(L) for h in range(H)}
    return card, note


def card_config_path(path: str | Path) -> Path:
    """Where a retrieval-head card's config (its ranking's stability and data) lies: `<card>.config.json`."""
    p = Path(path)
    return p.with_name(p.name + ".config.json")


def write_card(path: str | Path, card: dict[str, list[float]], config: dict[str, Any] | None = None) -> None:
    """Write a head card (one JSON object on one line, as the Retrieval Head code writes and reads it) and,
    given `config`, its `<card>.config.json`."""
    if config is not None:
        atomic_write_text(card_config_path(path), json.dumps(config, indent=2, allow_nan=False) + "\n")
    atomic_write_text(Path(path), json.dumps(card, allow_nan=True) + "\n")


def card_scores(card: dict[str, list[float]], n_layers: int, n_heads: int) -> np.ndarray:
    """`[n_layers, n_heads]`: each head's mean over its card list (NaN where the list is empty or missing)."""
    out = np.full((n_layers, n_heads), np.nan)
    for key, values in card.items():
        layer, head = (int(x) for x in key.split("-"))
        finite = [v for v in values if np.isfinite(v)]
        if finite:
            out[layer, head] = float(np.mean(finite))
    return out


def duo_pattern(scores: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """`[n_layers, n_kv_heads]` in [0, 1] from query-head scores `[n_layers, n_heads]` (module docstring's rule)."""
    kv = kv_head_scores(np.asarray(scores, float), n_kv_heads)
    finite = np.isfinite(kv)
    if not finite.any():
        raise HeadscopeError("every head's score is NaN (unscored); a DuoAttention pattern needs scored heads")
    lo, hi = float(kv[finite].min()), float(kv[finite].max())
    scaled = np.ones_like(kv) if hi == lo else (kv - lo) / (hi - lo)
    return np.where(finite, scaled, 0.0)


def check_card_path(path: str | Path, fmt: str, force: bool) -> Path:
    """The export_card path, refused before any work: unknown format, a file where a folder goes or the other
    way round, or one that exists without `force`."""
    if fmt not in CARD_FORMATS:
        raise OptionError("card_format", f"{fmt!r} is not one of {', '.join(CARD_FORMATS)}")
    p = Path(path)
    if fmt == "duo" and p.exists() and not p.is_dir():
        raise OptionError("export_card", f"{str(p)!r} is a file; the duo format is a directory (give a new name)")
    if fmt != "duo" and p.is_dir():
        raise OptionError("export_card", f"{str(p)!r} is a directory; give a file name such as card.json")
    if p.exists() and not force:
        raise OptionError("export_card", f"{str(p)!r} exists; pass force=True to replace it", also=("force",))
    if fmt != "duo" and card_config_path(p).exists() and not force:
        raise HeadscopeError(f"{str(card_config_path(p))!r} (the card's config) exists; pass force=True to replace it",
                             fields=("force",))
    if p.parent.exists() and not p.parent.is_dir():
        raise OptionError("export_card", f"{str(p)!r} lies under a file")
    return p


def write_duo(path: str | Path, pattern: np.ndarray, *, sink: int, recent: int, force: bool = False,
              source: str = "", config: dict[str, Any] | None = None) -> Path:
    """Write DuoAttention's pattern directory (module docstring) atomically."""
    if pattern.ndim != 2 or not np.all((pattern >= 0) & (pattern <= 1)):
        raise HeadscopeError(f"a DuoAttention pattern is [layers, kv_heads] in [0, 1]; got shape {pattern.shape}")
    path = Path(path)
    with atomic_dir(path, force=force) as tmp:
        np.savetxt(tmp / DUO_PATTERN, pattern, delimiter="\t")
        meta = {"sink_size": int(sink), "recent_size": int(recent), "num_hidden_layers": int(pattern.shape[0]),
                "num_key_value_heads": int(pattern.shape[1]),
                "rule": "max over each KV head's query heads, min-max scaled over the model; 1 = keep full",
                "source": source, **({"headscope": config} if config is not None else {})}
        (tmp / DUO_CONFIG).write_text(json.dumps(meta, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def kvcache_duo(report: KvcacheReport, n_kv_heads: int, by: str) -> tuple[np.ndarray, str, dict[str, Any]]:
    """What `kvcache --export-card` writes from kvcache.json's record: the pattern, where it came from, and what
    is known of its ranking's stability (measured here: `card_record`; read from a --scores file: that run's own
    record; learned: not a ranking of measured scores)."""
    scores = report.settings.scores
    learned = scores.get("learned")
    # DuoAttention's own pattern: the learned alphas, [layers, KV heads] in [0, 1]
    if learned is not None:
        return (np.asarray(learned["alpha"], float), "the learned alphas (--choose learned)",
                {"score": "learned alpha", "ranking_stability": None, "note": "optimised gates (DuoAttention), not "
                 "a ranking of measured scores: no split-half stability applies"})
    pattern = duo_pattern(np.asarray(report.scores, float), n_kv_heads)
    if scores.get("ranking") is not None:
        return pattern, f"--by {by}", scores["ranking"]
    return pattern, f"--by {by}", {"score": by, "ranking_stability": None, "from": scores.get("from"),
                                   "note": "scores read from --scores: the run that measured them records their "
                                           "stability (its roles.json)"}


@dataclass(frozen=True)
class HeadCard:
    """A head card made from roles' long-range record (`roles --long N --export-card FILE`): its values, the note
    said about them, and where and in which format it goes (outside --out)."""

    path: Path
    fmt: str
    score: str
    values: dict[str, list[float]]
    note: str
    # how stable the ranking was and what it came from (card_record)
    config: dict[str, Any] | None = None

    @classmethod
    def of(cls, long_context: dict[str, Any], path: str | Path, fmt: str, score: str) -> HeadCard:
        """The card of roles.json's `long_context` holding `score`, for `path` in format `fmt`."""
        values, note = head_card(long_context, score)
        return cls(Path(path), fmt, score, values, note, card_record(long_context, CARD_SCORES[score]))

    def record(self) -> dict[str, Any]:
        """What roles.json's `long_context.card` says about the card."""
        return {"file": str(self.path), "score": self.score, "note": self.note, "format": self.fmt,
                "config": self.config}

    def write(self, hm: Any, force: bool = False) -> Path:
        """Write the card (atomically) for model `hm`; returns its path."""
        if self.fmt == "duo":
            write_duo(self.path, duo_pattern(card_scores(self.values, hm.n_layers, hm.n_heads), hm.n_kv_heads),
                      sink=DUO_SINK, recent=DUO_RECENT, force=force, source=f"headscope roles: {hm.name}, "
                      f"--card-score {self.score}", config=self.config)
        else:
            write_card(self.path, self.values, self.config)
        return self.path
