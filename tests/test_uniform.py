"""`prune --uniform`: every point removes the same units from every layer, so the pruned model has one shape;
its checkpoint is an ordinary config that plain transformers loads with the gated model's logits; fractions no
whole number of rounds meets are rounded down; bad combinations are refused."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.hooks import head_gates
from headscope.models.checkpoint import save_model
from headscope.models.tiny import tiny_model
from headscope.redundancy.curves import prune_curve
from headscope.redundancy.curves.plans import uniform_round, uniform_stop
from headscope.redundancy.pruning import pruned_gates
from headscope.table import parse_head
from tests.test_artifacts import tiny_llama_dir

DATA = [list(range(5, 30)), list(range(40, 70)), list(range(20, 50)), list(range(70, 100))]


def test_rounds_and_rounding_down():
    llama = tiny_model("llama")  # 6 query heads over 2 KV heads (groups of 3), 2 layers
    assert uniform_round(llama, "slice") == 2 and uniform_round(llama, "group") == 3
    assert uniform_stop(llama, "slice", 0.5) == 2 * 2  # 0.5 x 6 = 3 heads -> one round of 2, per layer
    assert uniform_stop(llama, "slice", 0.7) == 2 * 2 * 2  # 4.2 -> two rounds
    assert uniform_stop(llama, "group", 0.9) == 3 * 2  # a layer keeps at least one group
    bert = tiny_model("bert")  # 4 heads, MHA
    assert uniform_round(bert, "head") == 1 and uniform_stop(bert, "head", 0.6) == 2 * 2
    with pytest.raises(HeadscopeError, match="^fraction 0.2 is less than one round: .*give at least 0.333"):
        uniform_stop(llama, "slice", 0.2)


@pytest.mark.parametrize("unit", ["slice", "group"])
def test_every_point_has_one_shape_and_saves_a_plain_checkpoint(tmp_path, unit):
    hm = tiny_model("llama", init_std=0.2)
    res = prune_curve(hm, DATA, method="output_norm", fraction=0.7, step=0.3, unit=unit, uniform=True,
                      progress=False)
    assert res.meta["uniform"] is True and len(res.points) >= 2
    g = hm.group_size
    for point in res.points[1:]:
        removed = [parse_head(n) for p in res.points[:res.points.index(point) + 1]
                   for n in p.removed]
        per_layer = {l: sorted(h for ll, h in removed if ll == l) for l in range(hm.n_layers)}
        counts = {len(v) for v in per_layer.values()}
        assert len(counts) == 1, per_layer
        for hs in per_layer.values():
            per_group = [sum(1 for h in hs if h // g == k) for k in range(hm.n_kv_heads)]
            if unit == "slice":
                assert len(set(per_group)) == 1, per_group  # the same count in every KV group
            else:
                assert all(c in (0, g) for c in per_group), per_group  # whole KV groups
    small = res.pruned_model(hm)
    path = save_model(small, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "auto_map" not in cfg
    plain = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([DATA[0][:12], DATA[1][:12]])
    with torch.no_grad(), head_gates(hm, pruned_gates(small)):
        want = hm.model(ids).logits
    with torch.no_grad():
        got = plain(ids).logits
    d = (got - want).abs().max().item()
    assert d < 1e-5, f"plain from_pretrained != gated model: max abs diff {d:.3g}"


def test_cli_refuses_uniform_with_layer_units(tmp_path, capsys):
    src, text = tiny_llama_dir(tmp_path)
    out = tmp_path / "o"
    capsys.readouterr()
    assert main(["prune", str(src), "--unit", "ffn", "--fraction", "0.2", "--uniform", "--data", str(text),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--uniform is for head units" in err[0] and not out.exists()
    assert main(["prune", str(src), "--fraction", "0.1", "--uniform", "--data", str(text), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "less than one round" in err[0] and not out.exists()
