"""Long inputs: built-in long sources, windows with a stride (every position counted once), clear errors."""

from __future__ import annotations

import pytest

from headscope.data import read_texts
from headscope.data.prepare import prepare_windows, window_starts
from headscope.data.sources import GUM_LONG_WORDS, long_passages
from headscope.errors import HeadscopeError


@pytest.mark.parametrize("n,length,stride", [(10, 4, 4), (10, 4, 3), (10, 4, 1), (4, 4, 2), (3, 8, 5), (17, 6, 4)])
def test_windows_count_every_position_once(n, length, stride):
    spans = window_starts(n, length, stride)
    counted = []
    for i, (s, e, c) in enumerate(spans):
        assert e - s <= length and s == i * stride
        counted += list(range(s + c, e))
        if i:  # every counted token of a later window has length - stride tokens before it in the window
            assert c >= min(length - stride, e - s)
    assert counted == list(range(n))
    assert spans[-1][1] == n


@pytest.mark.parametrize("stride", [0, 5, -1, True])
def test_bad_stride(stride):
    with pytest.raises(HeadscopeError, match="^stride"):
        window_starts(10, 4, stride)


def test_prepare_windows_frame_and_counts(minilm):
    tok = minilm.tokenizer
    text = " ".join(f"word{i} is here." for i in range(60))
    content = tok(text, add_special_tokens=False)["input_ids"]
    wins, _ = prepare_windows(minilm, [text], 64, stride=40)
    assert len(wins) > 2
    cls, sep = tok.cls_token_id, tok.sep_token_id
    counted = []
    for w in wins:
        assert len(w.ids) <= 64 and w.ids[0] == cls and w.ids[-1] == sep  # each window framed like a passage
        assert w.ids[1:-1] == content[w.start:w.start + len(w.ids) - 2]
        counted += w.ids[w.count_from:w.count_to]
    # counted over all windows: the passage exactly as the tokenizer frames it, each position once
    assert counted == tok(text)["input_ids"]
    short, _ = prepare_windows(minilm, ["a short one."], 64)
    assert len(short) == 1 and short[0].ids == tok("a short one.")["input_ids"]
    with pytest.raises(HeadscopeError, match="512 positions"):
        prepare_windows(minilm, [text], 1000)


def test_long_sources():
    gum = long_passages("gum-long")
    assert len(gum) == 4 and all(len(p.split()) >= GUM_LONG_WORDS for p in gum[:-1])
    assert read_texts("gum-long").texts == gum and read_texts("gum-long").source == "long:gum-long"
    ptb = read_texts("ptb-long").texts
    assert len(ptb) == 10 and min(len(p.split()) for p in ptb[:-1]) > 6000
    with pytest.raises(HeadscopeError, match="did you mean"):
        long_passages("gum-lng")
