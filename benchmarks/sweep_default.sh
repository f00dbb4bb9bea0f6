#!/usr/bin/env bash
# The head-count sweeps whose figures are in docs/sweep.md. Resumable: rerun to finish an interrupted run.
# Single-threaded and niced because the machine they ran on was shared; CPU seconds per configuration
# (train_cpu_s in sweep.csv) are the machine-independent cost.
set -euo pipefail
OUT=${1:-sweep-runs}
nice -n 10 headscope sweep --threads 1 --out "$OUT/ptb-default"                      # PTB bytes, h = 1..32
for seed in 0 1 2 3 4; do nice -n 10 headscope sweep --task xor --seed $seed --threads 1 --out "$OUT/xor"; done  # 1 min each
nice -n 10 headscope sweep --task pair --heads 1,2,4 --threads 1 --out "$OUT/pair"
nice -n 10 headscope sweep --heads 8 --kv-heads 1,2,4,8 --threads 1 --out "$OUT/ptb-default"  # MHA/GQA/MQA at h=8
for seed in 1 2; do nice -n 10 headscope sweep --heads 8 --seed $seed --threads 1 --out "$OUT/ptb-seeds"; done
for seed in 0 1 2; do nice -n 10 headscope sweep --steps 1200 --seed $seed --threads 1 --out "$OUT/ptb-1200"; done  # ~6 CPU-min per run
