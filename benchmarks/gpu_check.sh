#!/usr/bin/env bash
# The GPU path end to end on SmolLM2 (issue 12), in under 5 minutes on one GPU:
# bf16 weights, analyze through the statistics kernel, similar (blockwise JS + minibatch CKA), an
# exact single-head ablation scan, a prune with a saved model, an MHA->GQA conversion (3 -> 1 KV
# heads). Each step runs as its own process; its wall time is printed beside that of a process that
# loads the model the same way and runs one plain forward over the same passages (ratio = step / plain).
#
#   bash benchmarks/gpu_check.sh                     # GPU: DEVICE=cuda DTYPE=bfloat16, 64 passages of <= 256 tokens
#   DEVICE=cpu DTYPE=float32 LIMIT=4 MAXLEN=32 bash benchmarks/gpu_check.sh   # CPU dry run, tiny limits
#
# Environment: DEVICE (cuda), DTYPE (bfloat16), LIMIT (64 passages), MAXLEN (256 tokens), MODEL (smollm2),
# PY (.venv/bin/python if present, else python), OUT (a fresh temporary folder, removed at the end
# unless KEEP=1), STEPS (which steps after the plain forward; default all: analyze similar ablation
# prune gqa). Exits non-zero at the first step that fails.
set -euo pipefail

cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
LIMIT=${LIMIT:-64}
MAXLEN=${MAXLEN:-256}
MODEL=${MODEL:-smollm2}
if [[ -z "${PY:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
fi
OUT=${OUT:-$(mktemp -d -t headscope-gpu-check.XXXXXX)}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
[[ "${KEEP:-0}" == 1 ]] || trap 'rm -rf "$OUT"' EXIT

STEPS=${STEPS:-analyze similar ablation prune gqa}
want() { [[ " $STEPS " == *" $1 "* ]]; }
COMMON=(--device "$DEVICE" --dtype "$DTYPE")
DATA=(--data ptb-valid --limit "$LIMIT" --max-length "$MAXLEN")

echo "gpu_check: $MODEL on $DEVICE ($DTYPE), $LIMIT PTB-valid passages of <= $MAXLEN tokens, out $OUT"
"$PY" -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(),
(torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''))"

now() { date +%s.%N; }
declare -A WALL

run_step() {  # name, then the command
    local name=$1; shift
    local t0 t1
    t0=$(now)
    if ! "$@" > "$OUT/$name.log" 2>&1; then
        echo "gpu_check: step '$name' failed; its log:" >&2
        tail -n 30 "$OUT/$name.log" >&2
        exit 1
    fi
    t1=$(now)
    WALL[$name]=$("$PY" -c "print(round($t1 - $t0, 2))")
    printf '  %-10s %8.2f s\n' "$name" "${WALL[$name]}"
}

# The reference: load the model as every step does, one plain forward (default kernel) over the same passages.
run_step plain "$PY" - "$MODEL" "$DEVICE" "$DTYPE" "$LIMIT" "$MAXLEN" <<'PYEOF'
import sys, time, torch
from headscope.models import load_model
from headscope.data import read_texts, prepare_tokens, batches, pad_id
model, device, dtype, limit, maxlen = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
hm = load_model(model, device=device, dtype=dtype)
ids = prepare_tokens(hm, read_texts("ptb-valid", limit).texts, maxlen).ids
with torch.inference_mode():
    for b in batches(ids, 16, pad_id=pad_id(hm)):
        hm.model(**b.model_inputs(hm.device), use_cache=False)
if device.startswith("cuda"):
    torch.cuda.synchronize()
    print("peak GPU memory MiB", torch.cuda.max_memory_allocated() // 2**20)
PYEOF

want analyze && run_step analyze "$PY" -m headscope analyze "$MODEL" "${COMMON[@]}" "${DATA[@]}" --out "$OUT/analyze"
want similar && run_step similar "$PY" -m headscope similar "$MODEL" "${COMMON[@]}" "${DATA[@]}" --js-max-tokens 2000 --out "$OUT/similar"
want ablation && run_step ablation "$PY" -m headscope score "$MODEL" "${COMMON[@]}" "${DATA[@]}" --method ablation --out "$OUT/score"
want prune && run_step prune "$PY" -m headscope prune "$MODEL" "${COMMON[@]}" "${DATA[@]}" --method gradient --fraction 0.2 \
    --step 0.1 --save-model --out "$OUT/prune"
want gqa && run_step gqa "$PY" -m headscope gqa "$MODEL" "${COMMON[@]}" --kv-heads 1 --data ptb-valid --data-limit "$LIMIT" \
    --heldout ptb-test --heldout-limit "$LIMIT" --max-length "$MAXLEN" --out "$OUT/gqa"

echo "ratios to the plain forward process (${WALL[plain]} s, model load included):"
for name in $STEPS; do
    "$PY" -c "print(f'  {\"$name\":<10} {${WALL[$name]} / ${WALL[plain]}:6.2f}x')"
done
declare -A OUTPUT=([analyze]=analyze/heads.csv [similar]=similar/similar_pairs.csv [ablation]=score/importance.csv
                   [prune]=prune/prune.json [gqa]=gqa/gqa.json)
for name in $STEPS; do
    [[ -s "$OUT/${OUTPUT[$name]}" ]] || { echo "gpu_check: missing output ${OUTPUT[$name]}" >&2; exit 1; }
done
echo "gpu_check: every step ran and wrote its outputs"
