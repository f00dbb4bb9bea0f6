"""`headscope analyze` and `headscope models` end to end, including every bad input the issue lists."""

from __future__ import annotations

import json
import logging

import pytest

from headscope.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_analyze_default_model_writes_contract(tmp_path, capsys):
    out = tmp_path / "o"
    rc, stdout, _ = run(capsys, "analyze", "--out", str(out), "--limit", "8")
    assert rc == 0
    assert "minilm: 6 layers x 12 heads" in stdout and "previous token" in stdout
    header = (out / "heads.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["layer", "head"] and "entropy_norm" in header and "output_norm" in header
    meta = json.loads((out / "heads.json").read_text())["meta"]
    assert meta["model"] == "minilm" and meta["passages"] == 8 and meta["tokens_seen"] > 0
    assert {"torch", "transformers", "headscope"} <= set(meta["versions"]) and meta["seed"] == 0
    assert sorted(p.name for p in out.iterdir()) == ["heads.csv", "heads.json"]  # no temp files left


def test_models_lists_builtins(capsys):
    rc, stdout, _ = run(capsys, "models")
    assert rc == 0 and "minilm" in stdout and "smollm2" in stdout and "installed" in stdout


def test_refuses_existing_output_without_force(tmp_path, capsys):
    out = tmp_path / "o"
    assert run(capsys, "analyze", "--out", str(out), "--limit", "2")[0] == 0
    before = (out / "heads.csv").read_bytes()
    rc, _, err = run(capsys, "analyze", "--out", str(out), "--limit", "3")
    assert rc == 2 and "--force" in err
    assert (out / "heads.csv").read_bytes() == before
    assert run(capsys, "analyze", "--out", str(out), "--limit", "3", "--force")[0] == 0
    assert (out / "heads.csv").read_bytes() != before


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist"),
    (b"", "empty"),
    (b"\n  \n\n", "empty"),
    (b"good line\nbad \xff\xfe line\n", ":2: not valid UTF-8"),
])
def test_bad_data_fails_clearly_and_writes_nothing(tmp_path, capsys, content, needle):
    data = tmp_path / "data.txt"
    if content is not None:
        data.write_bytes(content)
    out = tmp_path / "o"
    rc, _, err = run(capsys, "analyze", "--data", str(data), "--out", str(out))
    assert rc == 2 and needle in err, err
    assert not out.exists()


def test_bad_jsonl(tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "fine"}\n{"txt": "no text field"}\n')
    rc, _, err = run(capsys, "analyze", "--data", str(data), "--out", str(tmp_path / "o"))
    assert rc == 2 and "d.jsonl:2" in err and "'text'" in err


def test_unsupported_model(tmp_path, capsys):
    model_dir = tmp_path / "xl"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "xlnet"}))
    rc, _, err = run(capsys, "analyze", str(model_dir), "--out", str(tmp_path / "o"))
    assert rc == 2 and "'xlnet' is not supported" in err and "bert" in err and "llama" in err


def test_unknown_builtin_name_suggests(tmp_path, capsys):
    rc, _, err = run(capsys, "analyze", "minilmm", "--out", str(tmp_path / "o"))
    assert rc == 2 and "did you mean 'minilm'" in err


def test_long_text_is_truncated_with_warning(tmp_path, capsys, caplog):
    data = tmp_path / "long.txt"
    data.write_text(" ".join(["word"] * 700) + "\nshort line\n")
    with caplog.at_level(logging.WARNING):
        rc, _, _ = run(capsys, "analyze", "--data", str(data), "--out", str(tmp_path / "o"), "--max-length", "1000")
    assert rc == 0
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert "exceeds the model's 512 positions" in warnings and "truncated" in warnings
    meta = json.loads((tmp_path / "o" / "heads.json").read_text())["meta"]
    assert meta["truncated"] == 1 and meta["max_length"] == 512


def test_conllu_data(tmp_path, capsys):
    data = tmp_path / "s.conllu"
    data.write_text(
        "# sent_id = 1\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tdo\tdo\tAUX\t_\t_\t3\taux\t_\tSpaceAfter=No\n"
        "2\tn't\tnot\tPART\t_\t_\t3\tadvmod\t_\t_\n3\tgo\tgo\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No\n"
        "3.1\tx\t_\t_\t_\t_\t_\t_\t_\t_\n4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_\n\n")
    rc, _, _ = run(capsys, "analyze", "--data", str(data), "--out", str(tmp_path / "o"))
    assert rc == 0
    from headscope import read_texts

    assert read_texts(data).texts == ["don't go."]


def test_failure_midway_leaves_no_output(tmp_path, capsys, monkeypatch):
    import headscope.commands.analyze as cmd

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd.verbs, "analyze", boom)
    rc, _, err = run(capsys, "analyze", "--out", str(tmp_path / "o"))
    assert rc == 130 and "no output was left half-written" in err
    assert not (tmp_path / "o").exists()
