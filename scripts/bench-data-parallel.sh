#!/usr/bin/env bash
# Data-parallel TreeLSTM training on this machine: one worker against two
# (scripts/launch.sh), each worker one LibTorch thread and no Prefetcher thread,
# so that two workers use the two cores and nothing more. Variants: gradient
# buckets sent during backward (default) or after it (--no-overlap), and
# embedding gradients gathered as rows (default) or made dense. Interleaved,
# REPEAT rounds; prints one JSON line per run and the medians.
#
#   scripts/bench-data-parallel.sh [DATA_DIR] [REPEAT]      (default: ../shared/data/sst, 3)
# Environment: TREES (training trees an epoch, default 4096), HIDDEN (128), BATCH (64).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data/sst}
repeat=${2:-3}
bin=./build/examples/tree_lstm
[ -x "$bin" ] || scripts/build.sh
data_args=()
[ -d "$data" ] && data_args=(--data "$data")
common=("${data_args[@]}" --epochs 2 --train-trees "${TREES:-4096}" --hidden "${HIDDEN:-128}" --batch "${BATCH:-64}"
        --threads 1 --no-prefetch --compare-batches 0 --quiet)
declare -A runs=(
  [1-worker]="$bin"
  [2-workers]="scripts/launch.sh 2 -- $bin"
  [2-workers-no-overlap]="scripts/launch.sh 2 -- $bin --no-overlap"
  [2-workers-densify]="scripts/launch.sh 2 -- $bin --dp-sparse densify"
)
order=(1-worker 2-workers 2-workers-no-overlap 2-workers-densify)
out=$(mktemp)
for ((r = 1; r <= repeat; r++)); do
  for name in "${order[@]}"; do
    log=$(${runs[$name]} "${common[@]}" 2>&1)
    # The second epoch: the first one warms allocators and the optimizer's state.
    rate=$(grep -E '^epoch 2:' <<<"$log" | sed -E 's/.* ([0-9]+) trees\/s.*/\1/')
    dp=$(grep -A2 -E '^epoch 2:' <<<"$log" | grep 'data-parallel' || true)
    backward=$(sed -nE 's/.*per batch ([0-9.]+) ms in backward.*/\1/p' <<<"$dp")
    wait_ms=$(sed -nE 's/.*, ([0-9.]+) ms waiting.*/\1/p' <<<"$dp")
    kb=$(sed -nE 's/.*, ([0-9]+) KB sent.*/\1/p' <<<"$dp")
    echo "{\"run\": \"$name\", \"round\": $r, \"trees_per_s\": ${rate:-null}, \"backward_ms\": ${backward:-null}, \"wait_ms\": ${wait_ms:-null}, \"kb_per_batch\": ${kb:-null}}" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = statistics.median(r["trees_per_s"] for r in rows if r["run"] == "1-worker")
for name in dict.fromkeys(r["run"] for r in rows):
    rs = [r for r in rows if r["run"] == name]
    med = lambda k: statistics.median(r[k] for r in rs) if rs[0][k] is not None else float("nan")
    rates = sorted(r["trees_per_s"] for r in rs)
    print(f"{name:22s} {med('trees_per_s'):7.0f} trees/s (min {rates[0]}, max {rates[-1]}) {med('trees_per_s') / base:5.2f}x"
          f"  backward {med('backward_ms'):6.2f} ms  waiting {med('wait_ms'):6.2f} ms  {med('kb_per_batch'):6.0f} KB/batch")
PY
rm -f "$out"
