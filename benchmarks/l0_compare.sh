#!/bin/bash
# The small comparison of issue 24: learned L0 gates against gradient, Taylor and exact ablation, at 10%, 20%
# and 30% of heads removed, on MiniLM and SmolLM2, no recovery for any method (the same budget), the metric on
# held-out PTB with intervals; then SmolLM2's KV heads chosen by learned mixing weights, the retrieval score and
# at random at 12.5%, 25% and 50% full. Small on purpose (CPU): raise LIMIT, HELDOUT, MAXLEN, L0STEPS for more.
# usage: OUT=/tmp/l0cmp bash benchmarks/l0_compare.sh [minilm] [smollm2] [kv]
set -euo pipefail
OUT=${OUT:-l0-compare}; LIMIT=${LIMIT:-32}; HELDOUT=${HELDOUT:-64}; MAXLEN=${MAXLEN:-32}; L0STEPS=${L0STEPS:-150}; BATCH=${BATCH:-8}
HS=${HS:-python -m headscope}
[ $# -gt 0 ] || set -- minilm smollm2 kv
for what in "$@"; do
  case $what in
    minilm|smollm2)
      for m in ${METHODS:-l0 gradient taylor ablation}; do
        /usr/bin/time -f "$what $m %e s" $HS prune "$what" --method "$m" --fraction 0.3 --step 0.1 --data ptb-train \
          --limit "$LIMIT" --max-length "$MAXLEN" --heldout ptb-valid --heldout-limit "$HELDOUT" --batch-size "$BATCH" \
          --l0-steps "$L0STEPS" --l0-lr "${L0LR:-0.1}" --out "$OUT/$what-$m" --force
      done ;;
    kv)
      /usr/bin/time -f "kv %e s" $HS kvcache smollm2 --keep-full 12.5%,25%,50% --context "${CONTEXT:-512}" --sink 4 \
        --window "${WINDOW:-64}" --passages 1 --needles "${NEEDLES:-2}" --score-haystacks 1 --choose learned \
        --learn-steps "${LEARNSTEPS:-10}" --learn-prompts 4 --out "$OUT/kv" --force ;;
  esac
done
