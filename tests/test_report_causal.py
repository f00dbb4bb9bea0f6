"""The report's "what heads do, causally" section, on the files a real `headscope.patch` run writes on a tiny model
(plus a hand-written paths.csv and roles.csv): its numbers are the files' numbers, it is absent without
patching.csv, and hostile text in the files stays text."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from test_report import IDS, full, page_data

import headscope
from headscope import artifacts as A
from headscope.learned.causal.pairs import induction_pairs
from headscope.models.tiny import tiny_model
from headscope.report import render_report
from headscope.report.causal import PATHS_TITLE, PLOT_NAMES, TITLE, TOP_HEADS, TOP_PATHS

HOSTILE = "</script><script>alert(1)</script><!--"
NUMBER = re.compile(r"[+-]\d+\.\d{3}|n/a")
PAIRS = 8


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    """A tiny llama (2 layers x 6 heads) patched on induction pairs: patching.csv, patching.json, composition.npz."""
    hm = tiny_model("llama", init_std=0.2)
    pairs = induction_pairs(None, hm.vocab_size, n=PAIRS, length=6, seed=0)
    out = tmp_path_factory.mktemp("patched")
    headscope.patch(hm, pairs, bootstrap=200).save(out)
    return hm, out


def paths_rows() -> list[dict]:
    """14 paths (more than the section shows), |effect| all different, one with hostile names."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(14):
        e = (1.0 - 0.06 * i) * (-1 if i % 3 == 2 else 1)
        lo, hi = e - rng.uniform(0.01, 0.1), e + rng.uniform(0.01, 0.1)
        rows.append({"sender": f"L0H{i % 6}", "receiver": "logits" if i % 4 == 3 else f"L1H{(i + i // 6) % 6}",
                     "via": "direct" if i % 4 == 3 else "qkv"[i % 3], "effect": e, "effect_lo": lo, "effect_hi": hi})
    rows[1].update(sender=HOSTILE, via="<img src=x onerror=alert(2)>")
    return rows


def roles_rows(n_layers: int, n_heads: int) -> list[dict]:
    return [{"layer": l, "head": h, "roles": "previous_token;induction" if (l + h) % 3 == 0 else "",
             "uncertain_roles": "sink" if (l + h) % 4 == 1 else ""} for l in range(n_layers) for h in range(n_heads)]


def results(tmp_path, patched, paths: bool = True, roles: bool = True):
    hm, src = patched
    out = tmp_path / "results"
    shutil.copytree(src, out)
    if paths:
        pd.DataFrame(paths_rows()).to_csv(out / A.PATHS_CSV.name, index=False)
    if roles:
        full(A.ROLES_CSV, roles_rows(hm.n_layers, hm.n_heads)).to_csv(out / A.ROLES_CSV.name, index=False)
    return out


def render(out, patched):
    """The report of folder `out` (the tiny model given: its grid, and statistics on IDS where no roles.csv)."""
    return render_report(out, model=patched[0], data=IDS, sentences=1)


def numbers(text: str) -> list[float]:
    return [float("nan") if s == "n/a" else float(s) for s in NUMBER.findall(text)]


def panel(data: dict, title: str) -> dict:
    found = [p for p in data["panels"] if p["title"] == title]
    assert len(found) == 1, [p["title"] for p in data["panels"]]
    return found[0]


def test_the_section_shows_the_files_numbers(tmp_path, patched):
    hm, _ = patched
    out = results(tmp_path, patched)
    html = render(out, patched).read_text(encoding="utf-8")
    data = page_data(html)
    p = panel(data, TITLE)
    table = pd.read_csv(out / "patching.csv")
    meta = json.loads((out / "patching.json").read_text())
    # the top heads by |exact effect|, each column with its interval, the role labels beside them
    top = table.reindex(table["effect"].abs().sort_values(ascending=False, kind="stable").index)[:TOP_HEADS]
    assert [r["head"] for r in p["rows"]] == [f"L{l}H{h}" for l, h in zip(top["layer"], top["head"], strict=True)]
    roles = {f"L{r['layer']}H{r['head']}": r for r in roles_rows(hm.n_layers, hm.n_heads)}
    for row, (_, want) in zip(p["rows"], top.iterrows(), strict=True):
        for col in ("effect", "attribution", "dla"):
            np.testing.assert_allclose(numbers(row[col]), [want[col], want[f"{col}_lo"], want[f"{col}_hi"]],
                                       atol=6e-4)
        assert row["roles"] == roles[row["head"]]["roles"].replace(";", ", ")
        assert row["uncertain roles"] == roles[row["head"]]["uncertain_roles"]
    text = " ".join(p["text"])
    mc, mx = meta["M_clean"], meta["M_corrupt"]
    assert f"M(clean) {mc['value']:+.3f} [{mc['lo']:+.3f}, {mc['hi']:+.3f}]" in text
    assert f"M(corrupt) {mx['value']:+.3f} [{mx['lo']:+.3f}, {mx['hi']:+.3f}]" in text
    assert f"over {PAIRS} pairs" in text and meta["pairs"]["n"] == PAIRS
    ag = meta["agreement"]
    assert f"Spearman {ag['spearman']:+.3f} over {ag['heads']} heads" in text
    assert p["plot"].startswith("data:image/png;base64,")
    assert set(PLOT_NAMES.values()) <= set(data["plots_written"])
    assert all((out / name).is_file() for name in PLOT_NAMES.values())
    # the strongest paths by |effect|, as paths.csv gives them, with their intervals
    q = panel(data, PATHS_TITLE)
    paths = pd.DataFrame(paths_rows())
    best = paths.reindex(paths["effect"].abs().sort_values(ascending=False, kind="stable").index)[:TOP_PATHS]
    assert len(q["rows"]) == TOP_PATHS < len(paths)
    for row, (_, want) in zip(q["rows"], best.iterrows(), strict=True):
        assert (row["sender"], row["receiver"], row["via"]) == (want.sender, want.receiver, want.via)
        np.testing.assert_allclose(numbers(row["effect"]), [want.effect, want.effect_lo, want.effect_hi], atol=6e-4)
    assert f"of the {len(paths)} paths" in q["text"][0] and f"over the {PAIRS} pairs" in q["text"][0]
    assert any("1 of these rows are not drawn" in s for s in q["text"])  # the hostile row
    assert q["plot"].startswith("data:image/png;base64,")
    top_head = p["rows"][0]
    assert any(s.startswith(f"Patching {top_head['head']} moves the task's metric most: effect {top_head['effect']}")
               for s in data["text"]["q1"])


def test_a_real_path_patching_run(tmp_path, patched):
    """`headscope.patch(..., paths=...)`'s own paths.csv: its strongest paths, with their intervals, all drawn."""
    hm, _ = patched
    out = tmp_path / "paths"
    headscope.patch(hm, induction_pairs(None, hm.vocab_size, n=PAIRS, length=6, seed=0), bootstrap=200,
                    paths="2").save(out)
    q = panel(page_data(render(out, patched).read_text(encoding="utf-8")), PATHS_TITLE)
    paths = pd.read_csv(out / "paths.csv")
    best = paths.reindex(paths["effect"].abs().sort_values(ascending=False, kind="stable").index)[:TOP_PATHS]
    assert len(q["rows"]) == TOP_PATHS and len(paths) > TOP_PATHS
    for row, (_, want) in zip(q["rows"], best.iterrows(), strict=True):
        assert (row["sender"], row["receiver"], row["via"]) == (want.sender, want.receiver, want.via)
        np.testing.assert_allclose(numbers(row["effect"]), [want.effect, want.effect_lo, want.effect_hi], atol=6e-4)
    assert f"of the {len(paths)} paths" in q["text"][0] and f"over the {PAIRS} pairs" in q["text"][0]
    run = json.loads((out / "patching.json").read_text())["paths"]
    assert q["text"][1] == f"Receivers: {', '.join(run['receivers'])} ({run['chosen']})."
    assert len(q["text"]) == 2 and q["plot"].startswith("data:image/png;base64,")  # every path drawn


def test_a_set_of_senders_is_one_row_drawn_from_each_head(tmp_path, patched):
    """`--senders`: paths.csv names the set `L0H1+L0H2`; the table keeps it as one row and the figure draws it (no
    row left undrawn)."""
    hm, _ = patched
    out = tmp_path / "set"
    headscope.patch(hm, induction_pairs(None, hm.vocab_size, n=PAIRS, length=6, seed=0), bootstrap=200,
                    paths="L1H3", senders="L0H1,L0H2").save(out)
    q = panel(page_data(render(out, patched).read_text(encoding="utf-8")), PATHS_TITLE)
    assert {row["sender"] for row in q["rows"]} == {"L0H1+L0H2"} and len(q["rows"]) == 4
    assert not any("not drawn" in t for t in q["text"]) and q["plot"].startswith("data:image/png;base64,")
    from headscope.report.causal import drawable

    assert [e["sender"] for e in drawable("L0H1+L0H2", "L1H3", "q", 0.5)] == [(0, 1), (0, 2)]
    assert drawable("L0H1+<b>", "L1H3", "q", 0.5) == []


def test_hostile_names_stay_text(tmp_path, patched):
    hm, _ = patched
    out = results(tmp_path, patched)
    html = render(out, patched).read_text(encoding="utf-8")
    # nothing closes or confuses the data block: the page's only tags are its own
    assert html.count("</script>") == 2 and html.count("<script") == 2 and "<!--" not in html and "<img" not in html
    q = panel(page_data(html), PATHS_TITLE)
    assert [r for r in q["rows"] if r["sender"] == HOSTILE][0]["via"] == "<img src=x onerror=alert(2)>"


def test_without_paths_the_k_composition_pairs(tmp_path, patched):
    out = results(tmp_path, patched, paths=False, roles=False)
    data = page_data(render(out, patched).read_text(encoding="utf-8"))
    meta = json.loads((out / "patching.json").read_text())
    q = panel(data, PATHS_TITLE)
    want = meta["composition"]["k"]
    assert len(q["rows"]) == len(want) > 0
    for row, w in zip(q["rows"], want, strict=True):
        assert (row["sender"], row["receiver"]) == (w["sender"], w["receiver"])
        assert row["K-composition"] == f"{w['score']:+.3f}"
    with np.load(out / "composition.npz", allow_pickle=False) as z:
        assert float(np.nanmax(z["k"])) == pytest.approx(want[0]["score"], rel=1e-6)
    assert "no interval" in q["text"][0]
    assert "roles" not in panel(data, TITLE)["columns"]  # no roles.csv: no role labels


def test_attribution_alone_is_mapped(tmp_path, patched):
    hm, _ = patched
    out = tmp_path / "attr"
    headscope.patch(hm, induction_pairs(None, hm.vocab_size, n=PAIRS, length=6, seed=0), methods=("attribution",),
                    bootstrap=200).save(out)
    p = panel(page_data(render(out, patched).read_text(encoding="utf-8")), TITLE)
    table = pd.read_csv(out / "patching.csv")
    top = table.reindex(table["attribution"].abs().sort_values(ascending=False, kind="stable").index)[:TOP_HEADS]
    assert [r["head"] for r in p["rows"]] == [f"L{l}H{h}" for l, h in zip(top["layer"], top["head"], strict=True)]
    assert "effect" not in p["columns"] and any("attribution estimate" in s for s in p["text"])


def test_absent_without_patching_csv(tmp_path, patched):
    out = results(tmp_path, patched)
    (out / "patching.csv").unlink()
    data = page_data(render(out, patched).read_text(encoding="utf-8"))
    assert not {TITLE, PATHS_TITLE} & {p["title"] for p in data["panels"]}
    assert not set(PLOT_NAMES.values()) & set(data["plots_written"])
    assert not any("patching" in s.lower() for s in data["text"]["q1"])


def test_without_patching_json_the_heads_without_the_run(tmp_path, patched):
    out = results(tmp_path, patched)
    (out / "patching.json").unlink()
    data = page_data(render(out, patched).read_text(encoding="utf-8"))
    p = panel(data, TITLE)
    assert len(p["rows"]) == TOP_HEADS and p["plot"].startswith("data:image/png;base64,")
    text = " ".join(p["text"])
    assert not re.search(r"M\(clean\) [+-]\d", text)
    assert "no patching.json" in text and "an unknown number of pairs" in text
    assert [r["#"] for r in panel(data, PATHS_TITLE)["rows"]] == list(range(1, TOP_PATHS + 1))


def test_odd_values_in_patching_json_are_shown_as_missing(tmp_path, patched):
    """Wrong types anywhere in patching.json (hand-edited or foreign) read as n/a, never as a broken page."""
    out = results(tmp_path, patched, paths=False)
    meta = json.loads((out / "patching.json").read_text())
    meta.update(metric=HOSTILE, M_clean={"value": "1", "lo": None, "hi": [2]}, M_corrupt=[1, 2], pairs=[HOSTILE],
                intervals="x", agreement={"spearman": True, "heads": -3}, composition={"k": {"sender": HOSTILE}})
    (out / "patching.json").write_text(json.dumps(meta))
    data = page_data(render(out, patched).read_text(encoding="utf-8"))
    text = " ".join(panel(data, TITLE)["text"])
    assert f"Metric `{HOSTILE}`" in text and "M(clean) n/a [n/a, n/a], M(corrupt) n/a [n/a, n/a]" in text
    assert "Spearman n/a over an unknown number of heads" in text and "an unknown number of pairs" in text
    q = panel(data, PATHS_TITLE)
    assert q["rows"] == [] and q["note"] == "no paths: no paths.csv (path patching), and patching.json holds no " \
                                            "K-composition pairs"


def test_text_in_patching_csv_numbers_gets_a_note(tmp_path, patched):
    out = results(tmp_path, patched, paths=False)
    table = pd.read_csv(out / "patching.csv")
    table["layer"] = table["layer"].astype(object)
    table.loc[3, "layer"] = HOSTILE
    table.to_csv(out / "patching.csv", index=False)
    p = panel(page_data(render(out, patched).read_text(encoding="utf-8")), TITLE)
    assert p["rows"] == [] and "layer/head values that are not whole numbers" in p["note"]


def test_a_cut_patching_csv_gets_a_note(tmp_path, patched):
    hm, _ = patched
    out = results(tmp_path, patched, paths=False)
    lines = (out / "patching.csv").read_text().splitlines()
    (out / "patching.csv").write_text("\n".join(lines[:-2]) + "\n")
    p = panel(page_data(render(out, patched).read_text(encoding="utf-8")), TITLE)
    assert p["rows"] == [] and "patching.csv does not hold exactly one row per head" in p["note"]


def test_the_section_in_chromium(browser, tmp_path, patched):
    from test_report_browser import open_page

    path = render(results(tmp_path, patched), patched)
    page, problems, requests = open_page(browser, path)
    try:
        box = page.locator("#q1-panels")
        assert box.locator("h3", has_text=TITLE).count() == 1 and box.locator("img").count() == 2
        assert page.locator("script").count() == 2 and page.locator("img[src='x']").count() == 0
        assert box.get_by_text(HOSTILE, exact=True).count() == 1  # shown as text
        assert problems == [], problems
        assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    finally:
        page.close()
