"""Run a sweep resumably: each finished configuration goes to runs/<key>.json at once, and sweep.csv
is rewritten (atomically) after it; a rerun reuses every configuration whose key already has a result."""

from __future__ import annotations

import json
import logging
import platform
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import torch

from ...artifacts import SWEEP_CSV, SWEEP_RUNS
from ...artifacts import write_csv as write_artifact_csv
from ...errors import HeadscopeError
from ...io import atomic_write_text
from ...provenance import provenance, shape_record
from .config import SWEEP_VERSION, SweepConfig, config_key
from .corpora import load_corpus
from .tasks import synthetic_fingerprint
from .training import train_config

log = logging.getLogger(__name__)

__all__ = ["CSV_COLUMNS", "Run", "run_provenance", "run_sweep", "save_run", "sweep_runs", "write_csv"]

CSV_COLUMNS = SWEEP_CSV.columns()


def run_provenance(cfg: SweepConfig, data_fp: str) -> dict[str, object]:
    """The provenance record of one configuration's run: a model trained from scratch on `cfg.task`."""
    model = {"name": cfg.label, "source": "trained from scratch by headscope sweep", "model_type": "sweep",
             "shape": shape_record(cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.head_dim)}
    data = {"source": cfg.task if cfg.task != "ptb" else f"ptb ({cfg.tokenization} tokens)", "sha256": data_fp}
    return provenance("sweep", model_info=model, data=data, options=asdict(cfg))


def write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    """sweep.csv at `path`: the declared columns, one row per configuration (the loss curves stay in runs/).

    Through `headscope.artifacts.write_csv`, the one row writer; a row read back from an older runs/<key>.json
    may lack a later column (an empty cell) and holds keys that are not columns."""
    if path.name != SWEEP_CSV.name:
        raise HeadscopeError(f"the sweep's table is written as {SWEEP_CSV.name}, not {path.name!r}")
    write_artifact_csv(path.parent, SWEEP_CSV, rows, CSV_COLUMNS)


@dataclass
class Run:
    """One configuration's result: its row, and the record runs/<key>.json holds (`reused`: read from there)."""

    cfg: SweepConfig
    key: str
    row: dict[str, object]
    record: dict[str, object]
    reused: bool


def sweep_runs(
    configs: Sequence[SweepConfig], saved: str | Path | None = None, force: bool = False, progress: bool = True,
    on_step: Callable[[SweepConfig, int, float], None] | None = None,
) -> Iterator[Run]:
    """Each configuration's run, in order: read from `saved`/runs/<key>.json when a finished one is there (not with
    `force`), else trained. Writes nothing."""
    runs = Path(saved) / SWEEP_RUNS.name if saved is not None else None
    corpus = None
    if any(c.task == "ptb" for c in configs):
        toks = {c.tokenization for c in configs if c.task == "ptb"}
        if len(toks) > 1:
            raise HeadscopeError(f"one sweep uses one tokenization; got {sorted(toks)}")
        corpus = load_corpus("ptb", toks.pop())
    for cfg in configs:
        data_fp = corpus.fingerprint if cfg.task == "ptb" and corpus is not None else synthetic_fingerprint(cfg.task)
        key = config_key(cfg, data_fp)
        path = runs / f"{key}.json" if runs is not None else None
        if path is not None and path.exists() and not force:
            record = _saved_record(path, key)
            log.info("%s: already finished (%s), skipped", cfg.label, path)
            yield Run(cfg, key, cast(dict, record["row"]), record, reused=True)
            continue
        result = train_config(cfg, corpus if cfg.task == "ptb" else None, progress=progress, on_step=on_step)
        assert isinstance(result, dict), "train_config returns the row alone unless return_model=True"
        row = result
        row["key"] = key
        record = {"key": key, "config": asdict(cfg), "data": data_fp, "version": SWEEP_VERSION,
                  "torch": torch.__version__, "python": platform.python_version(), "row": row,
                  "provenance": run_provenance(cfg, data_fp)}
        yield Run(cfg, key, row, record, reused=False)


def save_run(out: str | Path, run: Run, rows: list[dict[str, object]]) -> None:
    """`out/runs/<key>.json` (unless reused from there), then `out/sweep.csv` of `rows`, both atomically."""
    out = Path(out)
    path = out / SWEEP_RUNS.name / f"{run.key}.json"
    if not (run.reused and path.exists()):
        atomic_write_text(path, json.dumps(run.record, indent=1, sort_keys=True))
    write_csv(out / SWEEP_CSV.name, rows)


def run_sweep(
    configs: Sequence[SweepConfig], out: str | Path, force: bool = False, progress: bool = True,
    on_step: Callable[[SweepConfig, int, float], None] | None = None,
    on_config_done: Callable[[SweepConfig, dict[str, object], bool], None] | None = None,
) -> list[dict[str, object]]:
    """Train every configuration not already finished in `out` (all of them with `force`); return all rows.

    After each configuration: `out/runs/<key>.json` (the row and its full config), then `out/sweep.csv`
    (rows of `configs` finished so far, in order), both written atomically. `on_config_done(cfg, row,
    reused)` is called for each configuration, `reused` True when its result was loaded, not trained.
    """
    rows: list[dict[str, object]] = []
    for run in sweep_runs(configs, out, force, progress, on_step):
        rows.append(run.row)
        save_run(out, run, rows)
        if on_config_done is not None:
            on_config_done(run.cfg, run.row, run.reused)
    return rows


def _saved_record(path: Path, key: str) -> dict[str, object]:
    """The record a finished configuration left in `path`, its row checked (a damaged or edited file is named)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        row = record["row"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HeadscopeError(f"{path} is damaged ({type(e).__name__}: {e}); delete it to train that configuration "
                             f"again, or pass force=True", fields=("force",)) from None
    if not isinstance(row, dict) or row.get("key") != key:
        raise HeadscopeError(f"{path} is damaged (its row is not the result of configuration {key}); delete it to "
                             f"train that configuration again, or pass force=True", fields=("force",))
    return record
