"""The report in a real browser (headless Chromium via Playwright): renders without console errors,
shows every head, opens a head's maps, recolours the grid, and makes no network request."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import open_watched
from test_report import IDS, write_outputs

from headscope.models.tiny import tiny_model
from headscope.report import render_report

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A tiny causal GQA model (llama, 2 layers x 6 heads) with every section's file present."""
    hm = tiny_model("llama", init_std=0.2)
    out = tmp_path_factory.mktemp("report")
    write_outputs(out, hm.n_layers, hm.n_heads, np.random.default_rng(0))
    path = render_report(out, model=hm, data=IDS, sentences=2)
    return hm, path


def open_page(browser, path: Path):
    """The report file; every request is recorded and anything but the page itself or inline data refused."""
    return open_watched(browser, path.as_uri(), ("file:", "data:"), (1300, 900), 10000)


def colours(page) -> list[str]:
    return page.eval_on_selector_all("#grid .cell", "cs => cs.map(c => getComputedStyle(c).backgroundColor)")


def test_report_in_chromium(browser, report):
    hm, path = report
    page, problems, requests = open_page(browser, path)
    try:
        n = hm.n_layers * hm.n_heads
        assert page.locator("#grid .cell").count() == n
        names = page.eval_on_selector_all("#grid .cell", "cs => cs.map(c => c.dataset.name)")
        assert names == [f"L{l}H{h}" for l in range(hm.n_layers) for h in range(hm.n_heads)]

        # Switching the colouring column recolours the cells.
        page.select_option("#colour-by", "entropy_norm")
        before = colours(page)
        assert len(set(before)) > 1, before
        page.select_option("#colour-by", "importance_gradient")
        after = colours(page)
        assert after != before

        # Clicking a head shows that head's maps; hovering a map cell shows the weight transformers computes.
        layer, head = 1, 4
        page.locator(f"#grid .cell[data-name='L{layer}H{head}']").click()
        assert page.locator("#head-detail h3").inner_text().startswith(f"L{layer}H{head}")
        canvases = page.locator("#head-detail canvas")
        assert canvases.count() == 2
        assert page.eval_on_selector_all("#head-detail canvas", "cs => cs.map(c => c.dataset.head)") == \
            [f"L{layer}H{head}"] * 2
        ids = IDS[0]
        with torch.inference_mode():
            ref = hm.model(input_ids=torch.tensor([ids]), output_attentions=True).attentions[layer][0, head].numpy()
        canvas = canvases.nth(0)
        left, top, cell = (float(canvas.get_attribute(f"data-{k}")) for k in ("left", "top", "cell"))
        q, k = 7, 2  # the repeated half of IDS[0] attends back
        canvas.hover(position={"x": left + k * cell + cell / 2, "y": top + q * cell + cell / 2})
        caption = page.locator("#head-detail .map-caption").nth(0).inner_text()
        shown = float(caption.rsplit(":", 1)[1])
        assert abs(shown - ref[q, k]) <= 0.5 / 255 + 5e-4, f"shown {shown}, transformers {ref[q, k]:.4f}, {caption!r}"
        first = canvas.evaluate("c => c.toDataURL()")
        page.locator("#grid .cell[data-name='L0H0']").click()
        assert page.locator("#head-detail canvas").nth(0).evaluate("c => c.toDataURL()") != first

        # Every section rendered something; nothing says "not run yet" for the files the fixture wrote. The
        # only notes are the three panels whose verbs it did not run (roles --long, prune --unit, tasks).
        notes = page.locator(".missing").all_inner_texts()
        assert len(notes) == 3 and page.locator("[id$='-panels'] .missing").count() == 3, notes
        for needle in ("roles MODEL --long", "unit_curve.csv", "task_correlation.csv"):
            assert sum(needle in n for n in notes) == 1, (needle, notes)
        assert page.locator("#rankcorr table").count() == 1 and page.locator("#prune img").count() == 1

        page.locator(f"#grid .cell[data-name='L{layer}H{head}']").click()
        page.mouse.move(0, 0)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report-tiny-llama.png"), full_page=True)
        assert problems == [], problems
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
        assert requests[0] == path.as_uri()
    finally:
        page.close()


def test_missing_sections_in_chromium(browser, tmp_path):
    hm = tiny_model("bert", init_std=0.2)
    path = render_report(tmp_path / "bare", model=hm, data=IDS, sentences=1)
    page, problems, requests = open_page(browser, path)
    try:
        texts = page.locator(".missing").all_inner_texts()
        assert any("not run yet: run headscope score" in t for t in texts), texts
        assert any("not run yet: run headscope prune" in t for t in texts), texts
        assert page.locator("#grid .cell").count() == hm.n_layers * hm.n_heads
        # The plain-language summary is there and names this model's numbers.
        assert re.search(r"\d+ of 8 heads", page.locator("#q1-text").inner_text())
        assert problems == [], problems
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    finally:
        page.close()


def test_uncertain_heads_are_grey_in_the_roles_grid(browser, report, tmp_path):
    """A head whose only role is uncertain is grey (not 'no role' and not a role colour), the legend counts it,
    and the tooltip shows a column's interval beside it."""
    import json

    hm, path = report
    html = path.read_text(encoding="utf-8")
    start = html.index('id="hs-data"')
    start = html.index(">", start) + 1
    end = html.index("</script>", start)
    data = json.loads(html[start:end])
    n = hm.n_layers * hm.n_heads
    data["roles"] = ["sink"] + [""] * (n - 1)
    data["uncertain"] = ["", "sink"] + [""] * (n - 2)
    data["columns"]["entropy_lo"] = [0.0] * n
    data["columns"]["entropy_hi"] = [9.0] * n
    page_path = tmp_path / "report.html"
    page_path.write_text(html[:start] + json.dumps(data).replace("</", "<\\/") + html[end:], encoding="utf-8")
    page, problems, _ = open_page(browser, page_path)
    try:
        page.select_option("#colour-by", "roles")
        got = colours(page)
        assert got[1] == "rgb(150, 150, 150)" and got[0] not in (got[1], "rgb(225, 225, 225)") and \
            got[2] == "rgb(225, 225, 225)", got[:3]
        assert "uncertain (1)" in page.locator("#legend").inner_text()
        page.locator("#grid .cell[data-name='L0H1']").hover()
        tip = page.locator("#tooltip").inner_text()
        assert "uncertain roles" in tip and "[0, 9]" in tip.replace(".000", ""), tip
        assert not problems, problems
    finally:
        page.close()


def test_a_study_report_in_chromium(browser, tmp_path):
    """A report built by `headscope study` (a tiny BERT): the three answers head the page, no section says
    "not run yet", and the stages an encoder does not support show as plain lines."""
    from test_study import tiny_bert_dir

    from headscope.cli import main

    out = tmp_path / "study"
    assert main(["study", str(tiny_bert_dir(tmp_path)), "--budget", "3m", "--out", str(out)]) == 0
    page, problems, requests = open_page(browser, out / "report.html")
    try:
        assert page.locator("#study").is_visible()
        answers = page.locator("#study-text p").all_inner_texts()
        assert len(answers) == 3 and answers[0].startswith("What the heads learn"), answers
        assert page.locator(".missing").count() == 0, page.locator(".missing").all_inner_texts()
        lines = page.locator(".na").all_inner_texts()
        assert any("not supported for this model (gqa)" in t for t in lines), lines
        assert any(t.startswith("not applicable: GQA, MLA") for t in lines), lines
        assert page.locator("#kv table").count() == 1 and page.locator("#prune img").count() == 1
        assert problems == [], problems
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    finally:
        page.close()
