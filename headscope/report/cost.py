"""Question 3, what compression cost: each comparison found (compare.csv) as a table and a bar plot of what the
compressed model kept and lost against its original, capability by capability, each change with its interval.

A comparison is a compare.csv in a searched folder, found where the verbs write it:

- at the top of a folder: `headscope compare --out DIR`, or a prune / gqa / mla / kvcache `--out` folder whose
  check wrote compare.csv beside model/;
- `compare/<name>/compare.csv` inside a folder: a study's comparisons (`compare/prune`, `compare/gqa`, ...).

compare.json beside a compare.csv names the two models and holds the tolerance and the interval level; without
it the table is shown and the plot has no tolerance band. A compare.csv that cannot be used is named in one line
and the other comparisons are still shown.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .. import plots
from ..artifacts import COMPARE_CSV, COMPARE_JSON
from .causal import num
from .sources import Malformed, Part, Sources, data_url, json_beside, leads_out, within

__all__ = ["MOST_PLOTTED", "PLOT_NAMES", "VERDICTS", "comparisons", "cost_part"]

TITLE = "What it cost"
STUDY_FOLDER = "compare"  # a study writes compare/<prune|gqa|mla>/compare.csv
# compare.csv's verdicts (headscope.compare.verdict.VERDICTS; the report may not import compare, a test checks both)
VERDICTS = ("lost", "kept", "gained", "cannot tell")
NUMBERS = ("base", "other", "delta", "delta_lo", "delta_hi", "relative", "n")  # compare.csv's numeric columns
# comparisons drawn (each its own figure); more are shown as tables
MOST_PLOTTED = 8
PLOT_NAMES = {i: f"report-cost-{i}.png" for i in range(1, MOST_PLOTTED + 1)}


def comparisons(src: Sources) -> list[Path]:
    """Every compare.csv of the searched folders, in their order: at the top of each folder, then in each
    `compare/<name>/` subfolder (names sorted). A file reached through a symlink leading out of its folder is
    named in the problems and never opened."""
    found: list[Path] = []
    seen: set[Path] = set()
    for d in src.dirs:
        names = [COMPARE_CSV.name]
        sub = Path(d) / STUDY_FOLDER
        if sub.is_dir() and not sub.is_symlink():
            names += [f"{STUDY_FOLDER}/{p.name}/{COMPARE_CSV.name}" for p in sorted(sub.iterdir()) if p.is_dir()]
        for name in names:
            path = within(d, name)
            if path is None:
                if leads_out(d, name):
                    _leads_out(src, Path(d) / name, d)
                continue
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                found.append(path)
    return found


def _leads_out(src: Sources, path: Path, folder: Path) -> None:
    """Name a compare.csv that is a symlink out of its folder (once: `Sources.scan` names one at a folder's top)."""
    if not any(str(path) in note for note in src.problems.values()):
        src.problems[str(path)] = (f"{path} leads outside {str(folder)!r} (a symlink); headscope reads only files "
                                   f"inside the folders given: copy the file in instead")


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _reads_as_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def checked_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """compare.csv's rows when every verdict is one compare writes and every numeric cell a number (or empty)."""
    if not rows:
        raise Malformed("holds no capability")
    for r in rows:
        if r["verdict"] not in VERDICTS:
            raise Malformed(f"holds the verdict {str(r['verdict'])[:40]!r}; compare writes {', '.join(VERDICTS)}")
    for c in NUMBERS:
        cells = [r[c] for r in rows]
        # text among the numbers: pandas read the whole column as text
        if not all(_number(v) for v in cells):
            word = next((v for v in cells if not _reads_as_number(v)), next(v for v in cells if not _number(v)))
            raise Malformed(f"holds {str(word)[:40]!r} in its numeric column {c}")
    return rows


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _settings(src: Sources, path: Path) -> dict[str, Any]:
    """From compare.json beside compare.csv: the models' names, the tolerance and the interval level (each None
    when the file or the value is absent)."""
    doc = _dict(json_beside(src, path, COMPARE_JSON.name))
    settings = _dict(doc.get("settings"))
    tol = num(settings.get("tolerance"))
    level = num(_dict(settings.get("intervals")).get("level"))
    return {"base": _dict(doc.get("base")).get("name"), "other": _dict(doc.get("other")).get("name"),
            "tolerance": tol if 0 < tol < 1 else None, "level": level if 0 < level < 1 else None}


def relative_bounds(r: dict[str, Any]) -> tuple[float, float]:
    """The change's interval as shares of BASE's value (NaN when BASE's value is 0 or missing)."""
    base = abs(num(r["base"]))
    if not base or math.isnan(base):
        return math.nan, math.nan
    return num(r["delta_lo"]) / base, num(r["delta_hi"]) / base


def signed(v: Any) -> str:
    """A change as text, four significant digits (`n/a` when missing)."""
    x = num(v)
    return "n/a" if math.isnan(x) else f"{x:+.4g}"


def _table_row(r: dict[str, Any]) -> dict[str, Any]:
    rel = num(r["relative"])
    return {"capability": str(r["capability"]), "metric": str(r["metric"]),
            "BASE": f"{num(r['base']):.4g}", "OTHER": f"{num(r['other']):.4g}",
            "change [interval]": f"{signed(r['delta'])} [{signed(r['delta_lo'])}, {signed(r['delta_hi'])}]",
            "relative": "n/a" if math.isnan(rel) else f"{rel:+.1%}", "verdict": r["verdict"], "n": r["n"]}


def _bar(r: dict[str, Any]) -> dict[str, Any]:
    lo, hi = relative_bounds(r)
    drawn = "" if math.isfinite(num(r["relative"])) else ", BASE 0: not drawn"  # no share of a value of 0
    return {"label": f"{r['capability']} (n {r['n']}{drawn})", "relative": num(r["relative"]), "relative_lo": lo,
            "relative_hi": hi, "verdict": r["verdict"]}


def caption(s: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The panel's words, for a student: what each bar and each verdict means."""
    tol = f"{s['tolerance']:.0%}" if s["tolerance"] else "the tolerance"
    level = f"{s['level']:.0%} " if s["level"] else ""
    n = sorted({str(r["n"]) for r in rows})
    return [f"Each bar is how much OTHER's value of a capability moved from BASE's, as a share of BASE's value, "
            f"measured on the same items in both models; the black line is its {level}paired interval (the items "
            f"resampled for both models together). The grey band is the tolerance, +-{tol} of BASE's value"
            + ("" if s["tolerance"] else " (no compare.json beside the file: not drawn)") + ".",
            f"lost (red): the whole interval lies beyond the tolerance on the harmful side (perplexity up, a score "
            f"down); kept (blue): the whole interval lies inside it; gained (green): beyond it on the good side; "
            f"cannot tell (grey): the interval crosses an edge of the band, so more items are needed. n: the items "
            f"each row was measured on (passages, pairs or haystacks; here {', '.join(n)}); see docs/compare.md."]


def comparison_panel(part: Part, src: Sources, path: Path, i: int, figs: dict[str, bytes] | None) -> None:
    """One comparison's table and (the first MOST_PLOTTED) figure; a file that cannot be used, a one-line note."""
    t = src.table(COMPARE_CSV.name, path, one_of_several=True)
    try:
        rows = checked_rows(t.rows) if t is not None else None
    except Malformed as e:
        src.fault(COMPARE_CSV.name, str(e), path=path)
        rows = None
    if rows is None:
        part.panel("q3", f"{TITLE}: {path}", note=src.problems[str(path)])
        return
    s = _settings(src, path)
    base, other = s["base"] or "BASE", s["other"] or "OTHER"
    title = f"{TITLE}: {other} against {base}"
    plot = None
    if i in PLOT_NAMES:
        png = plots.cost_bars([_bar(r) for r in rows], s["tolerance"], f"{other} against {base}")
        if figs is not None:
            figs[PLOT_NAMES[i]] = png
            part.plots.append(PLOT_NAMES[i])
        plot = data_url(png)
    table = [_table_row(r) for r in rows]
    text = [f"BASE: {base}; OTHER: {other} ({path}).", *caption(s, rows)]
    part.panel("q3", title, list(table[0]), table, text=text, plot=plot)
    lost = [str(r["capability"]) for r in rows if r["verdict"] == "lost"]
    part.say("q3", f"Against {base}, {other} lost {len(lost)} of the {len(rows)} capabilities compared"
                   + (f" ({', '.join(lost)})" if lost else "") + f" ({path.name} in {path.parent}).")


def cost_part(src: Sources, figs: dict[str, bytes] | None = None) -> Part:
    """One panel per comparison found, at the end of question 3; nothing when no folder holds a compare.csv."""
    part = Part()
    for i, path in enumerate(comparisons(src), 1):
        comparison_panel(part, src, path, i, figs)
    return part
