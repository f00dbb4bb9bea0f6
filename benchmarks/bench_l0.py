"""Time per L0 gate-training step against a plain forward + backward on the same batch (issue 24).

One gate step (`redundancy.importance.l0.GateTraining` through the shared Trainer) is: draw a batch and one
hard-concrete sample per passage, the teacher forward (no grad; causal LMs only, encoders read a cached
reference), the gated forward, the backward to the gates only (the weights are frozen, so no weight gradient
is computed), and an Adam step on the gates. The plain step is one forward + backward of the model's own loss
to every weight on the same batch (LM: next-token NLL; encoder: mean squared final hidden state), gradients
dropped. The two are interleaved in every repeat and the median of the per-repeat ratios is reported, so
load on a shared machine hits both alike.

    python benchmarks/bench_l0.py [--models minilm,smollm2] [--batch 8] [--max-length 48] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from headscope import load_model
from headscope.eval.evaluate import make_reference, prepare
from headscope.eval.metrics import METRICS
from headscope.redundancy.importance.l0 import GateTraining, L0Settings
from headscope.train import frozen_weights


def plain_step(hm, batch) -> float:
    """Seconds of one forward + backward to every weight (gradients dropped)."""
    b, _, _ = batch
    ids, mask = b.input_ids.to(hm.device), b.attention_mask.to(hm.device)
    t0 = time.perf_counter()
    out = hm.model(input_ids=ids, attention_mask=mask, use_cache=False) if hm.causal else \
        hm.model(input_ids=ids, attention_mask=mask)
    if hm.causal:
        loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1))
    else:
        loss = out.last_hidden_state.pow(2).mean()
    loss.backward()
    dt = time.perf_counter() - t0
    hm.model.zero_grad(set_to_none=True)
    return dt


def bench(name: str, batch: int, max_length: int, repeats: int) -> dict:
    hm = load_model(name)
    prep, metric = prepare(hm, "ptb-valid", "auto", max_length, limit=4 * batch)
    ref = make_reference(hm, prep, batch_size=batch) if METRICS.get(metric).needs_reference else None
    run = GateTraining(hm, prep, metric, ref, L0Settings(steps=repeats + 1, target=0.3), batch_size=batch)
    gen = torch.Generator().manual_seed(1)
    with frozen_weights(hm):  # warm-up: one gate step
        run.trainer.run(1, run._batch, run._loss)
    plain_step(hm, run._batch(gen))
    gates, plain, ratios = [], [], []
    for _ in range(repeats):
        before = run.trainer.train_s
        with frozen_weights(hm):
            run.trainer.run(1, run._batch, run._loss)
        g = run.trainer.train_s - before
        p = plain_step(hm, run._batch(gen))
        gates.append(g)
        plain.append(p)
        ratios.append(g / p)
    return {"model": hm.name, "metric": metric, "batch": batch, "max_length": max_length,
            "tokens_per_batch": int(sum(len(t) for t in prep.ids[:batch])), "repeats": repeats,
            "gate_step_s": statistics.median(gates), "plain_fwd_bwd_s": statistics.median(plain),
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="minilm,smollm2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [bench(m, args.batch, args.max_length, args.repeats) for m in args.models.split(",")]
    for r in rows:
        print(f"{r['model']:<24} {r['metric']:<9} batch {r['batch']} x <= {r['max_length']} tokens: gate step "
              f"{r['gate_step_s']:.3f} s, plain fwd+bwd {r['plain_fwd_bwd_s']:.3f} s, ratio {r['ratio_median']:.2f} "
              f"(min {r['ratio_min']:.2f}, max {r['ratio_max']:.2f}, {r['repeats']} repeats)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
