#!/usr/bin/env bash
# Host work counted in instructions (valgrind's Ir). Wall time on a shared
# 2-core machine swings by 30-40% within seconds; an instruction count does
# not, so a change to recording or scheduling shows as a before/after pair of
# counts even where its wall-time effect (a few percent) is below the noise.
#
#   scripts/host-instructions.sh [host|gated] [BENCH] [TREES]
#
# host (default): recording and scheduling a TreeLSTM batch, per node
#   (`sheaf-bench --workload host`; synthetic trees, batch 64):
#   record_ir_per_node    TreeLSTM::sheaf_batch_loss (the model's calls)
#   schedule_ir_per_node  Graph::prepare (rounds, fusion, strategy, plan; no launch)
#   over every batch of the run, warm-up included.
# gated: the gated net's inference (synthetic trees, batch 64, h=128), per
#   batch: record (the model's calls before forward), schedule (every round's
#   rounds, fusion, strategy, plan), deliver (conds' callbacks: the branches
#   recorded) and, for scale, execute. GATED_STRATEGY=depth (or another
#   strategy) counts that schedule instead of auto's.
# BENCH: the sheaf-bench to count (default build/bench/sheaf-bench); TREES:
# how many (default 256 for host, 128 for gated). Prints one JSON line.
#
# Counts compare two builds on one machine: the compiler, LibTorch and
# valgrind's CPU (it reports no AVX-512, so kernels take their AVX2 paths)
# all move them. Needs valgrind (apt-get install -y valgrind); 1-3 minutes.
set -euo pipefail
workload=${1:-host}
# BENCH and HOST_IR_KEEP (a folder for the raw files) are taken from the caller's directory.
bench=$(realpath -m "${2:-$(dirname "$0")/../build/bench/sheaf-bench}")
keep=${HOST_IR_KEEP:+$(realpath -m "$HOST_IR_KEEP")}
cd "$(dirname "$0")/.."
case "$workload" in
  host) trees=${3:-256}; args=(--workload host --trees "$trees" --batch 64 --repeat 1 --systems sheaf:auto --json) ;;
  gated) trees=${3:-128}; args=(--workload gated_rvnn --hidden 128 --trees "$trees" --batch 64 --repeat 1
                                --systems "sheaf:${GATED_STRATEGY:-auto}" --modes infer --threads 1 --json) ;;
  *) echo "host-instructions: workload is host or gated, not '$workload'" >&2; exit 2 ;;
esac
command -v valgrind > /dev/null || { echo "host-instructions: needs valgrind (apt-get install -y valgrind)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -n "$keep" ] && trap 'mkdir -p "$keep" && cp "$out"/* "$keep"; rm -rf "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bench" "${args[@]}" > "$out/json" 2> "$out/log" ||
  { cat "$out/log" >&2; exit 1; }
callgrind_annotate --inclusive=yes --threshold=100 "$out/cg" > "$out/annotated"
python3 - "$workload" "$out/json" "$out/annotated" "$out/cg" "$bench" "$trees" <<'PY'
import json, re, sys
workload, run_json, annotated, raw, bench, trees = sys.argv[1:]
def inclusive(name):
    for line in open(annotated):  # sorted by count: the function itself before lines that merely contain the name
        m = re.match(r"\s*([\d,]+)\s", line)
        if m and name in line:
            return int(m.group(1).replace(",", ""))
    sys.exit(f"host-instructions: {name} not in the profile")
def calls(name):
    # Calls to functions whose name contains `name`, from callgrind's raw
    # file (names compressed: "(id) name" once, then "(id)").
    names, total, callee = {}, 0, None
    for line in open(raw):
        m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(2): names[m.group(1)] = m.group(2)
            callee = names.get(m.group(1), "") if line.startswith("cfn=") else None
        elif line.startswith("calls=") and callee is not None and name in callee:
            total += int(line.split("=")[1].split()[0])
    return total
result = {"workload": workload, "bench": bench, "trees": int(trees)}
if workload == "host":
    nodes = json.loads(open(run_json).readline())["nodes_recorded"]
    record = inclusive("TreeLSTM::sheaf_batch_loss(sheaf::Graph&, std::span<sheaf::data::Tree const* const")
    schedule = inclusive("sheaf::Graph::prepare(")
    result.update(nodes_recorded=nodes, record_ir_per_node=round(record / nodes, 1),
                  schedule_ir_per_node=round(schedule / nodes, 1), total_ir_per_node=round((record + schedule) / nodes, 1))
else:
    batches = calls("GatedRvNN::sheaf_batch_root_logits(")
    phases = {"record": "GatedRvNN::sheaf_batch_root_logits(", "schedule": "Engine::schedule_round(",
              "deliver": "Engine::deliver_waiters(", "execute": "Engine::execute_round("}
    result["batches"] = batches
    for key, name in phases.items():
        result[key + "_ir_per_batch"] = round(inclusive(name) / batches)
    result["host_ir_per_batch"] = sum(result[k + "_ir_per_batch"] for k in ("record", "schedule", "deliver"))
print(json.dumps(result))
PY
