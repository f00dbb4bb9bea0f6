"""The offline report: data read from an output directory, maps against transformers' own
attentions, missing sections, no network URLs, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from headscope import analyze
from headscope.cli import main
from headscope.models.tiny import tiny_model
from headscope.report import REPORT_NAME, render_report, report_data
from headscope.report.examples import decode_maps, encode_maps
from headscope.report.sources import Sources

IDS = [[5, 17, 33, 9, 41, 5, 17, 33, 9, 41], [7, 8, 9, 10, 11, 12, 13, 14]]


def page_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', html, re.DOTALL)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


def write_outputs(out: Path, n_layers: int, n_heads: int, rng: np.random.Generator) -> dict:
    """A hand-made output directory in the formats the other verbs write; returns the values used."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    grad = rng.random(len(heads))
    taylor = grad + rng.normal(0, 0.1, len(heads))
    pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                  "importance_gradient": grad, "importance_taylor": taylor}).to_csv(out / "importance.csv", index=False)
    pd.DataFrame([[1.0, 0.8], [0.8, 1.0]], index=["gradient", "taylor"],
                 columns=["gradient", "taylor"]).to_csv(out / "rank_correlation.csv")
    pd.DataFrame({"fraction_removed": [0.0, 0.25, 0.5], "n_removed": [0, 2, 4], "metric": [3.0, 3.4, 4.1],
                  "metric_recovered": [3.0, 3.1, 3.5]}).to_csv(out / "prune_curve.csv", index=False)
    pd.DataFrame({"layer": list(range(n_layers)), "heads": [n_heads] * n_layers,
                  "removable": [1, 3][:n_layers]}).to_csv(out / "redundancy.csv", index=False)
    (out / "prune.json").write_text(json.dumps({
        "metric": "lm_loss", "speedup": 1.37, "target_drop": 0.05,
        "within": {"5%": {"fraction_removed": 0.25, "n_removed": 2,
                          "recovered": {"fraction_removed": 0.5, "n_removed": 4}}}}))
    pd.DataFrame({"head_a": ["L0H1", "L1H2"], "head_b": ["L1H3", "L0H0"], "js": [0.01, 0.04],
                  "cka": [0.93, 0.85]}).to_csv(out / "similar_pairs.csv", index=False)
    (out / "clusters.json").write_text(json.dumps({"clusters": [{"heads": ["L0H1", "L1H3"], "size": 2}]}))
    N = n_layers * n_heads
    np.savez_compressed(out / "similarity.npz", heads=np.array([f"L{l}H{h}" for l, h in heads]),
                        n_layers=n_layers, n_heads=n_heads, meta=np.array("{}"), js=rng.random((N, N)))
    prev = rng.random((n_layers, n_heads))
    roles = {"model": "tiny", "n_layers": n_layers, "n_heads": n_heads,
             "thresholds": {"previous_token": 0.5},
             "scores": {"offset_m1_mass": prev.tolist()},
             "baselines": {"offset_m1_mass_uniform": np.full((n_layers, n_heads), 0.2).tolist()},
             "roles": {f"L{l}H{h}": (["previous_token"] if prev[l, h] > 0.5 else []) for l, h in heads},
             "census": {"previous_token": [{"head": f"L{l}H{h}", "score": float(prev[l, h]), "baseline": 0.2}
                                           for l, h in heads if prev[l, h] > 0.5]}}
    (out / "roles.json").write_text(json.dumps(roles))
    rows = [{"kind": "head", "layer": l, "head": h, "relation": "nsubj", "count": 30, "dep_to_head": a,
             "head_to_dep": a / 2, "accuracy": a, "baseline_offset": ""}
            for (l, h), a in zip(heads, rng.random(len(heads)))]
    rows.append({"kind": "offset_baseline", "layer": "", "head": "", "relation": "nsubj", "count": 30,
                 "dep_to_head": 0.3, "head_to_dep": 0.3, "accuracy": 0.3, "baseline_offset": -1})
    pd.DataFrame(rows).to_csv(out / "syntax.csv", index=False)
    pd.DataFrame({"task": "ptb", "n_heads": [1, 2, 4, 4], "d_head": [32, 16, 8, 8], "n_kv_heads": [1, 2, 4, 1],
                  "val_loss": [4.0, 3.8, 3.9, 3.95], "val_ppl": [54.6, 44.7, 49.4, 51.9],
                  "tokens_per_s": [900, 800, 700, 750]}).to_csv(out / "sweep.csv", index=False)
    (out / "gqa.json").write_text(json.dumps({"kv_heads": 2, "ppl_before": 20.0, "ppl_after": 24.0}))
    return {"grad": grad, "prev": prev}


@pytest.fixture(scope="module")
def bert():
    return tiny_model("bert", init_std=0.2)


def test_report_reads_every_section(tmp_path, bert):
    table = analyze(bert, IDS)
    out = tmp_path / "out"
    out.mkdir()
    table.to_csv(out / "heads.csv")
    table.to_json(out / "heads.json")
    vals = write_outputs(out, bert.n_layers, bert.n_heads, np.random.default_rng(0))
    path = render_report(out, model=bert, data=IDS, sentences=2)
    html = path.read_text(encoding="utf-8")
    d = page_data(html)
    N = bert.n_layers * bert.n_heads
    assert (d["n_layers"], d["n_heads"]) == (bert.n_layers, bert.n_heads)
    # Every grid column holds one value per head, equal to the source file's values.
    for name, flat in d["columns"].items():
        assert len(flat) == N, name
    got = np.array(d["columns"]["entropy_norm"], float)
    want = np.asarray(table["entropy_norm"], float).ravel()
    assert np.allclose(got, want, rtol=1e-4), f"max abs diff {np.abs(got - want).max()}"
    got = np.array(d["columns"]["importance_gradient"], float)
    assert np.allclose(got, vals["grad"], rtol=1e-4), f"max abs diff {np.abs(got - vals['grad']).max()}"
    # Role scores per head with their baselines, from roles.json's matrices.
    rec = d["role_scores"]["L1H2"]["offset_m1_mass"]
    assert abs(rec["score"] - vals["prev"][1, 2]) < 1e-4 and rec["baseline"] == 0.2, rec
    # Every section was found: nothing is reported missing except nothing.
    assert d["missing"] == {}, d["missing"]
    assert d["syntax"]["best"][0]["baseline"] == 0.3
    assert d["census"] and d["census"][0]["role"] == "previous_token"
    assert "js" in d["similarity"]["matrices"]
    assert d["prune"]["summary"]["speedup"] == 1.37
    assert any("1.37x" in s for s in d["text"]["q3"]), d["text"]["q3"]
    assert "Within a 5% perplexity increase, 25% of the heads (2) can be removed; with recovery training " \
           "between steps, 50% (4)." in d["text"]["q3"], d["text"]["q3"]
    assert any(s.startswith("At the target drop (5%), 4 heads are removable; layer 1 is the most redundant (3 of")
               for s in d["text"]["q3"]), d["text"]["q3"]
    assert any("nsubj" in s for s in d["text"]["q1"]), d["text"]["q1"]
    assert any("Best val_ppl on the ptb task: 44.7 with 2 heads" in s for s in d["text"]["q2"]), d["text"]["q2"]
    # PNG figures were written beside the page.
    for name in ("report-importance.png", "report-prune-curve.png", "report-redundancy.png", "report-sweep.png",
                 "report-heads-entropy_norm.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_missing_sections_say_which_verb_to_run(tmp_path, bert):
    out = tmp_path / "empty"
    path = render_report(out, model=bert, data=IDS, sentences=1)
    html = path.read_text(encoding="utf-8")
    d = page_data(html)
    # heads.csv was computed here (cheap) and written; everything else says how to get it.
    assert (out / "heads.csv").exists() and "heads" not in d["missing"]
    expect = {"importance": "score", "rank_correlation": "score", "roles": "roles", "syntax": "roles",
              "similarity": "similar", "prune_curve": "prune", "redundancy": "prune", "sweep": "sweep"}
    for key, verb in expect.items():
        assert d["missing"][key].startswith("not run yet: run `headscope " + verb + "`"), (key, d["missing"].get(key))
    # GQA conversion applies to LLaMA-like decoders only; for BERT the page says so instead.
    assert d["missing"]["gqa"].startswith("not applicable"), d["missing"]["gqa"]
    assert len(d["columns"]["entropy_norm"]) == bert.n_layers * bert.n_heads
    # The KV table needs no file: it is computed from the model's shape.
    assert "kv" not in d["missing"] and d["kv"]["rows"]


def test_no_network_urls_and_csp(tmp_path, bert):
    out = tmp_path / "o"
    write_outputs(out, bert.n_layers, bert.n_heads, np.random.default_rng(1))
    html = render_report(out, model=bert, data=IDS).read_text(encoding="utf-8")
    assert not re.search(r"https?://", html), re.findall(r".{40}https?://.{40}", html)[:3]
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=\"(?!data:)", html)
    assert "default-src 'none'" in html  # the browser itself refuses any load
    assert html.count("<script") == 2  # the data block and the inline code, nothing else


def test_example_maps_match_transformers_attentions(bert):
    """The embedded maps decode to transformers' own attention probabilities (to quantisation)."""
    from headscope.report.examples import example_maps

    ex = example_maps(bert, token_ids=IDS, n=2)
    assert len(ex) == 2
    for ids, e in zip(IDS, ex):
        with torch.inference_mode():
            x = torch.tensor([ids])
            ref = bert.model(input_ids=x, output_attentions=True).attentions
        ref = torch.stack([a[0] for a in ref]).numpy()  # [layer, head, q, k]
        got = decode_maps(e["maps"], bert.n_layers, bert.n_heads, len(ids), e["causal"])
        diff = np.abs(got - ref).max()
        assert diff <= 0.5 / 255 + 1e-6, f"max abs diff {diff}"
        assert e["tokens"] == [f"#{i}" for i in ids]


def test_causal_maps_keep_lower_triangle():
    gpt2 = tiny_model("gpt2", init_std=0.2)
    from headscope.report.examples import attention_maps

    maps = attention_maps(gpt2, IDS[0])
    text = encode_maps(maps, causal=True)
    n = len(IDS[0])
    assert len(text) < len(encode_maps(maps, causal=False))  # the upper triangle is not stored
    back = decode_maps(text, gpt2.n_layers, gpt2.n_heads, n, causal=True)
    diff = np.abs(back - maps).max()
    assert diff <= 0.5 / 255 + 1e-6, f"max abs diff {diff}"
    assert np.all(np.triu(maps[0, 0], 1) == 0)


def test_sources_prefer_from_dirs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "sweep.csv").write_text("heads\n1\n")
    (b / "sweep.csv").write_text("heads\n2\n")
    (b / "gqa.json").write_text("{}")
    s = Sources.scan([b, a])
    assert s.get("sweep.csv") == b / "sweep.csv" and s.get("gqa.json") == b / "gqa.json"
    assert Sources.scan([a, b]).get("sweep.csv") == a / "sweep.csv"


def test_report_data_without_model_needs_heads(tmp_path):
    from headscope.errors import HeadscopeError

    with pytest.raises(HeadscopeError, match="headscope analyze"):
        report_data(tmp_path / "nothing")


def test_cli_report_from_files_and_refuses_overwrite(tmp_path, bert, capsys):
    src = tmp_path / "runs"
    src.mkdir()
    analyze(bert, IDS).to_csv(src / "heads.csv")
    out = tmp_path / "rep"
    assert main(["report", "--no-model", "--from", str(src), "--out", str(out)]) == 0
    d = page_data((out / REPORT_NAME).read_text(encoding="utf-8"))
    assert len(d["columns"]["entropy"]) == bert.n_layers * bert.n_heads
    assert d["examples"] == [] and "examples" in d["missing"]
    assert main(["report", "--no-model", "--from", str(src), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["report", "--no-model", "--from", str(src), "--out", str(out), "--force"]) == 0
