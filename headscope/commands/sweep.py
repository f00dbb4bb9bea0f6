"""`headscope sweep`: train small models from scratch at fixed d_model, varying the number of heads."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from ..artifacts import SWEEP_CSV, SWEEP_RUNS, outputs
from ..capacity import verbs
from ..capacity.options import SweepOptions
from ..capacity.sweep.resumable import Run, save_run
from ..io import check_writable_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

OUTPUTS = outputs("sweep")  # sweep.csv, runs/, sweep_quality.png, sweep_speed.png


def register(sub: argparse._SubParsersAction) -> None:
    p = verb_parser(
        sub, "sweep", SweepOptions,
        help="train small LMs from scratch at fixed d_model, varying heads (resumable)",
        description="Train decoder-only models from scratch with the reference MHA/GQA/MQA attention, one per "
                    "head count (d_head = d_model/h unless --d-head is given), everything else fixed; write "
                    "sweep.csv, runs/<key>.json per configuration and PNG plots. Rerunning with the same --out "
                    "skips finished configurations. Head counts that do not divide d_model are skipped "
                    "(an error if none is left). See docs/sweep.md.",
    )
    p.set_defaults(func=run)


def _done(run: Run) -> None:
    """A configuration's line on stderr as soon as it is finished."""
    row: dict[str, Any] = run.row
    cfg = run.cfg
    tag = "reused" if run.reused else f"{row['wall_s']:.0f} s"
    quality = f"acc {100 * row['val_acc']:.1f}%" if cfg.task != "ptb" else f"bits/byte {row['val_bits_per_token']:.3f}"
    print(f"  {cfg.label:<24} val_loss {row['val_loss']:.4f}  {quality}  {row['tokens_per_s']:.0f} tok/s  ({tag})",
          file=sys.stderr, flush=True)


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    # validated by the CLI: --threads, --eval-tokens, --init-std
    options = SweepOptions.from_namespace(args)
    # before any training: a file or read-only --out fails now, not after
    check_writable_dir(options.out)
    t0 = time.perf_counter()

    def planned(o: SweepOptions, configs: list[Any]) -> None:
        print(f"headscope sweep: {len(configs)} configuration(s) into {o.out}/ ({o.task}, d_model={o.d_model}, "
              f"{o.layers} layer(s), {o.steps} steps of {o.batch_size}x{o.max_length} tokens, "
              f"{torch.get_num_threads()} thread(s))", file=sys.stderr)

    def finished(done: Run, rows: list[dict[str, Any]]) -> None:  # saved at once: a rerun resumes from here
        save_run(options.out, done, rows)
        _done(done)

    result = verbs.sweep(options, saved=options.out, progress=not options.no_progress, on_plan=planned,
                         on_run=finished)
    plots = result.plot(options.out)
    print("\n".join(result.lines()))
    print(f"\nwrote {options.out}/{SWEEP_CSV.name}, {SWEEP_RUNS.name}/*.json, {', '.join(p.name for p in plots)} "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
