"""The xor task: one attention-only head provably cannot compute it (at most 75 %), two heads can.

The proof (docs/sweep.md) rests on one identity: for a single head whose query is fixed, the logit
gap times the softmax normaliser is a sum of one term per key position. These tests check that
identity on the model the sweep trains, the bound on a trained single head (exhaustively, block by
block), an explicit two-head solution, and that trained two-head models find one.
"""

from __future__ import annotations

import math

import pytest
import torch

from headscope.capacity import sweep as S
from headscope.cli import main
from headscope.errors import HeadscopeError

P, Q = S.XOR_POSITIONS


def xor_cfg(**kw) -> S.SweepConfig:
    base = dict(task="xor", d_model=32, n_heads=1, n_layers=1, steps=600, seq=13, batch=128, init_std=0.2)
    return S.SweepConfig(**{**base, **kw})


def gap_and_normaliser(model: S.TinyLM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logit gap D = logit_1 - logit_0 at the query, and Z = sum_j exp(score_j) of head 0 there, per row.

    Computed in float64 from the model's own weights, so the identity below is checked to float64
    rounding, not to whatever float32 rounding the machine's BLAS does (the module itself runs its
    softmax in float32); both are checked equal to the module's own weights and logits first.
    """
    assert len(model.blocks) == 1 and model.blocks[0].mlp is None, "the identity is about one attention-only layer"
    attn = model.blocks[0].attn
    dh, weight = attn.d_head, (lambda m: m.weight.detach().double())
    resid = weight(model.tok_emb)[x] + weight(model.pos_emb)[: x.shape[1]]  # [batch, pos, d_model]
    q = resid[:, -1] @ weight(attn.q_proj).T  # [batch, head * d_head], at the query
    k = resid @ weight(attn.k_proj).T  # [batch, pos, kv_head * d_head]
    v = resid @ weight(attn.v_proj).T  # [batch, pos, kv_head * d_head]
    out = resid[:, -1].clone()  # [batch, d_model]: the residual stream at the query
    scores0 = None
    for h in range(attn.n_heads):
        cols = slice(h // attn.group_size * dh, (h // attn.group_size + 1) * dh)
        scores = (k[..., cols] @ q[:, h * dh:(h + 1) * dh, None]).squeeze(-1) / math.sqrt(dh)  # [batch, pos]
        scores0 = scores if h == 0 else scores0
        mixed = (scores.softmax(-1).unsqueeze(1) @ v[..., cols]).squeeze(1)  # [batch, d_head]
        out = out + mixed @ weight(attn.o_proj)[:, h * dh:(h + 1) * dh].T
    logits = out @ weight(model.head).T  # [batch, 2]
    # The hand-computed scores and logits are the module's: same weights at the query, same output.
    _, weights = attn(resid.float(), return_weights=True)  # [batch, head, q, k]
    torch.testing.assert_close(scores0.softmax(-1).float(), weights[:, 0, -1], atol=1e-6, rtol=0)
    torch.testing.assert_close(logits.float(), model(x)[:, -1], atol=1e-4, rtol=1e-5)
    return logits[:, 1] - logits[:, 0], scores0.exp().sum(-1)


def blocks_of_four(x_all: torch.Tensor) -> torch.Tensor:
    """Row indices [n/4, 4] of the inputs that differ only in bits P and Q: (0,0), (0,1), (1,0), (1,1)."""
    rows = torch.arange(len(x_all))
    base = rows[(x_all[:, P] == 0) & (x_all[:, Q] == 0)]  # xor_all_inputs puts bit j of the row number at j
    return torch.stack([base, base + (1 << Q), base + (1 << P), base + (1 << P) + (1 << Q)], 1)


def test_xor_inputs_are_every_bit_string_once_with_the_right_targets():
    x, y = S.xor_all_inputs(13)
    assert x.shape == (4096, 13) and (x[:, -1] == S.XOR_QUERY).all()
    assert len({tuple(r) for r in x[:, :-1].tolist()}) == 4096 and set(x[:, :-1].unique().tolist()) == {0, 1}
    assert (y[:, :-1] == -100).all() and torch.equal(y[:, -1], x[:, P] ^ x[:, Q])
    xb, yb = S.xor_batch(64, 13, torch.Generator().manual_seed(0))
    assert torch.equal(yb[:, -1], xb[:, P] ^ xb[:, Q]) and (xb[:, -1] == S.XOR_QUERY).all()
    # Each block of four really differs in exactly bits P and Q.
    idx = blocks_of_four(x)
    assert idx.shape == (1024, 4)
    diff = (x[idx[:, 0]] != x[idx[:, 3]]).any(0).nonzero().flatten().tolist()
    assert diff == [P, Q] and torch.equal(y[idx, -1][0], torch.tensor([0, 1, 1, 0]))


def interaction_and_spread(v: torch.Tensor) -> tuple[float, float]:
    """Largest |v(0,0) + v(1,1) - v(0,1) - v(1,0)| over blocks [n, 4], and the smallest spread in a block."""
    inter = (v[:, 0] + v[:, 3] - v[:, 1] - v[:, 2]).abs().max().item()
    return inter, (v.max(1).values - v.min(1).values).min().item()


@pytest.mark.parametrize("d_model,std", [(8, 0.5), (32, 0.2), (16, 0.4)])
def test_one_head_gap_times_normaliser_is_a_sum_over_positions(d_model, std):
    """The lemma: Z*D(a,b) = F(a) + G(b) + C, so the four-point interaction vanishes, for any weights."""
    model = S.build_model(xor_cfg(d_model=d_model, init_std=std), 3)
    x_all, _ = S.xor_all_inputs(13)
    idx = blocks_of_four(x_all)[torch.randperm(1024, generator=torch.Generator().manual_seed(0))[:64]]
    with torch.no_grad():
        d, z = gap_and_normaliser(model, x_all)
    inter, spread = interaction_and_spread((z * d)[idx])  # blocks [64, 4]: (0,0), (0,1), (1,0), (1,1)
    # Zero in exact arithmetic; in float64 the rounding of values below ~50 is ~1e-13, far below this bound.
    assert inter <= 1e-9 * spread, (inter, spread)
    # Not trivially zero: D alone (without the normaliser) does interact, clearly above float error.
    inter_d, spread_d = interaction_and_spread(d[idx])
    assert spread_d > 1e-4 and inter_d > 1e-3 * spread_d, (inter_d, spread_d)
    # And the check can fail: with two heads, Z (of head 0) * D is no longer a sum over positions.
    two = S.build_model(xor_cfg(d_model=d_model, init_std=std, n_heads=2), 3)
    with torch.no_grad():
        d2, z2 = gap_and_normaliser(two, x_all)
    inter2, spread2 = interaction_and_spread((z2 * d2)[idx])
    assert inter2 > 1e-3 * spread2, (inter2, spread2)


def test_trained_single_head_is_wrong_in_every_block_of_four_and_two_heads_are_right_everywhere():
    one, model = S.train_config(xor_cfg(n_heads=1), progress=False, return_model=True)
    two = S.train_config(xor_cfg(n_heads=2), progress=False)
    assert one["val_acc"] <= 0.75 and two["val_acc"] == 1.0, (one["val_acc"], two["val_acc"])
    # The single head learned what one head can (it is not stuck at chance), so the bound is what stops it.
    assert one["val_acc"] > 0.7, one["val_acc"]
    # Block by block: in every block of four inputs differing only in bits P and Q, one is wrong.
    x_all, y_all = S.xor_all_inputs(13)
    with torch.no_grad():
        right = model(x_all)[:, -1].argmax(-1) == y_all[:, -1]
    per_block = right[blocks_of_four(x_all)].sum(1)
    assert per_block.max() <= 3 and math.isclose(right.float().mean().item(), one["val_acc"])


def hand_built_two_heads(seq: int = 13) -> S.TinyLM:
    """Two heads that compute XOR exactly: an OR head and a NAND head, summed and thresholded.

    Residual dims: 0 bit is 1, 1 bit is 0, 2 query token, 3 operand position (P or Q), 4 constant,
    5 output of head A, 6 output of head B. At the query, both heads attend (score 20) to the two
    operand positions; head A adds 10 to keys holding a 1 and reads "is 1", head B adds 10 to keys
    holding a 0 and reads "is 0". So A ~ OR(a, b) and B ~ NAND(a, b), and A + B - 1.5 > 0 iff a != b.
    """
    cfg = S.SweepConfig(task="xor", d_model=8, n_heads=2, n_layers=1, steps=1, seq=seq, batch=1)
    model = S.build_model(cfg, 3)
    attn = model.blocks[0].attn
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.tok_emb.weight[0, 1] = 1  # bit 0
        model.tok_emb.weight[1, 0] = 1  # bit 1
        model.tok_emb.weight[S.XOR_QUERY, 2] = 1
        model.pos_emb.weight[:, 4] = 1
        model.pos_emb.weight[[P, Q], 3] = 1
        scale = math.sqrt(attn.d_head)  # the module divides scores by sqrt(d_head)
        for head, content_dim, out_dim in ((0, 0, 5), (1, 1, 6)):
            o = head * attn.d_head
            attn.q_proj.weight[o, 2] = attn.q_proj.weight[o + 1, 2] = 1
            attn.k_proj.weight[o, 3] = 20 * scale
            attn.k_proj.weight[o + 1, content_dim] = 10 * scale
            attn.v_proj.weight[o, content_dim] = 1
            attn.o_proj.weight[out_dim, o] = 1
        model.head.weight[1, 5] = model.head.weight[1, 6] = 1
        model.head.weight[1, 4] = -1.5
    return model


def test_two_hand_built_heads_solve_xor_on_every_input():
    model = hand_built_two_heads()
    x_all, y_all = S.xor_all_inputs(13)
    with torch.no_grad():
        logits = model(x_all)[:, -1]
    assert (logits.argmax(-1) == y_all[:, -1]).all()
    gap = (logits[:, 1] - logits[:, 0]) * (2 * y_all[:, -1] - 1)
    assert gap.min() > 0.4  # with margin: the gap is close to +-0.5 on every input
    # And each head is what the docstring says: A ~ OR, B ~ NAND of the two operand bits.
    resid = model.tok_emb(x_all) + model.pos_emb.weight[:13]
    out = model.blocks[0].attn(resid)[:, -1]
    a, b = x_all[:, P].float(), x_all[:, Q].float()
    torch.testing.assert_close(out[:, 5], torch.maximum(a, b), atol=1e-3, rtol=0)
    torch.testing.assert_close(out[:, 6], 1 - a * b, atol=1e-3, rtol=0)


def test_one_head_cannot_be_fixed_by_width_or_training_longer():
    """A wide single head, trained longer, is still exactly at or under the bound."""
    row = S.train_config(xor_cfg(d_model=64, steps=400, seed=1), progress=False)
    assert row["val_acc"] <= 0.75


def test_xor_sweep_cli_and_bad_seq(tmp_path, capsys):
    out = tmp_path / "xor"
    assert main(["sweep", "--task", "xor", "--heads", "1,2", "--d-model", "8", "--max-length", "13", "--steps", "5",
                 "--no-progress", "--threads", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "xor, d_model=8, 1 layer(s), 5 steps of 128x13 tokens" in err and "acc " in err
    lines = (out / "sweep.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[1].startswith("xor,8,1,1,1,8,") and ",0.2," in lines[1]
    assert (out / "sweep_quality.png").stat().st_size > 0
    with pytest.raises(HeadscopeError, match="at least 13"):
        S.plan_sweep("xor", 8, [1], 1, 5, 12, 4)
    assert main(["sweep", "--task", "xor", "--max-length", "9", "--out", str(tmp_path / "never")]) == 2
    assert "at least 13" in capsys.readouterr().err
