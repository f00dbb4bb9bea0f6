#!/usr/bin/env bash
# SmolLM2-135M: 3 -> 1 KV heads (MQA). Figures in docs/gqa.md ("Measured").
# Run from the repo root with the venv active:  nice bash benchmarks/gqa_smollm2.sh [OUTROOT]
# 1) mean grouping + 16 steps of KL-distillation uptraining at lr 1e-4 (reports before / converted / uptrained);
# 2) similarity grouping, no uptraining (3 -> 1 has one possible grouping, so it must equal run 1's converted model);
# 3) and 4) uptraining at lr 1e-3 (the default since these runs) for 8 and 32 steps.
set -euo pipefail
OUT=${1:-headscope-out/gqa}  # git-ignored; each checkpoint is ~540 MB (float32)
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
headscope gqa smollm2 --kv-heads 1 --grouping mean --uptrain 16 --lr 1e-4 --data-limit 400 --heldout-limit 100 \
  --max-length 64 --batch-size 8 --out "$OUT/mean-uptrain16" --force
headscope gqa smollm2 --kv-heads 1 --grouping similarity --uptrain 0 --data-limit 400 --heldout-limit 100 \
  --max-length 64 --batch-size 8 --out "$OUT/similarity" --force
for steps in 8 32; do
  headscope gqa smollm2 --kv-heads 1 --grouping mean --uptrain $steps --lr 1e-3 --data-limit 400 --heldout-limit 100 \
    --max-length 64 --batch-size 8 --out "$OUT/mean-uptrain$steps-lr1e-3" --force
done
