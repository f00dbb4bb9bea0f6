"""Provenance in every verb's JSON, and the report's refusal to mix models (issue 16)."""

from __future__ import annotations

import json
import os

import torch
from test_artifacts import tiny_bert_dir, tiny_llama_dir
from test_bad_input import listing

from headscope.artifacts import outputs
from headscope.cli import main
from headscope.models.tiny import tiny_model
from headscope.provenance import data_fingerprint, model_fingerprint, same_model


def test_fingerprint_follows_weights_and_config():
    a, b = tiny_model("bert", seed=0), tiny_model("bert", seed=0)
    assert model_fingerprint(a.model, a.config) == model_fingerprint(b.model, b.config)
    with torch.no_grad():
        next(iter(b.model.parameters())).view(-1)[0] += 1.0  # the first element is always sampled
    assert model_fingerprint(a.model, a.config) != model_fingerprint(b.model, b.config)
    c = tiny_model("bert", seed=1)
    assert model_fingerprint(a.model, a.config) != model_fingerprint(c.model, c.config)
    assert data_fingerprint(["a b", "c"])["sha256"] != data_fingerprint(["a b", "d"])["sha256"]


def test_analyze_and_kv_record_provenance(tmp_path):
    bert = str(tiny_bert_dir(tmp_path))
    assert main(["analyze", bert, "--limit", "2", "--max-length", "16", "--out", str(tmp_path / "a")]) == 0
    prov = json.loads((tmp_path / "a" / "heads.json").read_text())["meta"]["provenance"]
    assert prov["verb"] == "analyze" and prov["model"]["fingerprint"] and prov["data"]["passages"] == 2
    assert prov["options"]["limit"] == 2 and {"headscope", "transformers"} <= set(prov["versions"])
    assert main(["kv", bert, "--out", str(tmp_path / "k")]) == 0
    kv = json.loads((tmp_path / "k" / "kv.json").read_text())["provenance"]
    assert kv["verb"] == "kv" and same_model(kv["model"], prov["model"]) is True


def test_roles_never_writes_analyzes_files():
    assert "heads.csv" not in outputs("roles", optional=True)
    assert not set(outputs("roles", optional=True)) & set(outputs("analyze", optional=True))


def test_report_refuses_another_models_kv(tmp_path, capsys):
    bert = str(tiny_bert_dir(tmp_path))
    llama, _ = tiny_llama_dir(tmp_path)
    assert main(["analyze", bert, "--limit", "2", "--max-length", "16", "--out", str(tmp_path / "a")]) == 0
    assert main(["kv", str(llama), "--out", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    before = listing(tmp_path)
    rc = main(["report", bert, "--from", str(tmp_path / "k"), "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert rc == 2 and "report does not mix models" in err and "Traceback" not in err, err
    assert listing(tmp_path) == before
    # Without a model, the first file's provenance is the reference: still refused.
    assert main(["report", "--no-model", "--from", str(tmp_path / "k"), "--out", str(tmp_path / "a")]) == 2
    assert listing(tmp_path) == before


def test_report_keeps_a_users_truncated_heads_csv(tmp_path, capsys):
    bert = str(tiny_bert_dir(tmp_path))
    out = tmp_path / "o"
    out.mkdir()
    (out / "heads.csv").write_text("layer,head,entropy\n0,0,0.5\n")
    before = (out / "heads.csv").read_bytes()
    cwd = os.getcwd()
    main(["report", bert, "--sentences", "0", "--limit", "2", "--out", str(out)])
    os.chdir(cwd)
    assert (out / "heads.csv").read_bytes() == before


def test_fingerprint_samples_stay_inside_large_tensors():
    """Gemma-3's embedding has 262,144 x 640 = 167,772,160 elements: past 2**24 a float32 linspace
    rounds the last index up to the size itself."""
    from headscope.provenance import sample_indices

    for n in (1, 2, 255, 256, 257, 2**24 + 1, 167_772_160, 10**10):
        idx = sample_indices(n)
        assert idx[0] == 0 and idx[-1] == n - 1 and len(idx) == min(256, n)
        assert bool((idx[1:] > idx[:-1]).all())


def test_report_shows_each_files_provenance_and_flags_different_data(tmp_path, capsys):
    from headscope.report import report_data

    bert = "minilm"  # roles needs a real vocabulary for its induction sequences
    assert main(["analyze", bert, "--limit", "3", "--max-length", "16", "--out", str(tmp_path / "a")]) == 0
    assert main(["roles", bert, "--limit", "2", "--max-length", "16", "--out", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    d = report_data(tmp_path / "rep", None, [tmp_path / "a", tmp_path / "r"], write_plots=False)
    about = [p for p in d["panels"] if p["place"] == "about"]
    assert len(about) == 1
    rows = {r["file"].rsplit("/", 1)[-1]: r for r in about[0]["rows"]}
    assert rows["heads.csv"]["verb"] == "analyze" and rows["heads.csv"]["passages"] == 3
    assert rows["roles.csv"]["verb"] == "roles" and rows["roles.csv"]["passages"] == 2
    assert rows["heads.csv"]["fingerprint"] == rows["roles.csv"]["fingerprint"]
    flagged = [m for m in d["problems"] if "different data" in m]
    assert len(flagged) == 1 and "3 passages" in flagged[0] and "2 passages" in flagged[0], d["problems"]
    # The same data on both: nothing flagged.
    assert main(["roles", bert, "--limit", "3", "--max-length", "16", "--out", str(tmp_path / "r"), "--force"]) == 0
    d = report_data(tmp_path / "rep", None, [tmp_path / "a", tmp_path / "r"], write_plots=False)
    assert not [m for m in d["problems"] if "different data" in m], d["problems"]
