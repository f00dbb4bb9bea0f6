"""`prune --unit` and `score --unit` end to end on a tiny LLaMA: the declared files and columns, the saved
model reloads and scores what the curve says, and bad input is one line, exit 2, nothing written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope import artifacts as A
from headscope.cli import main
from headscope.errors import HeadscopeError
from headscope.eval.evaluate import evaluate
from headscope.models.checkpoint import load_checkpoint
from headscope.redundancy.pruning import check_unit_kind
from tests.families import model
from tests.test_artifacts import check_csv, check_keys, tiny_llama_dir


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path]:
    return tiny_llama_dir(tmp_path_factory.mktemp("units"))


def test_prune_unit_files_and_saved_model(llama, tmp_path):
    src, text = llama
    out = tmp_path / "p"
    argv = ["prune", str(src), "--unit", "mix", "--fraction", "0.5", "--step", "0.2", "--recover-steps", "1",
            "--latency", "--save-model", "--data", str(text), "--max-length", "16", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("prune --unit", optional=True))
    check_csv(out / "unit_curve.csv", A.UNIT_CURVE_CSV, {"lm_loss metric"})
    summary = check_keys(out / "units.json", A.UNITS_JSON, {"saved_model"})
    last = summary["points"][-1]
    assert last["fraction_params"] > 0.2 and any(r.startswith("A") for r in last["removed"])
    # The saved model is physically smaller by what the curve says, and scores the recovered metric.
    small = load_checkpoint(out / "model")
    n = sum(p.numel() for p in {id(p): p for p in small.model.parameters()}.values())
    assert summary["saved_model"]["parameters"] == n
    assert summary["n_parameters"] - n == last["params_removed"]
    got = evaluate(small, str(text), "lm_loss", max_length=16).value
    assert abs(got - last["metric_recovered"]) < 1e-4, (got, last["metric_recovered"])


def test_score_unit_files(llama, tmp_path):
    src, text = llama
    for unit, methods in (("block", ["block_influence", "ablation"]), ("ffn", ["taylor", "activation"])):
        out = tmp_path / unit
        assert (
            main(["score", str(src), "--unit", unit, "--data", str(text), "--max-length", "16", "--out", str(out)]) == 0
        )
        assert sorted(p.name for p in out.iterdir()) == sorted(A.outputs("score --unit"))
        check_csv(out / "unit_importance.csv", A.UNIT_IMPORTANCE_CSV, set(),
                  {"importance_<method>": [f"importance_{m}" for m in methods]})
        meta = check_keys(out / "unit_importance.json", A.UNIT_IMPORTANCE_JSON)
        assert meta["forward_passes"]["ablation"] == 3  # L + 1 for the 2-layer model
        rows = (out / "unit_importance.csv").read_text().splitlines()
        assert len(rows) == 1 + (2 if unit == "block" else 2 * 96)


@pytest.mark.parametrize("argv, message", [
    (["--unit", "block", "--fraction", "0.95"], "would remove every layer"),
    (["--unit", "ffn", "--fraction", "1.5"], "fraction must be in"),
    (["--unit", "block", "--fraction", "0.3", "--method", "taylor"], "not 'taylor'"),
    (["--unit", "attention", "--target-drop", "1%"], "--target-drop is for head units"),
    (["--unit", "ffn"], "needs --fraction"),
    (["--unit", "block", "--fraction", "0.3"], "no block unit fits in 30%"),  # a block holds 38.8%
])
def test_prune_unit_bad_input(llama, tmp_path, capsys, argv, message):
    src, text = llama
    out = tmp_path / "o"
    assert main(["prune", str(src), *argv, "--data", str(text), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("headscope prune: error:"), err
    assert not out.exists()


def test_score_unit_bad_method(llama, tmp_path, capsys):
    src, text = llama
    assert main(["score", str(src), "--unit", "ffn", "--method", "ablation", "--data", str(text),
                 "--out", str(tmp_path / "o")]) == 2
    assert "scored by taylor, activation" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unit_the_family_cannot_express():
    hm = model("llama")
    hm.spec = replace(hm.spec, ffn_in=(), ffn_out=None)  # a family whose spec declares no FFN
    with pytest.raises(HeadscopeError, match="cannot be expressed for the llama family"):
        check_unit_kind(hm, "ffn")
    from headscope.redundancy.curves import unit_curve
    with pytest.raises(HeadscopeError, match="cannot be expressed"):
        unit_curve(hm, [[5, 6, 7, 8]], unit="mix", fraction=0.3)
    one = model("gpt2")
    import transformers as tf

    from headscope.models import HeadModel
    cfg = one.config
    cfg.n_layer = 1
    torch.manual_seed(0)
    hm1 = HeadModel(model=tf.GPT2LMHeadModel(cfg).eval(), name="one-block")
    with pytest.raises(HeadscopeError, match="needs at least 2"):
        check_unit_kind(hm1, "block")


def test_report_section_reads_unit_curve_and_tasks(llama, tmp_path):
    from headscope.redundancy.importance.tasks import task_specific
    from headscope.report.sources import Sources
    from headscope.report.units import units_part
    from headscope.table import HeadTable

    empty = units_part(Sources.scan([tmp_path]))
    assert [p["note"] is not None for p in empty.panels] == [True, True]
    src, text = llama
    out = tmp_path / "p"
    assert main(["prune", str(src), "--unit", "block", "--fraction", "0.45", "--step", "0.1", "--data", str(text),
                 "--max-length", "16", "--out", str(out)]) == 0
    t = HeadTable(1, 4, {"importance_a": np.array([[4.0, 3, 2, 1]]), "importance_b": np.array([[1.0, 2, 3, 4]])}, {})
    import csv as _csv

    from headscope.redundancy.importance.tasks import task_correlations
    task_correlations(t).to_csv(out / "task_correlation.csv")
    rows = task_specific(t)
    with open(out / "task_specific.csv", "w", newline="") as f:
        w = _csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    part = units_part(Sources.scan([out]))
    titles = [p["title"] for p in part.panels]
    assert titles == ["Units beyond heads: block (block_influence)", "Head importance across tasks"]
    assert part.panels[1]["rows"][0]["b"] == pytest.approx(-1.0)
    assert any("agree least (Spearman -1.00)" in s for s in part.text["q3"])
    assert any(s.startswith("Removing block units") for s in part.text["q3"])


def test_curve_ends_at_the_most_that_fits_under_the_fraction():
    """The last point is the largest removal under --fraction even when it falls short of another whole step
    (a SmolLM2 mix curve asked for 20% once stopped at its 10% point)."""
    from headscope.redundancy.curves import unit_curve

    hm = model("llama")
    ids = [[5, 6, 7, 8, 9, 10, 11, 12]] * 2
    curve = unit_curve(hm, ids, unit="ffn", method="activation", fraction=0.3, step=0.25)
    fracs = [p.fraction_params for p in curve.points]
    assert fracs[0] == 0.0 and all(a < b for a, b in zip(fracs, fracs[1:], strict=False))
    assert fracs[-1] <= 0.3 + 1e-12 and len(fracs) == 3, fracs  # 0, the 25% step, and the rest up to 30%
    last = curve.points[-1]
    so_far = curve.records()[-1]["removed"].split()  # a point's `removed` holds its own step's units only
    per_neuron = last.params_removed / sum(int(r.split(":")[1]) for r in so_far)
    assert (0.3 - fracs[-1]) * curve.n_parameters < per_neuron + 1e-6  # not one more neuron would fit


def test_printed_points_name_every_kind_removed(llama, tmp_path, capsys):
    """The table `prune --unit mix` prints names the attention sub-layers a point removed, not only its last
    names (FFN neurons come last, so a mix's attention sub-layers were once cut off the printed line)."""
    from headscope.redundancy.curves.text import removed_text

    names = ["A3", "A0"] + [f"F{l}:{l + 1}" for l in range(8)]
    text = removed_text(names)
    assert text.startswith("A3 A0; ") and "FFN: 36 neurons from 8 layers" in text
    assert "layer 7 8, layer 6 7, layer 5 6" in text
    src, data = llama
    out = tmp_path / "mix"
    assert main(["prune", str(src), "--unit", "mix", "--fraction", "0.5", "--step", "0.2", "--data", str(data),
                 "--max-length", "16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    import json

    last = json.loads((out / "units.json").read_text())["points"][-1]["removed"]
    attn = [n for n in last if n.startswith("A")]
    n_ffn = sum(int(n.split(":")[1]) for n in last if n.startswith("F"))
    assert attn and n_ffn
    assert any(f"{' '.join(attn)}; FFN: {n_ffn} neurons" in line for line in printed), printed


def test_unit_curves_plot_draws_each_curve_and_its_recovery(tmp_path):
    """Several curves on one figure (docs/img/units_smollm2.png): one solid line per curve, a dashed one
    where the records carry recovered perplexities; no curves is an error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from headscope.plots import pruning_curves

    recs = {"block": [{"fraction_params": 0.0, "perplexity": 10.0, "perplexity_recovered": 10.0},
                      {"fraction_params": 0.1, "perplexity": 20.0, "perplexity_recovered": 15.0}],
            "heads": [{"fraction_params": 0.0, "perplexity": 10.0, "perplexity_recovered": ""},
                      {"fraction_params": 0.05, "perplexity": 12.0, "perplexity_recovered": ""}]}
    seen = []
    orig = plt.Figure.savefig

    def spy(fig, *a, **k):
        seen.extend((ln.get_label(), list(ln.get_ydata())) for ln in fig.axes[0].get_lines())
        return orig(fig, *a, **k)

    plt.Figure.savefig = spy
    try:
        png = pruning_curves(recs, title="t", path=tmp_path / "c.png")
    finally:
        plt.Figure.savefig = orig
    assert png[:8] == (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert seen == [("block", [10.0, 20.0]), ("block + recovery", [10.0, 15.0]), ("heads", [10.0, 12.0])]
    with pytest.raises(ValueError):
        pruning_curves({}, title="t", path=tmp_path / "d.png")
