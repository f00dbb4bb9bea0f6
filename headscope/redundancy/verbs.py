"""Question 3's verbs as library functions: each takes a loaded model, the data and its Options, writes
nothing, and returns a result the CLI saves and prints (`headscope.options.Result`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from .. import plots
from ..artifacts import (
    IMPORTANCE_CSV,
    IMPORTANCE_JSON,
    MODEL_DIR,
    PRUNE_CURVE_CSV,
    PRUNE_CURVE_PNG,
    PRUNE_JSON,
    RANK_CORRELATION_CSV,
    REDUNDANCY_CSV,
    TASK_CORRELATION_CSV,
    TASK_SPECIFIC_CSV,
    TASKS_CSV,
    TASKS_JSON,
    UNIT_CURVE_CSV,
    UNIT_CURVE_PNG,
    UNIT_IMPORTANCE_CSV,
    UNIT_IMPORTANCE_JSON,
    UNITS_JSON,
    write_csv,
)
from ..data import TextSource
from ..eval.evaluate import read_task_data
from ..heads import Head
from ..io import atomic_write_text
from ..models.adapter import HeadModel
from ..models.checkpoint import plain_shape, save_model
from ..options import OptionError, Result, check_data
from ..provenance import provenance
from ..table import HeadTable, grid, parse_head
from .curves import CurveResult, prune_curve
from .curves.text import curve_lines, unit_curve_lines
from .importance import CRITERIA, ScoreSettings, parse_methods, rank_correlations, score_units
from .importance import score as score_table
from .importance.tasks import (
    check_tasks_usable,
    parse_tasks,
    task_correlation_intervals,
    task_correlations,
    task_importance,
    task_specific,
)
from .options import DEFAULT_METHODS, PruneOptions, ScoreOptions, TasksOptions
from .protect import check_model as check_protect
from .pruning.heads import n_parameters
from .records import PruneSummary, TaskCorrelation, TaskSpecific, UnitRow, UnitScoreMeta


def parse_pruned(text: str | None, n_layers: int, n_heads: int) -> torch.Tensor | None:
    """A gate tensor with the listed heads at 0 (None when nothing is listed)."""
    if not text:
        return None
    gates = torch.ones(n_layers, n_heads)
    for item in text.split(","):
        if item.strip():
            layer, head = parse_head(item)
            if not (0 <= layer < n_layers and 0 <= head < n_heads):
                raise OptionError("pruned", f"names head {item.strip()}, which does not exist; the model has "
                                            f"L0..L{n_layers - 1} and H0..H{n_heads - 1}")
            gates[layer, head] = 0
    # nothing left to score: every importance would be NaN and every Spearman undefined
    if not gates.any():
        raise OptionError("pruned", f"lists all {n_layers * n_heads} heads; leave at least one head unpruned "
                                    f"to score")
    return gates


@dataclass
class ScoreResult(Result):
    """Head importance by each criterion, with intervals: importance.csv/.json and rank_correlation.csv."""

    table: HeadTable
    correlations: pd.DataFrame
    name: str
    files = (IMPORTANCE_CSV.name, IMPORTANCE_JSON.name, RANK_CORRELATION_CSV.name)

    def to_pandas(self) -> pd.DataFrame:
        return self.table.to_pandas()

    def write(self, folder: Path) -> None:
        self.table.to_csv(folder / IMPORTANCE_CSV.name)
        self.table.to_json(folder / IMPORTANCE_JSON.name)
        atomic_write_text(folder / RANK_CORRELATION_CSV.name,
                          self.correlations.to_csv(float_format="%.4f", lineterminator="\n"))

    def lines(self) -> list[str]:
        m = self.table.meta
        extra = f" (perplexity {m['metric_details']['perplexity']:.2f})" if "perplexity" in m["metric_details"] else ""
        out = [f"{self.name}: {m['n_layers']} layers x {m['n_heads']} heads, {m['passages']} passages, "
               f"{m['tokens_seen']} tokens from {m['data']}; metric {m['metric']} = {m['metric_value']:.4f}{extra}"]
        for method in m["methods"]:
            out += [""] + self._method_lines(method)
        out += ["", "Spearman rank correlation between criteria:", self.correlations.round(2).to_string()]
        return out + self._uncertainty_lines()

    def _method_lines(self, method: str) -> list[str]:
        table, m = self.table, self.table.meta
        col = f"importance_{method}"
        about = CRITERIA.get(method).help
        values, factor = _scaled(table[col])
        shown = grid(table, col, about) if _fits(table[col]) else \
            grid(table.with_columns({col: values}), col, f"{about}; shown x{factor:g}")
        top = [t for t in table.top(col, 5) if t[2] == t[2]]
        lo, hi = table[f"{col}_lo"], table[f"{col}_hi"]
        if method in m.get("learned", {}):
            r = m["learned"][method]
            return [shown, "  top: " + ", ".join(f"{Head(l, h)} {v:.4g}" for l, h, v in top)
                    + f"  (learned in {r['steps_done']} steps, {r['closed_units']} of {r['units']} gates closed; "
                      f"no interval: learned over all passages)"]
        return [shown, "  top: " + ", ".join(f"{Head(l, h)} {v:.4g} [{lo[l, h]:.3g}, {hi[l, h]:.3g}]"
                                             for l, h, v in top)]

    def _uncertainty_lines(self) -> list[str]:
        """Each ranking's split-half stability, the correlations' intervals, and what --until-stable reached."""
        m = self.table.meta
        iv = m["intervals"]
        out = ["", f"uncertainty ({iv['level']:.0%} {iv['method']} bootstrap over {m['passages']} passages, "
                   f"{iv['B']} resamples; intervals in importance.csv as importance_<method>_lo/_hi):"]
        for method, st in m["stability"].items():
            out.append(f"  {method:<14} split-half Spearman {st['spearman']:.2f}, {st['spearman_brown']:.2f} for all "
                       f"passages (Spearman-Brown); {st['overlap']:.1f} of the {st['k']} least important heads "
                       f"shared")
        for c in m["rank_correlations"]:
            out.append(f"  Spearman {c['a']} vs {c['b']}: {c['spearman']:.2f} [{c['lo']:.2f}, {c['hi']:.2f}]")
        u = m.get("until_stable")
        if u:
            state = "reached" if u["reached"] else "NOT reached"
            out.append(f"  --until-stable {u['target']}: {state} with {u['passages']} of the {u['available']} "
                       f"passages available" + ("" if u["reached"] else "; raise --limit or give more data"))
        return out


@dataclass
class UnitScoreResult(Result):
    """Importance of units beyond heads (attention sub-layers, blocks, FFN neurons): unit_importance.csv/.json."""

    unit: str
    # unit_importance.csv's rows: unit, layer, index, importance_<method>
    rows: list[UnitRow]
    meta: UnitScoreMeta
    name: str
    files = (UNIT_IMPORTANCE_CSV.name, UNIT_IMPORTANCE_JSON.name)

    def records(self) -> list[dict[str, Any]]:
        """unit_importance.csv's rows as JSON objects, their keys in the order score_units gave them."""
        return [r.to_json() for r in self.rows]

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.records())

    def write(self, folder: Path) -> None:
        write_csv(folder, UNIT_IMPORTANCE_CSV, self.records())
        atomic_write_text(folder / UNIT_IMPORTANCE_JSON.name,
                          json.dumps(self.meta.to_json(), indent=2, default=str) + "\n")

    def lines(self) -> list[str]:
        meta = self.meta
        out = [f"{self.name}: {self.unit} importance on {meta.passages} passages, metric {meta.metric} = "
               f"{meta.metric_value:.4f}"]
        for m in meta.methods:
            if self.unit == "ffn":
                per_layer: dict[int, list[float]] = {}
                for r in self.rows:
                    per_layer.setdefault(r.layer, []).append(r.importance(m))
                out.append(f"  {m}: per-layer mean "
                           + " ".join(f"L{l}:{sum(v) / len(v):.3g}" for l, v in per_layer.items()))
            else:
                order = sorted(self.rows, key=lambda r: r.importance(m))
                seconds = next(v for k, v in meta.seconds.items() if m in k.split("+"))
                out.append(f"  {m} ({seconds:.1f} s), least important first: "
                           + " ".join(f"L{r.layer}:{r.importance(m):.3g}" for r in order))
        return out


def score(hm: HeadModel, data: Any = None, options: ScoreOptions | None = None, *, progress: bool = False,
          **changes: Any) -> ScoreResult | UnitScoreResult:
    """`headscope score` on a loaded model: every head (or unit) scored by each criterion, with intervals.

    `data`: passages, a TextSource, a labelled jsonl or a corpus name / file (read with `options.limit`).
    Keywords override single options: `score(hm, texts, methods=("taylor",))`.
    """
    check_data(data)
    opts = (options or ScoreOptions()).replace(**changes).validate()
    source = read_task_data(opts.data if data is None else data, opts.limit) if data is None or \
        isinstance(data, (str, Path)) else data
    prov = provenance("score", hm, source, opts.with_only())  # before scoring: the model as loaded
    limit = opts.limit if isinstance(source, str) else None
    if opts.unit != "head":
        methods = None if opts.methods in (None, ("all",)) else [m for m in opts.methods if m]
        rows, meta = score_units(hm, source, opts.unit, methods, metric=opts.metric, max_length=opts.max_length,
                                 batch_size=opts.batch_size, seed=opts.seed, limit=limit, progress=progress)
        return UnitScoreResult(unit=opts.unit, rows=[UnitRow.from_json(r) for r in rows],
                               meta=UnitScoreMeta.from_json({**meta, "provenance": prov}), name=hm.name)
    methods = parse_methods(",".join(opts.methods or DEFAULT_METHODS))
    l0 = opts.l0_settings(0.5)
    extra = {"l0": {"settings": l0}} if "l0" in methods else {}
    gates = parse_pruned(opts.pruned, hm.n_layers, hm.n_heads)
    settings = ScoreSettings(methods=methods, metric=opts.metric, max_length=opts.max_length,
                             batch_size=opts.batch_size, ig_steps=opts.ig_steps, seed=opts.seed, limit=limit,
                             intervals=opts.intervals(), until_stable=opts.until_stable,
                             criterion_settings=extra)
    table = score_table(hm, source, settings, gates=gates, progress=progress)
    corr = rank_correlations(table)
    return ScoreResult(table=table.with_columns(meta={"provenance": prov}), correlations=corr, name=hm.name)


@dataclass
class TasksResult(Result):
    """Head importance under several tasks: tasks.csv, task_correlation.csv, task_specific.csv, tasks.json."""

    table: HeadTable
    correlations: pd.DataFrame
    intervals: list[TaskCorrelation]  # each pair of tasks' Spearman with its interval over heads
    # heads in the top 10% of one task and the bottom half of another
    specific: list[TaskSpecific]
    name: str
    files = (TASKS_CSV.name, TASK_CORRELATION_CSV.name, TASK_SPECIFIC_CSV.name, TASKS_JSON.name)

    def to_pandas(self) -> pd.DataFrame:
        return self.table.to_pandas()

    def write(self, folder: Path) -> None:
        buf = io.StringIO()
        fields = [f.name for f in TASK_SPECIFIC_CSV.fields]
        w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        for r in self.specific:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.to_json().items()})
        self.table.to_csv(folder / TASKS_CSV.name)
        self.table.to_json(folder / TASKS_JSON.name)
        atomic_write_text(folder / TASK_CORRELATION_CSV.name,
                          self.correlations.to_csv(float_format="%.4f", lineterminator="\n"))
        atomic_write_text(folder / TASK_SPECIFIC_CSV.name, buf.getvalue())

    def lines(self) -> list[str]:
        table, corr = self.table, self.correlations
        out = [f"{self.name}: {table.n_layers} layers x {table.n_heads} heads; tasks "
               + ", ".join(f"{t} ({s:.0f} s)" for t, s in table.meta["seconds"].items()),
               "", "Spearman rank correlation between tasks [95% interval over heads: Fisher z, Bonett-Wright "
                   "variance; the noise of each task's data is not in it]:"]
        names = list(corr.columns)
        cell = {(c.a, c.b): f"{c.spearman:.2f} [{c.lo:.2f}, {c.hi:.2f}]" for c in self.intervals}
        width = max([len(n) for n in names] + [18])
        out.append(" " * width + "".join(f"  {n:>{width}}" for n in names))
        for a in names:
            row = [cell.get((a, b)) or cell.get((b, a)) or ("1" if a == b else "-") for b in names]
            out.append(f"{a:<{width}}" + "".join(f"  {v:>{width}}" for v in row))
        pairs: dict[tuple[str, str], list[str]] = {}
        for r in self.specific:
            pairs.setdefault((r.task, r.other), []).append(r.head)
        if pairs:
            out += ["", "heads in the top 10% for one task and the bottom half for another:"]
            for (t, o), heads in pairs.items():
                out.append(f"  {t} not {o}: {' '.join(heads)}")
        return out


def tasks(hm: HeadModel, data: str | Sequence[str] | None = None, options: TasksOptions | None = None, *,
          progress: bool = False, **changes: Any) -> TasksResult:
    """`headscope tasks` on a loaded model: every head's importance under each task and the tasks' rank correlation.

    `data`: the tasks, as `--tasks` takes them ("lm_ptb,wordsim", or a list of names; a task's own data after
    '=', e.g. "classification=labels.jsonl"); None: `options.tasks`. Keywords override single options:
    `tasks(hm, "fidelity,wordsim", limit=32)`.
    """
    if data is not None:
        names = isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data)
        if not isinstance(data, str) and not names:
            raise OptionError("data", f"names the tasks: text like 'lm_ptb,wordsim' or a list of task names; got "
                                      f"{type(data).__name__} {data!r}"[:300])
        changes["tasks"] = data if isinstance(data, str) else ",".join(data)
    opts = (options or TasksOptions()).replace(**changes).validate()
    chosen = parse_tasks(opts.tasks)
    check_tasks_usable(hm, chosen)
    prov = provenance("tasks", hm, None, opts.with_only())
    table = task_importance(hm, chosen, method=opts.method, limit=opts.limit, max_length=opts.max_length,
                            batch_size=opts.batch_size, seed=opts.seed, progress=progress)
    corr = task_correlations(table)
    intervals = task_correlation_intervals(table)
    specific = task_specific(table)
    table = table.with_columns(meta={"provenance": prov, "correlation_intervals": {
        "level": 0.95, "method": "Fisher z over heads, Bonett-Wright variance (the tasks' data noise not included)",
        "pairs": intervals}})
    return TasksResult(table=table, correlations=corr, intervals=[TaskCorrelation.from_json(c) for c in intervals],
                       specific=[TaskSpecific.from_json(r) for r in specific], name=hm.name)


@dataclass
class PruneData:
    """What `prune` reads besides the model, read once: the scoring passages and the held-out ones."""

    source: Any
    heldout: Any = None


def read_prune_data(options: PruneOptions, data: Any = None) -> PruneData:
    """The scoring data (`data` as `prune` takes it, else `options.data`) and `options.heldout`, read here."""
    source = read_task_data(options.data if data is None else data, options.limit) if data is None or \
        isinstance(data, (str, Path)) else data
    heldout = read_task_data(options.heldout, options.heldout_limit or options.limit) if options.heldout else None
    return PruneData(source, heldout)


@dataclass
class PruneResult(Result):
    """A pruning curve: prune_curve.csv/.png, redundancy.csv and prune.json (units beyond heads: unit_curve.csv/.png
    and units.json), and model/ with --save-model."""

    curve: CurveResult
    summary: PruneSummary  # prune.json (units.json)
    model: HeadModel | None = None  # the physically pruned model (save_model)

    def __post_init__(self) -> None:
        heads = self.curve.scope == "heads"
        names = (PRUNE_CURVE_CSV, PRUNE_CURVE_PNG, REDUNDANCY_CSV, PRUNE_JSON) if heads else \
            (UNIT_CURVE_CSV, UNIT_CURVE_PNG, UNITS_JSON)
        self.files = tuple(a.name for a in names) + ((MODEL_DIR.name,) if self.model is not None else ())

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.curve.records())

    def write(self, folder: Path) -> None:
        """The curve's CSV, figure and JSON (prune_curve.* and redundancy.csv, or unit_curve.* and units.json)."""
        res = self.curve
        if self.model is not None:
            save_model(self.model, folder / MODEL_DIR.name)
        heads = res.scope == "heads"
        records = res.records()
        write_csv(folder, PRUNE_CURVE_CSV if heads else UNIT_CURVE_CSV, records)
        if heads:
            write_csv(folder, REDUNDANCY_CSV, res.redundancy())
        title = f"{res.model}: pruning by {res.method}" if heads else f"{res.model}: {res.unit} by {res.method}"
        plots.pruning_curve(records, metric=res.metric, baseline=res.baseline if heads else None,
                            target_drop=res.target_drop if heads else None, higher_is_better=res.higher_is_better,
                            recover_steps=res.recover_steps, title=title,
                            path=folder / (PRUNE_CURVE_PNG if heads else UNIT_CURVE_PNG).name)
        atomic_write_text(folder / (PRUNE_JSON if heads else UNITS_JSON).name,
                          json.dumps(self.summary.to_json(), indent=2, default=str) + "\n")

    def lines(self) -> list[str]:
        # the curve's printout reads prune.json's object (redundancy/curves/text.py)
        out = (curve_lines if self.curve.scope == "heads" else unit_curve_lines)(self.curve, self.summary.to_json())
        stable = self.summary.until_stable
        if stable is not None:
            state = "reached" if stable.reached else "NOT reached"
            out.append(f"--until-stable {stable.target}: {state} with {stable.passages} of the "
                       f"{stable.available} scoring passages" + ("" if stable.reached else
                                                                 "; raise --limit or give more data"))
        return out


def prune(hm: HeadModel, data: Any = None, options: PruneOptions | None = None, *, checkpoint: Path | None = None,
          progress: bool = False, **changes: Any) -> PruneResult:
    """`headscope prune` on a loaded model: the pruning curve (re-scored after each step, with recovery and
    intervals), redundancy per layer and, with `save_model=True`, the smaller model.

    `data`: the scoring passages (a TextSource, passages, a labelled jsonl or a corpus name / file read with
    `options.limit`) or a `PruneData` already read; the held-out text is `options.heldout`. `checkpoint`: a
    folder where an interrupted curve keeps its finished points and resumes from them (the CLI's --out); None
    writes nothing. Keywords override single options: `prune(hm, texts, fraction=0.5, step=0.25)`.
    """
    check_data(data)
    opts = (options or PruneOptions()).replace(**changes).validate()
    if opts.heads:
        opts = opts.replace(method=opts.method or "gradient")  # recorded as chosen in prune.json's provenance
    # a capability the family cannot do: refused before any forward
    check_protect(hm, opts.protect)
    read = data if isinstance(data, PruneData) else read_prune_data(opts, data)
    source = read.source
    stable = _until_stable(hm, source, opts, progress) if opts.until_stable is not None else None
    if stable is not None:
        source = TextSource(source.texts[:stable["passages"]], source.source)
    prov = provenance("prune", hm, source, opts.with_only(), heldout=read.heldout)  # before pruning: as loaded
    res = prune_curve(hm, source, opts, heldout=read.heldout, checkpoint=checkpoint, progress=progress)
    summary = res.summary()
    if stable is not None:
        summary["until_stable"] = stable
    small = None
    if opts.save_model:
        small = res.pruned_model(hm)
        summary["saved_model"] = _saved(hm, small, res, Path(opts.out) / MODEL_DIR.name)
    summary["provenance"] = prov
    return PruneResult(curve=res, summary=PruneSummary.from_json(summary), model=small)


def _until_stable(hm: Any, data: Any, opts: PruneOptions, progress: bool) -> dict[str, Any]:
    """How many of the scoring passages the unpruned ranking by --method needs to reach --until-stable (read in
    chunks, as `score --until-stable`); the curve then scores on those passages only."""
    if not isinstance(data, TextSource):
        raise OptionError("until_stable", "reads plain passages; labelled jsonl data is scored whole")
    settings = ScoreSettings(methods=(str(opts.method),), metric=opts.metric, max_length=opts.max_length,
                             batch_size=opts.batch_size, seed=opts.seed, until_stable=opts.until_stable)
    table = score_table(hm, data, settings, progress=progress)
    return dict(table.meta["until_stable"])


def _saved(hm: Any, small: HeadModel, res: CurveResult, path: Path) -> dict[str, Any]:
    """What prune.json says about the physically pruned model written to `path` (OUT/model): its size."""
    info: dict[str, Any] = {"path": str(path), "parameters": n_parameters(small),
                            "parameters_original": n_parameters(hm),
                            # an ordinary config (plain from_pretrained) where transformers accepts the shape
                            # (save_model decides by the same rule), else its own model_type (trust_remote_code)
                            "plain_config": not (small.pruned or small.ffn_pruned) or plain_shape(small) is not None}
    if res.scope == "heads":
        info.update({"heads_kept": sum(small.heads_in_layer(l) for l in range(small.n_layers)),
                     "recovered_weights": bool(res.recover_steps)})
    return info


def _fits(values: np.ndarray) -> bool:
    """Whether a column reads well with two decimals."""
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v)]
    return v.size == 0 or 0.05 <= v.max() < 1000


def _scaled(values: np.ndarray) -> tuple[np.ndarray, float]:
    """The column times a power of ten that brings its largest magnitude into [1, 10)."""
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v)]
    if v.size == 0 or v.max() == 0:
        return np.asarray(values, float), 1.0
    factor = 10.0 ** (-np.floor(np.log10(v.max())))
    return np.asarray(values, float) * factor, float(factor)
