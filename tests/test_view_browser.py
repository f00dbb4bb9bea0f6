"""`headscope view`'s page in a real browser (headless Chromium via Playwright): typed text is drawn for the
clicked head with transformers' own weights, two heads side by side, small multiples, the head's card with
the command behind each number, markup in the data shown as text, no console error, and no request leaving
the view's own server; the notebook page the same with nothing fetched at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import open_watched
from test_view import dirs, evidence  # noqa: F401  (fixtures this module's tests use)
from view_support import MARKUP, eager_reference, serving, unseen_text

import headscope
from headscope.models.loading import load_model
from headscope.view.heads import heads_table

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
# The one console message a refused request leaves (Chromium logs every 4xx load); only where a test asks for one.
REFUSED = "Failed to load resource: the server responded with a status of 413"


def open_page(browser, url: str, allowed: tuple[str, ...]):
    """The view at `url`; anything but the view's own server (or the page itself) is refused and recorded."""
    return open_watched(browser, url, allowed, (1400, 1000), 20000)


def run_text(page, text: str, drawn: int) -> None:
    page.fill("#text", text)
    page.press("#text", "Enter")
    page.wait_for_selector(f"body[data-drawn='{drawn}']", timeout=20000)


def hover_cell(page, canvas, q: int, k: int) -> float:
    cell = float(canvas.get_attribute("data-cell"))
    canvas.hover(position={"x": k * cell + cell / 2, "y": q * cell + cell / 2})
    panel = "xpath=ancestor::div[contains(@class,'panel')][1]/div[contains(@class,'caption')]"
    caption = canvas.locator(panel).inner_text()
    return float(caption.rsplit(":", 1)[1])


def test_typed_text_drawn_in_chromium(browser, dirs, evidence):  # noqa: F811
    hm = load_model(str(dirs["bert"]))
    text = unseen_text(6, seed=21) + " " + MARKUP
    tokens, ref = eager_reference(dirs["bert"], text)
    with serving(hm, heads_table(hm, [evidence])) as (base, _):
        page, problems, requests = open_page(browser, base + "/", (base + "/",))
        try:
            assert page.locator("#grid .cell").count() == 8
            run_text(page, text, 1)
            assert page.locator("#view-0 svg.arcs").get_attribute("data-head") == "L0H0"
            assert page.locator("#multiples canvas").count() == 8

            page.locator("#grid .cell[data-name='L1H2']").click()
            canvas = page.locator("#view-0 canvas[data-head='L1H2']")
            canvas.wait_for(timeout=10000)
            for q, k in ((0, 0), (3, 5), (len(tokens) - 1, 2)):
                shown = hover_cell(page, canvas, q, k)
                # the page gets every head rounded to 4 decimals and shows 4 decimals
                assert abs(shown - ref[1][2][q, k]) <= 1e-4 + 1e-6, (q, k, shown, ref[1][2][q, k])

            # Hovering a query token keeps only its arcs.
            page.locator("#view-0 svg text[data-side='q'][data-i='2']").hover()
            visible = page.eval_on_selector_all("#view-0 svg line", "ls => ls.filter(l => l.style.display !== 'none')"
                                                                    ".map(l => +l.dataset.q)")
            assert visible and set(visible) == {2}
            assert "attends to" in page.locator("#view-0 .caption").inner_text()

            # Shift+click: a second head beside the first.
            page.locator("#grid .cell[data-name='L0H3']").click(modifiers=["Shift"])
            page.locator("#view-1 canvas[data-head='L0H3']").wait_for(timeout=10000)
            assert page.locator("#view-0 canvas[data-head='L1H2']").count() == 1

            # The markup token is text on the page, never an element.
            labels = page.eval_on_selector_all("#view-0 svg text[data-side='q']", "ts => ts.map(t => t.dataset.token)")
            assert labels == tokens and MARKUP in labels
            shown = page.eval_on_selector_all("#view-0 svg text[data-side='q']", "ts => ts.map(t => t.textContent)")
            assert shown[1] == tokens[1] + tokens[1] + " (token 1)"  # the label, then its tooltip (full label)
            assert shown[-2].startswith(MARKUP[:17] + "\u2026" + MARKUP)  # cut to 18 characters on the page
            assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0

            # The card: roles, importance rank, KV-cache choice and patching effect, each with its command.
            card = page.locator("#view-0 .card").inner_text()
            assert "ablation: rank" in card and "of 8" in card and "sink 4 + window 16 only" in card
            assert "headscope roles " in card and "headscope score " in card and "--method ablation" in card
            assert "no provenance recorded" in card  # patching.csv was written without its JSON
            # its strongest paths from paths.csv, the markup sender shown as text
            assert "Strongest paths (path patching)" in card and "L0H1 \u2192 L1H2 via q: 0.3" in card, card
            assert MARKUP + " \u2192 L1H2 via k" in card

            before = page.eval_on_selector_all("#grid .cell", "cs => cs.map(c => c.style.background)")
            page.select_option("#colour-by", "importance:ablation")
            after = page.eval_on_selector_all("#grid .cell", "cs => cs.map(c => c.style.background)")
            assert after != before and len(set(after)) > 1
            page.mouse.move(0, 0)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "view-tiny-bert.png"), full_page=True)
            assert problems == [], problems
            assert all(u.startswith(base + "/") for u in requests), requests
        finally:
            page.close()


def test_long_and_refused_texts_in_chromium(browser, dirs):  # noqa: F811
    hm = load_model(str(dirs["llama"]))
    long = unseen_text(70, seed=22)
    tokens, ref = eager_reference(dirs["llama"], long)
    with serving(hm, max_tokens=100) as (base, _):
        page, problems, requests = open_page(browser, base + "/", (base + "/",))
        try:
            page.press("#text", "Enter")  # nothing typed: said on the page, nothing sent
            assert "type a sentence first" in page.locator("#status").inner_text()
            run_text(page, long, 1)  # the empty Enter sent nothing
            assert "long text" in page.locator("#status").inner_text()
            assert "up to 48 tokens" in page.locator("#multiples-note").inner_text()
            page.locator("#grid .cell[data-name='L1H4']").click()
            canvas = page.locator("#view-0 canvas[data-head='L1H4']")
            canvas.wait_for(timeout=10000)
            assert abs(hover_cell(page, canvas, len(tokens) - 1, 3) - ref[1][4][-1, 3]) <= 5e-5 + 1e-6
            assert page.locator("#view-0 svg.arcs").count() == 1  # 71 tokens: arcs still drawn (up to 96)
            assert problems == [], problems  # the long text asked no route that refuses it (no 413 on the way)
            page.fill("#text", unseen_text(120, seed=23))
            page.press("#text", "Enter")
            page.wait_for_selector("#status.error", timeout=20000)
            assert "the limit is 100 tokens" in page.locator("#status").inner_text()
            assert [p for p in problems if REFUSED not in p] == [], problems
            assert all(u.startswith(base + "/") for u in requests), requests
        finally:
            page.close()


def test_notebook_page_in_chromium(browser, dirs, tmp_path):  # noqa: F811
    hm = load_model(str(dirs["llama"]))
    text = unseen_text(8, seed=24)
    (path,) = headscope.view(hm, text, headscope.ViewOptions(heads=("L1H1", "L0H5"))).save(tmp_path)
    _, ref = eager_reference(dirs["llama"], text)
    page, problems, requests = open_page(browser, path.as_uri(), ("file:", "data:"))
    try:
        page.wait_for_selector("body[data-drawn]", timeout=20000)
        canvas = page.locator("#view-0 canvas[data-head='L1H1']")
        assert canvas.count() == 1 and page.locator("#view-1 canvas[data-head='L0H5']").count() == 1
        assert abs(hover_cell(page, canvas, 4, 2) - ref[1][1][4, 2]) <= 1e-4 + 1e-6
        assert page.locator("#multiples canvas").count() == 12
        assert page.locator("#text").input_value() == text and page.locator("#run").is_disabled()
        assert np.isfinite(len(requests)) and all(u.startswith(("file:", "data:")) for u in requests), requests
        assert problems == [], problems
    finally:
        page.close()


def test_notebook_iframe_in_chromium(browser, dirs):  # noqa: F811
    """What a notebook shows: `_repr_html_`'s iframe draws the page from its srcdoc alone."""
    hm = load_model(str(dirs["bert"]))
    v = headscope.view(hm, unseen_text(5, seed=25) + " " + MARKUP)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.set_content("<!doctype html><html><body>" + v._repr_html_() + "</body></html>")
        frame = page.frame_locator("iframe")
        frame.locator("body[data-drawn]").wait_for(timeout=20000)
        assert frame.locator("#view-0 canvas[data-head='L0H0']").count() == 1
        assert frame.locator("#multiples canvas").count() == 8
        assert page.evaluate("window.pwned") is None and frame.locator("img").count() == 0
        assert problems == [], problems
    finally:
        page.close()
