"""Head-count sweeps: resumability, rows, skipping, learning, the xor and pair tasks, determinism, FLOPs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from headscope.capacity import sweep as S
from headscope.capacity.sweep.corpora import eval_windows, load_corpus, random_windows
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.io import FLOAT_FORMAT

TINY = dict(task="ptb", d_model=16, n_layers=2, steps=4, seq=16, batch=4, eval_tokens=256)


@pytest.fixture(scope="module")
def ptb():
    return load_corpus("ptb", "byte")


def tiny_cfg(**kw) -> S.SweepConfig:
    return S.SweepConfig(**{**TINY, "n_heads": 2, **kw})


class Interrupt(Exception):
    pass


def test_resume_after_interruption_skips_finished_and_matches(tmp_path):
    configs = [tiny_cfg(n_heads=1), tiny_cfg(n_heads=4)]
    full = S.run_sweep(configs, tmp_path / "full", progress=False)

    def crash(cfg, step, loss):  # the machine dies during the second configuration
        if cfg.n_heads == 4 and step == 2:
            raise Interrupt

    out = tmp_path / "resumed"
    with pytest.raises(Interrupt):
        S.run_sweep(configs, out, progress=False, on_step=crash)
    assert len(list((out / "runs").glob("*.json"))) == 1
    assert (out / "sweep.csv").read_text().count("\n") == 2  # header + the finished configuration

    trained, reused = [], []
    rows = S.run_sweep(configs, out, progress=False, on_step=lambda c, s, l: trained.append(c.n_heads),
                       on_config_done=lambda c, r, was_reused: (reused if was_reused else []).append(c.n_heads))
    assert reused == [1]
    assert set(trained) == {4}, f"only the unfinished configuration may train; trained {sorted(set(trained))}"
    for a, b in zip(full, rows, strict=True):
        for col in ("val_loss", "train_loss", "params", "flops_per_token", "key"):
            assert a[col] == b[col], f"{col}: uninterrupted {a[col]} vs resumed {b[col]}"
    # A third run trains nothing at all.
    again = []
    S.run_sweep(configs, out, progress=False, on_step=lambda c, s, l: again.append(s))
    assert again == []


def test_force_retrains(tmp_path):
    cfg = [tiny_cfg(steps=2)]
    S.run_sweep(cfg, tmp_path, progress=False)
    steps = []
    S.run_sweep(cfg, tmp_path, progress=False, force=True, on_step=lambda c, s, l: steps.append(s))
    assert steps == [0, 1]


def test_key_changes_with_config_and_data():
    a = tiny_cfg()
    assert S.config_key(a, "d1") == S.config_key(tiny_cfg(), "d1")
    assert S.config_key(a, "d1") != S.config_key(a, "d2")
    assert S.config_key(a, "d1") != S.config_key(tiny_cfg(seed=1), "d1")
    assert S.config_key(a, "d1") != S.config_key(tiny_cfg(n_kv_heads=1), "d1")


def test_row_has_all_fields_and_consistent_values(ptb):
    cfg = tiny_cfg(n_heads=4, n_kv_heads=2)
    row = S.train_config(cfg, ptb, progress=False)
    assert set(S.CSV_COLUMNS) - {"key"} <= set(row), f"missing {set(S.CSV_COLUMNS) - set(row)}"
    model = S.build_model(cfg, ptb.vocab_size)
    assert row["params"] == sum(p.numel() for p in model.parameters())
    # bf16 cache: K and V, per layer, per KV head, d_head values of 2 bytes.
    assert row["kv_bytes_per_token"] == 2 * cfg.n_layers * 2 * cfg.head_dim * 2
    assert row["layout"] == "GQA" and row["d_head"] == 4
    assert row["train_tokens"] == cfg.steps * cfg.batch * cfg.seq
    assert row["train_flops_per_token"] == 3 * row["flops_per_token"]
    assert math.isclose(row["val_ppl"], math.exp(row["val_loss"]))
    assert math.isclose(row["val_bits_per_token"], row["val_loss"] / math.log(2))
    assert math.isclose(row["val_word_ppl"], math.exp(row["val_loss"] * ptb.tokens_per_word))
    for col in ("val_loss", "tokens_per_s", "tokens_per_cpu_s", "wall_s"):
        assert math.isfinite(row[col]) and row[col] > 0, f"{col}={row[col]}"
    assert 0.0 <= row["val_acc"] <= 1.0
    assert [s for s, _ in row["loss_curve"]] == [0, cfg.steps - 1]


def test_csv_and_json_written(tmp_path):
    rows = S.run_sweep([tiny_cfg(n_heads=1), tiny_cfg(n_heads=2)], tmp_path, progress=False)
    import pandas as pd

    df = pd.read_csv(tmp_path / "sweep.csv")
    assert list(df.columns) == S.CSV_COLUMNS
    assert df["n_heads"].tolist() == [1, 2]
    # sweep.csv is written by the one row writer (floats to 6 significant digits); runs/ keeps every digit.
    assert df["val_loss"].tolist() == [float(format(r["val_loss"], FLOAT_FORMAT)) for r in rows]
    record = json.loads((tmp_path / "runs" / f"{rows[0]['key']}.json").read_text())
    assert record["config"]["n_heads"] == 1 and record["row"]["val_loss"] == rows[0]["val_loss"]
    prov = record["provenance"]  # issue 16: every run traceable to its model shape, data and versions
    assert prov["verb"] == "sweep" and prov["model"]["shape"]["n_heads"] == 1
    assert prov["data"]["sha256"] == record["data"] and prov["options"]["n_heads"] == 1
    assert {"headscope", "transformers", "torch"} <= set(prov["versions"])
    plots = S.plot_sweep(rows, tmp_path)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)


def test_plots_average_seeds_and_keep_step_budgets_apart(tmp_path):
    assert S.mean_by_heads([2, 1, 2, 1, 2], [3.0, 1.0, 5.0, 2.0, 4.0]) == (
        [1, 2],
        [1.5, 4.0],
        [1.0, 3.0],
        [2.0, 5.0],
        3,
    )
    rows = [dict(task="ptb", d_model=8, n_layers=1, n_heads=h, n_kv_heads=h, d_head=8 // h, steps=st, batch=2, seq=4,
                 val_bits_per_token=v, tokens_per_s=1.0, tokens_per_cpu_s=1.0)
            for h, st, v in [(1, 10, 3.0), (1, 10, 3.2), (2, 10, 2.9), (1, 30, 2.5), (2, 30, 2.4)]]
    import matplotlib.axes

    labels = []
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kw):
        if kw.get("label"):
            labels.append((kw["label"], list(args[1])))
        return original(self, *args, **kw)

    matplotlib.axes.Axes.plot = spy
    try:
        S.plot_sweep(rows, tmp_path)
    finally:
        matplotlib.axes.Axes.plot = original
    quality = [(label, ys) for label, ys in labels if "wall clock" not in label and "CPU" not in label]
    assert quality == [("ptb MHA d_head=d/h, 10 steps, mean of 2 seeds (bars: min-max)", [3.1, 2.9]),
                       ("ptb MHA d_head=d/h, 30 steps", [2.5, 2.4])], quality


def test_skips_heads_not_dividing_d_model():
    configs, skipped = S.plan_sweep("ptb", 12, [1, 5, 4, 8], 2, 3, 8, 2)
    assert [c.n_heads for c in configs] == [1, 4]
    assert len(skipped) == 2 and "h=5" in skipped[0] and "h=8" in skipped[1]
    # With an explicit d_head, any head count is fine.
    configs, skipped = S.plan_sweep("ptb", 12, [5], 2, 3, 8, 2, d_heads=[4])
    assert [(c.n_heads, c.head_dim) for c in configs] == [(5, 4)] and not skipped
    # KV-head counts that do not divide h are skipped for that h only.
    configs, skipped = S.plan_sweep("ptb", 16, [2, 4], 2, 3, 8, 2, kv_heads=[1, 4])
    assert [(c.n_heads, c.kv_heads) for c in configs] == [(2, 1), (4, 1), (4, 4)]
    assert len(skipped) == 1 and "h=2 kv=4" in skipped[0]
    # Spelling out the defaults (kv = h, d_head = d_model/h) gives the same configuration and key.
    explicit, _ = S.plan_sweep("ptb", 16, [4], 2, 3, 8, 2, kv_heads=[4], d_heads=[4])
    implicit, _ = S.plan_sweep("ptb", 16, [4], 2, 3, 8, 2)
    assert explicit == implicit and S.config_key(explicit[0], "d") == S.config_key(implicit[0], "d")
    with pytest.raises(HeadscopeError, match="not divisible by 3"):
        S.plan_sweep("ptb", 10, [3, 7], 2, 3, 8, 2)


def test_cli_refuses_when_no_head_count_divides(capsys):
    assert main(["sweep", "--d-model", "10", "--heads", "3,7", "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert "no valid configuration" in err and "d_model=10" in err


def test_cli_end_to_end(tmp_path, capsys):
    args = ["sweep", "--d-model", "16", "--heads", "1,3,2", "--steps", "2", "--max-length", "16", "--batch-size", "2",
            "--eval-tokens", "64", "--out", str(tmp_path), "--no-progress"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "skipping h=3" in captured.err
    for name in ("sweep.csv", "sweep_quality.png", "sweep_speed.png"):
        assert (tmp_path / name).exists()
    assert main(args) == 0  # a rerun reuses both configurations
    assert captured.out.count("\n") >= 3 and capsys.readouterr().err.count("(reused)") == 2


def test_loss_decreases_on_tiny_run(ptb):
    losses = []
    cfg = tiny_cfg(d_model=32, steps=60, seq=32, batch=8, lr=3e-3)
    row = S.train_config(cfg, ptb, progress=False, on_step=lambda c, s, l: losses.append(l))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 1.0, f"training loss went from {first:.3f} to {last:.3f}"
    # Validation after training beats the uniform byte model (ln 256 nats) by a clear margin.
    assert row["val_loss"] < math.log(256) - 1.0, row["val_loss"]


def test_pair_targets_depend_on_exactly_the_two_offsets():
    g = torch.Generator().manual_seed(0)
    V, (a, b) = S.PAIR_VOCAB, S.PAIR_OFFSETS
    x, y = S.pair_batch(3, 20, g)
    assert (y[:, : max(a, b)] == -100).all()
    i = torch.arange(max(a, b), 20)
    assert torch.equal(y[:, i], x[:, i - a] + V * x[:, i - b])
    assert int(y.max()) < V * V and int(y[y >= 0].min()) >= 0
    # Brute force: changing the token at j changes the target at i exactly when j = i - a or j = i - b.
    for j in range(20):
        x2 = x.clone()
        x2[:, j] = (x2[:, j] + 1) % V
        y2 = torch.full_like(y, -100)
        y2[:, i] = x2[:, i - a] + V * x2[:, i - b]
        changed = {int(t) for t in (y2 != y).any(0).nonzero().flatten()}
        expected = {p for p in (j + a, j + b) if max(a, b) <= p < 20}
        assert changed == expected, f"token {j}: targets {sorted(changed)} changed, expected {sorted(expected)}"


def test_attention_only_model_is_a_weighted_sum_of_values():
    """The premise of the one-head argument: output = read-out(e + p + sum_j A_ij W_O W_V (e_j + p_j))."""
    cfg = S.SweepConfig(task="pair", d_model=16, n_heads=1, n_layers=1, steps=1, seq=12, batch=2)
    model = S.build_model(cfg, S.PAIR_VOCAB)
    for p in model.parameters():
        torch.nn.init.normal_(p, 0, 0.3)  # weights large enough that attention is far from uniform
    x, _ = S.pair_batch(2, 12, torch.Generator().manual_seed(1))
    resid = model.tok_emb(x) + model.pos_emb.weight[:12]  # [batch, pos, d_model]
    attn = model.blocks[0].attn
    _, weights = attn(resid, return_weights=True)  # [batch, head, q, k]
    values = resid @ attn.v_proj.weight.T @ attn.o_proj.weight.T  # [batch, pos, d_model]
    manual = model.head(resid + weights[:, 0] @ values)
    got = model(x)
    err = (got - manual).abs().max().item()
    assert err < 1e-5, f"max abs difference {err}"
    assert weights[0, 0, 5, :6].max() < 0.99  # really a mixture, so the check is not trivial


def test_same_seed_same_result_different_seed_differs(ptb):
    a = S.train_config(tiny_cfg(), ptb, progress=False)
    b = S.train_config(tiny_cfg(), ptb, progress=False)
    c = S.train_config(tiny_cfg(seed=1), ptb, progress=False)
    assert a["val_loss"] == b["val_loss"] and a["train_loss"] == b["train_loss"]
    assert a["val_loss"] != c["val_loss"]


def test_pair_config_trains_and_reports_accuracy():
    cfg = S.SweepConfig(task="pair", d_model=16, n_heads=2, n_layers=1, steps=3, seq=12, batch=4,
                        eval_tokens=96)
    row = S.train_config(cfg, progress=False)
    assert 0.0 <= row["val_acc"] <= 1.0 and math.isnan(row["val_word_ppl"])
    assert row["params"] == sum(p.numel() for p in S.build_model(cfg, S.PAIR_VOCAB).parameters())


@pytest.mark.parametrize("kw", [dict(n_heads=1), dict(n_heads=4, n_kv_heads=1), dict(n_heads=2, d_head=6)])
def test_flops_match_pytorch_flop_counter(kw):
    cfg = tiny_cfg(**kw)
    model = S.build_model(cfg, 256)
    ids = torch.randint(0, 256, (1, cfg.seq))
    with FlopCounterMode(display=False) as counter:
        model(ids)
    measured = counter.get_total_flops() / cfg.seq
    assert S.model_flops_per_token(model, cfg.seq) == measured, (S.model_flops_per_token(model, cfg.seq), measured)


def test_windows(ptb):
    g = torch.Generator().manual_seed(0)
    x, y = random_windows(ptb.train, 8, 3, g)
    assert x.shape == y.shape == (3, 8) and torch.equal(x[:, 1:], y[:, :-1])
    xs, ys = eval_windows(ptb.valid, 16, 160)
    assert xs.shape == (10, 16) and torch.equal(xs[:, 1:], ys[:, :-1])
    assert len(ptb.valid) > 300_000 and ptb.vocab_size == 256 and 5 < ptb.tokens_per_word < 6
    text = bytes(xs[0].tolist()).decode()
    assert text == bytes(ptb.valid[:16].tolist()).decode()
