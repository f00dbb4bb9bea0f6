"""`headscope view` against hostile and broken input (issue 40): results folders whose symlinks lead out, malformed
and unreadable files in --from, Host headers for every bound address, framing, HEAD, clients that leave or drip,
SIGTERM, a busy port, texts longer than the model's positions, long answers at once, and the Python API's
arguments. Every case gets its documented answer (docs/errors.md, docs/view.md) and the server keeps serving."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import pytest
import torch
from users import as_user
from view_support import get, serving, tokenizer_dir, unseen_text

import headscope
from headscope.cli import main
from headscope.models.loading import load_model
from headscope.view import server as view_server
from headscope.view.heads import heads_table
from headscope.view.hosts import HostCheck, parse_host
from headscope.view.page import EXAMPLES
from headscope.view.server import ViewApp, make_server

REPO = Path(__file__).resolve().parents[1]
POSITIONS = 64  # the tiny BERT's position table: a longer text is cut to it


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> Path:
    return tokenizer_dir(tmp_path_factory.mktemp("view-faults"), "bert", max_position_embeddings=POSITIONS)


@pytest.fixture(scope="module")
def hm(bert):
    return load_model(str(bert))


@pytest.fixture(scope="module")
def evidence(bert, tmp_path_factory) -> Path:
    """Real analyze, roles and score outputs on the tiny BERT."""
    out = tmp_path_factory.mktemp("evidence")
    data = out.parent / "passages.txt"
    data.write_text("\n".join(unseen_text(12, seed=s) for s in range(6)) + "\n")
    for verb in (["analyze"], ["roles"], ["score", "--method", "ablation"]):
        assert main([verb[0], str(bert), "--data", str(data), "--out", str(out), "--bootstrap", "100",
                     *verb[1:]]) == 0, verb
    return out


def copy_of(evidence: Path, tmp_path: Path, name: str = "results") -> Path:
    d = tmp_path / name
    shutil.copytree(evidence, d)
    return d


def strict_json(text: str):
    """JSON as a strict client reads it: NaN and Infinity are not JSON."""
    def refuse(c):
        raise AssertionError(f"not JSON: {c}")
    return json.loads(text, parse_constant=refuse)


# --- a folder whose symlinks lead out of it -------------------------------------------------------------------------
_OPENED: list[str] = []
_RECORDING = [False]


def _record_opens(event: str, args: tuple) -> None:
    if _RECORDING[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


def opened_during(fn):
    """Every path Python opened while `fn` ran (audit events: open(), io.open, Path.read_text, np.load, pandas)."""
    if not getattr(opened_during, "hooked", False):
        sys.addaudithook(_record_opens)
        opened_during.hooked = True
    _OPENED.clear()
    _RECORDING[0] = True
    try:
        result = fn()
    finally:
        _RECORDING[0] = False
    return result, list(_OPENED)


def linked_out(evidence: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A results folder whose importance.csv is a symlink to a file outside it, whose roles.csv leads out through a
    symlinked subfolder, and whose heads.json is a symlink out too; the outside files hold a marker value."""
    d = copy_of(evidence, tmp_path)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    imp = pd.read_csv(evidence / "importance.csv")
    imp["importance_ablation"] = 0.7777
    imp.to_csv(outside / "importance.csv", index=False)
    roles = pd.read_csv(evidence / "roles.csv", keep_default_na=False)
    roles["roles"] = "secretrole"
    roles.to_csv(outside / "sub" / "roles.csv", index=False)
    shutil.copy(evidence / "heads.json", outside / "heads.json")
    for name in ("importance.csv", "roles.csv", "heads.json"):
        (d / name).unlink()
    (d / "importance.csv").symlink_to(outside / "importance.csv")
    (d / "sub").symlink_to(outside / "sub", target_is_directory=True)
    (d / "roles.csv").symlink_to(Path("sub") / "roles.csv")
    (d / "heads.json").symlink_to(outside / "heads.json")
    return d, outside


def test_view_never_opens_a_file_through_a_symlink_out_of_the_folder(hm, evidence, tmp_path):
    d, outside = linked_out(evidence, tmp_path)
    t, opened = opened_during(lambda: heads_table(hm, [d]))
    escaped = [p for p in opened if Path(p).resolve().is_relative_to(outside.resolve())]
    assert escaped == [], escaped
    assert any(str(d / "heads.csv") == p for p in opened)  # the folder's own files are read
    for name in ("importance.csv", "roles.csv"):
        assert sum(f"{d / name} leads outside" in p for p in t["problems"]) == 1, t["problems"]
    assert "importance" not in t["sources"] and "roles" not in t["sources"] and "statistics" in t["sources"]
    assert "0.7777" not in json.dumps(t) and "secretrole" not in json.dumps(t)
    # a link that stays inside the folder is followed
    inner = copy_of(evidence, tmp_path, "inner")
    (inner / "kept").mkdir()
    (inner / "importance.csv").rename(inner / "kept" / "importance.csv")
    (inner / "importance.csv").symlink_to(Path("kept") / "importance.csv")
    assert "importance" in heads_table(hm, [inner])["sources"]


# --- malformed files: each named in one line, the rest served, only JSON sent -------------------------------------
def _text_in_numbers(d: Path) -> str:
    df = pd.read_csv(d / "importance.csv")
    df["importance_ablation"] = df["importance_ablation"].astype(object)
    df.loc[3, "importance_ablation"] = "high"
    df.to_csv(d / "importance.csv", index=False)
    return "importance.csv holds 'high' in its numeric column importance_ablation"


def _text_in_head_numbers(d: Path) -> str:
    df = pd.read_csv(d / "roles.csv", keep_default_na=False)
    df["head"] = df["head"].astype(object)
    df.loc[1, "head"] = "two"
    df.to_csv(d / "roles.csv", index=False)
    return "roles.csv holds 'two' in its numeric column head"


def _kvcache_rows_not_objects(d: Path) -> str:
    (d / "kvcache.json").write_text(json.dumps({
        "model": "tiny", "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "d_head": 8, "settings": {}, "scores": [],
        "rows": [1, "full", None]}))
    return "kvcache.json holds rows that are not a list of objects"


def _provenance_of_wrong_shape(d: Path) -> str | None:
    for name in ("importance.json", "heads.json"):
        doc = json.loads((d / name).read_text())
        doc["meta"]["provenance"]["model"] = "a string, not a record"
        doc["meta"]["provenance"]["options"] = [1, 2]
        (d / name).write_text(json.dumps(doc))
    doc = json.loads((d / "roles.json").read_text())
    doc["provenance"] = ["not", "a", "record"]
    (d / "roles.json").write_text(json.dumps(doc))
    return None  # nothing to refuse: the numbers are served, without a command line


def _nan_and_inf_in_a_window(d: Path) -> str | None:
    (d / "kvcache.json").write_text(
        '{"model": "tiny", "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "d_head": 8, "settings": {}, "scores": [],'
        ' "rows": [{"method": "score", "budget": 0.5, "window": NaN, "sink": Infinity, "full_heads": [[1], [0]]}]}')
    return None


def _missing_declared_column(d: Path) -> str:
    pd.read_csv(d / "heads.csv").drop(columns=["layer"]).to_csv(d / "heads.csv", index=False)
    return "heads.csv cannot be read (table is missing the key column(s) ['layer']"


def _rows_of_another_grid(d: Path) -> str:
    pd.DataFrame({"layer": [0, 5], "head": [0, 1], "effect": [0.1, 0.2]}).to_csv(d / "patching.csv", index=False)
    return "patching.csv has a row for layer 5, head 1, outside the served model's 2 x 4 heads"


BROKEN = {"text in a numeric column": _text_in_numbers, "text among head numbers": _text_in_head_numbers,
          "kvcache rows not objects": _kvcache_rows_not_objects,
          "provenance of the wrong shape": _provenance_of_wrong_shape,
          "NaN and inf in a window": _nan_and_inf_in_a_window, "a declared column missing": _missing_declared_column,
          "rows outside the grid": _rows_of_another_grid}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_malformed_file_is_named_and_the_rest_is_served(hm, evidence, tmp_path, case, caplog):
    d = copy_of(evidence, tmp_path)
    says = BROKEN[case](d)
    caplog.set_level(logging.WARNING)
    t = heads_table(hm, [d])
    with serving(hm, t) as (base, _):
        status, text = get(base + "/api/heads")
        assert status == 200 and isinstance(text, dict)
        status, model = get(base + "/api/model")
        assert status == 200  # the server keeps serving
    raw = json.dumps(t, allow_nan=False)  # nothing that is not JSON
    strict_json(raw)
    if says is None:
        assert t["problems"] == [], t["problems"]
    else:
        named = [p for p in t["problems"] if says in p]
        assert len(named) == 1 and "\n" not in named[0], t["problems"]
        assert any(says in r.getMessage() for r in caplog.records)  # and in the log, once
    # the other files are still served
    assert "importance" in t["sources"] or case == "text in a numeric column"
    assert t["statistics"], "the statistics (heads.csv, or roles.csv when heads.csv is unusable) are served"
    if case == "NaN and inf in a window":
        assert t["kvcache"] == [{"label": "score, 50% of KV heads full", "full": [False, True, False, False,
                                                                                 True, False, False, False],
                                 "window": None, "sink": None}]
    if case == "provenance of the wrong shape":
        assert "ablation" in t["importance"] and "roles" in t["sources"]


# --- unreadable files, as a user without root's override ----------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def _start(args: list[str], prefix: list[str] | None = None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", "headscope", "view", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    line = proc.stdout.readline()
    m = re.search(r"on http://[^ ]+:(\d+)/", line)
    if not m:
        proc.kill()
        raise AssertionError(f"no address line: {line!r} {proc.stderr.read()}")
    return proc, int(m[1])


def test_view_of_an_unreadable_file_names_it_and_serves_the_rest(bert, evidence, tmp_path):
    d = copy_of(evidence, tmp_path)
    (d / "heads.csv").chmod(0)
    (d / "importance.json").chmod(0)
    try:
        proc, port = _start([str(bert), "--from", str(d), "--port", "0"], as_user())
        try:
            status, t = get(f"http://127.0.0.1:{port}/api/heads")
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    finally:
        (d / "heads.csv").chmod(0o644)
        (d / "importance.json").chmod(0o644)
    assert status == 200
    note = (f"{d / 'heads.csv'} cannot be read (Permission denied); give a file this user can read (check its "
            f"permissions, e.g. chmod u+r, or its owner)")
    assert t["problems"] == [note], t["problems"]
    assert t["sources"]["statistics"]["file"] == "roles.csv" and "ablation" in t["importance"]
    assert "PermissionError" not in err and "Traceback" not in err, err
    assert sum(note in line for line in err.splitlines()) == 1, err


# --- the Host header, for every bound address ----------------------------------------------------------------------
def test_host_names_answered_for_each_kind_of_address(monkeypatch):
    two = HostCheck("127.0.0.2", "127.0.0.2", 8000)
    for ok in ("127.0.0.2", "127.0.0.2:8000", "localhost", "LOCALHOST:8000", "localhost."):
        assert two.allows(ok), ok
    for bad in ("evil.example", "evil.example:8000", "127.0.0.2:8001", "127.0.0.1", "127.0.0.2.evil.example", "",
                None, "127.0.0.2:", "127.0.0.2:80:80", "[127.0.0.2]", "127.0.0.2 x"):
        assert not two.allows(bad), bad
    lan = HostCheck("10.1.2.3", "10.1.2.3", 8000)
    assert lan.allows("10.1.2.3:8000") and lan.allows("10.1.2.3")
    assert not lan.allows("localhost") and not lan.allows("evil.example:8000") and not lan.allows("10.1.2.4")
    six = HostCheck("::1", "::1", 8000)
    for ok in ("[::1]", "[::1]:8000", "[0:0::1]:8000", "localhost:8000"):
        assert six.allows(ok), ok
    for bad in ("::1", "::1:8000", "[::1", "[::1]8000", "[::1]:8001", "[::2]:8000", "[evil.example]"):
        assert not six.allows(bad), bad
    named = HostCheck("localhost", "127.0.0.1", 8000)
    assert named.allows("localhost:8000") and named.allows("127.0.0.1:8000") and not named.allows("evil.example")
    monkeypatch.setattr(socket, "gethostname", lambda: "box")
    monkeypatch.setattr(socket, "getfqdn", lambda: "box.lab.example")
    anywhere = HostCheck("0.0.0.0", "0.0.0.0", 8000)
    for ok in ("192.168.1.5:8000", "[fe80::1]:8000", "box", "box.lab.example:8000", "localhost"):
        assert anywhere.allows(ok), ok
    for bad in ("evil.example", "evil.example:8000", "192.168.1.5:9000", "box.evil.example"):
        assert not anywhere.allows(bad), bad
    assert parse_host("[::1]:80") == ("::1", 80) and parse_host("Example.COM.") == ("example.com", None)


def _raw(port: int, host_header: str | None, method: str = "GET", path: str = "/api/model",
         address: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(30)
        s.connect((address, port))
        head = f"{method} {path} HTTP/1.1\r\n" + (f"Host: {host_header}\r\n" if host_header is not None else "")
        s.sendall((head + "Connection: close\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _serve_on(hm, address: str):
    app = ViewApp(hm, heads_table(hm, []), 64, EXAMPLES)
    server = make_server(app, address, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def test_a_server_on_another_loopback_address_refuses_foreign_hosts(hm):
    server, thread = _serve_on(hm, "127.0.0.2")
    port = server.server_address[1]
    try:
        status, _, body = _raw(port, "evil.example", address="127.0.0.2")
        assert status == 403 and "127.0.0.2" in json.loads(body)["error"]
        status, _, body = _raw(port, f"evil.example:{port}", address="127.0.0.2")
        assert status == 403
        assert _raw(port, None, address="127.0.0.2")[0] == 403  # HTTP/1.1 without Host
        for ok in ("127.0.0.2", f"127.0.0.2:{port}", f"localhost:{port}"):
            status, _, body = _raw(port, ok, address="127.0.0.2")
            assert status == 200 and json.loads(body)["n_layers"] == 2, ok
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_server_on_ipv6_loopback_answers_bracketed_hosts(hm):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        server, thread = _serve_on(hm, "::1")
    except headscope.HeadscopeError as e:
        pytest.skip(f"::1 cannot be bound here ({e})")
    port = server.server_address[1]
    try:
        for ok in ("[::1]", f"[::1]:{port}"):
            assert _raw(port, ok, address="::1")[0] == 200, ok
        for bad in ("::1", f"::1:{port}", f"[::1]:{port + 1}", "evil.example"):
            assert _raw(port, bad, address="::1")[0] == 403, bad
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# --- framing, HEAD -------------------------------------------------------------------------------------------------
def test_the_page_cannot_be_framed_and_head_is_405(hm):
    with serving(hm) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        for path in ("/", "/api/model", "/nowhere"):
            status, headers, body = _raw(port, f"127.0.0.1:{port}", path=path)
            assert headers["x-frame-options"] == "DENY", path
            csp = headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "connect-src 'self'" in csp and "default-src 'none'" in csp
        page = _raw(port, f"127.0.0.1:{port}", path="/")[2].decode()
        assert "frame-ancestors" not in page  # a meta CSP cannot say it (browsers warn); the header does
        for path in ("/", "/api/model"):
            status, headers, body = _raw(port, f"127.0.0.1:{port}", method="HEAD", path=path)
            assert status == 405 and body == b"", (path, status, body)


# --- clients that leave, or drip --------------------------------------------------------------------------------------
def test_a_client_leaving_mid_answer_is_one_quiet_line(hm, capfd, caplog):
    caplog.set_level(logging.INFO, logger="headscope.view.server")
    text = unseen_text(30, seed=3)
    with serving(hm) as (base, app):
        port = int(base.rsplit(":", 1)[1])
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"GET /api/attention?text={quote(text)}&layer=1&head=2 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                      f"\r\n".encode())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
            s.close()
        time.sleep(2)
        assert get(base + "/api/model")[0] == 200  # still serving
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "ConnectionResetError" not in err, err
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]


def test_a_dripping_client_is_cut_off_at_the_request_deadline(hm, monkeypatch):
    monkeypatch.setattr(view_server, "REQUEST_SECONDS", 2)
    with serving(hm) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(0.2)
        start = time.monotonic()
        closed_after = None
        s.sendall(b"GET /api/model HTTP/1.1\r\n")
        while time.monotonic() - start < 10:
            try:
                s.sendall(b"X")  # one header byte every 0.3 s: each read is quick, the request never ends
                if s.recv(1024) == b"":
                    closed_after = time.monotonic() - start
                    break
            except TimeoutError:
                pass
            except OSError:
                closed_after = time.monotonic() - start
                break
            time.sleep(0.1)
        s.close()
        assert closed_after is not None and closed_after < 5, closed_after
        assert get(base + "/api/model")[0] == 200


# --- the command: SIGTERM, a busy port, --from '' ------------------------------------------------------------------
def test_sigterm_exits_143_after_closing(bert):
    proc, port = _start([str(bert), "--port", "0"])
    assert get(f"http://127.0.0.1:{port}/api/model")[0] == 200
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, err)
    assert "headscope view: terminated (SIGTERM)" in err and "Traceback" not in err, err
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=3).close()


def test_a_busy_port_is_refused_before_the_model_loads(bert, monkeypatch, capsys):
    import headscope.commands.view as command

    def never(args):
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(command, "load_from_args", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["view", str(bert), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"headscope view: error: cannot listen on 127.0.0.1:{port}"), err


def test_an_empty_from_is_refused(bert, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["view", str(bert), "--from", "", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["headscope view: error: --from is empty text; give a folder holding other verbs' outputs"], err
    with pytest.raises(headscope.HeadscopeError, match="from_dirs is empty text"):
        headscope.ViewOptions(from_dirs=(" ",)).validate()


# --- a text longer than the model's positions; long answers one at a time ---------------------------------------
def _eager(bert: Path, ids: list[int]) -> list[np.ndarray]:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(bert, attn_implementation="eager").eval()
    with torch.no_grad():
        att = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    return [a[0].numpy() for a in att]


def test_a_text_longer_than_the_positions_is_cut_with_a_note(hm, bert):
    from transformers import AutoTokenizer

    text = unseen_text(POSITIONS + 25, seed=21)
    tok = AutoTokenizer.from_pretrained(bert)
    assert len(tok(text)["input_ids"]) > POSITIONS
    cut = tok(text, truncation=True, max_length=POSITIONS)["input_ids"]
    ref = _eager(bert, cut)
    with serving(hm, max_tokens=512) as (base, _):
        status, body = get(f"{base}/api/attention?text={quote(text)}&layer=1&head=3")
        assert status == 200, body
        assert len(body["ids"]) == POSITIONS and body["ids"] == cut and body["tokens"][-1] == "[SEP]"
        assert body["note"].startswith(f"text cut to its first {POSITIONS} of ") and f"{POSITIONS} positions" in \
            body["note"]
        assert float(np.abs(np.asarray(body["weights"]) - ref[1][3]).max()) <= 1e-4
        status, short = get(f"{base}/api/attention?text={quote('the year .')}&layer=0&head=0")
        assert status == 200 and short["note"] is None
    v = headscope.view(hm, text, max_tokens=512, heads=("L1H3",))
    assert v.note == body["note"] and v.tokens == body["tokens"] and v.lines()[-1] == v.note
    assert float(np.abs(v.weights(1, 3) - ref[1][3]).max()) <= 1e-4


def test_long_answers_are_one_at_a_time(hm, monkeypatch):
    monkeypatch.setattr(view_server, "LONG_TOKENS", 20)
    long, short = unseen_text(30, seed=4), "the year ."
    with serving(hm) as (base, app):
        url = f"{base}/api/attention?layer=0&head=1&text="
        assert app.long.acquire(blocking=False)  # a long answer is being computed or sent
        try:
            status, body = get(url + quote(long))
            assert status == 503 and "busy: a long text" in body["error"], body
            assert get(url + quote(short))[0] == 200  # short texts are still answered
        finally:
            app.long.release()
        status, body = get(url + quote(long))
        assert status == 200 and len(body["weights"]) == len(body["tokens"])


# --- the Python API checks its arguments ---------------------------------------------------------------------------
API_CASES = [
    (lambda hm, v: v.weights(99, 0), "layer 99 does not exist: the model has layers 0..1"),
    (lambda hm, v: v.weights(-1, 0), "layer -1 does not exist"),
    (lambda hm, v: v.weights(0, 4), "head 4 does not exist in layer 0: it has heads 0..3"),
    (lambda hm, v: v.weights(0, "1"), "head must be a whole number, got '1'"),
    (lambda hm, v: v.weights(True, 0), "layer must be a whole number, got True"),
    (lambda hm, v: v.weights(0, 1.0), "head must be a whole number, got 1.0"),
    (lambda hm, v: v.write(5), "folder must be a path, got 5"),
    (lambda hm, v: headscope.view(hm, "the year", heads=(0, 1)), "heads is (0, 1); give head names"),
    (lambda hm, v: headscope.view(hm, "the year", heads="L0H1"), "heads is 'L0H1'; give head names"),
    (lambda hm, v: headscope.view(hm, "the year", max_tokens="5"), "max_tokens must be a whole number; got str '5'"),
    (lambda hm, v: headscope.view(hm, "the year", max_tokens=5.0), "max_tokens must be a whole number; got float 5.0"),
    (lambda hm, v: headscope.view(hm, "the year", max_tokens=True), "max_tokens must be a whole number; got bool True"),
    (lambda hm, v: headscope.view(hm, "the year", max_tokens=0), "max_tokens must be at least 1"),
    (lambda hm, v: headscope.view(hm, "the year", port="80"), "port must be a whole number; got str '80'"),
    (lambda hm, v: headscope.view(hm, "the year", host=5), "host must be text; got int 5"),
    (lambda hm, v: headscope.view(hm, "the year", open="yes"), "open must be True or False; got str 'yes'"),
    (lambda hm, v: headscope.view(hm, "the year", from_dirs="results"),
     "from_dirs must be a tuple of text; got str 'results'"),
    (lambda hm, v: headscope.view(hm, "the year", from_dirs=("",)), "from_dirs is empty text"),
    (lambda hm, v: headscope.view(hm, 5), "text must be a string, got int"),
    (lambda hm, v: headscope.view(None, "the year"), "hm must be a loaded model"),
    (lambda hm, v: headscope.view(hm, "the year", 5), "options must be a ViewOptions, got int"),
    (lambda hm, v: heads_table(hm, "results"), "dirs must be a list of folders, got 'results'"),
    (lambda hm, v: heads_table(hm, ["/no/such/folder"]), "dirs holds '/no/such/folder', which is not a folder"),
    (lambda hm, v: heads_table("minilm", []), "hm must be a loaded model"),
]


@pytest.mark.parametrize("case", range(len(API_CASES)))
def test_the_python_api_refuses_bad_arguments_by_name(hm, case):
    call, says = API_CASES[case]
    v = headscope.view(hm, "the year .")
    with pytest.raises(headscope.HeadscopeError) as e:
        call(hm, v)
    assert says in str(e.value), str(e.value)
    assert np.allclose(v.weights(np.int64(1), 2).sum(axis=-1), 1, atol=1e-5)  # numpy whole numbers are fine


def test_the_page_shows_the_cut_note_and_each_unusable_file(browser, hm, evidence, tmp_path):
    from conftest import open_watched

    d = copy_of(evidence, tmp_path)
    says = [_text_in_numbers(d), _kvcache_rows_not_objects(d)]
    text = unseen_text(POSITIONS + 25, seed=24)
    with serving(hm, heads_table(hm, [d]), max_tokens=512) as (base, _):
        page, problems, requests = open_watched(browser, base + "/", (base + "/",), (1400, 1000), 20000)
        try:
            page.wait_for_selector("body[data-ready='1']", timeout=20000)
            shown = page.locator("#status").inner_text().splitlines()
            assert len(shown) == 2 and all(any(s in line for line in shown) for s in says), shown
            page.fill("#text", text)
            page.press("#text", "Enter")
            page.wait_for_selector("body[data-drawn='1']", timeout=20000)
            status = page.locator("#status").inner_text()
            assert status.startswith(f"{POSITIONS} tokens") and f"text cut to its first {POSITIONS} of" in status, \
                status
            # the one refusal: /api/maps answers 413 for a text over 48 tokens, and the page asks per head
            assert [p for p in problems if "status of 413" not in p] == [], problems
            assert all(u.startswith(base + "/") for u in requests), requests
        finally:
            page.close()
