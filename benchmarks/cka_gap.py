"""Gap between the minibatch CKA (default) and the exact full-data CKA (`--cka exact`) against tokens.

One forward over the first `--limit` passages of `--data` captures every head's output per passage;
then, for each passage count in `--passages`, the head outputs of the first n passages are fed to both
estimators in exactly the order `similarity(..., limit=n)` feeds them (its length-sorted batches), with
the same W_O factors, pool and seed. So each row's two CKA matrices are the ones `headscope similar
--limit n` computes with `--cka minibatch` and `--cka exact` (JS is not computed).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/cka_gap.py minilm --data ptb-valid \
        --passages 8,16,32,64,128,256,512

Prints one row per passage count: tokens, max and mean |minibatch - exact| over pairs of `cka` and `cka_z`,
and the 99th percentile.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

import headscope
from headscope.data import batches, pad_id, prepare_tokens, resolve_max_length
from headscope.hooks import on_head_outputs
from headscope.learned.similarity import DEFAULT_CKA_BATCH, DEFAULT_CKA_POOL, MinibatchCKA, StreamingCKA, layer_weights


def pool_groups(lengths: list[int], pool: int, seed: int = 0) -> list[list[int]]:
    """Passage indices in a seeded random order, cut into groups of about `pool` tokens (`--order pooled`:
    each pool a random sample of passages, sorted by length inside a group). Measured: no better than
    length order, see docs/similarity.md."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    groups: list[list[int]] = [[]]
    size = 0
    for i in order:
        if size >= max(pool, 1) and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(int(i))
        size += int(lengths[i])
    return [g for g in groups if g]


def capture(hm, ids: list[list[int]], batch_size: int) -> list[torch.Tensor]:
    """Per passage, the head outputs `[tokens, N, d_head]` (float32), all layers stacked."""
    per: list[torch.Tensor | None] = [None] * len(ids)
    outputs: dict[int, torch.Tensor] = {}

    def keep(layer: int, z: torch.Tensor) -> None:
        outputs[layer] = z.detach().clone()  # [B, P, head, d_head]

    with on_head_outputs(hm, keep), torch.inference_mode():
        for batch in batches(ids, batch_size, pad_id=pad_id(hm)):
            outputs.clear()
            hm.model(**batch.model_inputs(hm.device), use_cache=False)
            z = torch.cat([outputs[l] for l in range(hm.n_layers)], dim=2)  # [B, P, N, d]
            for row, i in enumerate(batch.index):
                per[i] = z[row, : len(ids[i])].float().clone()
    return per  # type: ignore[return-value]


def gaps(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    iu = np.triu_indices(a.shape[0], 1)
    d = np.abs(a[iu] - b[iu])
    d = d[np.isfinite(d)]
    return {"max": float(d.max()), "mean": float(d.mean()), "p99": float(np.quantile(d, 0.99))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="minilm")
    p.add_argument("--data", default="ptb-valid")
    p.add_argument("--passages", default="8,16,32,64,128,256,512")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--cka-batch", default=str(DEFAULT_CKA_BATCH), help="comma list: one minibatch row each")
    p.add_argument("--cka-pool", default=str(DEFAULT_CKA_POOL), help="comma list: one minibatch row each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--order", choices=("sorted", "shuffled", "pooled"), default="sorted",
                   help="batches fed in length order (as similarity() fed them before) or in a seeded shuffled order")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    counts = [int(x) for x in args.passages.split(",")]
    cka_batches = [int(x) for x in args.cka_batch.split(",")]
    pools = [int(x) for x in args.cka_pool.split(",")]
    torch.manual_seed(args.seed)
    hm = headscope.load_model(args.model)
    max_len = resolve_max_length(hm, args.max_length)
    tokens = prepare_tokens(hm, args.data, max_len, max(counts))
    t0 = time.time()
    per = capture(hm, tokens.ids, args.batch_size)
    print(f"{args.model}: captured {sum(len(t) for t in tokens.ids)} tokens of {len(per)} passages "
          f"from {tokens.source} in {time.time() - t0:.0f} s", flush=True)
    n = hm.n_layers * hm.n_heads
    r = torch.cat([torch.linalg.qr(layer_weights(hm, l).o.double())[1] for l in range(hm.n_layers)])
    rows = []
    print(f"{'passages':>8} {'tokens':>7} {'cka_batch':>9} {'pool':>6} {'max|d| cka':>10} {'mean':>7} {'p99':>7} "
          f"{'max|d| cka_z':>12} {'mean':>7}", flush=True)
    # The exact estimator is a full-data scatter: the order of the samples only changes rounding, so one
    # accumulator fed passage by passage gives every prefix's exact CKA.
    exact, fed = StreamingCKA(n, hm.d_head), 0
    for count in sorted(counts):
        ids = tokens.ids[:count]
        for i in range(fed, count):
            exact.update(per[i])
        fed = count
        ref = {"cka": exact.cka(r), "cka_z": exact.cka()}
        order = [b.index for b in batches(ids, args.batch_size, pad_id=0)]
        if args.order == "pooled":  # pool_groups: random groups of ~pool tokens, each cut into sorted batches
            order = [[g[j] for j in b.index] for g in pool_groups([len(t) for t in ids], pools[0], args.seed)
                     for b in batches([ids[i] for i in g], args.batch_size, pad_id=0)]
        if args.order == "shuffled":
            perm = np.random.default_rng(args.seed).permutation(len(order))
            order = [order[k] for k in perm]
        chunks = [torch.cat([per[i] for i in idx]) for idx in order]  # what similarity() feeds, batch by batch
        for cb, pool in [(cb, pool) for cb in cka_batches for pool in pools]:
            mini = MinibatchCKA(n, hm.d_head, cb, {"cka": r, "cka_z": None}, pool=pool, seed=args.seed)
            for c in chunks:
                mini.update(c)
            est = mini.cka()
            g, gz = gaps(est["cka"], ref["cka"]), gaps(est["cka_z"], ref["cka_z"])
            row = {"model": args.model, "data": tokens.source, "passages": count, "tokens": mini.count,
                   "cka_batch": cb, "cka_pool": pool, "order": args.order, "cka": g, "cka_z": gz}
            rows.append(row)
            print(f"{count:>8} {mini.count:>7} {cb:>9} {pool:>6} {g['max']:>10.4f} {g['mean']:>7.4f} {g['p99']:>7.4f} "
                  f"{gz['max']:>12.4f} {gz['mean']:>7.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
