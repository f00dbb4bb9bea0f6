#!/bin/bash
# The same study before and after a change, in turn, one thread each: wall and CPU seconds of each run.
#   benchmarks/study_before_after.sh BASE_COMMIT MODEL BUDGET ROUNDS   (e.g. 3d551fa minilm 6m 2)
# Checks out BASE_COMMIT and HEAD into temporary worktrees and runs both with this checkout's .venv; compare the
# plans in each run's study.json (stage levels) before comparing times.
set -euo pipefail
BASE=$1; MODEL=$2; BUDGET=$3; ROUNDS=${4:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd); PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d); trap 'git -C "$ROOT" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true;
  git -C "$ROOT" worktree remove --force "$WORK/new" >/dev/null 2>&1 || true' EXIT
git -C "$ROOT" worktree add -q "$WORK/base" "$BASE"
git -C "$ROOT" worktree add -q "$WORK/new" HEAD
for round in $(seq 1 "$ROUNDS"); do
  for side in new base; do
    (cd "$WORK/$side" && PYTHONPATH="$WORK/$side" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" -c "
import resource, subprocess, sys, time
t = time.time()
rc = subprocess.call([sys.executable, '-m', 'headscope', 'study', '$MODEL', '--budget', '$BUDGET', '--out',
                      '$WORK/$side$round'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print('$MODEL $side round $round: exit', rc, 'wall', round(time.time() - t, 1), 's, CPU', round(r.ru_utime + r.ru_stime, 1), 's')
")
    "$PY" -c "
import json; st = json.load(open('$WORK/$side$round/study.json'))
print('  levels', {n: r.get('level') for n, r in st['stages'].items() if r.get('status') == 'done'})"
  done
done
