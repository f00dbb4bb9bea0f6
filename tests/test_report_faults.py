"""`headscope report --from` against hostile and broken folders (issue 40): a symlink out of the folder is never
opened, one unreadable or malformed file does not block the report (the rest is reported and the file named in
one line), and `--from ''` is refused. Permission cases run without root's override (setpriv)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_view_faults import _env, opened_during
from users import as_user
from view_support import tokenizer_dir, unseen_text

from headscope.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def evidence(tmp_path_factory) -> Path:
    """Real analyze and roles outputs on a tiny BERT."""
    base = tmp_path_factory.mktemp("report-faults")
    bert = tokenizer_dir(base, "bert", max_position_embeddings=128)
    out = base / "evidence"
    data = base / "passages.txt"
    data.write_text("\n".join(unseen_text(12, seed=s) for s in range(6)) + "\n")
    for verb in ("analyze", "roles"):
        assert main([verb, str(bert), "--data", str(data), "--out", str(out), "--bootstrap", "100"]) == 0, verb
    return out


def copy_of(evidence: Path, tmp_path: Path) -> Path:
    d = tmp_path / "results"
    shutil.copytree(evidence, d)
    return d


def page_data(out: Path) -> dict:
    page = (out / "report.html").read_text()
    m = re.search(r'<script type="application/json" id="hs-data">(.*?)</script>', page, re.DOTALL)
    assert m, "no embedded data"
    return json.loads(m[1])


def test_report_never_opens_a_file_through_a_symlink_out_of_the_folder(evidence, tmp_path, capsys):
    d = copy_of(evidence, tmp_path)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    roles = pd.read_csv(evidence / "roles.csv", keep_default_na=False)
    roles["roles"] = "secretrole"
    roles.to_csv(outside / "sub" / "roles.csv", index=False)
    shutil.copy(evidence / "roles.json", outside / "roles.json")
    (d / "roles.csv").unlink()
    (d / "roles.json").unlink()
    (d / "sub").symlink_to(outside / "sub", target_is_directory=True)
    (d / "roles.csv").symlink_to(Path("sub") / "roles.csv")
    (d / "roles.json").symlink_to(outside / "roles.json")
    out = tmp_path / "out"
    code, opened = opened_during(lambda: main(["report", "--no-model", "--from", str(d), "--out", str(out)]))
    assert code == 0
    escaped = [p for p in opened if Path(p).resolve().is_relative_to(outside.resolve())]
    assert escaped == [], escaped
    page = (out / "report.html").read_text()
    assert "secretrole" not in page
    problems = page_data(out)["problems"]
    for name in ("roles.csv", "roles.json"):
        assert sum(f"{d / name} leads outside" in p for p in problems) == 1, problems


def test_report_of_an_unreadable_heads_csv_names_it_and_reports_the_rest(evidence, tmp_path):
    d = copy_of(evidence, tmp_path)
    (d / "heads.csv").chmod(0)
    out = tmp_path / "out"
    try:
        r = subprocess.run([*as_user(), sys.executable, "-m", "headscope", "report", "--no-model", "--from", str(d),
                            "--out", str(out)], capture_output=True, text=True, env=_env(), timeout=300)
    finally:
        (d / "heads.csv").chmod(0o644)
    assert r.returncode == 0, r.stderr
    assert "PermissionError" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    note = (f"{d / 'heads.csv'} cannot be read (Permission denied); give a file this user can read (check its "
            f"permissions, e.g. chmod u+r, or its owner)")
    assert sum(note in line for line in r.stderr.splitlines()) == 1, r.stderr
    data = page_data(out)
    assert note in data["problems"]
    # the statistics come from roles.csv, which the same verbs' folder holds
    roles = pd.read_csv(d / "roles.csv")
    assert data["n_layers"] == 2 and data["n_heads"] == 4
    assert data["columns"]["entropy_norm"] == pytest.approx(list(roles["entropy_norm"]), rel=5e-5)


def _text_among_numbers(d: Path) -> str:
    df = pd.read_csv(d / "heads.csv")
    df["entropy"] = df["entropy"].astype(object)
    df.loc[2, "entropy"] = "high"
    df.to_csv(d / "heads.csv", index=False)
    return "heads.csv holds 'high' in its numeric column entropy"


def _census_of_wrong_shape(d: Path) -> str:
    doc = json.loads((d / "roles.json").read_text())
    doc["census"] = {"sink": [5, "L0H0"], "induction": 3}
    (d / "roles.json").write_text(json.dumps(doc))
    return "roles.json could not be used"


def _provenance_of_wrong_shape(d: Path) -> None:
    doc = json.loads((d / "heads.json").read_text())
    doc["meta"]["provenance"]["model"] = "a string, not a record"
    (d / "heads.json").write_text(json.dumps(doc))
    doc = json.loads((d / "roles.json").read_text())
    doc["provenance"] = ["not", "a", "record"]
    (d / "roles.json").write_text(json.dumps(doc))


def _kvcache_rows_not_objects(d: Path) -> None:
    (d / "kvcache.json").write_text(json.dumps({
        "model": "tiny", "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "d_head": 8, "settings": {}, "scores": [],
        "rows": [1, "full", None]}))


BROKEN = {"text among numbers": _text_among_numbers, "a census of the wrong shape": _census_of_wrong_shape,
          "provenance of the wrong shape": _provenance_of_wrong_shape, "kvcache rows not objects":
          _kvcache_rows_not_objects}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_malformed_file_does_not_block_the_report(evidence, tmp_path, case, capsys):
    d = copy_of(evidence, tmp_path)
    says = BROKEN[case](d)
    out = tmp_path / "out"
    assert main(["report", "--no-model", "--from", str(d), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "unexpected" not in err and "Traceback" not in err, err
    data = page_data(out)
    if says is not None:
        named = [p for p in data["problems"] if says in p]
        assert len(named) == 1 and "\n" not in named[0], data["problems"]
    assert data["columns"].get("entropy_norm"), "the statistics are reported"


def test_an_empty_from_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--no-model", "--from", "", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["headscope report: error: --from is empty text; give a folder holding other verbs' outputs"], err
    assert not (tmp_path / "out").exists()


def test_unreadable_file_notes_do_not_blame_the_verb(tmp_path):
    """A permission fault says to fix the permissions, not to rerun the verb that wrote the file."""
    from headscope.report.sources import Sources

    (tmp_path / "roles.csv").write_text("layer,head\n0,0\n")
    src = Sources.scan([tmp_path])
    src.cannot_read("roles.csv", PermissionError(13, "Permission denied"))
    assert src.problems["roles.csv"].endswith("cannot be read (Permission denied); give a file this user can read "
                                              "(check its permissions, e.g. chmod u+r, or its owner)")
    src.cannot_read("roles.csv", ValueError("bad line 3"))
    assert src.problems["roles.csv"].endswith("cannot be read (bad line 3); rerun `headscope roles` to rewrite it")
    assert os.path.isdir(tmp_path)
