"""The view's issue-43 features in a real browser (headless Chromium via Playwright): the address restores and
follows the view, malformed addresses are ignored with a note, norm-based weights drawn equal to a by-hand
computation, one head over a 1,500-token text as a window with an overview, a slider and a token search, a
greedy continuation marked on the page and equal to transformers' generate, a PNG download of the shown head,
roles as stripes with a legend and which way a score is better, saved views that never show a stale map, and
the notebook's iframe in a narrow cell. No console error and no request leaving the view's own server."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import numpy as np
import pytest
import torch
from conftest import open_watched
from test_view import dirs, evidence  # noqa: F401  (the tiny models the evidence fixture is made for)
from test_view_browser import hover_cell, run_text
from test_view_features import by_hand, short_words
from test_view_features import dirs as feature_dirs  # noqa: F401
from view_support import MARKUP, eager_reference, serving, tokenizer_dir, unseen_text

import headscope
from headscope.models.loading import load_model
from headscope.view.heads import heads_table

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def open_page(browser, url: str, allowed: tuple[str, ...], size: tuple[int, int] = (1400, 1000)):
    return open_watched(browser, url, allowed, size, 60000)


def address(page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.evaluate("location.href")).query)


def test_address_restores_and_follows_the_view(browser, feature_dirs):  # noqa: F811
    hm = load_model(str(feature_dirs["bert"]))
    text = unseen_text(8, seed=51)
    _, norms = by_hand(feature_dirs["bert"], text)
    with serving(hm) as (base, _):
        url = f"{base}/?text={quote(text)}&head=L1H2&head2=L0H3&weighting=norm"
        page, problems, requests = open_page(browser, url, (base + "/",))
        try:
            page.wait_for_selector("body[data-drawn]", timeout=20000)
            assert page.locator("#text").input_value() == text
            assert page.locator("#weighting").input_value() == "norm"
            canvas = page.locator("#view-0 canvas.heat[data-head='L1H2']")
            assert canvas.count() == 1 and page.locator("#view-1 canvas.heat[data-head='L0H3']").count() == 1
            assert page.locator("#grid .cell.sel0[data-name='L1H2']").count() == 1
            for q, k in ((0, 0), (4, 2), (7, 9)):  # the norm-based weight, 4 decimals on the page
                assert abs(hover_cell(page, canvas, q, k) - norms[1][2][q, k]) <= 1e-4 + 1e-6
            assert "norm-based" in page.locator("#view-0 .panel-bar h3").inner_text()
            # clicking and typing update the address
            page.locator("#grid .cell[data-name='L0H1']").click()
            page.locator("#view-0 canvas.heat[data-head='L0H1']").wait_for(timeout=10000)
            assert address(page) == {"text": [text], "head": ["L0H1"], "head2": ["L0H3"], "weighting": ["norm"]}
            page.select_option("#weighting", "attention")
            run_text(page, "the company said", 3)
            assert address(page) == {"text": ["the company said"], "head": ["L0H1"], "head2": ["L0H3"]}
            page.fill("#text", "the market")
            assert address(page)["text"] == ["the market"]
            assert problems == [], problems
            assert all(u.startswith(base + "/") for u in requests), requests
        finally:
            page.close()

        bad = f"{base}/?head=L9H9&head2=%3Cb%3E&weighting=bogus&gen=3&text=&x=1"
        page, problems, _ = open_page(browser, bad, (base + "/",))
        try:
            notes = page.locator("#notes").inner_text()
            for says in ("head=L9H9 is not a head of this model", "head2=<b> is not a head such as L2H5",
                         "weighting=bogus is not attention or norm", "gen=3: this model does not generate",
                         "text is empty"):
                assert says in notes, notes
            assert page.locator("#grid .cell.sel0[data-name='L0H0']").count() == 1  # the default head
            assert page.locator("#notes b").count() == 0 and problems == [], problems
            run_text(page, "the year", 1)  # the page works after a malformed address
            assert page.locator("#view-0 canvas.heat[data-head='L0H0']").count() == 1
        finally:
            page.close()


@pytest.fixture(scope="module")
def long_llama(tmp_path_factory):
    return tokenizer_dir(tmp_path_factory.mktemp("view-long"), "llama", max_position_embeddings=4096)


def test_a_head_over_1500_then_4096_tokens(browser, long_llama):
    hm = load_model(str(long_llama))
    words = unseen_text(1499, seed=52).split()
    words[1000] = MARKUP  # the one token the search box looks for
    text = " ".join(words)
    tokens, ref = eager_reference(long_llama, text)
    assert len(tokens) == 1500
    with serving(hm, max_tokens=4096) as (base, _):
        page, problems, requests = open_page(browser, base + "/", (base + "/",))
        try:
            page.fill("#text", text)
            page.press("#text", "Enter")
            page.wait_for_selector("body[data-drawn='1']", timeout=120000)
            canvas = page.locator("#view-0 canvas.heat[data-head='L0H0']")
            assert canvas.get_attribute("data-size") == "128"
            q0, k0 = int(canvas.get_attribute("data-top")), int(canvas.get_attribute("data-left"))
            assert (q0, k0) == (1500 - 128, 1500 - 128)  # the newest tokens first
            assert page.locator("#view-0 canvas.overview").count() == 1
            assert abs(hover_cell(page, canvas, 100, 20) - ref[0][0][q0 + 100, k0 + 20]) <= 5e-5 + 1e-6
            caption = page.locator("#view-0 .caption").inner_text()
            assert f"query {q0 + 100} {tokens[q0 + 100]} \u2192 key {k0 + 20} {tokens[k0 + 20]}" in caption

            page.fill("#view-0 input.find", "onerror")  # jump to the token
            page.press("#view-0 input.find", "Enter")
            page.wait_for_selector("#view-0 canvas.heat[data-top='936']", timeout=60000)
            assert "found \"onerror\" at token 1000" in page.locator("#view-0 .found").inner_text()
            canvas = page.locator("#view-0 canvas.heat")
            assert abs(hover_cell(page, canvas, 64, 3) - ref[0][0][1000, 936 + 3]) <= 5e-5 + 1e-6

            page.locator("#view-0 input.position").fill("300")  # the slider: a window around token 300
            page.wait_for_selector("#view-0 canvas.heat[data-top='236']", timeout=60000)
            page.locator("#grid .cell[data-name='L1H4']").click()  # another head of the long text
            canvas = page.locator("#view-0 canvas.heat[data-head='L1H4']")
            canvas.wait_for(timeout=60000)
            assert abs(hover_cell(page, canvas, 5, 5) - ref[1][4][1372 + 5, 1372 + 5]) <= 5e-5 + 1e-6
            page.mouse.move(0, 0)
            ARTIFACTS.mkdir(exist_ok=True)
            page.locator("#view-0 .panel").first.screenshot(path=str(ARTIFACTS / "view-long-window.png"))
            run_text(page, short_words(4096, seed=58), 2)  # the model's maximum here: 4,096 tokens
            assert "4096 tokens" in page.locator("#status").inner_text()
            canvas = page.locator("#view-0 canvas.heat[data-head='L1H4']")
            assert (canvas.get_attribute("data-top"), canvas.get_attribute("data-size")) == ("3968", "128")
            assert problems == [], problems  # no failed request, no console error on the way
            assert all(u.startswith(base + "/") for u in requests), requests
            assert not any("/api/maps" in u for u in requests)  # every head's maps never asked for a long text
        finally:
            page.close()


def test_continuation_marked_and_equal_to_transformers(browser, feature_dirs):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hm = load_model(str(feature_dirs["llama"]))
    text = unseen_text(6, seed=53)
    tok = AutoTokenizer.from_pretrained(feature_dirs["llama"])
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(feature_dirs["llama"]).eval().generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)[0].tolist()
    with serving(hm) as (base, _):
        page, problems, requests = open_page(browser, base + "/", (base + "/",))
        try:
            page.fill("#text", text)
            page.fill("#gen-n", "12")
            page.click("#gen")
            page.wait_for_selector("body[data-drawn]", timeout=30000)
            generated = ref[ids.shape[1]:]
            assert page.locator("#continuation mark.gen").inner_text() == tok.decode(generated)
            marked = page.eval_on_selector_all("#view-0 svg text.gen[data-side='q']",
                                               "ts => ts.map(t => t.dataset.token)")
            assert marked == tok.convert_ids_to_tokens(generated)
            assert "greedy continuation" in page.locator("#status").inner_text()
            assert address(page)["gen"] == ["12"]
            shown = page.eval_on_selector_all("#view-0 svg text[data-side='q']", "ts => ts.map(t => t.dataset.token)")
            assert shown == tok.convert_ids_to_tokens(ref)  # the heads over prompt and continuation
            assert problems == [], problems
        finally:
            page.close()
        # the shared address regenerates the same continuation
        page, problems, _ = open_page(browser, page.url, (base + "/",))
        try:
            page.wait_for_selector("body[data-drawn]", timeout=30000)
            assert page.locator("#continuation mark.gen").inner_text() == tok.decode(ref[ids.shape[1]:])
            assert problems == [], problems
        finally:
            page.close()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_export_downloads_the_shown_head(browser, dirs, tmp_path):  # noqa: F811
    from PIL import Image

    hm = load_model(str(dirs["bert"]))
    text = unseen_text(9, seed=54)
    with serving(hm) as (base, _):
        page, problems, _ = open_page(browser, f"{base}/?text={quote(text)}&head=L1H3", (base + "/",))
        try:
            page.wait_for_selector("body[data-drawn]", timeout=20000)
            with page.expect_download() as got:
                page.locator("#view-0 button.png").click()
            d = got.value
            assert d.suggested_filename.startswith("headscope-") and d.suggested_filename.endswith("-L1H3.png")
            path = tmp_path / "head.png"
            d.save_as(path)
            data = path.read_bytes()
            w, h = png_size(data)
            assert 560 <= w <= 2000 and 400 <= h <= 2000 and 2_000 < len(data) < 2_000_000, (w, h, len(data))
            img = np.asarray(Image.open(path).convert("RGB")).astype(int)
            assert (img[5:30, 10:300] < 100).any()  # the title's ink: model and head
            # the heat map, drawn 11 tokens x cell, scaled: many distinct blues below the text
            assert len({tuple(p) for p in img[140:400, 20:400].reshape(-1, 3)}) > 20
            assert problems == [], problems
        finally:
            page.close()


def test_roles_striped_and_which_way_is_better(browser, dirs, evidence):  # noqa: F811
    hm = load_model(str(dirs["bert"]))
    table = heads_table(hm, [evidence])
    table["roles"] = ["local;broad", "broad", "", "local", "", "", "", ""]
    table["uncertain"] = [""] * 8
    table["role_detail"] = {"L0H0": [{"role": "local", "score": 0.969, "lo": 0.9, "hi": 1.02, "baseline": 12.171,
                                      "help": "attends much closer than a uniform head", "higher_is_better": False}]}
    with serving(hm, table) as (base, _):
        page, problems, _ = open_page(browser, f"{base}/?text=the%20year", (base + "/",))
        try:
            page.wait_for_selector("body[data-drawn]", timeout=20000)
            page.select_option("#colour-by", "roles")
            bg = page.eval_on_selector_all("#grid .cell", "cs => cs.map(c => c.style.background)")
            assert "linear-gradient" in bg[0] and bg[0].count("rgb(") == 2 + 2  # two stripes, each from and to
            assert "linear-gradient" not in bg[1] and bg[1] != bg[3] and bg[1] != bg[2]
            legend = page.locator("#legend").inner_text()
            assert "local" in legend and "broad" in legend and "several roles: one stripe each (1 heads)" in legend
            card = page.locator("#view-0 .card").inner_text()
            assert "local (attends much closer than a uniform head): score 0.969 [0.900, 1.020] (95% interval), " \
                   "baseline 12.171; lower is better" in card, card
            assert "\u221aweight" in page.locator("#view-0 .legend-scale").inner_text()
            assert problems == [], problems
        finally:
            page.close()


def test_saved_views_never_show_a_stale_map(browser, dirs, tmp_path):  # noqa: F811
    hm = load_model(str(dirs["llama"]))
    short = headscope.view(hm, unseen_text(8, seed=55))
    (path,) = short.save(tmp_path / "short")
    page, problems, requests = open_page(browser, path.as_uri(), ("file:", "data:"))
    try:
        page.wait_for_selector("body[data-drawn]", timeout=20000)
        assert page.locator("#examples button").count() == 0  # nothing else can be computed in a saved view
        assert "headscope view MODEL" in page.locator("#examples").inner_text()
        assert page.locator("#gen-box").is_hidden() and page.locator("#weighting").is_disabled()
        assert problems == [], problems
    finally:
        page.close()
    text = unseen_text(200, seed=56)
    long = headscope.view(hm, text, headscope.ViewOptions(heads=("L1H1",)))
    (path,) = long.save(tmp_path / "long")
    _, ref = eager_reference(dirs["llama"], text)
    page, problems, requests = open_page(browser, path.as_uri(), ("file:", "data:"))
    try:
        page.wait_for_selector("body[data-drawn]", timeout=30000)
        canvas = page.locator("#view-0 canvas.heat[data-head='L1H1']")
        q0, k0 = int(canvas.get_attribute("data-top")), int(canvas.get_attribute("data-left"))
        assert abs(hover_cell(page, canvas, 7, 7) - ref[1][1][q0 + 7, k0 + 7]) <= 1e-4 + 1e-6
        assert page.locator("#grid .cell.absent").count() == 11
        page.locator("#grid .cell[data-name='L0H2']").click(force=True)
        assert "L0H2 is not in this saved view" in page.locator("#status").inner_text()
        assert page.locator("#grid .cell.sel0[data-name='L1H1']").count() == 1  # the selection stays
        assert page.locator("#view-0 canvas.heat[data-head='L1H1']").count() == 1
        assert all(u.startswith(("file:", "data:", "blob:")) for u in requests), requests
        assert [p for p in problems if "not in this saved view" not in p] == [], problems
    finally:
        page.close()


def test_notebook_view_in_a_narrow_cell(browser, dirs):  # noqa: F811
    hm = load_model(str(dirs["bert"]))
    v = headscope.view(hm, unseen_text(6, seed=57), heads=("L1H0",))
    assert repr(v).startswith(f"<headscope view of {hm.name}: {len(v.tokens)} tokens of ")
    assert "showing L1H0 (maps of every head)" in repr(v)
    page = browser.new_page(viewport={"width": 480, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.set_content(f"<!doctype html><html><body style='margin:0;width:440px'>{v._repr_html_()}</body></html>")
        frame = page.frame_locator("iframe")
        frame.locator("body[data-drawn]").wait_for(timeout=20000)
        assert page.eval_on_selector("iframe", "f => f.getBoundingClientRect().width") <= 440
        inner = page.frames[1]
        # nothing but the wide tables scrolls sideways: the page itself fits the cell
        wide = inner.evaluate("[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > "
                              "window.innerWidth + 1).map(e => e.tagName + '#' + e.id + '.' + e.className)")
        assert inner.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), wide
        assert frame.locator("#view-0 canvas.heat[data-head='L1H0']").count() == 1
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "view-notebook-narrow.png"))
        assert problems == [], problems
    finally:
        page.close()


def test_a_note_in_an_answer_is_shown(browser, dirs):  # noqa: F811
    """A note the server adds to an answer (a text cut to the model's positions) is shown on the page."""
    hm = load_model(str(dirs["bert"]))
    with serving(hm) as (base, app):
        answer = app.answer

        def noting(route, params, send):
            if route != "/api/attention":
                return answer(route, params, send)
            pieces: list[bytes] = []
            answer(route, params, pieces.extend)  # the answer's JSON, sent in pieces
            body = json.loads(b"".join(pieces))
            body["note"] = f"the text has 1500 tokens; the model reads {MARKUP} 512"
            return send([json.dumps(body).encode("utf-8")])

        app.answer = noting
        page, problems, _ = open_page(browser, f"{base}/?text=the%20year", (base + "/",))
        try:
            page.wait_for_selector("body[data-drawn]", timeout=20000)
            assert page.locator("#notes").inner_text() == f"the text has 1500 tokens; the model reads {MARKUP} 512"
            assert page.locator("#notes img").count() == 0 and problems == [], problems
        finally:
            page.close()
