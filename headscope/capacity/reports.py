"""The records question 2's Results carry: kv.csv's rows (`KvResult.rows`), gqa.json and mla.json
(`ConversionResult.report`) and kvcache.json (`KvcacheResult.report`), typed where code reads them (the printout,
the table, card export, the study); every other key is kept as it came (`Record.rest`) and each file is written
with its keys in their order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..options.record import Record

__all__ = ["ConversionReport", "GqaReport", "KvBytes", "KvRow", "KvcacheReport", "KvcacheRow", "KvcacheSettings",
           "MlaReport"]


@dataclass
class KvRow(Record):
    """A row of kv.csv: one layout of a model (`source` "model") or a classic config's own layout ("classic"),
    the fields the printed tables read; dtype, seq_len, batch stay in `rest`."""

    source: str
    name: str
    layout: str
    is_model: bool
    n_layers: int
    n_heads: int
    n_kv_heads: int
    group_size: int
    # one number, or a list of them when layers differ in head size
    d_head: int | list[int]
    n_sliding_layers: int
    bytes_per_token: int
    vs_mha: float
    # the whole sequence and the whole batch: present when a sequence length was given (kv always gives one)
    bytes_per_sequence: int
    cache_bytes: int
    note: str
    # a classic config's key in the calculator's table; None for a model's rows (not a kv.csv column)
    key: str | None = None


@dataclass
class KvBytes(Record):
    """A model's KV cache measured on a batch beside the calculator's bytes (MLA: also bytes per token)."""

    measured: int
    calculated: int
    seq_len: int
    batch: int
    dtype: str
    match: bool  # measured == calculated
    bytes_per_token: int | None = None  # MLA's reports only


@dataclass
class ConversionReport(Record):
    """What gqa.json and mla.json share: the model, the texts, perplexity and KL at each stage, KV bytes."""

    model: str
    n_layers: int
    n_heads: int
    data: str | None  # the uptraining text's name
    heldout: str
    heldout_passages: int
    max_length: int
    ppl_before: float
    ppl_after: float
    kl_after: float  # nats/token, converted vs original
    ppl_uptrained: float | None  # None: no uptraining steps
    kl_uptrained: float | None
    kv_bytes_before: KvBytes
    kv_bytes_after: KvBytes
    provenance: dict[str, Any]


@dataclass
class GqaReport(ConversionReport):
    """gqa.json; the search's keys are present when `grouping` was search and a search ran."""

    n_kv_heads_before: int
    n_kv_heads_after: int
    grouping_used: str
    search_trace: list[Any] | None = None  # per layer: the chosen candidate, its groups and KLs
    search_start: str | None = None  # "adjacent" or "similarity"
    calibration_kl_adjacent: float | None = None
    calibration_kl_similarity: float | None = None
    calibration_kl_start: float | None = None
    calibration_kl_search: float | None = None
    kl_evaluations: int | None = None
    search_seconds: float | None = None
    layers_changed_by_search: list[int] | None = None


@dataclass
class MlaReport(ConversionReport):
    """mla.json: the latent rank and the RoPE dimensions kept per KV head."""

    n_kv_heads: int
    d_head: int
    kv_rank: int
    full_rank: int
    rope_dims: int
    selection: str  # how the RoPE dimensions were chosen


@dataclass
class KvcacheSettings(Record):
    """kvcache.json's settings: the caches' shape, the budgets, the scores that ranked the heads, the text."""

    sink: int
    window: int
    context: int
    budgets: list[float]
    # by, from, and the measured ranking or the learned alphas (card export reads them)
    scores: dict[str, Any]
    data: str
    passages: int
    needles: int
    # the uptraining text and batches; None without uptraining steps
    uptrain: dict[str, Any] | None


@dataclass
class KvcacheRow(Record):
    """A row of kvcache.csv and kvcache.json: one cache (full, the score's or the learned choice, its random
    control) at one budget, the fields the printout reads; the plan (full_heads, sink, window), the answers, the
    passages' losses and the other columns stay in `rest`."""

    method: str
    budget: float
    full_kv_heads: int
    windowed_kv_heads: int
    riders: int
    kv_bytes_measured: int
    kv_ratio: float
    perplexity: float
    needle_accuracy: float
    needles: int
    # the needles' exact binomial interval (NaN without needles); None on a row as measured, before the intervals
    needle_accuracy_lo: float | None = None
    needle_accuracy_hi: float | None = None
    # steps of uptraining the model decoding through this cache took (0: none)
    uptrain_steps: int = 0
    # a choice against its random control at equal bytes (verdict, method, passages, ...); None on other rows
    vs_random: dict[str, Any] | None = None


@dataclass
class KvcacheReport(Record):
    """kvcache.json: the model, the settings, one row per cache (method, budget, quality, bytes: kvcache.csv's
    rows, with the heads kept full) and every head's score, [layers][heads] (what card export ranks)."""

    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    settings: KvcacheSettings
    rows: list[KvcacheRow]
    scores: list[list[float]]
    provenance: dict[str, Any]
