#!/usr/bin/env bash
# On a GPU machine, after scripts/cuda-run.sh's build step: the benchmark
# configurations where gathers matter, run with the CUDA row gathers (one
# kernel a gather, backend/row_copies.h) and with them switched off
# (SHEAF_NO_CUDA_ROW_GATHERS=1: LibTorch ops), alternated, into
# OUT/gathers-on.jsonl and OUT/gathers-off.jsonl.
#
#   scripts/cuda-gathers-ab.sh OUT_DIR [SST_DIR]    (BUILD_DIR, default build-cuda; SHEAF_DEADLINE seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: scripts/cuda-gathers-ab.sh OUT_DIR [SST_DIR]}"); mkdir -p "$out"
data=(); [ $# -gt 1 ] && [ -f "$2/train.txt" ] && data=(--data "$2")
bench=${BUILD_DIR:-build-cuda}/bench/sheaf-bench
deadline=${SHEAF_DEADLINE:-300}
common=(--device cuda --threads 1 --repeat 3 --trees 256 --json --systems sheaf:auto,hand --modes train,infer)
for args in "attention" "shift_reduce --hidden 256 --batch 64" "treelstm --hidden 256 --batch 256" "treelstm --hidden 256 --batch 64" \
            "transformer"; do
  for variant in on off; do
    left=$((deadline - SECONDS)); [ "$left" -le 10 ] && { echo "skipped (deadline): $args $variant"; continue; }
    flag=(); [ $variant = off ] && flag=(env SHEAF_NO_CUDA_ROW_GATHERS=1)
    data_args=(); [[ $args == treelstm* || $args == shift_reduce* ]] && data_args=("${data[@]}")
    # shellcheck disable=SC2086
    timeout "$left" "${flag[@]}" "$bench" --workload $args "${common[@]}" "${data_args[@]}" 2>/dev/null | grep '^{' >>"$out/gathers-$variant.jsonl"
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = {}
for v in ("on", "off"):
    for line in open(f"{sys.argv[1]}/gathers-{v}.jsonl"):
        r = json.loads(line)
        rows.setdefault((r["workload"], r["mode"], r["hidden"], r["batch"], r["system"]), {})[v] = r
for k, d in rows.items():
    print("%-12s %-5s h%-4d b%-4d %-6s" % k, "  ".join(
        "%s %8.1f/s %.2fx hand, ops %5.0f/%5.0f" % (v, r["trees_per_sec"], r["ratio_vs_hand"], r["launches_forward"], r["launches_backward"])
        for v, r in sorted(d.items(), reverse=True)))
PY
