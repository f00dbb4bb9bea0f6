"""`sweep` as a library function: small LMs trained from scratch at fixed d_model, varying the number of heads;
nothing written until `SweepResult.save` (the CLI saves each configuration as it finishes, to resume)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..artifacts import SWEEP_CSV, SWEEP_RUNS
from ..io import atomic_write_text
from ..options import Result
from .options import SweepOptions
from .sweep import plan_sweep, plot_sweep
from .sweep.plots import FIGURES
from .sweep.resumable import Run, sweep_runs, write_csv


@dataclass
class SweepResult(Result):
    """Every configuration's run: sweep.csv, runs/<key>.json, sweep_quality.png and sweep_speed.png."""

    runs: list[Run]
    task: str
    files = (SWEEP_CSV.name, SWEEP_RUNS.name, *FIGURES.values())

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [run.row for run in self.runs]

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def write(self, folder: Path) -> None:
        for run in self.runs:
            atomic_write_text(folder / SWEEP_RUNS.name / f"{run.key}.json",
                              json.dumps(run.record, indent=1, sort_keys=True))
        write_csv(folder / SWEEP_CSV.name, self.rows)
        self.plot(folder)

    def plot(self, folder: str | Path) -> list[Path]:
        """The figures alone, into `folder` (the CLI saved every run as it finished)."""
        return plot_sweep(self.rows, folder)

    def lines(self) -> list[str]:
        quality = "val_acc" if self.task != "ptb" else "val_bits_per_token"
        out = [f"{'heads':>5} {'kv':>3} {'d_head':>6} {'params':>9} {'fwd MFLOP/tok':>13} {'KV B/tok':>8} "
               f"{'val_loss':>8} {quality:>18} {'tok/s':>7} {'tok/cpu-s':>9}"]
        for r in self.rows:
            out.append(f"{r['n_heads']:>5} {r['n_kv_heads']:>3} {r['d_head']:>6} {r['params']:>9} "
                       f"{r['flops_per_token'] / 1e6:>13.2f} {r['kv_bytes_per_token']:>8} {r['val_loss']:>8.4f} "
                       f"{r[quality]:>18.4f} {r['tokens_per_s']:>7.0f} {r['tokens_per_cpu_s']:>9.0f}")
        return out


def sweep(options: SweepOptions | None = None, *, saved: str | Path | None = None, progress: bool = False,
          on_plan: Callable[[SweepOptions, list[Any]], None] | None = None,
          on_run: Callable[[Run, list[dict[str, Any]]], None] | None = None, **changes: Any) -> SweepResult:
    """`headscope sweep`: one small model trained from scratch per head count (the task's defaults fill what is
    not given). `saved`: a sweep folder whose finished configurations are read instead of trained (unless
    `options.force`); `on_plan(options with the task's defaults, configurations)` sees the plan before any
    training, `on_run(run, rows so far)` each configuration as it finishes. Keywords override
    single options: `sweep(task="xor", heads=(1, 2), steps=200)`. Sets torch's CPU threads when `threads` is given.
    """
    o = (options or SweepOptions()).replace(**changes).validate().with_task_defaults()
    if o.threads is not None:
        # here: torch's thread count is a process-wide setting only this option changes
        import torch

        torch.set_num_threads(o.threads)
    # Every task has a default for each of these (`SWEEP_DEFAULTS`).
    assert o.d_model is not None and o.heads is not None and o.layers is not None and o.steps is not None
    assert o.max_length is not None and o.batch_size is not None
    configs, skipped = plan_sweep(o.task, o.d_model, o.heads, o.layers, o.steps, o.max_length, o.batch_size,
                                  seed=o.seed, kv_heads=o.kv_heads, d_heads=o.d_head, lr=o.lr,
                                  eval_tokens=o.eval_tokens, tokenization=o.tokenization, init_std=o.init_std)
    for msg in skipped:
        print(f"headscope sweep: skipping {msg}", file=sys.stderr)
    if on_plan is not None:
        on_plan(o, configs)
    runs: list[Run] = []
    for run in sweep_runs(configs, saved, force=o.force, progress=progress):
        runs.append(run)
        if on_run is not None:
            on_run(run, [r.row for r in runs])
    return SweepResult(runs=runs, task=o.task)
