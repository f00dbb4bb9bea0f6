"""The report's "what it cost" section: every compare.csv found (a `compare --out` folder, a compressing verb's
folder with compare.csv beside model/, a study's compare/<name>/) becomes a table and a bar plot coloured by
verdict; a malformed compare.csv is named in one line and the rest of the report is built."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.image import imread
from test_compare import bigram_pairs, planted_model
from test_report import IDS, page_data

import headscope
from headscope import plots
from headscope.artifacts import COMPARE_CSV
from headscope.compare.verdict import VERDICTS as COMPARE_VERDICTS
from headscope.models.tiny import tiny_model
from headscope.report import render_report
from headscope.report.build import figure_names
from headscope.report.cost import PLOT_NAMES, VERDICTS, comparisons, cost_part
from headscope.report.sources import Sources, clean

COLUMNS = COMPARE_CSV.columns()


def rows(*specs: tuple[str, float, float, float, float, str]) -> pd.DataFrame:
    """compare.csv rows from (capability, base, delta, delta_lo, delta_hi, verdict), n 16."""
    return pd.DataFrame([{"capability": c, "metric": "logit_diff", "base": b, "other": b + d, "delta": d,
                          "delta_lo": lo, "delta_hi": hi, "relative": d / abs(b), "verdict": v, "n": 16}
                         for c, b, d, lo, hi, v in specs], columns=COLUMNS)


def write_compare(folder: Path, table: pd.DataFrame, base: str | None = None, other: str | None = None,
                  tolerance: float = 0.05) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    table.to_csv(folder / "compare.csv", index=False)
    if base is not None:
        (folder / "compare.json").write_text(json.dumps({
            "settings": {"tolerance": tolerance, "intervals": {"level": 0.95}}, "notes": [], "rows": {},
            "base": {"name": base}, "other": {"name": other}, "provenance": {}}))
    return folder / "compare.csv"


PRUNE = rows(("lm", 42.0, 0.1, -0.6, 1.1, "kept"), ("greater-than", 7.3, -0.56, -0.64, -0.47, "lost"),
             ("induction", 12.8, -0.73, -1.15, -0.38, "cannot tell"))
GQA = rows(("ioi", 4.0, -4.8, -5.6, -4.0, "lost"), ("retrieval", 1.0, 0.2, 0.1, 0.3, "gained"))


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    """A real `compare --out` folder: the planted model against itself with its induction head zeroed."""
    d = tmp_path_factory.mktemp("cmp")
    got = headscope.compare(planted_model(), planted_model(zero=(1, 0)), tasks=("induction",),
                            pairs=(str(bigram_pairs(d / "bigram.jsonl")),), items=12, bootstrap=200)
    got.save(d / "out")
    return d / "out"


def test_a_compare_folder_is_a_table_and_a_plot_with_its_models_named(compared):
    part = cost_part(Sources.scan([compared]), figs := {})
    (panel,) = part.panels
    assert panel["place"] == "q3" and panel["title"] == "What it cost: planted-L1H0-zeroed against planted"
    csv = pd.read_csv(compared / "compare.csv")
    assert [r["capability"] for r in panel["rows"]] == list(csv["capability"])
    assert [r["verdict"] for r in panel["rows"]] == list(csv["verdict"]) == ["lost", "kept"]
    ind = clean(csv.iloc[0].to_dict())  # the report reads numbers to 5 significant digits, then shows 4
    assert panel["rows"][0]["change [interval]"] == \
        f"{ind['delta']:+.4g} [{ind['delta_lo']:+.4g}, {ind['delta_hi']:+.4g}]"
    assert panel["rows"][0]["n"] == 12 and panel["rows"][0]["relative"] == f"{ind['relative']:+.1%}"
    assert panel["plot"].startswith("data:image/png;base64,") and list(figs) == [PLOT_NAMES[1]]
    words = " ".join(panel["text"])
    assert "+-5% of BASE's value" in words and "95% paired interval" in words and "lost (red)" in words
    assert "planted-L1H0-zeroed lost 1 of the 2 capabilities compared (induction)" in " ".join(part.text["q3"])


def test_a_verb_check_folder_and_a_study_folder_each_give_their_comparisons(tmp_path):
    check = tmp_path / "prune-run"
    (check / "model").mkdir(parents=True)
    write_compare(check, PRUNE, "smollm2", "prune-run/model")
    study = tmp_path / "study"
    write_compare(study / "compare" / "prune", PRUNE, "smollm2", "pruned")
    write_compare(study / "compare" / "gqa", GQA)  # no compare.json: models unnamed, no tolerance band
    src = Sources.scan([check, study])
    assert comparisons(src) == [check / "compare.csv", study / "compare/gqa/compare.csv",
                                study / "compare/prune/compare.csv"]
    part = cost_part(src, figs := {})
    titles = [p["title"] for p in part.panels]
    assert titles == ["What it cost: prune-run/model against smollm2", "What it cost: OTHER against BASE",
                      "What it cost: pruned against smollm2"]
    assert sorted(figs) == sorted(PLOT_NAMES[i] for i in (1, 2, 3))
    assert "(no compare.json beside the file: not drawn)" in " ".join(part.panels[1]["text"])
    assert [r["verdict"] for r in part.panels[1]["rows"]] == ["lost", "gained"]
    assert not src.problems


def test_a_folder_given_twice_is_one_comparison(tmp_path):
    write_compare(tmp_path / "c", PRUNE, "a", "b")
    assert len(comparisons(Sources.scan([tmp_path / "c", tmp_path / "c" / "."]))) == 1


@pytest.mark.parametrize("fault, said", [
    (lambda t: t.assign(verdict=["kept", "perhaps", "lost"]), "holds the verdict 'perhaps'"),
    (lambda t: t.assign(delta_lo=["-0.6", "low", "-1"]), "holds 'low' in its numeric column delta_lo"),
    (lambda t: t.drop(columns=["delta_hi"]), "lacks the declared column delta_hi"),
    (lambda t: t.iloc[:0], "holds no capability"),
])
def test_a_malformed_compare_csv_is_named_in_one_line_and_the_rest_is_built(tmp_path, fault, said):
    study = tmp_path / "study"
    write_compare(study / "compare" / "gqa", GQA, "smollm2", "gqa")
    bad = write_compare(study / "compare" / "mla", fault(PRUNE), "smollm2", "mla")
    src = Sources.scan([study])
    part = cost_part(src, {})
    assert [p["title"] for p in part.panels] == ["What it cost: gqa against smollm2", f"What it cost: {bad}"]
    note = src.problems[str(bad)]
    assert note.startswith(f"{bad} ") and said in note and "\n" not in note, note
    assert part.panels[1]["note"] == note and part.panels[0]["rows"]


def test_the_report_page_shows_the_comparisons_and_names_the_bad_one(tmp_path):
    bert = tiny_model("bert", init_std=0.2)
    study = tmp_path / "study"
    write_compare(study / "compare" / "prune", PRUNE, "tiny", "pruned")
    bad = write_compare(study / "compare" / "gqa", GQA.assign(n=["many", 3]), "tiny", "gqa")
    out = tmp_path / "report"
    path = render_report(out, model=bert, from_dirs=[study], data=IDS, sentences=0)
    d = page_data(path.read_text(encoding="utf-8"))
    cost = [p for p in d["panels"] if p["title"].startswith("What it cost")]
    assert [p["title"] for p in cost] == [f"What it cost: {bad}", "What it cost: pruned against tiny"]
    assert any(str(bad) in p and "numeric column n" in p for p in d["problems"]), d["problems"]
    assert d["columns"]["entropy_norm"]  # the rest of the report is there
    # the one drawn comparison's figure beside the page; the bad one has none
    assert (out / PLOT_NAMES[2]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (out / PLOT_NAMES[1]).exists()


def test_every_figure_name_is_declared_and_the_verdicts_are_compares():
    assert set(PLOT_NAMES.values()) <= set(figure_names())
    assert VERDICTS == COMPARE_VERDICTS == tuple(plots.VERDICT_COLOURS)


def test_the_bars_are_coloured_by_verdict_with_their_intervals():
    fig, ax = plots.figure(5, 3)
    got = [{"label": v, "relative": r, "relative_lo": r - 0.02, "relative_hi": r + 0.03, "verdict": v}
           for v, r in zip(VERDICTS, (-0.4, 0.01, 0.3, -0.05), strict=True)]
    bars = plots.draw_cost_bars(ax, got, 0.05)
    assert [b.get_facecolor() for b in bars] == [to_rgba(plots.VERDICT_COLOURS[v]) for v in VERDICTS]
    assert [round(b.get_width(), 6) for b in bars] == [-0.4, 0.01, 0.3, -0.05]
    assert [b.get_y() + b.get_height() / 2 for b in bars] == [3, 2, 1, 0]  # the first row at the top
    (segments,) = [c.get_segments() for c in ax.collections if isinstance(c, LineCollection)]
    assert [(round(s[0][0], 6), round(s[1][0], 6)) for s in segments] == [(-0.42, -0.37), (-0.01, 0.04),
                                                                          (0.28, 0.33), (-0.07, -0.02)]
    assert sorted(t.get_text() for t in ax.get_legend().get_texts()) == sorted(["tolerance +-5%", *VERDICTS])


def red_pixels(png: bytes) -> int:
    img = imread(io.BytesIO(png))[..., :3]
    red = np.array(to_rgba(plots.VERDICT_COLOURS["lost"])[:3])
    return int((np.abs(img - red).max(-1) < 0.02).sum())


def test_a_lost_row_is_red_in_the_figure_and_none_is_without_one():
    kept = [{"label": "lm", "relative": 0.01, "relative_lo": 0.0, "relative_hi": 0.02, "verdict": "kept"}]
    lost = [*kept, {"label": "ioi", "relative": -0.6, "relative_lo": -0.7, "relative_hi": -0.5, "verdict": "lost"}]
    assert red_pixels(plots.cost_bars(kept, 0.05, "t")) == 0
    assert red_pixels(plots.cost_bars(lost, 0.05, "t")) > 100


def test_a_compare_csv_through_a_symlink_out_of_the_folder_is_named_not_read(tmp_path):
    outside = write_compare(tmp_path / "outside", PRUNE, "a", "b")
    study = tmp_path / "study"
    (study / "compare" / "prune").mkdir(parents=True)
    (study / "compare" / "prune" / "compare.csv").symlink_to(outside)
    src = Sources.scan([study])
    part = cost_part(src, {})
    assert not part.panels and any("leads outside" in p for p in src.problems.values())
