"""The report's quality-vs-bytes panel (question 2): rows from real gqa/mla runs and a kvcache.csv, chart, table."""

from __future__ import annotations

import csv
import json

import pytest

from headscope import artifacts as A
from headscope.report.kv_quality import COLUMNS, MHA2MLA_SMOLLM_135M, kv_quality_part, rows
from headscope.report.sources import Sources


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny LLaMA checkpoint through `headscope gqa --kv-heads 1` and `headscope mla` at two ranks."""
    from test_mla import _cli_checkpoint

    from headscope.cli import main

    tmp = tmp_path_factory.mktemp("kvq")
    src, text = _cli_checkpoint(tmp)
    common = ["--data", str(text), "--heldout", str(text), "--uptrain", "2"]
    assert main(["gqa", str(src), "--kv-heads", "1", *common, "--out", str(tmp / "mqa")]) == 0
    for r in (4, 12):
        assert (
            main(["mla", str(src), "--kv-rank", str(r), "--rope-dims", "4", *common, "--out", str(tmp / f"r{r}")]) == 0
        )
    return tmp


def test_rows_hold_the_files_numbers(runs):
    table = rows(Sources.scan([runs / "mqa", runs / "r4", runs / "r12"]))
    by = {(r["method"], r["setting"]): r for r in table}
    assert [r["method"] for r in table].count("original") == 1  # same held-out text: one original row
    g = json.loads((runs / "mqa" / "gqa.json").read_text())
    mqa = next(r for r in table if r["method"] == "MQA")
    assert mqa["kv_share"] == pytest.approx(0.5)  # 2 -> 1 KV heads
    assert mqa["ppl_ratio_converted"] == pytest.approx(g["ppl_after"] / g["ppl_before"])
    assert mqa["ppl_ratio_uptrained"] == pytest.approx(g["ppl_uptrained"] / g["ppl_before"])
    for r in (4, 12):
        m = json.loads((runs / f"r{r}" / "mla.json").read_text())
        row = by[("MLA", f"rank {r} + 4 RoPE dims/KV head (2-norm)")]
        assert row["kv_share"] == pytest.approx((r + 2 * 4) / (2 * 2 * 8))  # (rank + kv x rope) / (2 kv d_head)
        assert row["kv_bytes_per_token"] == 2 * (r + 2 * 4) * 4
        assert row["ppl_ratio_uptrained"] == pytest.approx(m["ppl_uptrained"] / m["ppl_before"])
        assert row["uptrain_steps"] == 2
    assert [r["setting"] for r in table if r["method"] == "MLA"] == sorted(
        [r["setting"] for r in table if r["method"] == "MLA"], key=lambda s: int(s.split()[1]))


def test_kvcache_rows_relative_to_its_full_cache(tmp_path):
    cols = A.KVCACHE_CSV.columns()
    base = {c: "" for c in cols}
    data = [dict(base, method="full", budget=1, kv_fraction=1, kv_bytes_per_token=100, perplexity=10, context=2048,
                 needle_accuracy=1.0, uptrain_steps=0, sink=4, window=64),
            dict(base, method="score", chosen_by="retrieval_score", budget=0.25, kv_fraction=0.25,
                 kv_bytes_per_token=25, perplexity=12, context=2048, needle_accuracy=0.75, uptrain_steps=0, sink=4,
                 window=64),
            dict(base, method="random", budget=0.25, kv_fraction=0.25, kv_bytes_per_token=25, perplexity=15,
                 context=2048, needle_accuracy=0.25, uptrain_steps=0, sink=4, window=64)]
    with (tmp_path / "kvcache.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(data)
    table = rows(Sources.scan([tmp_path]))
    score = next(r for r in table if r["method"] == "head-aware cache (score)")
    assert score["ppl_ratio_converted"] == pytest.approx(1.2) and score["needle_accuracy"] == 0.75
    assert score["kv_share"] == 0.25 and "by retrieval_score" in score["setting"]
    rand = next(r for r in table if r["method"] == "head-aware cache (random)")
    assert rand["ppl_ratio_converted"] == pytest.approx(1.5)


def test_part_has_chart_table_and_the_published_rows(runs):
    part = kv_quality_part(Sources.scan([runs / "mqa", runs / "r4", runs / "r12"]))
    mine, published = part.panels
    assert mine["place"] == "q2" and mine["plot"].startswith("data:image/png;base64,")
    assert mine["columns"] == COLUMNS and len(mine["rows"]) == 4  # original, MQA, two MLA ranks
    assert published["rows"][-1]["avg"] == 40.97 and len(published["rows"]) == len(MHA2MLA_SMOLLM_135M)
    assert "2502.14837" in published["text"][0]
    assert any("keeps" in s and "MLA at rank 4" in s for s in part.text["q2"]), part.text


def test_nothing_found_says_which_verbs_to_run(tmp_path):
    part = kv_quality_part(Sources.scan([tmp_path]))
    assert "headscope mla" in part.panels[0]["note"] and part.panels[0]["rows"] == []


def test_files_of_another_model_are_left_out_and_named(runs, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    m = json.loads((runs / "r4" / "mla.json").read_text())
    m["provenance"]["model"]["fingerprint"] = "0" * 64  # as if converted from another model
    m["kv_rank"] = 5
    (other / "mla.json").write_text(json.dumps(m))
    skipped: list[str] = []
    table = rows(Sources.scan([runs / "r4", other]), skipped)
    assert [r["setting"].split()[1] for r in table if r["method"] == "MLA"] == ["4"]
    assert skipped == [str(other / "mla.json")]
    part = kv_quality_part(Sources.scan([runs / "r4", other]))
    assert any("Left out" in t and str(other) in t for t in part.panels[0]["text"])
