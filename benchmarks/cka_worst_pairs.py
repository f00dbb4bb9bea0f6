"""Why the minibatch CKA and the exact (biased) CKA disagree on a few head pairs: the worst pairs, dissected.

For the first `--passages` passages of `--data`, captures every head's output z (`cka_z`'s features), computes
the exact CKA (`StreamingCKA`, what `similar --cka exact` computes) and the minibatch CKA with a pool holding
every token (so the minibatches are uniform over the data), and for the `--top` pairs where they differ most
computes from the full T x T Gram matrices:

- `biased`: the exact CKA again, as <HKH, HLH> / (|HKH| |HLH|) (a check of the streaming accumulator);
- `unbiased`: the full-data unbiased-HSIC CKA (Song et al.'s estimator over all T tokens: what the minibatch
  estimator estimates);
- `no_diag`: the biased CKA with the Gram diagonals (each token paired with itself) removed from the sums;
- `top1%`: the share of each head's centred squared norm sum_t |z_t - mean|^2 carried by its 1% largest tokens,
  and `pos0`: the share carried by the passages' first tokens.

    HF_HUB_OFFLINE=1 python benchmarks/cka_worst_pairs.py smollm2 --passages 128 --top 8 --cka-batch 256,1024
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from cka_gap import capture  # run as a script, its own folder (benchmarks/) is on sys.path

import headscope
from headscope.data import batches, prepare_tokens, resolve_max_length
from headscope.learned.cka import MinibatchCKA, StreamingCKA, hsic1_linear
from headscope.table import head_name


def gram_cka(x: torch.Tensor, y: torch.Tensor, diagonal: bool = True) -> float:
    """Biased linear CKA from the centred Gram matrices; without `diagonal`, token self-pairs are dropped."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    k, l = xc @ xc.T, yc @ yc.T
    if not diagonal:
        k.fill_diagonal_(0)
        l.fill_diagonal_(0)
    return float((k * l).sum() / torch.sqrt((k * k).sum() * (l * l).sum()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="smollm2")
    p.add_argument("--data", default="ptb-valid")
    p.add_argument("--passages", type=int, default=128)
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cka-batch", default="256", help="comma list of minibatch sizes; the pairs are the worst of the first"
    )
    args = p.parse_args()
    torch.manual_seed(args.seed)
    hm = headscope.load_model(args.model)
    tokens = prepare_tokens(hm, args.data, resolve_max_length(hm, None), args.passages)
    per = capture(hm, tokens.ids, args.batch_size)
    n = hm.n_layers * hm.n_heads
    exact = StreamingCKA(n, hm.d_head)
    for z in per:
        exact.update(z)
    ref = exact.cka()
    total = sum(len(z) for z in per)
    iu = np.triu_indices(n, 1)
    ests = {}
    for cb in (int(x) for x in args.cka_batch.split(",")):
        mini = MinibatchCKA(n, hm.d_head, cb, transforms={"cka_z": None}, pool=total + 1, seed=args.seed)
        for idx in (b.index for b in batches(tokens.ids, args.batch_size, pad_id=0)):
            mini.update(torch.cat([per[i] for i in idx]))
        ests[cb] = mini.cka()["cka_z"]
        g = np.abs(ests[cb][iu] - ref[iu])
        g = g[np.isfinite(g)]
        print(f"cka_batch {cb}: {mini.minibatches} minibatches; |minibatch - exact| max {g.max():.4f}, "
              f"mean {g.mean():.4f}, p99 {np.quantile(g, 0.99):.4f}", flush=True)
    first_cb = next(iter(ests))
    est = ests[first_cb]
    d = np.abs(est[iu] - ref[iu])
    d[~np.isfinite(d)] = -1
    worst = np.argsort(-d)[: args.top]
    all_z = torch.cat(per).double()  # [T, N, d_head]
    first = torch.zeros(total, dtype=torch.bool)
    first[np.cumsum([0] + [len(z) for z in per[:-1]])] = True
    print(f"{args.model}: {len(per)} passages, {total} tokens; cka_z over {len(iu[0])} pairs: max |minibatch - exact| "
          f"{d.max():.4f}, mean {d[d >= 0].mean():.4f}")
    others = [cb for cb in ests if cb != first_cb]
    print(f"{'pair':>14} {'exact':>7} {'mb ' + str(first_cb):>9} " + "".join(f"{'mb ' + str(cb):>9} " for cb in others)
          + f"{'biased':>7} {'unbiased':>8} {'no_diag':>7} {'top1% a':>7} {'top1% b':>7} {'pos0 a':>6} {'pos0 b':>6}")

    def shares(x: torch.Tensor) -> tuple[float, float]:
        e = ((x - x.mean(0)) ** 2).sum(1)
        k = max(1, int(0.01 * len(e)))
        return float(e.topk(k).values.sum() / e.sum()), float(e[first].sum() / e.sum())

    for w in worst:
        a, b = int(iu[0][w]), int(iu[1][w])
        xa, xb = all_z[:, a], all_z[:, b]
        ta, pa = shares(xa)
        tb, pb = shares(xb)
        unb = hsic1_linear(xa, xb) / np.sqrt(hsic1_linear(xa, xa) * hsic1_linear(xb, xb))
        name = f"{head_name(*divmod(a, hm.n_heads))}/{head_name(*divmod(b, hm.n_heads))}"
        print(f"{name:>14} {ref[a, b]:>7.4f} {est[a, b]:>9.4f} " + "".join(f"{ests[cb][a, b]:>9.4f} " for cb in others)
              + f"{gram_cka(xa, xb):>7.4f} {unb:>8.4f} "
              f"{gram_cka(xa, xb, diagonal=False):>7.4f} {ta:>7.3f} {tb:>7.3f} {pa:>6.3f} {pb:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
