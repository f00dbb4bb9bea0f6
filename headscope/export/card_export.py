"""`export_card(result, hm, ...)`: the head card of a `roles` or `kvcache` result, written by the library.

What `roles --export-card` and `kvcache --export-card` write, for the CLI and for Python alike (`headscope.cards`
holds the formats). A roles card comes from roles.json's long-range record: `record_card` puts what the card is
(file, format, score, how stable its ranking is) into that record first, so the result's roles.json says it, and
`export_card` then writes the card it describes. A kvcache card is DuoAttention's pattern of the KV heads the run
ranked (its `by` score, or the learned alphas), with the run's own sink and window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..capacity.kvcache_verb import KvcacheResult
from ..errors import HeadscopeError
from ..learned.longctx.confidence import card_warning
from ..learned.verbs import RolesResult
from ..models.adapter import HeadModel
from .cards import HeadCard, kvcache_duo, write_duo

__all__ = ["ExportedCard", "export_card", "record_card"]


@dataclass(frozen=True)
class ExportedCard:
    """A card written: where, and what to say about its ranking (None when nothing)."""

    path: Path
    warning: str | None = None


def record_card(result: RolesResult, path: str | Path, fmt: str = "duo", score: str = "retrieval") -> RolesResult:
    """`result` with the head card for `path` (format `fmt`, long-range score `score`) recorded in roles.json's
    `long_context.card`, ready for `export_card`; a result without a long-range census is refused."""
    long_context = result.report.long_context
    if not long_context:
        raise HeadscopeError("a head card is made from the long-range roles, and this result has none: run roles "
                             "with `long` set to export one")
    card = HeadCard.of(long_context, path, fmt, score)
    return result.with_card(card.record(), card.note)


def export_card(result: RolesResult | KvcacheResult, hm: HeadModel, path: str | Path | None = None, *,
                force: bool = False) -> ExportedCard:
    """Write the head card of `result` for the model `hm` (atomically; an existing one is replaced only with
    `force`). A roles result's card is the one `record_card` recorded (`path` defaults to its file); a kvcache
    result's card is the DuoAttention pattern directory `path` of the KV heads its run ranked."""
    if isinstance(result, RolesResult):
        long_context = result.report.long_context or {}
        rec = long_context.get("card")
        if rec is None:
            raise HeadscopeError("this roles result records no head card: call record_card(result, path) first")
        card = HeadCard.of(long_context, path if path is not None else rec["file"], rec["format"], rec["score"])
        return ExportedCard(card.write(hm, force))
    if path is None:
        raise HeadscopeError("a kvcache card needs the folder to write it to (path)")
    o = result.options
    pattern, chosen, record = kvcache_duo(result.report, hm.n_kv_heads, o.by)
    written = write_duo(path, pattern, sink=o.sink, recent=o.window, force=force,
                        source=f"headscope kvcache: {hm.name}, {chosen}", config=record)
    return ExportedCard(written, card_warning(record) if "stable" in record else None)
