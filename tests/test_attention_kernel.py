"""The statistics kernel: blockwise statistics equal eager's full-map statistics, and the model's
outputs under it equal sdpa's (the kernel changes nothing the model computes)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from headscope import HeadscopeError, HeadStats, on_attention_weights
from headscope.attention import KERNEL_NAME, stats_kernel
from headscope.attention.kernel import stats_attention_forward
from headscope.data import TokenClasses, batches
from headscope.hooks import on_attention_blocks
from headscope.learned.analyze import run_stats
from headscope.models.tiny import tiny_model
from headscope.redundancy.pruning.heads import prune_heads
from headscope.stats import STATISTICS, collect_stats, collect_stats_kernel

# Four passages of 23, 17, 9 and 4 tokens: batches of 3 are right-padded, and T = 23 is prime, so
# block sizes 3 and 8 leave a short last block.
_G = torch.Generator().manual_seed(3)
SEQS = [[3] + torch.randint(5, 120, (n - 1,), generator=_G).tolist() for n in (23, 17, 9, 4)]
T = 23
# Some ids flagged special and punctuation, so those masses are not all zero.
SPECIAL = (3, 2, 40, 41, 42, 43, 44)
PUNCT = tuple(range(60, 90))

# family -> tiny_model overrides; mistral's window (5) is shorter than the sequence.
FAMILIES = {"bert": {}, "gpt2": {}, "llama": {}, "mistral": {"sliding_window": 5}, "qwen2": {}}


def flags(vocab: int = 120) -> TokenClasses:
    special = torch.zeros(vocab, dtype=torch.bool)
    special[list(SPECIAL)] = True
    punct = torch.zeros(vocab, dtype=torch.bool)
    punct[list(PUNCT)] = True
    return TokenClasses(special, punct)


def collect(hm, *, kernel: bool, block: int = 128, batch_size: int = 3, seqs=SEQS, tile: int = 1024) -> HeadStats:
    """Statistics of `seqs` through the kernel or through eager's full maps (today's reference)."""
    stats = HeadStats(hm.n_layers, hm.n_heads)
    ctx = collect_stats_kernel(hm, stats, flags(), block, tile=tile) if kernel else collect_stats(hm, stats, flags())
    with ctx as session, torch.no_grad():
        for batch in batches(seqs, batch_size, pad_id=0):
            session.set_batch(batch.attention_mask, batch.input_ids)
            hm.model(**batch.model_inputs(), use_cache=False)
    return stats


def assert_stats_equal(got: HeadStats, want: HeadStats, tol: float = 1e-5) -> None:
    assert (got.tokens, got.passages) == (want.tokens, want.passages)
    assert set(got.sums) == set(want.sums) == set(STATISTICS)
    g, w = got.means(), want.means()
    for name in STATISTICS:
        assert np.array_equal(got.counts[name], want.counts[name]), f"{name}: counts differ"
        assert np.array_equal(np.isnan(g[name]), np.isnan(w[name])), f"{name}: NaN pattern differs"
        ok = ~np.isnan(w[name])
        d = np.abs(g[name][ok] - w[name][ok]).max() if ok.any() else 0.0
        assert d < tol, f"{name}: max abs diff {d}"


@pytest.fixture(params=list(FAMILIES))
def model(request):
    return tiny_model(request.param, init_std=0.2, **FAMILIES[request.param])


@pytest.mark.parametrize("block", [1, 3, 8, T, 128])
def test_kernel_statistics_equal_eager(model, block):
    eager = collect(model, kernel=False)
    assert_stats_equal(collect(model, kernel=True, block=block), eager)
    assert eager.sums["special_mass"].any() and eager.sums["punct_mass"].any()


@pytest.mark.parametrize("block, tile", [(1, 1), (3, 2), (8, 5), (T, 7), (5, T)])
def test_online_softmax_over_key_tiles_equals_eager(model, block, tile, monkeypatch):
    """Keys walked in tiles shorter than the sequence (running maximum rescaled between tiles; the near
    keys and key 0 in other tiles than the diagonal; windows starting inside a tile): eager's statistics,
    and no logits wider than a tile are ever computed."""
    import headscope.attention.blocks as blocks

    widths = []
    original = blocks.masked_logits

    def recording(query, key, mask, q0, q1, k0, k1, **kwargs):
        widths.append((q1 - q0, k1 - k0))
        return original(query, key, mask, q0, q1, k0, k1, **kwargs)

    monkeypatch.setattr(blocks, "masked_logits", recording)
    got = collect(model, kernel=True, block=block, tile=tile)
    assert widths and max(q for q, _ in widths) <= block and max(k for _, k in widths) <= tile
    assert_stats_equal(got, collect(model, kernel=False))


def test_rows_from_probabilities_when_another_consumer_reads_them(model):
    """With a consumer of probabilities attached too, the statistics are read from the blocks' probabilities
    (`rows_from_block`) instead of the tiled walk: the same numbers."""
    stats = HeadStats(model.n_layers, model.n_heads)
    seen = []
    with collect_stats_kernel(model, stats, flags(), 3) as session, torch.no_grad(), \
            on_attention_blocks(model, lambda layer, q0, probs: seen.append(layer), block=3):
        for batch in batches(SEQS, 3, pad_id=0):
            session.set_batch(batch.attention_mask, batch.input_ids)
            model.model(**batch.model_inputs(), use_cache=False)
    assert seen
    assert_stats_equal(stats, collect(model, kernel=False))


@pytest.mark.parametrize("family", ["roberta", "electra"])
def test_other_encoder_families(family):
    hm = tiny_model(family, init_std=0.2)
    assert_stats_equal(collect(hm, kernel=True, block=3), collect(hm, kernel=False))


def test_sliding_window_is_shorter_than_the_sequence():
    hm = tiny_model("mistral", init_std=0.2, **FAMILIES["mistral"])
    assert hm.sliding_window(0) == 5 < T
    wide = tiny_model("mistral", init_std=0.2)  # same weights, no window: the window must matter
    d = np.abs(collect(hm, kernel=True).means()["entropy"] - collect(wide, kernel=True).means()["entropy"]).max()
    assert d > 1e-2, f"the window changed entropy by only {d}"


def test_run_stats_goes_through_the_kernel_and_equals_eager(model, monkeypatch):
    from headscope.attention.kernel import AttentionKernel

    calls = []
    original = AttentionKernel.forward

    def counting(self, info, *args, **kwargs):
        calls.append(info.layer)
        return original(self, info, *args, **kwargs)

    monkeypatch.setattr(AttentionKernel, "forward", counting)
    kernel = run_stats(model, SEQS, 2, block=5)
    assert len(calls) == 2 * model.n_layers  # two batches, every layer
    assert model.config._attn_implementation == "eager"  # restored afterwards
    assert_stats_equal(kernel, run_stats(model, SEQS, 2, eager=True))


def test_pruned_model(model):
    """Physically pruned: one layer loses every head, another keeps one query head per KV group fewer."""
    per_group = model.group_size
    partial = [g * per_group for g in range(model.n_kv_heads)] if per_group > 1 else [1, 2]
    small = prune_heads(model, {0: list(range(model.n_heads)), 1: partial})
    assert small.heads_in_layer(0) == 0 and 0 < small.heads_in_layer(1) < model.n_heads
    eager = collect(small, kernel=False)
    for block in (1, 3, T):
        assert_stats_equal(collect(small, kernel=True, block=block), eager)
    assert np.isnan(eager.means()["entropy"][0]).all()


def _inputs():
    batch = next(batches(SEQS[:3], 3, pad_id=0))
    return batch.model_inputs()


def test_outputs_equal_sdpa_forward(model):
    """Under the kernel (with a consumer reading every block) every layer's output equals sdpa's."""
    sdpa = copy.deepcopy(model.model)
    sdpa.set_attn_implementation("sdpa")
    inputs = _inputs()
    with torch.no_grad():
        want = sdpa(**inputs, output_hidden_states=True, use_cache=False).hidden_states
        blocks = []
        with stats_kernel(model, block=3) as kernel, kernel.consumer(lambda b: blocks.append(b.layer)):
            assert model.config._attn_implementation == KERNEL_NAME
            got = model.model(**inputs, output_hidden_states=True, use_cache=False).hidden_states
    assert sorted(set(blocks)) == list(range(model.n_layers)) and len(blocks) == model.n_layers * 8
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        d = (g - w).abs().max().item()
        assert d == 0.0, f"hidden state {layer}: max abs diff {d} from the sdpa forward"


def test_blocks_equal_eager_weights(model):
    """on_attention_blocks hands out eager's probability rows, block by block, over all keys.

    Rows of padded queries are left out: a padded query outside every real key's window sees no key
    at all, and such a row is uniform over whichever keys were computed (eager: all T).
    """
    inputs = _inputs()
    valid = inputs["attention_mask"].bool()  # [batch, q]
    full, rows = {}, {}
    with torch.no_grad():
        with on_attention_weights(model, lambda l, p: full.__setitem__(l, p.clone())):
            model.model(**inputs, use_cache=False)
        with on_attention_blocks(model, lambda l, q0, p: rows.setdefault(l, {}).__setitem__(q0, p.clone()), block=3):
            model.model(**inputs, use_cache=False)
    for layer, want in full.items():
        assert sorted(rows[layer]) == list(range(0, T, 3))
        got = torch.cat([rows[layer][q0] for q0 in sorted(rows[layer])], dim=2)  # [batch, head, q, k]
        d = (got - want).abs().amax(dim=(1, 3))[valid].max().item()  # over real queries
        assert d < 1e-6, f"layer {layer}: max abs diff {d} from eager's weights"


@pytest.mark.parametrize("block", [0, -3, 2.5, True])
def test_bad_block_size_is_a_clear_error(block):
    hm = tiny_model("gpt2")
    with pytest.raises(HeadscopeError, match="block size must be a positive"):
        with stats_kernel(hm, block):
            pass
    with pytest.raises(HeadscopeError, match="block size must be a positive"):
        run_stats(hm, SEQS, 2, block=block)
    assert hm.config._attn_implementation == "eager"


def test_unsupported_attention_is_a_clear_error():
    """An attention module that computes attention itself (no AttentionInterface) is refused up front."""
    hm = tiny_model("llama")
    attn = hm.attention(1)
    base = type(attn)

    class OwnAttention(base):
        def forward(self, hidden_states, *args, **kwargs):  # its own attention, never the registry
            return base.forward(self, hidden_states, *args, **kwargs)

    attn.__class__ = OwnAttention
    with pytest.raises(HeadscopeError, match=r"OwnAttention \(layer 1.*AttentionInterface"):
        with stats_kernel(hm):
            pass
    assert hm.config._attn_implementation == "eager"


def test_layers_that_skip_the_kernel_are_caught_at_run_time():
    """A layer that never reaches the kernel during a forward (e.g. source the check could not read)."""
    hm = tiny_model("llama")
    attn = hm.attention(0)
    original = type(attn).forward

    def eager_only(self, *args, **kwargs):
        saved = self.config._attn_implementation
        self.config._attn_implementation_internal = "eager"
        try:
            return original(self, *args, **kwargs)
        finally:
            self.config._attn_implementation_internal = saved

    with stats_kernel(hm) as kernel, kernel.consumer(lambda b: None):
        attn.forward = eager_only.__get__(attn)
        with pytest.raises(HeadscopeError, match=r"layers \[0\].*did not run through the statistics kernel"):
            with torch.no_grad():
                hm.model(**_inputs(), use_cache=False)
    del attn.forward
    assert hm.config._attn_implementation == "eager"


def test_kv_cache_is_refused_while_collecting():
    hm = tiny_model("llama", init_std=0.2)
    ids = torch.tensor([SEQS[0][:8]])
    with torch.no_grad():
        cache = hm.model(input_ids=ids, use_cache=True).past_key_values
        with stats_kernel(hm) as kernel, kernel.consumer(lambda b: None):
            with pytest.raises(HeadscopeError, match="1 queries against 9 keys.*use_cache=False"):
                hm.model(input_ids=torch.tensor([[7]]), cache=cache, use_cache=True)


def test_nested_kernels_share_one_block_size():
    hm = tiny_model("gpt2")
    with stats_kernel(hm, 4) as outer:
        with stats_kernel(hm, 4) as inner:
            assert inner is outer
        with pytest.raises(HeadscopeError, match="already active.*block 4.*block 8"):
            with stats_kernel(hm, 8):
                pass
        assert hm.config._attn_implementation == KERNEL_NAME
    assert hm.config._attn_implementation == "eager"


def _eager_softcap(q, k, v, mask, scaling, softcap):
    """Reference: eager attention with logit soft-capping (Gemma-2 style), repeat_kv for GQA."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = torch.tanh(q @ k.transpose(-1, -2) * scaling / softcap) * softcap
    s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    p = s.softmax(-1)
    return (p @ v).transpose(1, 2), p


@pytest.mark.parametrize("block", [1, 4, 16])
def test_softcap_output_and_blocks_equal_eager(block):
    """sdpa has no soft-capping: the kernel computes that output from its own blocks, exactly as eager."""
    hm = tiny_model("llama")
    attn = hm.attention(0)
    g = torch.Generator().manual_seed(0)
    b, h, kv, t, d = 2, hm.n_heads, hm.n_kv_heads, 13, hm.d_head
    q, k, v = (torch.randn(b, n, t, d, generator=g) * 3 for n in (h, kv, kv))
    mask = torch.ones(b, 1, t, t, dtype=torch.bool).tril()
    mask[1, :, :, 9:] = False  # right padding in row 1
    want_out, want_p = _eager_softcap(q, k, v, mask, 0.3, 5.0)
    got_p = {}
    keep = lambda blk: got_p.__setitem__(blk.q_start, blk.full_probs())  # noqa: E731
    with stats_kernel(hm, block) as kernel, kernel.consumer(keep):
        kernel._start_forward()
        out, weights = stats_attention_forward(attn, q, k, v, mask, scaling=0.3, softcap=5.0)
    assert weights is None
    d_out = (out - want_out).abs().max().item()
    d_p = (torch.cat([got_p[s] for s in sorted(got_p)], dim=2) - want_p).abs().max().item()
    assert d_out < 1e-5 and d_p < 1e-6, f"max abs diff: output {d_out}, probabilities {d_p}"
    # and outside any kernel context (no consumers), the same output
    out2, _ = stats_attention_forward(attn, q, k, v, mask, scaling=0.3, softcap=5.0)
    assert (out2 - want_out).abs().max().item() < 1e-5


@pytest.mark.parametrize("block, tile", [(1, 1), (4, 3), (16, 5), (16, 64)])
def test_rows_walk_equals_eager_with_softcap_and_padding(block, tile):
    """The tiled online-softmax walk (`fused_rows`) on one soft-capped GQA layer with right padding: the
    output and every per-query value equal eager's full map, computed by hand."""
    hm = tiny_model("llama")
    attn = hm.attention(0)
    g = torch.Generator().manual_seed(1)
    b, h, kv, t, d = 2, hm.n_heads, hm.n_kv_heads, 13, hm.d_head
    q, k, v = (torch.randn(b, n, t, d, generator=g) * 3 for n in (h, kv, kv))
    mask = torch.ones(b, 1, t, t, dtype=torch.bool).tril()
    mask[1, :, :, 9:] = False  # right padding in row 1
    cols = torch.rand(b, t, 2, generator=g)
    want_out, p = _eager_softcap(q, k, v, mask, 0.3, 5.0)  # p [batch, head, q, k]
    got = []
    with torch.no_grad(), stats_kernel(hm, block, output="blocks", tile=tile) as kernel, \
            kernel.rows_consumer(got.append, lambda layer: cols):
        kernel._start_forward()
        out, _ = stats_attention_forward(attn, q, k, v, mask, scaling=0.3, softcap=5.0)
    assert len(got) == -(-t // block)
    cat = lambda name: torch.cat([getattr(r, name) for r in got], dim=2)  # noqa: E731
    pos = torch.arange(t)
    want = {"entropy": -torch.special.xlogy(p, p).sum(-1), "max_weight": p.amax(-1),
            "mean_distance": (p * (pos[:, None] - pos[None, :]).abs()).sum(-1), "first": p[..., 0],
            "weighted": p @ cols[:, None]}
    checks = {name: (cat(name) - w).abs().max().item() for name, w in want.items()}
    near = cat("near")
    for n, offset in enumerate((-1, 0, 1)):
        diag = torch.diagonal(p, offset=offset, dim1=-2, dim2=-1)
        lo = max(0, -offset)
        checks[f"near{offset:+d}"] = (near[..., lo:lo + diag.shape[-1], n] - diag).abs().max().item()
    checks["output"] = (out - want_out).abs().max().item()
    assert max(checks.values()) < 1e-5, checks


def test_tile_size_must_be_positive():
    with pytest.raises(HeadscopeError, match="tile size must be a positive number of keys, got 0"):
        with stats_kernel(tiny_model("llama"), tile=0):
            pass


REAL_TEXTS = ["The quick brown fox, which was hungry, jumped over the lazy dog near the river bank.",
              "In 1989, the company reported a net loss of $ 3.2 million, or 45 cents a share.", "Short one."]


@pytest.mark.real
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_real_weights_kernel_equals_eager(name, request):
    """On the shipped weights, with right padding and a block (7) that divides no length.

    Attention statistics agree to 1e-5 (measured: at most 2.4e-6, SmolLM2's mean_distance). output_norm
    is read from the output projection's input, which an sdpa forward and an eager forward compute in a
    different float order (not the kernel's doing); it agrees to 1e-5 relative (measured 9e-7).
    """
    from headscope.data import prepare_tokens

    hm = request.getfixturevalue(name)
    ids = prepare_tokens(hm, REAL_TEXTS, 128).ids
    got, want = run_stats(hm, ids, 3, block=7), run_stats(hm, ids, 3, eager=True)
    g, w = got.means(), want.means()
    for stat in STATISTICS:
        assert np.array_equal(got.counts[stat], want.counts[stat]), f"{stat}: counts differ"
        ok = ~np.isnan(w[stat])  # next_token_mass is NaN throughout for causal SmolLM2
        assert np.array_equal(np.isnan(g[stat]), ~ok), f"{stat}: NaN pattern differs"
        diff = np.abs(g[stat][ok] - w[stat][ok])
        d = (diff / np.abs(w[stat][ok])).max() if stat == "output_norm" else diff.max(initial=0.0)
        assert d < 1e-5, f"{stat}: max {'relative' if stat == 'output_norm' else 'abs'} diff {d}"
