"""The offline report: data read from an output directory, maps against transformers' own
attentions, missing sections, no network URLs, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from headscope import artifacts as A
from headscope.cli import main
from headscope.learned.analyze import analyze
from headscope.models.tiny import tiny_model
from headscope.report import REPORT_NAME, render_report, report_data
from headscope.report.examples import decode_maps, encode_maps
from headscope.report.sources import Sources

IDS = [[5, 17, 33, 9, 41, 5, 17, 33, 9, 41], [7, 8, 9, 10, 11, 12, 13, 14]]


def page_data(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', html, re.DOTALL)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


def full(art: A.Artifact, rows: list[dict]) -> pd.DataFrame:
    """Rows with every column `art` declares (those a row leaves out are filled with 0), in declared order."""
    cols = art.columns()
    return pd.DataFrame([{c: r.get(c, 0) for c in cols} for r in rows], columns=cols)


def write_outputs(out: Path, n_layers: int, n_heads: int, rng: np.random.Generator) -> dict:
    """A hand-made output directory in the formats the other verbs write (every declared column and key,
    see headscope.artifacts); returns the values used."""
    out.mkdir(parents=True, exist_ok=True)
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    grad = rng.random(len(heads))
    taylor = grad + rng.normal(0, 0.1, len(heads))
    pd.DataFrame({"layer": [l for l, _ in heads], "head": [h for _, h in heads],
                  "importance_gradient": grad, "importance_taylor": taylor}).to_csv(out / "importance.csv", index=False)
    pd.DataFrame([[1.0, 0.8], [0.8, 1.0]], index=["gradient", "taylor"],
                 columns=["gradient", "taylor"]).to_csv(out / "rank_correlation.csv")
    metric, recovered = [3.0, 3.4, 4.1], [3.0, 3.1, 3.5]
    full(A.PRUNE_CURVE_CSV, [
        {"step": i, "fraction_removed": f, "n_removed": n, "metric": m, "drop": np.exp(m - 3.0) - 1,
         "perplexity": np.exp(m), "metric_recovered": mr, "drop_recovered": np.exp(mr - 3.0) - 1,
         "perplexity_recovered": np.exp(mr), "removed": " ".join(f"L0H{j}" for j in range(n))}
        for i, (f, n, m, mr) in enumerate(zip([0.0, 0.25, 0.5], [0, 2, 4], metric, recovered, strict=True))]
    ).drop(columns=["wordsim353", "simlex999", "wordsim353_recovered", "simlex999_recovered"]).to_csv(
        out / "prune_curve.csv", index=False)
    pd.DataFrame({"layer": list(range(n_layers)), "heads": [n_heads] * n_layers,
                  "removable": [1, 3][:n_layers]}).to_csv(out / "redundancy.csv", index=False)
    (out / "prune.json").write_text(json.dumps({
        **{k: None for k in A.PRUNE_JSON.required()},
        "model": "tiny", "method": "gradient", "metric": "lm_loss", "higher_is_better": False, "recover_steps": 4,
        "baseline": 3.0, "target_drop": 0.05,
        "within": {"5%": {"fraction_removed": 0.25, "n_removed": 2,
                          "recovered": {"fraction_removed": 0.5, "n_removed": 4}}},
        "saved_model": {"path": "model", "parameters": 800, "parameters_original": 1000, "heads_kept": 10,
                        "recovered_weights": True}}))
    full(A.SIMILAR_PAIRS_CSV, [{"head_a": "L0H1", "head_b": "L1H3", "js": 0.01, "cka": 0.93},
                               {"head_a": "L1H2", "head_b": "L0H0", "js": 0.04, "cka": 0.85}]
         ).to_csv(out / "similar_pairs.csv", index=False)
    (out / "clusters.json").write_text(json.dumps({
        "js_max": 0.05, "cka_min": 0.8, "rule": "complete linkage", "meta": {},
        "clusters": [{"heads": ["L0H1", "L1H3"], "size": 2, "max_js": 0.01, "mean_js": 0.01, "min_cka": 0.93,
                      "mean_cka": 0.93}]}))
    N = n_layers * n_heads
    np.savez_compressed(out / "similarity.npz", heads=np.array([f"L{l}H{h}" for l, h in heads]),
                        n_layers=n_layers, n_heads=n_heads, meta=np.array("{}"),
                        **{m: rng.random((N, N)) for m in A.SIMILARITY_MATRICES})
    prev = rng.random((n_layers, n_heads))
    roles = {"model": "tiny", "n_layers": n_layers, "n_heads": n_heads, "causal": False,
             "thresholds": {"previous_token": 0.5}, "text": {}, "induction": {},
             "scores": {"offset_m1_mass": prev.tolist()},
             "baselines": {"offset_m1_mass_uniform": np.full((n_layers, n_heads), 0.2).tolist()},
             "roles": {f"L{l}H{h}": (["previous_token"] if prev[l, h] > 0.5 else []) for l, h in heads},
             "census": {"previous_token": [{"head": f"L{l}H{h}", "score": float(prev[l, h]), "baseline": 0.2}
                                           for l, h in heads if prev[l, h] > 0.5]},
             "syntax": None, "coreference": None}
    (out / "roles.json").write_text(json.dumps(roles))
    rows = [{"kind": "head", "layer": l, "head": h, "relation": "nsubj", "count": 30, "dep_to_head": a,
             "head_to_dep": a / 2, "accuracy": a, "baseline_offset": ""}
            for (l, h), a in zip(heads, rng.random(len(heads)), strict=True)]
    rows.append({"kind": "offset_baseline", "layer": "", "head": "", "relation": "nsubj", "count": 30,
                 "dep_to_head": 0.3, "head_to_dep": 0.3, "accuracy": 0.3, "baseline_offset": -1})
    pd.DataFrame(rows).to_csv(out / "syntax.csv", index=False)
    loss = [4.0, 3.8, 3.9, 3.95]
    full(
        A.SWEEP_CSV,
        [
            {
                "task": "ptb",
                "d_model": 32,
                "n_layers": 2,
                "n_heads": h,
                "d_head": dh,
                "n_kv_heads": kv,
                "steps": 10,
                "seq": 16,
                "batch": 4,
                "val_loss": v,
                "val_ppl": np.exp(v),
                "val_bits_per_token": v / np.log(2),
                "tokens_per_s": s,
                "tokens_per_cpu_s": s / 2,
            }
            for h, dh, kv, v, s in zip(
                [1, 2, 4, 4], [32, 16, 8, 8], [1, 2, 4, 1], loss, [900, 800, 700, 750], strict=True
            )
        ],
    ).to_csv(out / "sweep.csv", index=False)
    (out / "gqa.json").write_text(json.dumps({
        **{k: None for k in A.GQA_JSON.required()}, "model": "tiny", "n_kv_heads_before": 4, "n_kv_heads_after": 2,
        "grouping_used": "mean", "ppl_before": 20.0, "ppl_after": 24.0,
        "kv_bytes_before": {"measured": 2048, "batch": 2, "seq_len": 8},
        "kv_bytes_after": {"measured": 1024, "batch": 2, "seq_len": 8}}))
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
    assert d["prune"]["summary"]["baseline"] == 3.0 and d["prune"]["details"]["saved_model"]["heads_kept"] == 10
    assert "The physically pruned model keeps 10 heads and 80.0% of the parameters (800 of 1,000)." \
        in d["text"]["q3"], d["text"]["q3"]
    # prune.json without intervals: the point estimate, said as one, and no claim that heads can go
    assert "25% of heads (2) stay within a 5% drop of perplexity by the point estimate (no interval: the curve kept " \
           "no per-passage sums, so no claim on what can be removed); with recovery training between steps, 50% of " \
           "heads (4) stay within" in " ".join(d["text"]["q3"]), d["text"]["q3"]
    assert not any("can go" in s for s in d["text"]["q3"]), d["text"]["q3"]
    assert any(s.startswith("Of the 4 heads the curve removed before its point estimate passed the target drop (5%), "
                            "layer 1 gave the most (3 of") for s in d["text"]["q3"]), d["text"]["q3"]
    assert any("nsubj" in s for s in d["text"]["q1"]), d["text"]["q1"]
    assert any("Best val_bits_per_token on the ptb task: 5.482 with 2 heads" in s for s in d["text"]["q2"]), \
        d["text"]["q2"]
    # PNG figures were written beside the page.
    for name in ("report-importance.png", "report-prune-curve.png", "report-redundancy.png", "report-sweep.png",
                 "report-sweep-speed.png", "report-heads-entropy_norm.png"):
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
    for ids, e in zip(IDS, ex, strict=True):
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

    with pytest.raises(HeadscopeError, match="and no model given; analyze a model into .* first, or give the model"):
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


def test_file_lacking_declared_columns_is_named_not_guessed(tmp_path, bert):
    """A file without the columns its verb writes gets a note naming it and the columns; the report does
    not fall back to look-alike names (`heads` for `n_heads`, `tok_per_s` for `tokens_per_s`)."""
    out = tmp_path / "o"
    write_outputs(out, bert.n_layers, bert.n_heads, np.random.default_rng(2))
    sweep = pd.read_csv(out / "sweep.csv").rename(columns={"n_heads": "heads", "tokens_per_s": "tok_per_s"})
    sweep.to_csv(out / "sweep.csv", index=False)
    prune = json.loads((out / "prune.json").read_text())
    del prune["within"]
    (out / "prune.json").write_text(json.dumps(prune))
    d = report_data(out, model=bert, data=IDS, sentences=0)
    note = d["missing"]["sweep"]
    assert str(out / "sweep.csv") in note and "n_heads, tokens_per_s" in note and "headscope sweep" in note, note
    assert "sweep" not in d and not any("Best" in s for s in d["text"]["q2"]), d["text"]["q2"]
    assert "within" in d["missing"]["prune_summary"] and "prune.json" in d["missing"]["prune_summary"]
    assert note in d["problems"] and len(d["problems"]) == 2, d["problems"]
    # The other sections still read their (complete) files.
    assert d["prune"]["curve"]["rows"] and d["similarity"]["pairs"]


def test_declarations_name_every_file_the_report_reads():
    from headscope.report.build import figure_names

    readable = {n for n, a in A.ARTIFACTS.items() if a.kind in ("csv", "json", "npz")}
    assert set(Sources.scan([]).found) == set()  # nothing found in no directory
    assert {
        "heads.csv",
        "roles.csv",
        "roles.json",
        "kv.json",
        "syntax.csv",
        "similar_pairs.csv",
        "similarity.npz",
        "clusters.json",
        "importance.csv",
        "rank_correlation.csv",
        "prune_curve.csv",
        "redundancy.csv",
        "prune.json",
        "kv.csv",
        "sweep.csv",
        "gqa.json",
    } <= readable
    assert all(n.startswith("report-") and n.endswith(".png") for n in figure_names())
