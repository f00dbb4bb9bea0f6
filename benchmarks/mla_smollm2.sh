#!/usr/bin/env bash
# SmolLM2: KV bytes per token against held-out perplexity for MQA (headscope gqa --kv-heads 1) and MLA at
# MHA2MLA's three SmolLM-135M latent sizes (d_kv = 8/16/32 per KV head = --kv-rank 24/48/96, 8 RoPE dims per
# KV head), each converted and after the same uptraining budget, then one report whose question 2 holds the
# quality-vs-bytes chart and table.
# Usage: benchmarks/mla_smollm2.sh [OUT]   (default bench-mla/)
# SETTINGS overrides the shared options. The default is the GQA figures' (README "Are more heads better?");
# docs/mla.md's figures used the smaller SETTINGS it names, because the shared 2-core machine was loaded.
set -euo pipefail
OUT=${1:-bench-mla}
HS=${HEADSCOPE:-.venv/bin/headscope}
read -r -a COMMON <<< "${SETTINGS:---uptrain 32 --lr 1e-3 --data-limit 400 --heldout-limit 100 --max-length 64 --batch-size 8}"
export HF_HUB_OFFLINE=1
# One thread per run: on an oversubscribed machine two OpenMP threads spend minutes in barrier waits
# (one LAPACK SVD of a 360 x 576 matrix stalled for over 20 min with 2 threads at load 30).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
uptime
# all four at once: each run is one process that mostly waits for its share of the loaded CPUs
nice -n 10 "$HS" gqa smollm2 --kv-heads 1 "${COMMON[@]}" --force --out "$OUT/mqa" > "$OUT/mqa.log" 2>&1 &
for r in 24 48 96; do
  nice -n 10 "$HS" mla smollm2 --kv-rank "$r" --rope-dims 8 "${COMMON[@]}" --force --out "$OUT/mla-$r" > "$OUT/mla-$r.log" 2>&1 &
done
wait
uptime
FROM=(--from "$OUT/mqa"); for r in 24 48 96; do FROM+=(--from "$OUT/mla-$r"); done
if [ -d "$OUT/kvcache" ]; then FROM+=(--from "$OUT/kvcache"); fi
nice -n 10 "$HS" report smollm2 "${FROM[@]}" --out "$OUT/report" --sentences 0 --limit 8 --max-length 32 --force
