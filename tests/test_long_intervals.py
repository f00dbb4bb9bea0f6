"""Long-range role scores with intervals over haystacks / windows, their rankings' split-half stability, and the
head cards that record it (issue 35)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_study import WORDS

from headscope.cli import main
from headscope.learned.longctx import PATTERNS
from headscope.learned.longctx.confidence import (
    STABLE_AT,
    card_record,
    card_warning,
    is_stable,
    long_intervals,
    needle_sums,
    reached,
    window_sums,
)
from headscope.learned.roles.registry import LongThresholds, role_columns
from headscope.models.tiny import tiny_model
from headscope.uncertainty import IntervalSettings

SETTINGS = IntervalSettings(B=400, seed=0)


def covered(lo: np.ndarray, hi: np.ndarray, true: np.ndarray) -> float:
    return float(((lo <= true) & (true <= hi)).mean())


def test_retrieval_intervals_cover_the_true_hit_rate():
    """Per-haystack hits of heads with known hit rates p (binomial over a 6-token needle): the 95% intervals
    over 24 haystacks cover p for about 95% of 3 x 240 heads."""
    rng = np.random.default_rng(1)
    shares = []
    for rep in range(3):
        true = rng.uniform(0.05, 0.9, size=(4, 60))
        hits = rng.binomial(6, true, size=(24, 4, 60)) / 6  # [haystack, layer, head]
        sums = needle_sums(hits, [0.01] * 24, list(range(24)))
        iv = long_intervals([sums], LongThresholds(), IntervalSettings(B=400, seed=rep), seed=rep)
        b = iv["bounds"]["retrieval_score"]
        shares.append(covered(b["lo"], b["hi"], true))
    assert 0.90 <= np.mean(shares) <= 0.985, shares


def test_window_intervals_cover_the_true_mass():
    """Windows with different numbers of counted queries, each query's mass drawn around a head's true mean:
    (Beta-distributed), the ratio-of-sums interval over 16 windows covers the true mean for about 95% of the heads."""
    rng = np.random.default_rng(2)
    L, H, W = 3, 80, 16
    true = rng.uniform(0.1, 0.9, size=(L, H))
    rows = []
    for _ in range(W):
        n = int(rng.integers(20, 200))  # counted queries of this window
        q = rng.beta(4 * true, 4 * (1 - true), size=(n, L, H))  # masses in [0, 1] with mean `true`
        row = {}
        for name in PATTERNS:
            row[name], row[name + "|count"], row[name + "_uniform"] = q.sum(0), np.full(L, n), np.full(L, 0.3 * n)
        rows.append(row)
    iv = long_intervals([window_sums(rows, PATTERNS, H)], LongThresholds(), SETTINGS, seed=0)
    b = iv["bounds"]["streaming_share"]
    assert 0.90 <= covered(b["lo"], b["hi"], true) <= 0.99
    assert iv["rows"]["streaming_share"] == W
    base = iv["bounds"]["streaming_share_uniform"]  # the baseline's interval too (constant 0.3: degenerate)
    assert np.allclose(base["lo"], 0.3) and np.allclose(base["hi"], 0.3)


def test_stability_tells_a_real_ranking_from_noise():
    rng = np.random.default_rng(3)
    true = rng.uniform(0, 1, size=(2, 30))
    real = needle_sums(np.clip(true[None] + rng.normal(0, 0.1, (16, 2, 30)), 0, 1), [0.0] * 16, list(range(16)))
    noise = needle_sums(rng.uniform(0, 1, (16, 2, 30)), [0.0] * 16, list(range(16)))
    th = LongThresholds()
    good = long_intervals([real], th, SETTINGS, 0)["stability"]["retrieval_score"]
    bad = long_intervals([noise], th, SETTINGS, 0)["stability"]["retrieval_score"]
    assert good["spearman_brown"] >= STABLE_AT > bad["spearman_brown"]
    assert is_stable(good) and not is_stable(bad)
    assert reached(real, ("retrieval_score",), 0.9, 0) and not reached(noise, ("retrieval_score",), 0.9, 0)
    assert not reached(real.take(list(range(6))), ("retrieval_score",), 0.1, 0)  # under 8 haystacks: not yet


def test_one_haystack_has_no_interval_and_is_never_called_stable():
    sums = needle_sums(np.full((1, 2, 3), 0.5), [0.0], [0])
    lc = {"length": 128, "needles": {"haystacks": [{}], "succeeded": 1},
          "uncertainty": long_intervals([sums], LongThresholds(), SETTINGS, 0)}
    b = lc["uncertainty"]["bounds"].get("retrieval_score")
    assert b is None or np.isnan(b["lo"]).all()
    rec = card_record(lc, "retrieval_score")
    assert rec["stable"] is False and rec["haystacks"] == 1 and rec["windows"] == 0
    json.dumps(rec, allow_nan=False)  # NaN stability is written as null
    line = card_warning(rec)
    assert line is not None and line.startswith("warning:") and "\n" not in line and "1 haystacks" in line


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    base = tmp_path_factory.mktemp("longiv")
    from tokenizers import Tokenizer, models, pre_tokenizers  # only this fixture builds a tokenizer
    from transformers import PreTrainedTokenizerFast  # (as test_study.tiny_llama_dir, with 512 positions)

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", ".", ",", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    src = base / "llama"  # streaming / echo at long range need more than sink 64 + recent 256 tokens
    tiny_model("llama", vocab_size=len(vocab), max_position_embeddings=512).model.save_pretrained(src)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(src)
    rng = np.random.default_rng(0)
    text = base / "t.txt"
    text.write_text("\n".join(" ".join(rng.choice(WORDS, 12)) for _ in range(8)) + "\n")
    long = base / "long.txt"
    long.write_text("\n".join(" ".join(rng.choice(WORDS, 1600)) for _ in range(4)) + "\n")
    return src, text, long


def _roles(src, text, long, out, *extra):
    return main(["roles", str(src), "--data", str(text), "--limit", "8", "--max-length", "16", "--long", "384",
                 "--long-data", str(long), "--out", str(out), "--bootstrap", "200", *extra])


@pytest.mark.parametrize("fmt", ["duo", "retrieval-head"])
def test_roles_long_writes_intervals_and_the_card_records_stability(llama, tmp_path, capsys, fmt):
    src, text, long = llama
    out, card = tmp_path / "out", tmp_path / ("duo" if fmt == "duo" else "card.json")
    score = "streaming" if fmt == "duo" else "retrieval"
    assert _roles(src, text, long, out, "--long-windows", "6", "--haystacks", "2", "--export-card", str(card),
                  "--card-format", fmt, "--card-score", score) == 0
    printed = capsys.readouterr().out
    df = pd.read_csv(out / "roles.csv")
    for name in role_columns("long"):  # every long-range score has its interval columns
        assert {name, f"{name}_lo", f"{name}_hi"} <= set(df.columns), name
    s, lo, hi = df["streaming_share"], df["streaming_share_lo"], df["streaming_share_hi"]
    assert np.isfinite(lo).all() and (lo <= s + 1e-12).all() and (s <= hi + 1e-12).all()
    lc = json.loads((out / "roles.json").read_text())["long_context"]
    assert lc["uncertainty"]["stability"]["streaming_share"]["passages"] == 6
    config = (json.loads((card / "config.json").read_text())["headscope"] if fmt == "duo"
              else json.loads((tmp_path / "card.json.config.json").read_text()))
    assert config["windows"] == 6 and config["haystacks"] == 2 and "ranking_stability" in config
    assert config == lc["card"]["config"]
    warned = [ln for ln in printed.splitlines() if "warning: the card's" in ln]
    assert len(warned) == (0 if config["stable"] else 1)
    if fmt == "retrieval-head":  # the tiny model answers no needle: nothing to rank, called unstable
        assert config["stable"] is False and len(warned) == 1


def test_until_stable_with_long_reads_windows_until_stable_or_the_cap(llama, tmp_path):
    src, text, long = llama
    out = tmp_path / "o"
    assert _roles(src, text, long, out, "--long-windows", "12", "--haystacks", "0", "--until-stable", "0.5") == 0
    lc = json.loads((out / "roles.json").read_text())["long_context"]
    u, stab = lc["until_stable"], lc["uncertainty"]["stability"]
    assert u["windows_cap"] == 12 and 8 <= u["windows"] <= 12 and lc["text"]["windows"] == u["windows"]
    if u["windows"] < 12:  # stopped early: every pattern's ranking had reached the target
        assert all(stab[k]["spearman_brown"] >= 0.5 for k in PATTERNS if k in stab)


def test_until_stable_with_long_refuses_caps_below_eight(llama, tmp_path, capsys):
    src, text, long = llama
    assert _roles(src, text, long, tmp_path / "o", "--long-windows", "12", "--haystacks", "3",
                  "--until-stable", "0.9") == 2
    assert "--haystacks is 3" in capsys.readouterr().err
    assert not (tmp_path / "o" / "roles.csv").exists()
