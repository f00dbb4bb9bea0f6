"""`headscope kvcache` end to end on a tiny LLaMA (outputs against their declarations, bytes = formula,
the random control at equal bytes) and every bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from test_artifacts import WORDS, tiny_llama_dir
from test_bad_input import refused

from headscope import artifacts as A
from headscope.cli import main
from headscope.models.tiny import tiny_model

SMALL = ["--sink", "2", "--window", "8", "--context", "64", "--limit", "1", "--chunk", "16"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny LLaMA (6 query heads over 3 KV heads, 128 positions) and a text file of 100-word lines."""
    base = tmp_path_factory.mktemp("kvcache")
    src, _ = tiny_llama_dir(base, num_key_value_heads=3, max_position_embeddings=128, init_std=0.2)
    rng = np.random.default_rng(0)
    text = base / "long.txt"
    text.write_text("\n".join(" ".join(rng.choice(WORDS, 100)) for _ in range(3)) + "\n")
    return src, text


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_kvcache_run_with_retrieval_scores(llama, tmp_path):
    src, text = llama
    out = tmp_path / "out"
    assert main(["kvcache", str(src), "--keep-full", "34%,67%", "--data", str(text), "--needles", "2",
                 "--haystacks", "1", *SMALL, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("kvcache", optional=True))  # with the check
    header = (out / "kvcache.csv").read_text().splitlines()[0].split(",")
    assert A.KVCACHE_CSV.check(header) == []
    assert [c for c in header if not c.endswith(("_lo", "_hi"))] == A.KVCACHE_CSV.columns()
    assert {"needle_accuracy_lo", "needle_accuracy_hi", "ppl_vs_random_lo", "ppl_vs_random_hi"} <= set(header)
    report = json.loads((out / "kvcache.json").read_text())
    assert A.KVCACHE_JSON.check(list(report)) == []
    rows = _rows(out / "kvcache.csv")
    assert [r["method"] for r in rows] == ["full", "score", "random", "score", "random"]
    assert [int(r["full_kv_heads"]) for r in rows] == [6, 2, 2, 4, 4]  # 2 layers x 3 KV heads; random = equal bytes
    for r in rows:
        assert r["kv_bytes_measured"] == r["kv_bytes_formula"]
        assert int(r["needles"]) == 2 and r["uptrain_steps"] == "0"
    assert float(rows[0]["kv_ratio"]) == 1.0 and float(rows[1]["kv_ratio"]) < float(rows[3]["kv_ratio"]) < 1.0
    assert rows[1]["chosen_by"] == "retrieval_score" and rows[2]["chosen_by"] == ""
    assert report["settings"]["scores"]["haystacks"] == 1 and report["provenance"]["verb"] == "kvcache"
    assert len(report["rows"][1]["full_heads"]) == 2 and len(report["rows"][1]["answers"]) == 2
    assert np.asarray(report["scores"], float).shape == (2, 6)
    for r, j in zip(rows, report["rows"], strict=True):  # needle counts: the exact binomial interval of k of 2
        assert float(r["needle_accuracy_lo"]) <= float(r["needle_accuracy"]) <= float(r["needle_accuracy_hi"])
        if r["method"] == "score":  # one passage: no paired interval, and the verdict says so
            assert r["ppl_vs_random_lo"] == "" and "no interval from 1 passage" in j["vs_random"]["verdict"]
            control = rows[rows.index(r) + 1]
            assert abs(float(r["ppl_vs_random"]) - (float(r["perplexity"]) - float(control["perplexity"]))) < 1e-3


def test_kvcache_threshold_from_a_scores_file(llama, tmp_path):
    src, text = llama
    scores = tmp_path / "heads.csv"
    values = {(0, 1): 0.9, (1, 4): 0.5}  # L0H1 -> KV head 0 of layer 0, L1H4 -> KV head 2 of layer 1
    scores.write_text("layer,head,retrieval_score\n" + "".join(
        f"{l},{h},{values.get((l, h), 0.0)}\n" for l in range(2) for h in range(6)))
    out = tmp_path / "out"
    assert main(["kvcache", str(src), "--threshold", "0.4", "--scores", str(scores), "--data", str(text),
                 "--needles", "0", "--no-random", *SMALL, "--out", str(out)]) == 0
    report = json.loads((out / "kvcache.json").read_text())
    assert [r["method"] for r in report["rows"]] == ["full", "score"]
    assert report["rows"][1]["full_heads"] == [[0], [2]] and report["rows"][1]["riders"] == 2


@pytest.mark.parametrize("extra,message", [
    (["--keep-full", "0"], "--keep-full '0' must lie in (0, 1]"),
    (["--keep-full", "150%"], "--keep-full '150%' must lie in (0, 1]"),
    (["--keep-full=-5%"], "must lie in (0, 1]"),
    (["--keep-full", "half"], "is not a share of KV heads"),
    (["--sink", "-1"], "--sink must be 0 or more"),
    (["--window", "-4"], "--window must be at least 1"),
    (["--window", "0"], "--window must be at least 1"),
    (["--context", "10"], "--context 10 must exceed --sink + --window = 10"),
    (["--keep-full", "25%", "--threshold", "0.1"], "not both"),
    (["--by", "entropy"], "--by 'entropy' needs --scores FILE"),
    (["--scores", "missing.csv"], "--scores 'missing.csv' is not a file"),
    (["--limit", "0"], "--limit must be at least 1"),
])
def test_bad_input(llama, tmp_path, capsys, extra, message):
    src, text = llama
    refused(tmp_path, capsys, ["kvcache", str(src), "--data", str(text), "--sink", "2", "--window", "8", *extra],
            message)


def test_bad_scores_column(llama, tmp_path, capsys):
    src, text = llama
    f = tmp_path / "heads.csv"
    f.write_text("layer,head,entropy\n0,0,1.0\n")
    refused(tmp_path, capsys, ["kvcache", str(src), "--data", str(text), "--scores", str(f), "--by", "entropyy"],
            "has no column 'entropyy'")


def test_unsupported_family_and_mqa(tmp_path, capsys):
    gpt2 = tmp_path / "gpt2"
    tiny_model("gpt2").model.save_pretrained(gpt2)
    refused(tmp_path, capsys, ["kvcache", str(gpt2)], "model type 'gpt2'")
    mqa, _ = tiny_llama_dir(tmp_path, num_key_value_heads=1)
    refused(tmp_path, capsys, ["kvcache", str(mqa), "--context", "60", "--window", "8"], "is MQA (1 KV head per layer")
