"""Retrain the one-head pair-task model of docs/sweep.md (same seed and batches as the sweep) and measure where its
head looks."""

import json
import sys

import torch

import headscope.capacity.sweep as S

torch.set_num_threads(1)

cfg = S.SweepConfig(task="pair", d_model=256, n_heads=1, n_layers=1, steps=400, seq=64, batch=32)
# Same training as the sweep (same seed, same batches), but keep the model.
row, m = S.train_config(cfg, progress=False, return_model=True)
x, y = S.pair_batch(256, 64, torch.Generator().manual_seed(123))
with torch.no_grad():
    resid = m.tok_emb(x) + m.pos_emb.weight[:64]
    _, w = m.blocks[0].attn(resid, return_weights=True)  # [b,1,q,k]
w = w[:, 0]
q = torch.arange(7, 64)
a1 = w[:, q, q - 1]
a7 = w[:, q, q - 7]
rest = 1 - a1 - a7
same = (x[:, q-1] == x[:, q-7])
out = {"val_acc": row["val_acc"], "w_i-1_mean": a1.mean().item(), "w_i-1_std": a1.std().item(),
       "w_i-7_mean": a7.mean().item(), "w_i-7_std": a7.std().item(), "w_other_mean": rest.mean().item(),
       "w_i-1_when_equal_tokens": a1[same].mean().item()}
print(json.dumps(out, indent=1))
with open(sys.argv[1] if len(sys.argv) > 1 else "probe_one_head.json", "w") as f:
    json.dump(out, f, indent=1)
