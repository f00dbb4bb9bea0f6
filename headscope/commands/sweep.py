"""`headscope sweep`: train small models from scratch at fixed d_model, varying the number of heads."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from ..artifacts import SWEEP_CSV, SWEEP_RUNS, outputs
from ..capacity.options import SweepOptions
from ..capacity.sweep import plan_sweep, plot_sweep, run_sweep
from ..errors import HeadscopeError
from ..io import check_writable_dir
from ..models.adapter import HeadModel
from ..options.cli import verb_parser

OUTPUTS = outputs("sweep")  # sweep.csv, runs/, sweep_quality.png, sweep_speed.png
# Per-task defaults; every one can be overridden on the command line.
DEFAULTS = {
    "ptb": dict(d_model=256, heads=(1, 2, 4, 8, 16, 32), layers=2, steps=400, max_length=64, batch_size=32, lr=3e-3,
                init_std=None),
    # xor: 16 bits + the query token, one target per sequence, so more sequences per step. GPT-2's small
    # init leaves this model at the symmetric point where XOR's gradient vanishes; N(0, 0.2) does not.
    "xor": dict(d_model=64, heads=(1, 2, 4, 8, 16), layers=1, steps=1000, max_length=17, batch_size=128, lr=3e-3,
                init_std=0.2),
    "pair": dict(d_model=256, heads=(1, 2, 4), layers=1, steps=400, max_length=64, batch_size=32, lr=3e-3,
                 init_std=None),
}


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


def run(args: argparse.Namespace, model: HeadModel | None = None) -> int:
    check_writable_dir(args.out)  # before any training: a file or read-only --out fails now, not after
    if args.threads is not None:
        if args.threads < 1:
            raise HeadscopeError(f"--threads must be positive; got {args.threads}")
        torch.set_num_threads(args.threads)
    # The task's defaults fill what was not given, on a copy (the parsed options stay as given).
    args = argparse.Namespace(**{**vars(args), **{name: value for name, value in DEFAULTS[args.task].items()
                                                  if getattr(args, name) is None}})
    if args.eval_tokens < args.max_length:
        raise HeadscopeError(f"--eval-tokens must be at least --max-length ({args.max_length}); got "
                             f"{args.eval_tokens}")
    if args.init_std is not None and not args.init_std > 0:
        raise HeadscopeError(f"--init-std must be positive; got {args.init_std}")
    layers, steps = args.layers, args.steps
    configs, skipped = plan_sweep(args.task, args.d_model, args.heads, layers, steps, args.max_length, args.batch_size,
                                  seed=args.seed, kv_heads=args.kv_heads, d_heads=args.d_head, lr=args.lr,
                                  eval_tokens=args.eval_tokens, tokenization=args.tokenization,
                                  init_std=args.init_std)
    for msg in skipped:
        print(f"headscope sweep: skipping {msg}", file=sys.stderr)
    print(f"headscope sweep: {len(configs)} configuration(s) into {args.out}/ "
          f"({args.task}, d_model={args.d_model}, {layers} layer(s), {steps} steps of "
          f"{args.batch_size}x{args.max_length} tokens, "
          f"{torch.get_num_threads()} thread(s))", file=sys.stderr)
    t0 = time.perf_counter()

    def done(cfg: Any, row: dict[str, Any], reused: bool) -> None:
        tag = "reused" if reused else f"{row['wall_s']:.0f} s"
        print(
            f"  {cfg.label:<24} val_loss {row['val_loss']:.4f}  "
            + (
                f"acc {100 * row['val_acc']:.1f}%"
                if cfg.task != "ptb"
                else f"bits/byte {row['val_bits_per_token']:.3f}"
            )
            + f"  {row['tokens_per_s']:.0f} tok/s  ({tag})",
            file=sys.stderr,
            flush=True,
        )

    rows: list[dict[str, Any]] = run_sweep(configs, args.out, force=args.force, progress=not args.no_progress,
                                           on_config_done=done)
    plots = plot_sweep(rows, args.out)
    quality = "val_acc" if args.task != "ptb" else "val_bits_per_token"
    print(f"{'heads':>5} {'kv':>3} {'d_head':>6} {'params':>9} {'fwd MFLOP/tok':>13} {'KV B/tok':>8} "
          f"{'val_loss':>8} {quality:>18} {'tok/s':>7} {'tok/cpu-s':>9}")
    for r in rows:
        print(f"{r['n_heads']:>5} {r['n_kv_heads']:>3} {r['d_head']:>6} {r['params']:>9} "
              f"{r['flops_per_token'] / 1e6:>13.2f} {r['kv_bytes_per_token']:>8} {r['val_loss']:>8.4f} "
              f"{r[quality]:>18.4f} {r['tokens_per_s']:>7.0f} {r['tokens_per_cpu_s']:>9.0f}")
    print(f"\nwrote {args.out}/{SWEEP_CSV.name}, {SWEEP_RUNS.name}/*.json, {', '.join(p.name for p in plots)} "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
