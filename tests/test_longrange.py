"""Long-range roles: block results equal eager maps, known answers on hand-built attention, haystacks, cards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headscope.errors import HeadscopeError
from headscope.export.cards import CARD_SCORES, head_card
from headscope.hooks import on_attention_blocks, on_attention_weights
from headscope.learned.longctx import (
    LONG_SCORES,
    PATTERNS,
    LongThresholds,
    PatternReducer,
    PatternSettings,
    RetrievalCounter,
    build_haystack,
    check_long_args,
    decide_long,
)
from headscope.learned.longctx.needle import Haystack
from headscope.models.tiny import tiny_model

SETTINGS = PatternSettings(sink=2, recent=5, far=6)


def _ids(t: int = 40, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 12, (1, t), generator=g)  # a small alphabet: many repeats at every distance


def _patterns(hm, ids, blocks: bool, count=(0, None)) -> dict[str, np.ndarray]:
    red = PatternReducer(hm, SETTINGS)
    red.set_window(ids[0], count[0], count[1] if count[1] is not None else ids.shape[1])
    if blocks:
        ctx = on_attention_blocks(hm, red, 7)  # 7 does not divide 40: a ragged last block
    else:
        ctx = on_attention_weights(hm, lambda layer, p: red(layer, 0, p))  # the full eager map as one block
    with ctx, torch.inference_mode():
        hm.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return red.results()


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])  # GQA; MQA with a sliding-window layer
def test_pattern_blocks_equal_eager_maps(family):
    hm = tiny_model(family)
    ids = _ids()
    for count in ((0, None), (13, 33)):  # a whole window, and a later window's counted slice
        got, want = _patterns(hm, ids, True, count), _patterns(hm, ids, False, count)
        for k in want:
            # Gemma's sliding layer (window 4) sees nothing outside sink + recent or 6 back: NaN there, in both
            assert np.isfinite(want[k][-1]).all(), k
            assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k
            diff = np.nanmax(np.abs(got[k] - want[k]))
            assert diff < 1e-6, f"{family} {k} {count}: max abs difference {diff}"


def _feed(red: PatternReducer, p: torch.Tensor) -> dict[str, np.ndarray]:
    for layer in range(red.hm.n_layers):
        red(layer, 0, p)
    return red.results()


def test_patterns_known_answers():
    hm = tiny_model("llama")
    t = 30
    ids = torch.tensor([5, 6, 7] * 10)  # token at q repeats at q-3, q-6, ...: copies at least 6 back from q >= 6
    red = PatternReducer(hm, SETTINGS)
    red.set_window(ids, 0, t)
    # a uniform causal head scores exactly its baseline on every pattern
    uniform = torch.tril(torch.ones(t, t)) / torch.arange(1, t + 1)[:, None]
    res = _feed(red, uniform.expand(1, hm.n_heads, t, t).clone())
    for k in ("streaming_share", "echo_far", "induction_far"):
        np.testing.assert_allclose(res[k], res[k + "_uniform"], rtol=1e-6, atol=1e-9)
    # a head that always looks 6 back: echo 1 (a copy 6 back), induction 0, streaming 0 outside the window
    q = torch.arange(t)
    six = torch.zeros(t, t)
    six[q[6:], q[6:] - 6] = 1
    six[q[:6], 0] = 1
    red = PatternReducer(hm, SETTINGS)
    red.set_window(ids, 0, t)
    res = _feed(red, six.expand(1, hm.n_heads, t, t).clone())
    assert np.allclose(res["echo_far"], 1) and np.allclose(res["induction_far"], 0)
    # counted: queries 7..29 (they see a key outside sink 0-1 + recent q-4..q); 6 back is outside, except
    # for query 7, whose key 1 is a sink
    assert np.allclose(res["streaming_share"], 1 / 23)
    # 5 back holds the token after a copy 6 back (induction target), inside the recent window (recent=5: 0..4 back)
    five = torch.zeros(t, t)
    five[q[5:], q[5:] - 5] = 1
    five[q[:5], 0] = 1
    red = PatternReducer(hm, SETTINGS)
    red.set_window(ids, 0, t)
    res = _feed(red, five.expand(1, hm.n_heads, t, t).clone())
    assert np.allclose(res["induction_far"], 1) and np.allclose(res["echo_far"], 0)


def test_retrieval_counter_known_answer_and_blocks():
    hm = tiny_model("llama")
    ids = _ids(40, seed=3)[0].tolist()
    ids[10:16] = [20, 21, 22, 23, 24, 25]  # the needle: 6 tokens
    ids[36:39] = [22, 23, 24]  # the answer copies three needle tokens
    hay = Haystack(ids, (10, 16), (36, 39), 0.25, "fact", "answer")
    # hand-built: every head's top-1 key at each answer step is the needle copy of the target -> 3/6;
    # a step pointing at the right token outside the needle, or at the wrong needle token, scores nothing
    c = RetrievalCounter(hm, hay)
    p = torch.zeros(1, hm.n_heads, 40, 40)
    for step, key in zip((35, 36, 37), (12, 13, 14), strict=True):
        p[0, :, step, key] = 1
    p[0, 0, 37, 14], p[0, 0, 37, 38] = 0, 1  # head 0 takes the answer's own copy at step 37 (outside the needle)
    p[0, 1, 36, 13], p[0, 1, 36, 15] = 0, 1  # head 1 takes another needle token at step 36
    c(0, 0, p)
    want = np.full(hm.n_heads, 3 / 6)
    want[:2] = 2 / 6
    np.testing.assert_allclose(c.hits[0], want)
    # chance: a step sees s + 1 keys, one of them the needle copy of its target
    assert c.chance() == pytest.approx((1 / 36 + 1 / 37 + 1 / 38) / 6)
    # on a real forward, blocks give the same hits as eager maps
    x = torch.tensor([ids])
    got, want = RetrievalCounter(hm, hay), RetrievalCounter(hm, hay)
    with torch.inference_mode():
        with on_attention_blocks(hm, got, 5):
            hm.model(input_ids=x, use_cache=False)
        with on_attention_weights(hm, lambda layer, probs: want(layer, 0, probs)):
            hm.model(input_ids=x, use_cache=False)
    np.testing.assert_array_equal(got.hits, want.hits)


def test_decide_long_rule():
    s = {"retrieval_score": np.array([[0.5, 0.05, 0.5]]), "retrieval_score_uniform": np.array([[0.01, 0.01, 0.2]])}
    s.update(
        {"streaming_share": np.array([[0.95, 0.95, 0.85]]), "streaming_share_uniform": np.array([[0.34, 0.5, 0.1]])}
    )
    roles = decide_long(s, LongThresholds())
    # retrieval: 0.05 is below 0.1; 0.5 is not 3x of 0.2. streaming: 0.95 is 0.61 above 0.34 but only 0.45
    # above 0.5; 0.85 is below 0.9
    assert roles == {(0, 0): ["retrieval", "streaming"]}


def test_long_roles_come_from_the_registry():
    """The long-range roles read the scores the passes write, and the card names the same scores."""
    assert LONG_SCORES == ("retrieval_score", *PATTERNS)
    assert CARD_SCORES == {"retrieval": "retrieval_score", "streaming": "streaming_share", "echo": "echo_far",
                           "induction": "induction_far"}
    assert LongThresholds().as_dict() == {"retrieval_score": 0.1, "min_ratio": 3.0, "streaming_share": 0.9,
                                          "streaming_margin": 0.5, "echo_far": 0.3, "induction_far": 0.3}
    s = {"echo_far": np.array([[0.4, 0.4]]), "echo_far_uniform": np.array([[0.1, 0.2]])}
    assert decide_long(s, LongThresholds()) == {(0, 0): ["echo_far"]}
    assert decide_long(s, LongThresholds(min_ratio=2.0)) == {(0, 0): ["echo_far"], (0, 1): ["echo_far"]}


def test_haystack_spans(minilm):
    tok = minilm.tokenizer
    hay = build_haystack(tok, 256, 0.5, index=2, seed=0)
    assert len(hay.ids) <= 256 and len(hay.ids) > 200
    n0, n1 = hay.needle
    a0, a1 = hay.answer
    assert tok.decode(hay.ids[n0:n1]).replace(" ", "") == hay.fact.lower().replace(" ", "")
    assert tok.decode(hay.ids[a0:a1]).strip() == hay.answer_text.strip()
    assert 0.3 < n0 / len(hay.ids) < 0.7  # inserted at about half the haystack
    assert set(hay.ids[a0:a1]) <= set(hay.ids[n0:n1])  # the answer can be copied from the needle
    assert build_haystack(tok, 256, 0.5, index=2, seed=0) == hay  # seeded
    with pytest.raises(HeadscopeError, match="no room"):
        build_haystack(tok, 30, 0.5, index=0)


def test_head_card_format(tmp_path):
    per = np.arange(2 * 2 * 3, dtype=float).reshape(2, 2, 3)  # [haystack, layer, head]
    report = {"needles": {"per_haystack": per, "haystacks": [{"succeeded": False}, {"succeeded": True}]},
              "scores": {"streaming_share": np.ones((2, 3))}}
    card, note = head_card(report)
    assert card["1-2"] == [per[1, 1, 2]] and note == ""  # only the answered haystack, as Wu et al. keep
    assert len(card) == 6 and all(k.count("-") == 1 for k in card)
    # read the way the Retrieval Head / HeadKV code reads it
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    head_list = json.loads(path.read_text())
    ranked = sorted(([int(x) for x in k.split("-")], np.mean(v)) for k, v in head_list.items())
    assert ranked[-1] == ([1, 2], per[1, 1, 2])
    report["needles"]["haystacks"][1]["succeeded"] = False
    card, note = head_card(report)
    assert card["0-0"] == [0.0, 6.0] and "answered none" in note
    assert head_card(report, "streaming")[0]["1-1"] == [1.0]
    with pytest.raises(HeadscopeError, match="^card_score 'nope' is not one of"):
        head_card(report, "nope")


def test_long_args_refused():
    hm = tiny_model("llama")  # 64 positions
    with pytest.raises(HeadscopeError, match="64 positions"):
        check_long_args(hm, 128, 1, 1, None, 16)
    with pytest.raises(HeadscopeError, match="block size"):
        check_long_args(None, 64, 1, 1, None, 0)
    with pytest.raises(HeadscopeError, match="^stride"):
        check_long_args(None, 64, 1, 1, 0, 16)
    with pytest.raises(HeadscopeError, match="nothing to measure"):
        check_long_args(None, 64, 0, 0, None, 16)
    with pytest.raises(HeadscopeError, match="encoder"):
        check_long_args(tiny_model("bert"), 64, 1, 1, None, 16)


# --- the roles verb ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,msg", [
    (["--long", "256", "--block", "0"], "block size"),
    (["--long", "256", "--stride", "0"], "--stride"),
    (["--long", "256", "--stride", "300"], "--stride"),
    (["--long", "32"], "--long must be"),
    (["--long", "256", "--long-data", "gum-lng"], "did you mean"),
    (["--export-card", "c.json"], "needs --long"),
])
def test_cli_long_bad_input_before_any_model(tmp_path, capsys, argv, msg):
    from headscope.cli import main

    out = tmp_path / "out"
    # "nomodel" would fail to load: the error must come first, and nothing be written
    assert main(["roles", "nomodel", "--out", str(out), *argv]) == 2
    assert msg in capsys.readouterr().err and not out.exists()


def test_cli_card_refuses_existing_file(tmp_path, capsys):
    from headscope.cli import main

    card = tmp_path / "card.json"
    card.write_text("{}")
    assert main(["roles", "nomodel", "--out", str(tmp_path / "o"), "--long", "256", "--export-card", str(card)]) == 2
    assert "--force" in capsys.readouterr().err and card.read_text() == "{}"


@pytest.mark.real
def test_cli_long_roles_smollm2(tmp_path, smollm2, monkeypatch):
    """The verb end to end on SmolLM2 (short: 160 tokens, one window, one haystack): columns, JSON, card;
    the long-range options are checked before the model loads, never by the pass itself."""
    import importlib

    import pandas as pd

    import headscope.learned.options as opts
    from headscope import artifacts as A
    from headscope.cli import main

    checks = []
    lr = importlib.import_module(
        "headscope.learned.longctx.long_roles"
    )  # the module: the package exports a function of its name
    for module in (opts, lr):
        monkeypatch.setattr(module, "check_long_args", lambda *a, f=module.check_long_args: (checks.append(a), f(*a)))
    out, card = tmp_path / "out", tmp_path / "card.json"
    rc = main(["roles", "smollm2", "--limit", "2", "--long", "160", "--long-windows", "1", "--haystacks", "1",
               "--export-card", str(card), "--out", str(out)])
    assert rc == 0
    # Checked with the options alone (by the CLI, then by the library call it makes), never again by long_roles
    # once the model is loaded.
    assert checks and all(c[0] is None for c in checks), checks
    df = pd.read_csv(out / "roles.csv", keep_default_na=False)
    assert {"retrieval_score", "streaming_share", "echo_far", "induction_far"} <= set(df.columns)
    assert all(A.ROLES_CSV.field_for(c) is not None for c in df.columns)  # every column declared
    rep = json.loads((out / "roles.json").read_text())
    lc = rep["long_context"]
    assert lc["length"] == 160 and lc["needles"]["haystacks"][0]["tokens"] <= 160
    assert lc["text"]["windows"] == 1 and lc["text"]["counted_tokens"] == 160
    head_list = json.loads(card.read_text())
    assert len(head_list) == 30 * 9 and all(len(v) == 1 for v in head_list.values())
    best = max(head_list.items(), key=lambda kv: np.mean(kv[1]))
    assert np.mean(best[1]) > 0.1  # SmolLM2 copies the 6-digit code: some head's top-1 key follows it
