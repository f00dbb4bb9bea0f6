#!/usr/bin/env bash
# SmolLM2: KV bytes per token against held-out perplexity for MQA (headscope gqa --kv-heads 1) and MLA at
# MHA2MLA's three SmolLM-135M latent sizes (d_kv = 8/16/32 per KV head = --kv-rank 24/48/96, 8 RoPE dims per
# KV head), each converted and after the same 32-step uptraining. Every run uses the GQA figures' settings
# (README "Are more heads better?"). Then one report with the quality-vs-bytes chart and table (question 2).
# Usage: benchmarks/mla_smollm2.sh [OUT]   (default bench-mla/); about 20-30 min on 2 shared CPU cores.
set -euo pipefail
OUT=${1:-bench-mla}
HS=${HEADSCOPE:-.venv/bin/headscope}
COMMON=(--uptrain 32 --lr 1e-3 --data-limit 400 --heldout-limit 100 --max-length 64 --batch-size 8 --force)
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
uptime
nice -n 10 "$HS" gqa smollm2 --kv-heads 1 "${COMMON[@]}" --out "$OUT/mqa"
for r in 24 48 96; do
  nice -n 10 "$HS" mla smollm2 --kv-rank "$r" --rope-dims 8 "${COMMON[@]}" --out "$OUT/mla-$r"
done
uptime
FROM=(--from "$OUT/mqa"); for r in 24 48 96; do FROM+=(--from "$OUT/mla-$r"); done
[ -d "$OUT/kvcache" ] && FROM+=(--from "$OUT/kvcache")
nice -n 10 "$HS" report smollm2 "${FROM[@]}" --out "$OUT/report" --sentences 0 --limit 8 --max-length 32 --force
