"""`headscope compare`: a planted induction head zeroed is `lost` on induction and `kept` where it takes no part; a
model against itself changes nothing; the paired intervals cover in simulation; the deltas equal forwards done by
hand with plain transformers; bad input is one line before any forward; the CLI and Python write the same files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf

import headscope
from headscope.cli import main
from headscope.compare import CompareOptions, decide, paired_change
from headscope.models import wrap
from headscope.uncertainty import IntervalSettings, ratio

V, P, D = 24, 32, 128  # vocabulary, positions, residual width of the planted model
TOK, POS, PREV, IND, ANCHOR = 0, V, V + P, 2 * V + P, (D - 2, D - 1)  # where each subspace of the residual starts
WORDS = [f"w{i}" for i in range(2, V)]  # ids 2..V-1; 0 is <s>, 1 is <unk>


def word_tokenizer() -> tf.PreTrainedTokenizerFast:
    """A word-level tokenizer: <s> w2 w3 ... (one id a word), <s> put before every text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "<unk>": 1, **{w: i for i, w in enumerate(WORDS, 2)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>", pad_token="<s>")


def planted_model(zero: tuple[int, int] | None = None) -> headscope.HeadModel:
    """A two-layer GPT-2 whose weights are written by hand (MLPs off):

    - L0H0, a previous-token head: position t's query meets position t-1's key; it copies the previous token into
      the PREV subspace;
    - L1H0, an induction head: the current token's query meets a key whose PREV holds the same token; it copies
      that position's token into the IND subspace, which the unembedding reads (+10 on that token's logit). With no
      earlier copy it rests on position 0 (half the score of a match): <s>, which carries no token;
    - a direct path from the current token to the logits: +3 on the token after it (w5 -> w6), a bigram rule no
      head takes part in;
    - two large opposite anchor coordinates in every token embedding keep the layer norms' scale near 1.

    `zero`: that head's weights set to 0 (the model with the head removed)."""
    cfg = tf.GPT2Config(vocab_size=V, n_positions=P, n_embd=D, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    model = tf.GPT2LMHeadModel(cfg).eval()
    dh, c = D // 2, 15.5  # c^2 / sqrt(dh) ~ 30: a near one-hot softmax
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in [*(b.ln_1 for b in model.transformer.h), *(b.ln_2 for b in model.transformer.h),
                   model.transformer.ln_f]:
            ln.weight.fill_(1.0)
        wte, wpe = model.transformer.wte.weight, model.transformer.wpe.weight
        for i in range(2, V):
            wte[i, TOK + i] = 1.0
        wte[:, ANCHOR[0]], wte[:, ANCHOR[1]] = 8.0, -8.0
        for t in range(P):
            wpe[t, POS + t] = 1.0
        # c_attn: x [.., D] @ W [D, 3D] -> q | k | v, head h at columns h*dh.. of each
        w0 = model.transformer.h[0].attn.c_attn.weight
        for t in range(P - 1):
            w0[POS + t, t] = c  # q: position t
            w0[POS + t, D + t + 1] = c  # k: position t, met by the query of t + 1
        for i in range(V):
            w0[TOK + i, 2 * D + i] = 1.0  # v: the token
            model.transformer.h[0].attn.c_proj.weight[i, PREV + i] = 1.0
        w1 = model.transformer.h[1].attn.c_attn.weight
        for i in range(V):
            w1[TOK + i, i] = c  # q: the current token
            w1[PREV + i, D + i] = c  # k: the previous token
            w1[TOK + i, 2 * D + i] = 1.0  # v: the token
            model.transformer.h[1].attn.c_proj.weight[i, IND + i] = 1.0
        w1[ANCHOR[0], V] = c / 8.0 / math.sqrt(2)  # q: a constant (the anchor, ~8 after the norm's scale)...
        w1[POS + 0, D + V] = c / math.sqrt(2)  # ... meets position 0's key: half a match's score
        lm = model.lm_head.weight  # [V, D]
        for i in range(V):
            lm[i, IND + i] = 10.0
            if i + 1 < V:
                lm[i + 1, TOK + i] = 3.0
        if zero is not None:
            layer, head = zero
            attn = model.transformer.h[layer].attn
            attn.c_proj.weight[head * dh:(head + 1) * dh] = 0.0  # the head's slice of the output projection
    return wrap(model, word_tokenizer(), "planted" if zero is None else f"planted-L{zero[0]}H{zero[1]}-zeroed")


def bigram_pairs(path: Path) -> Path:
    """Pairs whose answer only the bigram rule gives: the last word appears once, so induction finds no copy."""
    lines = []
    for k in range(8):
        a, b, last, other_last = 2 + k, 12 + k, 4 + k * 2 % 14, 5 + (k * 2 + 3) % 14
        while last in (a, b) or other_last in (a, b, last):
            last, other_last = last + 1, other_last + 2
        lines.append(json.dumps({"clean": f"w{a} w{b} w{last}", "corrupt": f"w{a} w{b} w{other_last}",
                                 "answer": f" w{last + 1}", "wrong": f" w{other_last + 1}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


TEXTS = [" ".join(f"w{2 + (i * 7 + j * 5) % (V - 2)}" for j in range(12)) for i in range(8)]


def test_the_planted_model_does_induction():
    hm = planted_model()
    a = torch.tensor([[5, 9, 3, 17, 11, 6, 20, 8, 5 + 9]])  # distinct tokens, then the first ones again
    ids = torch.cat([a, a[:, :4]], 1)
    logits = hm.model(input_ids=ids).logits[0, -1]
    assert int(logits.argmax()) == int(a[0, 4]), logits  # the token after the earlier copy of the last one


def test_a_zeroed_induction_head_is_lost_on_induction_and_kept_on_the_bigram(tmp_path):
    base, other = planted_model(), planted_model(zero=(1, 0))
    pairs = bigram_pairs(tmp_path / "bigram.jsonl")
    got = headscope.compare(base, other, CompareOptions(base="planted", other="zeroed", tasks=("induction",),
                                                        pairs=(str(pairs),), items=16, bootstrap=400))
    ind, bigram = got.change("induction"), got.change("pairs:bigram")
    assert ind.verdict == "lost" and ind.base > 5 and ind.delta_hi < -0.05 * ind.base, ind
    assert bigram.verdict == "kept" and bigram.base > 1 and abs(bigram.delta) < 1e-3, bigram
    # zeroing a head that does nothing (L1H1) keeps both
    same = headscope.compare(base, planted_model(zero=(1, 1)), tasks=("induction",), pairs=(str(pairs),), items=16,
                             bootstrap=400)
    assert [c.verdict for c in same.changes] == ["kept", "kept"], same.lines()


def test_a_model_against_itself_changes_nothing(tmp_path):
    hm = planted_model()
    got = headscope.compare(hm, hm, tasks=("lm", "induction"), pairs=(str(bigram_pairs(tmp_path / "bigram.jsonl")),),
                            items=8, bootstrap=200, data=TEXTS)
    assert [c.capability for c in got.changes] == ["lm", "induction", "pairs:bigram"]
    for c in got.changes:
        assert (c.delta, c.delta_lo, c.delta_hi, c.verdict) == (0.0, 0.0, 0.0, "kept"), c
        assert c.base == c.other and c.n >= 8


def _by_hand_logit_diffs(model: torch.nn.Module, b) -> np.ndarray:
    """logit(answer) - logit(wrong) at each pair's last real token, one pair at a time, with plain transformers."""
    out = []
    with torch.no_grad():
        for i in range(len(b)):
            n = int(b.mask[i].sum())
            logits = model(input_ids=b.clean[i:i + 1, :n]).logits[0, n - 1]
            out.append(float(logits[b.answer[i]] - logits[b.wrong[i]]))
    return np.array(out)


def test_the_deltas_equal_forwards_by_hand(tmp_path):
    base, other = planted_model(), planted_model(zero=(0, 0))  # the previous-token head: induction breaks too
    got = headscope.compare(base, other, tasks=("lm", "induction"), items=12, bootstrap=200, data=TEXTS)
    from headscope.learned.causal.pairs import induction_pairs

    b = induction_pairs(base.tokenizer, base.vocab_size, n=12, seed=0)
    want = _by_hand_logit_diffs(other.model, b) - _by_hand_logit_diffs(base.model, b)
    ind = got.change("induction")
    assert ind.delta == pytest.approx(want.mean(), abs=1e-5) and ind.n == 12
    # perplexity over the passages: exp of the mean NLL over every predicted token, each model on its own
    tok = base.tokenizer

    def ppl(model):
        nll, n = 0.0, 0
        with torch.no_grad():
            for text in TEXTS:
                ids = torch.tensor([tok(text)["input_ids"]])
                out = model(input_ids=ids, labels=ids)
                nll, n = nll + float(out.loss) * (ids.shape[1] - 1), n + ids.shape[1] - 1
        return math.exp(nll / n)

    lm = got.change("lm")
    assert lm.base == pytest.approx(ppl(base.model), rel=1e-5)
    assert lm.delta == pytest.approx(ppl(other.model) - ppl(base.model), rel=1e-4)


def test_paired_intervals_cover_in_simulation():
    """Items whose values differ between the models by a known mean (and share a large item effect): the 95% paired
    interval of the change holds the true difference in about 95% of draws, and is far narrower than the items'
    spread."""
    rng = np.random.default_rng(0)
    true, n, runs, hits, widths = 0.3, 40, 200, 0, []
    for r in range(runs):
        item = rng.normal(5.0, 3.0, n)  # what both models share: each item's difficulty
        base, other = item + rng.normal(0, 0.5, n), item + true + rng.normal(0, 0.5, n)
        ones = np.ones(n)
        c = paired_change("sim", "m", True, {"v": base, "n": ones}, {"v": other, "n": ones}, ratio("v", "n"),
                          IntervalSettings(B=400, seed=r), 0.05)
        hits += c.delta_lo <= true <= c.delta_hi
        widths.append(c.delta_hi - c.delta_lo)
    assert 0.91 <= hits / runs <= 0.99, hits / runs
    unpaired = 2 * 1.96 * math.sqrt(2 * (3.0 ** 2 + 0.5 ** 2) / n)  # two independent samples' interval width
    assert np.mean(widths) < 0.25 * unpaired, (np.mean(widths), unpaired)


@pytest.mark.parametrize("delta, lo, hi, higher, verdict, needed", [
    (-3.0, -4.0, -2.0, True, "lost", None),  # a score fell beyond 6.25% of 8 (0.5; numbers exact in binary)
    (3.0, 2.0, 4.0, False, "lost", None),  # a loss rose beyond it
    (3.0, 2.0, 4.0, True, "gained", None),
    (0.1, -0.2, 0.4, True, "kept", None),
    (0.25, -0.5, 1.0, True, "cannot tell", 360),  # to be kept: the bound 0.75 from 0.25 must come to 0.25: 40 x 3^2
    (-1.0, -1.5, -0.25, True, "cannot tell", 90),  # to be lost: the bound 0.75 from -1 must come to 0.5: 40 x 1.5^2
])
def test_the_verdict_follows_the_claims_rule(delta, lo, hi, higher, verdict, needed):
    assert decide(delta, lo, hi, 8.0, 0.0625, higher, 40) == (verdict, needed)


def _refused(argv, capsys) -> str:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


def test_bad_input_is_one_line_before_any_forward(tmp_path, capsys, monkeypatch):
    base = planted_model()
    calls = []
    for hm in (base,):
        hm.model.register_forward_pre_hook(lambda *a: calls.append(1))
    # different tokenizers: the same words under other ids
    other = planted_model()
    from tokenizers import Tokenizer, models, pre_tokenizers

    shuffled = Tokenizer(models.WordLevel({"<s>": 0, "<unk>": 1, **{w: i for i, w in enumerate(WORDS[::-1], 2)}},
                                          unk_token="<unk>"))
    shuffled.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other.tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=shuffled, unk_token="<unk>")
    other.model.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(headscope.HeadscopeError, match="different tokenizers"):
        headscope.compare(base, other, tasks=("induction",), bootstrap=200)
    # an empty pairs file
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(headscope.HeadscopeError, match="holds no pairs"):
        headscope.compare(base, planted_model(), pairs=(str(empty),), bootstrap=200)
    assert not calls
    # the CLI: a missing folder, an empty pairs file: one line, exit 2, nothing loaded
    monkeypatch.setattr("headscope.commands.compare.load_model", lambda *a, **k: pytest.fail("a model loaded"))
    out = tmp_path / "out"
    assert "no-such-folder" in _refused(["compare", "smollm2", str(tmp_path / "no-such-folder"), "--out", str(out)],
                                        capsys)
    assert "holds no pairs" in _refused(["compare", "smollm2", "smollm2", "--pairs", str(empty), "--out", str(out)],
                                        capsys)
    assert "--tasks" in _refused(["compare", "a", "b", "--tasks", "lm,nope", "--out", str(out)], capsys)
    assert not out.exists()


def test_cli_and_python_give_the_same_files(tmp_path, monkeypatch, capsys):
    pairs = bigram_pairs(tmp_path / "bigram.jsonl")
    models = {"base": planted_model(), "other": planted_model(zero=(1, 0))}
    monkeypatch.setattr("headscope.commands.compare.check_model_name", lambda *a: None)
    monkeypatch.setattr("headscope.commands.compare.load_model", lambda name, **k: models[name])
    argv = ["compare", "base", "other", "--tasks", "induction", "--pairs", str(pairs), "--items", "8",
            "--bootstrap", "200", "--out", str(tmp_path / "cli")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "induction: logit_diff" in printed and "lost: induction" in printed
    opts = CompareOptions(base="base", other="other", tasks=("induction",), pairs=(str(pairs),), items=8,
                          bootstrap=200, out=str(tmp_path / "lib"))
    result = headscope.compare(models["base"], models["other"], opts)
    assert not (tmp_path / "lib").exists()  # nothing written before save
    result.save(tmp_path / "lib")
    cli, lib = tmp_path / "cli", tmp_path / "lib"
    assert sorted(p.name for p in cli.iterdir()) == sorted(p.name for p in lib.iterdir()) == ["compare.csv",
                                                                                               "compare.json"]
    assert (cli / "compare.csv").read_text() == (lib / "compare.csv").read_text()
    a, b = (json.loads((d / "compare.json").read_text()) for d in (cli, lib))
    for rec in (a, b):
        for row in rec["rows"].values():
            row.pop("seconds")
        rec["provenance"].pop("versions", None)
    assert a["rows"] == b["rows"] and a["settings"] == b["settings"]
    header = (cli / "compare.csv").read_text().splitlines()[0].split(",")
    assert header == ["capability", "metric", "base", "other", "delta", "delta_lo", "delta_hi", "relative", "verdict",
                      "n"]
    from headscope.artifacts import COMPARE_CSV, COMPARE_JSON

    assert header == [f.name for f in COMPARE_CSV.fields]
    assert sorted(a) == sorted(f.name for f in COMPARE_JSON.fields)


def _zeroed(hm: headscope.HeadModel, heads: list[tuple[int, int]]) -> headscope.HeadModel:
    """A copy of `hm` with `heads` zeroed at the output projection (the head mask, made permanent)."""
    import copy

    other = headscope.HeadModel(model=copy.deepcopy(hm.model), tokenizer=hm.tokenizer, name=f"{hm.name}-zeroed")
    for layer, head in heads:
        w = other.out_weight(layer).clone()
        w[:, head * hm.d_head:(head + 1) * hm.d_head] = 0.0
        other.set_out_weight(layer, w)
    return other


def test_smollm2_without_its_name_movers_loses_ioi_and_without_null_heads_does_not(smollm2, tmp_path):
    """The name movers of docs/patching.md (L23H3, L29H1) zeroed: IOI lost; two heads of no IOI effect (L26H6, L27H7,
    attribution within +-0.0002) zeroed: not lost. The pairs row's change equals plain forwards to 0.02."""
    from headscope.learned.causal.pairs import builtin_pairs

    pairs = builtin_pairs("ioi")[:12]
    path = tmp_path / "ioi12.jsonl"
    path.write_text("".join(json.dumps(p.__dict__) + "\n" for p in pairs))
    tok = smollm2.tokenizer

    def logit_diffs(model):
        out = []
        with torch.no_grad():
            for p in pairs:
                logits = model(input_ids=torch.tensor([tok(p.clean)["input_ids"]])).logits[0, -1]
                a, w = (tok(t, add_special_tokens=False)["input_ids"][0] for t in (p.answer, p.wrong))
                out.append(float(logits[a] - logits[w]))
        return np.array(out)

    base = logit_diffs(smollm2.model)
    verdicts = {}
    for name, heads in {"movers": [(23, 3), (29, 1)], "null": [(26, 6), (27, 7)]}.items():
        other = _zeroed(smollm2, heads)
        got = headscope.compare(smollm2, other, tasks=("ioi",), pairs=(str(path),), items=12, bootstrap=400)
        row = got.change("pairs:ioi12")
        assert row.n == 12 and row.delta == pytest.approx(float((logit_diffs(other.model) - base).mean()), abs=0.02)
        verdicts[name] = row.verdict
    assert verdicts["movers"] == "lost" and verdicts["null"] != "lost", verdicts


def test_an_encoders_fidelity_row_is_the_cosine_of_its_pooled_outputs():
    """On an encoder the language-model row is fidelity: each passage's mean-pooled final hidden states in OTHER
    against BASE's, by cosine (BASE's own is 1); the change equals the cosines computed by hand."""
    from headscope.models.tiny import tiny_model

    base = tiny_model("bert")
    other = _zeroed(base, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 2)])
    ids = [[(7 * i + 3 * j) % 100 + 5 for j in range(6 + i % 4)] for i in range(10)]
    got = headscope.compare(base, other, tasks=("fidelity",), data=ids, bootstrap=200)
    row = got.change("fidelity")
    want = []
    with torch.no_grad():
        for seq in ids:
            x = torch.tensor([seq])
            a, b = (m.model(input_ids=x).last_hidden_state[0].double().mean(0) for m in (base, other))
            want.append(float(torch.nn.functional.cosine_similarity(a, b, dim=0)))
    assert row.base == 1.0 and row.n == 10
    # float32 forwards: the change agrees to a thousandth of itself (a random tiny BERT moves little: ~6e-5)
    assert row.delta == pytest.approx(np.mean(want) - 1.0, rel=1e-3) and row.delta < -1e-5, row
    with pytest.raises(headscope.HeadscopeError, match="does not apply to tiny-bert"):
        headscope.compare(base, other, tasks=("lm",), data=ids, bootstrap=200)


def test_base_from_reuses_base_measurements_on_the_same_items(tmp_path):
    """A second candidate against the same BASE with --base-from: BASE runs no forward on rows whose items are the
    same, and every figure equals a fresh comparison's; a folder measured on another BASE is refused."""
    base = planted_model()
    pairs = str(bigram_pairs(tmp_path / "bigram.jsonl"))
    kw = dict(tasks=("lm", "induction", "heads"), pairs=(pairs,), items=8, bootstrap=200, data=TEXTS)
    headscope.compare(base, planted_model(zero=(1, 0)), **kw).save(tmp_path / "first")
    second = planted_model(zero=(0, 0))
    fresh = headscope.compare(base, second, **kw)
    calls = []
    handle = base.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        reused = headscope.compare(base, second, base_from=str(tmp_path / "first"), **{**kw, "items": 8})
    finally:
        handle.remove()
    assert not calls
    assert [c.row() for c in reused.changes] == [c.row() for c in fresh.changes]
    assert all(r["base_reused_from"] == str(tmp_path / "first") for r in reused.record.rows.values())
    assert reused.record.rows["heads:induction"]["carriers"] == fresh.record.rows["heads:induction"]["carriers"]
    assert fresh.record.rows["heads:induction"]["carriers"] == ["L1H0"]
    # other items (16 pairs instead of 8): measured again
    more = headscope.compare(base, second, base_from=str(tmp_path / "first"), **{**kw, "items": 16})
    assert more.record.rows["lm"]["base_reused_from"] and not more.record.rows["induction"]["base_reused_from"]
    with pytest.raises(headscope.HeadscopeError, match="measured another BASE"):
        headscope.compare(second, base, base_from=str(tmp_path / "first"), **kw)


def _pattern(folder: Path, scores, sink: int, window: int) -> Path:
    folder.mkdir()
    np.savetxt(folder / "full_attention_heads.tsv", np.asarray(scores), delimiter="\t")
    (folder / "config.json").write_text(json.dumps({"sink_size": sink, "recent_size": window}))
    return folder


def test_other_through_a_head_aware_cache_equals_kvcache_own_decoding(tmp_path):
    """--cache: OTHER is BASE decoding through DuoAttention's pattern. With every KV head full nothing changes; with
    half of them windowed the lm row's OTHER perplexity equals capacity.kvcache's own cached evaluation of the same
    passages, and the reversed pattern keeps the other half."""
    from headscope.capacity.kvcache import CachePlan
    from headscope.capacity.kvcache.evaluate import evaluate_perplexity
    from headscope.models.tiny import tiny_model

    hm = tiny_model("llama")  # 2 layers x 2 KV heads
    ids = [[(11 * i + 7 * j) % 110 + 5 for j in range(40)] for i in range(6)]
    pattern = _pattern(tmp_path / "duo", [[0.9, 0.1], [0.2, 0.8]], sink=2, window=4)
    kw = dict(tasks=("lm", "induction"), data=ids, items=6, bootstrap=200, cache=str(pattern))
    full = headscope.compare(hm, hm, keep_full=1.0, **kw)
    assert all(abs(c.delta) < 1e-4 * max(1.0, abs(c.base)) for c in full.changes), full.lines()
    half = headscope.compare(hm, hm, keep_full=0.5, **kw)
    assert half.record.settings.cache["full"] == [[0], [1]]
    want = evaluate_perplexity(hm, CachePlan(((0,), (1,)), 2, 3, 2, 4), ids)["perplexity"]
    assert half.change("lm").other == pytest.approx(want, rel=1e-5) and abs(half.change("lm").delta) > 1e-3
    upside = headscope.compare(hm, hm, keep_full=0.5, cache_reversed=True, **kw)
    assert upside.record.settings.cache["full"] == [[1], [0]]
    want = evaluate_perplexity(hm, CachePlan(((1,), (0,)), 2, 3, 2, 4), ids)["perplexity"]
    assert upside.change("lm").other == pytest.approx(want, rel=1e-5)
    assert "through a head-aware KV cache (2 of 4 KV heads full" in half.lines()[0]
    with pytest.raises(headscope.HeadscopeError, match="no DuoAttention pattern"):
        headscope.compare(hm, hm, tasks=("lm",), data=ids, cache=str(tmp_path), bootstrap=200)


def test_a_physically_pruned_other_compares_like_the_same_heads_zeroed():
    """OTHER with fewer heads (what prune --save-model writes) against BASE: the same changes as BASE with those heads
    zeroed, since physical pruning equals a gate of 0."""
    from headscope.models.tiny import tiny_model
    from headscope.redundancy.pruning.heads import prune_heads

    hm = tiny_model("llama")  # 6 query heads in 2 KV groups: one head of each group goes
    gone = [(0, 1), (0, 4), (1, 0), (1, 3)]
    ids = [[(13 * i + 5 * j) % 110 + 5 for j in range(20)] for i in range(8)]
    kw = dict(tasks=("lm", "induction"), data=ids, items=8, bootstrap=200)
    pruned = headscope.compare(hm, prune_heads(hm, gone), **kw)
    masked = headscope.compare(hm, _zeroed(hm, gone), **kw)
    for a, b in zip(pruned.changes, masked.changes, strict=True):
        assert a.delta == pytest.approx(b.delta, rel=1e-4, abs=1e-5) and a.verdict == b.verdict, (a, b)
    assert abs(pruned.change("lm").delta) > 1e-3


def test_the_heads_row_follows_base_carrier_heads_into_other(tmp_path):
    """heads:induction: BASE's carrier (attribution effect interval above 0) is the planted induction head (the
    previous-token head's clean output cannot help the corrupt run, whose last token has no earlier copy, so to first
    order it carries nothing); in OTHER without the induction head the carrier moves nothing, so the row is lost. Per
    pair, the row's BASE value is the carrier's attribution estimate, (z_clean - z_corrupt) . dM/dz, as patch's."""
    from headscope.learned.causal.attribution import attribution_scan
    from headscope.learned.causal.pairs import induction_pairs

    base, other = planted_model(), planted_model(zero=(1, 0))
    got = headscope.compare(base, other, tasks=("induction", "heads"), items=12, bootstrap=400)
    names = [c.capability for c in got.changes]
    assert names[:2] == ["induction", "heads:induction"]
    assert names[2:] and all(n.startswith("roles:") for n in names[2:])  # the role census (test_compare_census)
    rec = got.record.rows["heads:induction"]
    assert rec["carriers"] == ["L1H0"], rec["carriers"]
    row = got.change("heads:induction")
    assert row.verdict == "lost" and row.base > 5 and abs(row.other) < 1e-3 * row.base, row
    runs = attribution_scan(base, induction_pairs(base.tokenizer, base.vocab_size, n=12, seed=0))
    np.testing.assert_allclose(rec["items"]["base"]["v"], runs.patched[:, 1, 0] - runs.corrupt, rtol=1e-9)
    # without a pair row, heads is the role census alone
    alone = headscope.compare(base, other, tasks=("lm", "heads"), data=TEXTS, bootstrap=200)
    assert [c.capability for c in alone.changes] == ["lm", *names[2:]]
