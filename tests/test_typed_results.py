"""Results carry typed records (issue 41): `Record` gives the keys code reads as typed fields and writes the object
back with every key in the order it came, so a Result's file is the same, byte for byte, as the dict it was built
from would have given."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from headscope.capacity.reports import GqaReport, KvBytes, KvcacheReport, KvcacheRow, KvRow, MlaReport
from headscope.learned.causal.records import PatchRecord
from headscope.options import Record
from headscope.options.record import Estimate, IntervalsUsed
from headscope.redundancy.records import PruneSummary, UnitRow, UntilStable


@dataclass
class _Inner(Record):
    measured: int
    match: bool


@dataclass
class _Outer(Record):
    name: str
    inner: _Inner
    points: list[_Inner]
    maybe: float | None = None


def _object() -> dict[str, Any]:
    # typed keys interleaved with untyped ones, nested objects with their own untyped keys
    return {"first": [1, 2], "name": "m", "inner": {"measured": 3, "formula": "2 x 3", "match": True},
            "middle": {"a": None}, "points": [{"match": False, "measured": 1}, {"measured": 2, "match": True, "x": 0}],
            "last": "end"}


def test_a_record_writes_back_the_object_it_came_from_key_for_key():
    data = _object()
    rec = _Outer.from_json(data)
    assert rec.name == "m" and rec.inner.measured == 3 and rec.inner.match is True
    assert [p.measured for p in rec.points] == [1, 2] and isinstance(rec.points[0], _Inner)
    assert rec.rest == {"first": [1, 2], "middle": {"a": None}, "last": "end"}
    assert rec.inner.rest == {"formula": "2 x 3"}
    assert rec.maybe is None  # absent from the object: its default, and not written back
    assert json.dumps(rec.to_json()) == json.dumps(data)  # the same text: same keys, same order


def test_a_value_given_after_reading_is_written():
    rec = _Outer.from_json(_object())
    rec.maybe = 0.5
    rec.rest["added"] = 1
    rec.inner.measured = 4
    out = rec.to_json()
    assert list(out)[-2:] == ["added", "maybe"] and out["maybe"] == 0.5 and out["inner"]["measured"] == 4


def test_a_record_built_directly_writes_its_fields_in_order():
    rec = _Outer(name="n", inner=_Inner(1, False), points=[], maybe=None, rest={"x": 1})
    assert rec.to_json() == {"name": "n", "inner": {"measured": 1, "match": False}, "points": [], "maybe": None,
                             "x": 1}
    assert list(rec.to_json()) == ["name", "inner", "points", "maybe", "x"]


def test_an_object_without_a_key_code_reads_is_refused_by_name():
    data = _object()
    del data["inner"]
    with pytest.raises(TypeError, match=r"_Outer needs the keys \['inner'\]"):
        _Outer.from_json(data)


def _kv_bytes(per_token: bool) -> dict[str, Any]:
    extra = {"bytes_per_token": 96, "formula": "latent"} if per_token else {}
    return {"measured": 1536, "calculated": 1536, **extra, "seq_len": 16, "batch": 1, "dtype": "float32",
            "match": True}


def test_the_conversion_reports_type_what_the_printout_reads():
    common = {"model": "m", "model_type": "llama", "n_layers": 2, "n_heads": 6}
    texts = {"data": "t.txt", "data_passages": 12, "heldout": "t.txt", "heldout_passages": 12, "max_length": 16}
    scores = {"heldout_tokens": 132, "ppl_before": 401.5, "ppl_after": 332.2, "kl_after": 1.38, "ppl_uptrained": None,
              "kl_uptrained": None}
    gqa = {**common, "n_kv_heads_before": 2, "n_kv_heads_after": 1, "grouping": "search", **texts,
           "grouping_used": "search", "groups": [[[0, 1]], [[0, 1]]], "search_candidates": 8,
           "search_skipped": "only one grouping possible", "kl_evaluations": 0, **scores,
           "kv_bytes_before": _kv_bytes(False), "kv_bytes_after": _kv_bytes(False), "provenance": {"verb": "gqa"}}
    rec = GqaReport.from_json(gqa)
    assert rec.kv_bytes_after.measured == 1536 and rec.ppl_uptrained is None and rec.kl_evaluations == 0
    assert rec.search_trace is None and "search_trace" not in rec.to_json()
    assert json.dumps(rec.to_json(), indent=2) == json.dumps(gqa, indent=2)
    mla = {**common, "n_kv_heads": 2, "d_head": 8, "d_model": 48, "kv_rank": 4, "full_rank": 24, "rope_dims": 4,
           "selection": "2-norm", **texts, **scores, "kv_bytes_before": _kv_bytes(True),
           "kv_bytes_after": _kv_bytes(True), "kv_fraction": 0.375, "provenance": {}}
    rec = MlaReport.from_json(mla)
    assert isinstance(rec.kv_bytes_before, KvBytes) and rec.kv_bytes_before.bytes_per_token == 96
    assert json.dumps(rec.to_json(), indent=2) == json.dumps(mla, indent=2)


def test_the_kvcache_and_patching_records():
    settings = {"sink": 2, "window": 8, "context": 64, "budgets": [0.34], "threshold": None,
                "scores": {"by": "retrieval_score", "from": None}, "data": "long.txt", "passages": 1, "needles": 1,
                "chunk": 16, "random_control": True, "seed": 0, "uptrain": None}
    full = {"method": "full", "budget": 1.0, "full_kv_heads": 6, "windowed_kv_heads": 0, "sink": 2, "window": 8,
            "kv_bytes_measured": 24576, "kv_ratio": 1.0, "perplexity": 194.9, "needle_accuracy": 0.0, "needles": 1,
            "uptrain_steps": 0, "full_heads": [[0, 1, 2], [0, 1, 2]], "riders": 0, "needle_accuracy_lo": 0.0,
            "needle_accuracy_hi": 0.975}
    score = {**full, "method": "score", "budget": 0.34, "full_kv_heads": 2, "windowed_kv_heads": 4,
             "vs_random": {"verdict": "no better than random", "method": "bca", "passages": 1}}
    kv = {"model": "m", "n_layers": 2, "n_heads": 6, "n_kv_heads": 3, "d_head": 8, "settings": settings,
          "rows": [full, score], "scores": [[0.0, 0.1]], "provenance": {}}
    rec = KvcacheReport.from_json(kv)
    assert rec.settings.scores["by"] == "retrieval_score" and rec.settings.rest["chunk"] == 16
    assert all(isinstance(r, KvcacheRow) for r in rec.rows)
    assert rec.rows[0].vs_random is None and rec.rows[1].vs_random is not None
    assert rec.rows[1].rest["full_heads"] == [[0, 1, 2], [0, 1, 2]] and rec.rows[1].needle_accuracy_hi == 0.975
    assert "vs_random" not in rec.rows[0].to_json()
    assert json.dumps(rec.to_json()) == json.dumps(kv)
    patch = {"metric": "logit_diff", "direction": "noising", "positions": "all", "methods": ["exact"],
             "M_clean": {"value": 1.0, "lo": 0.5, "hi": 1.5}, "M_corrupt": {"value": 0.0, "lo": -0.1, "hi": 0.1},
             "pairs": {"n": 4}, "intervals": {"level": 0.95, "B": 200, "method": "bca", "seed": 0},
             "composition": "not computed: one layer", "provenance": {}}
    rec = PatchRecord.from_json(patch)
    assert isinstance(rec.M_clean, Estimate) and rec.M_clean.hi == 1.5
    assert isinstance(rec.intervals, IntervalsUsed) and rec.intervals.B == 200 and rec.intervals.seed == 0
    assert rec.agreement is None and rec.paths is None and rec.composition == "not computed: one layer"
    assert json.dumps(rec.to_json()) == json.dumps(patch)


def test_the_prune_summary_reads_until_stable_and_keeps_the_curves_own_keys():


    summary = {"model": "m", "n_layers": 2, "method": "gradient", "metric": "fidelity", "higher_is_better": True,
               "unit": "head", "baseline": 1.0, "within": {"0.01": {"fraction": 0.25}}, "points": 3,
               "intervals": {"level": 0.95, "B": 200, "method": "bca", "seed": 0}, "heldout": "t.txt",
               "heldout_passages": 4, "until_stable": {"target": 0.9, "reached": False, "passages": 8,
                                                       "available": 8, "rho": 0.7}, "provenance": {}}
    rec = PruneSummary.from_json(summary)
    assert isinstance(rec.until_stable, UntilStable) and rec.until_stable.reached is False
    assert rec.until_stable.rest == {"rho": 0.7} and rec.saved_model is None
    assert rec.rest["within"] == {"0.01": {"fraction": 0.25}}
    assert json.dumps(rec.to_json(), indent=2) == json.dumps(summary, indent=2)


def test_kv_rows_are_typed_and_give_back_the_calculators_rows_in_order():
    from headscope.capacity.kv_bytes import classic_rows
    from headscope.capacity.verbs import kv

    result = kv(None, classic=True, max_length=16, batch_size=2, cache_dtype="bf16")
    expected = [{"source": "classic", **r} for r in classic_rows(16, 2, "bf16")]
    assert all(isinstance(r, KvRow) for r in result.rows)
    llama = next(r for r in result.rows if r.key == "llama2-70b")
    # 80 layers x 8 KV heads x 128 d_head x 2 (K, V) x 2 bytes, for 16 tokens and a batch of 2
    assert llama.bytes_per_token == 2 * 80 * 8 * 128 * 2 and llama.cache_bytes == llama.bytes_per_token * 16 * 2
    assert llama.rest == {"dtype": "bf16", "seq_len": 16, "batch": 2}
    assert json.dumps(result.records()) == json.dumps(expected)


def test_unit_rows_read_each_methods_importance_and_keep_the_columns_in_order():
    row = {"unit": "ffn", "layer": 1, "index": 7, "importance_taylor": 0.25, "importance_activation": 2.0}
    rec = UnitRow.from_json(row)
    assert (rec.unit, rec.layer, rec.index) == ("ffn", 1, 7)
    assert rec.importance("taylor") == 0.25 and rec.importance("activation") == 2.0
    with pytest.raises(KeyError):
        rec.importance("ablation")
    assert json.dumps(rec.to_json()) == json.dumps(row)
