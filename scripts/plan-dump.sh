#!/usr/bin/env bash
# Every plan a set of small sheaf-bench runs makes (SHEAF_DEBUG=1's plan
# dumps), for checking that a change to recording, rounds, strategies or the
# planner leaves the plans as they were: dump before and after, then cmp.
#
#   scripts/plan-dump.sh [BENCH] [SST_DIR] > plans.txt
#
# 7 workloads x {every strategy, auto/unfused, auto/inline} x {train, infer}
# at small sizes (hidden 16, 48 trees in batches of 16), plus one SST
# training run where SST_DIR (default ../shared/data/sst) exists. The output
# is deterministic: two runs of one build are byte-identical. About 20 s.
set -euo pipefail
bench=$(realpath -m "${1:-$(dirname "$0")/../build/bench/sheaf-bench}")
sst=${2:-$(dirname "$0")/../../shared/data/sst}
plans() { awk '/^\[sheaf\] plan \(/{p=1; print; next} p && /^  /{print; next} {p=0}'; }
for w in treelstm shift_reduce gated_rvnn tagger tagger-char attention transformer; do
  for sys in sheaf sheaf:auto/unfused sheaf:auto/inline; do
    for m in train infer; do
      echo "=== $w $sys $m"
      SHEAF_DEBUG=1 "$bench" --workload "$w" --trees 48 --batch 16 --repeat 1 --systems "$sys" --modes "$m" \
        --hidden 16 2>&1 > /dev/null | plans
    done
  done
done
if [ -d "$sst" ]; then
  echo "=== sst"
  SHEAF_DEBUG=1 "$bench" --workload treelstm --data "$sst" --trees 128 --batch 64 --repeat 1 --systems sheaf:auto \
    --modes train --hidden 16 2>&1 > /dev/null | plans
fi
