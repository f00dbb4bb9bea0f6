"""`headscope sweep`: train small models from scratch at fixed d_model, varying the number of heads."""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ..errors import HeadscopeError

OUTPUTS = ["sweep.csv", "sweep_quality.png", "sweep_speed.png"]
DEFAULT_STEPS = {"ptb": 400, "synthetic": 400}
DEFAULT_LAYERS = {"ptb": 2, "synthetic": 1}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,2,4; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep", help="train small LMs from scratch at fixed d_model, varying heads (resumable)",
        description="Train decoder-only models from scratch with the reference MHA/GQA/MQA attention, one per "
                    "head count (d_head = d_model/h unless --d-head is given), everything else fixed; write "
                    "sweep.csv, runs/<key>.json per configuration and PNG plots. Rerunning with the same --out "
                    "skips finished configurations. Head counts that do not divide d_model are skipped "
                    "(an error if none is left). See docs/sweep.md.")
    p.add_argument("--task", default="ptb", choices=["ptb", "synthetic"],
                   help="ptb: next-byte LM on Penn Treebank, scored on PTB valid; synthetic: output the pair of "
                        "tokens at two offsets with a one-layer attention-only model (default: ptb)")
    p.add_argument("--d-model", type=int, default=256, help="model width (default 256)")
    p.add_argument("--heads", type=_int_list, default=[1, 2, 4, 8, 16, 32],
                   help="query-head counts, comma-separated (default 1,2,4,8,16,32)")
    p.add_argument("--kv-heads", type=_int_list, default=None,
                   help="KV-head counts to try for each head count (default: = heads, MHA); those not dividing h are skipped")
    p.add_argument("--d-head", type=_int_list, default=None,
                   help="d_head values, independent of the head count (default: d_model/h)")
    p.add_argument("--layers", type=int, default=None, help="layers (default 2 for ptb, 1 for synthetic)")
    p.add_argument("--steps", type=int, default=None, help="training steps per configuration (default 400)")
    p.add_argument("--seq", type=int, default=64, help="tokens per training window (default 64)")
    p.add_argument("--batch", type=int, default=32, help="windows per step (default 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    p.add_argument("--eval-tokens", type=int, default=65536, help="validation targets scored (default 65536)")
    p.add_argument("--tokenization", default="byte", choices=["byte", "word"], help="PTB tokens (default byte)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0, help="random seed for init and data order (default 0)")
    p.add_argument("--out", default="headscope-sweep", help="output directory (default: headscope-sweep/)")
    p.add_argument("--force", action="store_true",
                   help="retrain configurations already finished in --out (default: reuse them, i.e. resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..sweep import plan_sweep, plot_sweep, run_sweep

    if args.threads is not None:
        if args.threads < 1:
            raise HeadscopeError(f"--threads must be positive; got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.eval_tokens < args.seq:
        raise HeadscopeError(f"--eval-tokens must be at least --seq ({args.seq}); got {args.eval_tokens}")
    layers = args.layers if args.layers is not None else DEFAULT_LAYERS[args.task]
    steps = args.steps if args.steps is not None else DEFAULT_STEPS[args.task]
    configs, skipped = plan_sweep(args.task, args.d_model, args.heads, layers, steps, args.seq, args.batch,
                                  seed=args.seed, kv_heads=args.kv_heads, d_heads=args.d_head, lr=args.lr,
                                  eval_tokens=args.eval_tokens, tokenization=args.tokenization)
    for msg in skipped:
        print(f"headscope sweep: skipping {msg}", file=sys.stderr)
    print(f"headscope sweep: {len(configs)} configuration(s) into {args.out}/ "
          f"({args.task}, d_model={args.d_model}, {layers} layer(s), {steps} steps of {args.batch}x{args.seq} tokens, "
          f"{torch.get_num_threads()} thread(s))", file=sys.stderr)
    t0 = time.perf_counter()

    def done(cfg, row, reused):
        tag = "reused" if reused else f"{row['wall_s']:.0f} s"
        print(f"  {cfg.label:<24} val_loss {row['val_loss']:.4f}  " +
              (f"acc {100 * row['val_acc']:.1f}%" if cfg.task == "synthetic" else f"bits/byte {row['val_bits_per_token']:.3f}")
              + f"  {row['tokens_per_s']:.0f} tok/s  ({tag})", file=sys.stderr, flush=True)

    rows = run_sweep(configs, args.out, force=args.force, progress=not args.no_progress, on_config_done=done)
    plots = plot_sweep(rows, args.out)
    quality = "val_acc" if args.task == "synthetic" else "val_bits_per_token"
    print(f"{'heads':>5} {'kv':>3} {'d_head':>6} {'params':>9} {'fwd MFLOP/tok':>13} {'KV B/tok':>8} "
          f"{'val_loss':>8} {quality:>18} {'tok/s':>7} {'tok/cpu-s':>9}")
    for r in rows:
        print(f"{r['n_heads']:>5} {r['n_kv_heads']:>3} {r['d_head']:>6} {r['params']:>9} "
              f"{r['flops_per_token'] / 1e6:>13.2f} {r['kv_bytes_per_token']:>8} {r['val_loss']:>8.4f} "
              f"{r[quality]:>18.4f} {r['tokens_per_s']:>7.0f} {r['tokens_per_cpu_s']:>9.0f}")
    print(f"\nwrote {args.out}/sweep.csv, runs/*.json, {', '.join(p.name for p in plots)} "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
