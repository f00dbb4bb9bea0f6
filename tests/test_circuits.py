"""Circuits (learned/circuits): the GQA-native graph, the evaluator against edge patching done by hand with plain
transformers modules and hooks, EAP against exact edge patching on a model linear in the edges, a planted two-edge
circuit, and GQA's key/value receivers against the same model ungrouped (each query head its own copy of the
keys)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from headscope.errors import HeadscopeError
from headscope.learned.causal.pairs import PairBatch
from headscope.learned.circuits.evaluate import evaluate_circuits
from headscope.learned.circuits.faithfulness import FRACTIONS, area, faithfulness_curves, sizes
from headscope.learned.circuits.graph import build_graph
from headscope.learned.circuits.scores import edge_scores
from headscope.models.adapter import HeadModel
from headscope.models.tiny import tiny_model
from headscope.uncertainty import IntervalSettings

P, T = 4, 6


def _pairs(vocab: int = 100, seed: int = 0, at: int = 1) -> PairBatch:
    """P clean/corrupt pairs of T random tokens differing at position `at`."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(3, vocab, (P, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, at] = (clean[:, at] + 1 + torch.randint(0, vocab - 5, (P,), generator=g)) % (vocab - 3) + 3
    return PairBatch(clean, corrupt, torch.ones(P, T, dtype=torch.long), torch.full((P,), T - 1),
                     torch.tensor([5, 6, 7, 8]), torch.tensor([9, 10, 11, 12]), [], "test pairs")


def _metric(model: nn.Module, b: PairBatch, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=b.mask, use_cache=False).logits[:, -1]
    return (logits.gather(1, b.answer[:, None]) - logits.gather(1, b.wrong[:, None]))[:, 0].numpy()


def _drop_one(graph, sender: str, receiver: str) -> np.ndarray:
    """A circuit of every edge but one."""
    names = graph.edge_names()
    keep = np.ones(graph.n_edges, dtype=bool)
    keep[names.index((sender, receiver))] = False
    return keep


# --- the graph -----------------------------------------------------------------------------------------------


def test_graph_is_gqa_native_and_ordered_as_mib():
    hm = tiny_model("llama")  # 2 layers, 6 query heads, 2 KV heads
    g = build_graph(hm)
    L, H, G = 2, 6, 2
    assert len(g.senders) == 1 + L * (H + 1)
    assert len(g.receivers) == L * (H + 2 * G + 1) + 1
    names = set(g.edge_names())
    assert ("L0H3", "MLP0") in names and ("MLP0", "MLP0") not in names  # a layer's heads feed its MLP
    assert ("L0H3", "L0H1.q") not in names and ("L0H3", "L1G1.k") in names and ("MLP0", "L1G0.v") in names
    assert ("L1H5", "logits") in names and ("input", "L0G1.v") in names
    assert not any(r.endswith((".k", ".v")) and "H" in r.split(".")[0] for _, r in names)  # keys by group
    # every sender before the receiver, nothing else: 10 + 7 + 10 x 8 + 14 + 15
    assert g.n_edges == 126
    assert sizes(g.n_edges)[FRACTIONS.index(0.02)] == 2 and sizes(g.n_edges)[-1] == 126


@pytest.mark.parametrize("family", ["gemma3_text", "bert"])
def test_families_that_are_not_residual_in_residual_out_are_refused_in_one_line(family):
    with pytest.raises(HeadscopeError) as e:
        build_graph(tiny_model(family))
    assert "\n" not in str(e.value) and "circuits" in str(e.value)


# --- the evaluator against edge patching by hand -------------------------------------------------------------


def _llama_by_hand(model, b: PairBatch, sender_head: tuple[int, int], receiver: tuple[int, str, int]) -> np.ndarray:
    """Edge patching done by hand on a LlamaForCausalLM: the clean run with one receiver's input (layer, kind
    "q"/"k"/"v", its head or KV head) given sender_head's corrupt write instead of its clean one."""
    layers, cfg = model.model.layers, model.config
    dh = cfg.hidden_size // cfg.num_attention_heads
    sl, sh = sender_head

    def write(ids: torch.Tensor) -> torch.Tensor:  # the sender head's W_O z_h
        got = {}
        o = layers[sl].self_attn.o_proj
        h = o.register_forward_pre_hook(lambda m, a: got.setdefault("z", a[0]))
        _metric(model, b, ids)
        h.remove()
        w = o.weight[:, sh * dh:(sh + 1) * dh]
        return got["z"][..., sh * dh:(sh + 1) * dh] @ w.T

    delta = write(b.corrupt) - write(b.clean)
    rl, kind, index = receiver
    layer = layers[rl]
    proj = getattr(layer.self_attn, f"{kind}_proj")
    resid = {}

    def keep_input(m, args, kwargs):
        resid["x"] = args[0] if args else kwargs["hidden_states"]

    def patch(m, args, out):
        x = layer.input_layernorm(resid["x"] + delta)
        rows = slice(index * dh, (index + 1) * dh)
        out = out.clone()
        out[..., rows] = F.linear(x, proj.weight[rows])
        return out

    hs = [layer.register_forward_pre_hook(keep_input, with_kwargs=True), proj.register_forward_hook(patch)]
    try:
        return _metric(model, b, b.clean)
    finally:
        for h in hs:
            h.remove()


@pytest.mark.parametrize("kind,index,name", [("q", 4, "L1H4.q"), ("k", 1, "L1G1.k"), ("v", 0, "L1G0.v")])
def test_one_edge_into_a_head_by_hand_equals_the_evaluator(kind, index, name):
    hm = tiny_model("llama", init_std=0.2)
    b = _pairs()
    g = build_graph(hm)
    by_hand = _llama_by_hand(hm.model, b, (0, 2), (1, kind, index))
    runs = evaluate_circuits(hm, g, b, [_drop_one(g, "L0H2", name)], batch_size=3)
    assert np.abs(runs.circuits[:, 0] - by_hand).max() < 1e-5, np.abs(runs.circuits[:, 0] - by_hand).max()
    assert np.abs(by_hand - runs.clean).max() > 1e-3  # the edge matters, so the check can fail


def test_gpt2_edges_into_mlp_values_and_logits_by_hand_equal_the_evaluator():
    """GPT-2 (fused c_attn, Conv1D): the evaluator against hooks on ln_2, c_attn and ln_f written here."""
    hm = tiny_model("gpt2", init_std=0.2)
    model, b, g = hm.model, _pairs(), build_graph(hm)
    blocks, d, heads = model.transformer.h, model.config.n_embd, model.config.n_head
    dh = d // heads

    def mlp_write(layer: int, ids: torch.Tensor) -> torch.Tensor:
        got = {}
        h = blocks[layer].mlp.register_forward_hook(lambda m, a, o: got.setdefault("o", o))
        _metric(model, b, ids)
        h.remove()
        return got["o"]

    def head_write(layer: int, head: int, ids: torch.Tensor) -> torch.Tensor:
        got = {}
        proj = blocks[layer].attn.c_proj
        h = proj.register_forward_pre_hook(lambda m, a: got.setdefault("z", a[0]))
        _metric(model, b, ids)
        h.remove()
        return got["z"][..., head * dh:(head + 1) * dh] @ proj.weight[head * dh:(head + 1) * dh]  # Conv1D [in, out]

    def run_with(module: nn.Module, hook) -> np.ndarray:
        h = module.register_forward_hook(hook)
        try:
            return _metric(model, b, b.clean)
        finally:
            h.remove()

    # L0H1 -> MLP0 (a head into its own layer's MLP)
    delta = head_write(0, 1, b.corrupt) - head_write(0, 1, b.clean)
    ln2 = blocks[0].ln_2
    by_hand = run_with(ln2, lambda m, a, o: F.layer_norm(a[0] + delta, (d,), ln2.weight, ln2.bias, ln2.eps))
    got = evaluate_circuits(hm, g, b, [_drop_one(g, "L0H1", "MLP0")]).circuits[:, 0]
    assert np.abs(got - by_hand).max() < 1e-5
    # MLP0 -> L1G3.v (MHA: group 3 is head 3; the value rows of the fused projection)
    delta = mlp_write(0, b.corrupt) - mlp_write(0, b.clean)
    attn, ln1 = blocks[1].attn.c_attn, blocks[1].ln_1
    resid = {}
    hk = blocks[1].register_forward_pre_hook(lambda m, a, k: resid.__setitem__("x", a[0] if a else k["hidden_states"]),
                                             with_kwargs=True)

    def values(m, a, out):
        x = F.layer_norm(resid["x"] + delta, (d,), ln1.weight, ln1.bias, ln1.eps)
        cols = slice(2 * d + 3 * dh, 2 * d + 4 * dh)
        out = out.clone()
        out[..., cols] = x @ attn.weight[:, cols] + attn.bias[cols]
        return out

    by_hand = run_with(attn, values)
    hk.remove()
    got = evaluate_circuits(hm, g, b, [_drop_one(g, "MLP0", "L1G3.v")]).circuits[:, 0]
    assert np.abs(got - by_hand).max() < 1e-5
    # L1H0 -> logits
    delta = head_write(1, 0, b.corrupt) - head_write(1, 0, b.clean)
    lnf = model.transformer.ln_f
    by_hand = run_with(lnf, lambda m, a, o: F.layer_norm(a[0] + delta, (d,), lnf.weight, lnf.bias, lnf.eps))
    got = evaluate_circuits(hm, g, b, [_drop_one(g, "L1H0", "logits")]).circuits[:, 0]
    assert np.abs(got - by_hand).max() < 1e-5
    assert np.abs(by_hand - _metric(model, b, b.clean)).max() > 1e-4


def test_empty_circuit_is_the_corrupt_run_and_full_circuit_the_clean_run():
    hm = tiny_model("llama", init_std=0.2)
    b, g = _pairs(), build_graph(hm)
    runs = evaluate_circuits(hm, g, b, [np.ones(g.n_edges, bool), np.zeros(g.n_edges, bool)], batch_size=2)
    assert np.abs(runs.circuits[:, 0] - _metric(hm.model, b, b.clean)).max() < 1e-5
    assert np.abs(runs.circuits[:, 1] - _metric(hm.model, b, b.corrupt)).max() < 1e-5
    assert np.abs(runs.empty - runs.corrupt).max() < 1e-5


@pytest.mark.parametrize("family,overrides", [("qwen3", {}), ("smollm3", {}), ("starcoder2", {}), ("phi3", {}),
                                              ("gpt_neox", {"use_parallel_residual": False}), ("mistral", {})])
def test_every_mapped_family_rebuilds_the_corrupt_run_from_its_edges(family, overrides):
    """With every edge patched each receiver reads the corrupt residual rebuilt from the senders' writes: the
    corrupt run, in every family models/residual.py maps (its norms, MLP and head writes read right)."""
    hm = tiny_model(family, init_std=0.2, **overrides)
    b, g = _pairs(), build_graph(hm)
    runs = evaluate_circuits(hm, g, b, [np.ones(g.n_edges, bool)], batch_size=4)
    assert np.abs(runs.empty - runs.corrupt).max() < 1e-4, np.abs(runs.empty - runs.corrupt).max()
    assert np.abs(runs.circuits[:, 0] - runs.clean).max() < 1e-5
    assert np.abs(runs.clean - runs.corrupt).max() > 1e-3


def test_gpt_neox_with_its_parallel_residual_is_refused_in_one_line():
    with pytest.raises(HeadscopeError) as e:
        build_graph(tiny_model("gpt_neox"))
    assert "parallel" in str(e.value) and "\n" not in str(e.value)


def test_an_edge_into_a_kv_group_equals_patching_that_groups_keys_for_all_its_query_heads():
    """GQA: the same model ungrouped (num_key_value_heads = heads, each query head its own copy of its group's key
    and value rows) computes the same; patching there the keys of every query head of group 1 by hand equals the
    evaluator's one edge into L1G1.k on the grouped model."""
    import transformers as tf

    hm = tiny_model("llama", init_std=0.2)
    cfg = hm.model.config
    H, G = cfg.num_attention_heads, cfg.num_key_value_heads
    dh, size = cfg.hidden_size // H, H // G
    flat = tf.LlamaConfig(**{**cfg.to_dict(), "num_key_value_heads": H})
    flat._attn_implementation = "eager"
    mha = tf.LlamaForCausalLM(flat).eval()
    state = dict(hm.model.state_dict())
    for key in list(state):
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            w = state[key].view(G, dh, -1)
            state[key] = w.repeat_interleave(size, dim=0).reshape(H * dh, -1)
    mha.load_state_dict(state)
    b = _pairs()
    assert np.abs(_metric(mha, b, b.clean) - _metric(hm.model, b, b.clean)).max() < 1e-5
    layers = mha.model.layers

    def head0_write(ids):
        got = {}
        o = layers[0].self_attn.o_proj
        h = o.register_forward_pre_hook(lambda m, a: got.setdefault("z", a[0]))
        _metric(mha, b, ids)
        h.remove()
        return got["z"][..., 0:dh] @ o.weight[:, 0:dh].T

    delta = head0_write(b.corrupt) - head0_write(b.clean)
    layer, resid = layers[1], {}
    k = layer.self_attn.k_proj

    def keys(m, a, out):
        x = layer.input_layernorm(resid["x"] + delta)
        out = out.clone()
        for h in range(size, 2 * size):  # the query heads of group 1, each with its own keys
            out[..., h * dh:(h + 1) * dh] = F.linear(x, k.weight[h * dh:(h + 1) * dh])
        return out

    hs = [layer.register_forward_pre_hook(lambda m, a, kw: resid.__setitem__("x", a[0] if a else kw["hidden_states"]),
                                          with_kwargs=True), k.register_forward_hook(keys)]
    by_hand = _metric(mha, b, b.clean)
    for h in hs:
        h.remove()
    g = build_graph(hm)
    got = evaluate_circuits(hm, g, b, [_drop_one(g, "L0H0", "L1G1.k")]).circuits[:, 0]
    assert np.abs(got - by_hand).max() < 1e-5, np.abs(got - by_hand).max()
    assert np.abs(by_hand - _metric(mha, b, b.clean)).max() > 1e-4


# --- scores ----------------------------------------------------------------------------------------------------


def _linear_in_the_edges(hm: HeadModel) -> HeadModel:
    """The model made linear in every receiver's input: norms become identities, queries and keys zero (uniform
    attention), MLPs write nothing."""
    base = hm.model.model
    with torch.no_grad():
        for layer in base.layers:
            layer.input_layernorm, layer.post_attention_layernorm = nn.Identity(), nn.Identity()
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.k_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    base.norm = nn.Identity()
    return hm


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_eap_equals_exact_edge_patching_on_a_model_linear_in_the_edges(method):
    hm = _linear_in_the_edges(tiny_model("llama", init_std=0.2))
    b, g = _pairs(), build_graph(hm)
    runs = edge_scores(hm, g, b, method=method, steps=3, batch_size=3)
    every = np.ones(g.n_edges, bool)
    circuits = [every.copy() for _ in range(g.n_edges)]
    for e, c in enumerate(circuits):
        c[e] = False
    exact = evaluate_circuits(hm, g, b, circuits, batch_size=4)
    want = -(exact.circuits - exact.clean[:, None])  # positive when patching the edge lowers M
    assert np.abs(runs.scores - want).max() < 1e-4, np.abs(runs.scores - want).max()
    assert np.abs(want).max() > 1e-2 and (np.abs(want) > 1e-6).sum() > 10  # edges that matter, of both kinds


def test_eap_ig_interpolates_the_inputs_from_the_corrupt_end():
    """One step of EAP-IG is the gradient at alpha = 0, the corrupt run's embeddings: minus EAP on the swapped
    pairs (whose clean run is the corrupt text); on a nonlinear model it differs from EAP and from two steps."""
    hm = tiny_model("llama", init_std=0.2)
    b, g = _pairs(), build_graph(hm)
    swapped = PairBatch(b.corrupt, b.clean, b.mask, b.position, b.answer, b.wrong, [], "swapped")
    one = edge_scores(hm, g, b, method="eap-ig", steps=1).scores
    assert np.abs(one + edge_scores(hm, g, swapped, method="eap").scores).max() < 1e-5
    eap, two = edge_scores(hm, g, b, method="eap").scores, edge_scores(hm, g, b, method="eap-ig", steps=2).scores
    assert np.abs(one - eap).max() > 1e-4 and np.abs(two - one).max() > 1e-4


# --- a planted circuit -----------------------------------------------------------------------------------------


def _planted() -> HeadModel:
    """A hand-built 2-layer GQA LLaMA: token embeddings differ only along e1 between the clean and corrupt tokens,
    L0H0's values read e1 and its output writes e3, and logit(answer) - logit(wrong) reads e3 alone; every other
    head writes nothing, MLPs write nothing, norms are identities, attention uniform. Two edges carry the task:
    input -> L0G0.v and L0H0 -> logits."""
    hm = _linear_in_the_edges(tiny_model("llama"))
    m = hm.model
    dh = m.config.hidden_size // m.config.num_attention_heads
    with torch.no_grad():
        emb = m.model.embed_tokens.weight
        emb.zero_()
        emb[:, 0] = 1.0  # every token: e0
        emb[20:, 1] = 1.0  # tokens from 20 on: e1 too
        for layer in m.model.layers:
            layer.self_attn.v_proj.weight.zero_()
            layer.self_attn.o_proj.weight.zero_()
        m.model.layers[0].self_attn.v_proj.weight[0, 1] = 1.0  # group 0's first value channel reads e1
        m.model.layers[0].self_attn.o_proj.weight[3, 0] = 2.0  # head 0 (first channel) writes e3
        m.lm_head.weight.zero_()
        m.lm_head.weight[5, 3] = 1.0  # the answer reads e3
        m.lm_head.weight[9, 0] = 0.5  # the wrong token reads e0, the same in both runs
    assert dh > 1
    return hm


def test_a_planted_two_edge_circuit_is_found_first_and_is_faithful_at_two_edges():
    hm = _planted()
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(20, 100, (P, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randint(3, 20, (P,), generator=g)
    b = PairBatch(clean, corrupt, torch.ones(P, T, dtype=torch.long), torch.full((P,), T - 1),
                  torch.full((P,), 5), torch.full((P,), 9), [], "planted")
    graph = build_graph(hm)
    for method in ("eap", "eap-ig"):
        scores = edge_scores(hm, graph, b, method=method, batch_size=2).scores.mean(0)
        names = graph.edge_names()
        top = {names[i] for i in np.argsort(-np.abs(scores))[:2]}
        assert top == {("input", "L0G0.v"), ("L0H0", "logits")}, top
        assert np.sort(np.abs(scores))[-3] < 1e-6 * np.abs(scores).max()
    curves = faithfulness_curves(hm, graph, b, scores, IntervalSettings(B=200), batch_size=2).record
    at_two = curves["curve"][FRACTIONS.index(0.02)]
    assert at_two["edges"] == 2 and abs(at_two["faithfulness"] - 1) < 1e-5
    assert abs(curves["curve"][0]["faithfulness"]) < 1e-6  # 0 edges at 0.001 of 126: the empty circuit
    assert abs(curves["curve"][-1]["faithfulness"] - 1) < 1e-5
    f = np.array([p["faithfulness"] for p in curves["curve"]])
    assert abs(curves["cmd"] - area(np.abs(1 - f))) < 1e-9
    assert curves["cmd_lo"] <= curves["cmd"] <= curves["cmd_hi"] and curves["cpr_lo"] <= curves["cpr"]


def test_areas_are_trapezoids_over_the_fractions():
    ones = np.ones(len(FRACTIONS))
    assert area(ones) == pytest.approx(1 - 0.001)
    ramp = np.asarray(FRACTIONS)
    assert area(ramp) == pytest.approx((1 - 0.001 ** 2) / 2)


# --- the verb ----------------------------------------------------------------------------------------------------


def test_cli_writes_the_declared_files_and_refuses_in_one_line(tmp_path, capsys):
    import json

    from test_artifacts import check_csv, check_keys, tiny_bert_dir, tiny_llama_dir
    from test_verbs_common import PAIRS_TEXT

    import headscope.artifacts as A
    from headscope.cli import main

    llama = tiny_llama_dir(tmp_path)[0]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(PAIRS_TEXT)
    out = tmp_path / "out"
    assert main(["circuit", str(llama), "--pairs", str(pairs), "--method", "eap-ig", "--ig-steps", "2",
                 "--bootstrap", "200", "--out", str(out)]) == 0
    check_csv(out / "edges.csv", A.EDGES_CSV, set())
    data = check_keys(out / "circuit.json", A.CIRCUIT_JSON)
    assert [p["fraction"] for p in data["curve"]] == list(FRACTIONS) and data["method"] == "eap-ig"
    assert set(data["curve"][0]) >= {"edges", "fraction", "faithfulness", "faithfulness_lo", "faithfulness_hi",
                                     "random"}
    rows = (out / "edges.csv").read_text().splitlines()
    assert len(rows) == 1 + data["total_edges"]
    assert data["cmd_lo"] <= data["cmd"] <= data["cmd_hi"] and data["cpr_lo"] <= data["cpr"] <= data["cpr_hi"]
    assert json.loads((out / "circuit.json").read_text())["provenance"]["verb"] == "circuit"
    # the report's section reads both files: the curve with its band, and the smallest circuit reaching 0.8
    from headscope.report.circuit import PLOT_NAMES, circuit_part
    from headscope.report.sources import Sources

    figs: dict[str, bytes] = {}
    part = circuit_part(Sources.scan([out]), figs)
    reach = next(p for p in data["curve"] if p["faithfulness"] >= 0.8)
    assert [p["plot"] is not None for p in part.panels] == [True, True] and set(figs) == set(PLOT_NAMES.values())
    assert f"{reach['edges']} edges" in " ".join(part.text["q1"])
    assert len(part.panels[0]["rows"]) == len(FRACTIONS)
    capsys.readouterr()
    bert = tiny_bert_dir(tmp_path)
    assert main(["circuit", str(bert), "--pairs", str(pairs), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "causal LM" in err and not (tmp_path / "b").exists()


def test_library_scores_are_the_mean_over_pairs_with_intervals():
    import headscope

    hm = tiny_model("llama", init_std=0.2)
    b = _pairs()
    got = headscope.circuit(hm, b, method="eap", bootstrap=200, batch_size=3)
    assert np.allclose(got.score, got.per_pair.mean(0))
    assert (got.score_lo <= got.score + 1e-12).all() and (got.score <= got.score_hi + 1e-12).all()
    assert got.to_pandas().shape[0] == got.graph.n_edges
