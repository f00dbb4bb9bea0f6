"""Benchmark `headscope circuit`'s costs as ratios against plain forwards of the same pairs, in one run.

  python benchmarks/bench_circuit.py [--model smollm2] [--pairs benchmarks/data/ioi_fresh.jsonl] [--limit 8]
                                     [--ig-steps 5] [--independent]

Times, on the same pairs in one batch: one plain forward of the clean texts (sdpa), one forward and backward,
EAP (two capturing forwards, one forward and backward with every receiver's own input), EAP-IG (m of those), the
faithfulness curve (3 x 10 circuits plus the empty one, one wired forward each) and, with --independent, the
independent EAP-IG of benchmarks/circuit_independent.py (LLaMA family only). The issue's expectation: EAP about a
forward and a backward, EAP-IG m of them, the curve one forward per size. Threads: BENCH_THREADS (default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch

    from headscope.learned.causal.pairs import induction_pairs, load_pairs
    from headscope.learned.causal.patching import logits_at
    from headscope.learned.circuits.faithfulness import faithfulness_curves
    from headscope.learned.circuits.graph import build_graph
    from headscope.learned.circuits.scores import edge_scores
    from headscope.models import load_model
    from headscope.models.tiny import tiny_model
    from headscope.uncertainty import IntervalSettings

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama", help="tiny-llama (built here) or any model headscope loads")
    p.add_argument("--pairs", default="benchmarks/data/ioi_fresh.jsonl")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--ig-steps", type=int, default=5)
    p.add_argument("--independent", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    if a.model == "tiny-llama":
        hm = tiny_model("llama")
        b = induction_pairs(None, hm.vocab_size, n=a.limit, length=8)
    else:
        hm = load_model(a.model)
        b = load_pairs(hm.tokenizer, hm.causal, hm.vocab_size, pairs=a.pairs, limit=a.limit)
    hm.model.set_attn_implementation("sdpa")
    for prm in hm.model.parameters():
        prm.requires_grad_(False)
    graph = build_graph(hm)
    n = len(b)

    def timed(fn):
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out

    def forward_backward():
        emb = hm.model.get_input_embeddings()(b.clean).detach().requires_grad_(True)
        out = hm.model(inputs_embeds=emb, attention_mask=b.mask, use_cache=False).logits
        out[torch.arange(n), b.position].sum().backward()

    with torch.no_grad():
        logits_at(hm, b.clean, b.mask, b.position)  # warm-up
        forward, _ = timed(lambda: logits_at(hm, b.clean, b.mask, b.position))
    secs = {"one forward (sdpa)": forward, "forward + backward": timed(forward_backward)[0]}
    secs["EAP"], eap = timed(lambda: edge_scores(hm, graph, b, method="eap", batch_size=n))
    secs[f"EAP-IG (m={a.ig_steps})"], _ = timed(lambda: edge_scores(hm, graph, b, method="eap-ig", steps=a.ig_steps,
                                                                      batch_size=n))
    secs["curve (31 circuits)"], _ = timed(lambda: faithfulness_curves(hm, graph, b, eap.scores.mean(0),
                                                                        IntervalSettings(B=200), batch_size=n))
    if a.independent:
        sys.path.insert(0, str(Path(__file__).parent))
        import circuit_independent as ci

        d = {"clean": b.clean, "corrupt": b.corrupt, "mask": b.mask, "last": b.position, "answer": b.answer,
             "wrong": b.wrong}
        secs[f"independent EAP-IG (m={a.ig_steps})"], _ = timed(lambda: ci.eap_ig(hm.model, d, a.ig_steps, n))
    print(json.dumps({"model": hm.name, "pairs": n, "tokens": int(b.mask.shape[1]), "edges": graph.n_edges,
                      "threads": torch.get_num_threads(), "seconds": {k: round(v, 3) for k, v in secs.items()}}))
    print(f"{'':<32}{'seconds':>9}{'x one forward':>15}")
    for k, v in secs.items():
        print(f"{k:<32}{v:>9.2f}{v / forward:>15.1f}")


if __name__ == "__main__":
    main()
