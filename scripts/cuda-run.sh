#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a pip-installed CUDA torch (no Debian
# packages): builds Sheaf against that LibTorch and runs the GPU checks.
#
#   scripts/cuda-run.sh HEADERS_DIR OUT_DIR [SST_DIR] [STEP...]
#
# HEADERS_DIR: made by scripts/vendor-headers.sh on a machine that has the
# header-only packages. STEPs (default: build test profile bench), in order:
#   build     configure + build into $BUILD_DIR (default build-cuda); device.txt, build.log
#             ($BUILD_TARGETS, default all: e.g. "sheaf-tests sheaf-bench" to save device time)
#   test      sheaf-tests "[cuda]" (every op, control flow, TreeLSTM, parser on the GPU); tests-cuda.txt
#   alltests  the whole suite (CPU tests too, against this LibTorch); tests-all.txt
#   profile   one profiled pass of TreeLSTM train+infer, phases synchronised; profile.txt
#   calibrate sheaf-bench --workload calibrate --device cuda: the CostModel's CUDA figures; calibrate-cuda.txt
#   bench     the GPU benchmark set; results-cuda.jsonl (docs/ takes it, see bench/report.py)
#             ($SHEAF_TREES trees per run, default 512)
# Steps after a failed one still run; the exit status says whether any failed.
# SHEAF_DEADLINE (seconds, default 540) stops the bench step's runs from starting past it.
set -uo pipefail
cd "$(dirname "$0")/.."
hdr=$(realpath "${1:?usage: scripts/cuda-run.sh HEADERS_DIR OUT_DIR [SST_DIR] [STEP...]}")
out=$(realpath -m "${2:?OUT_DIR}"); shift 2
data=""
if [ $# -gt 0 ] && [ -d "$1" ]; then data=$1; shift; fi
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(build test profile bench)
mkdir -p "$out"
build=${BUILD_DIR:-build-cuda}
bench=$build/bench/sheaf-bench
deadline=${SHEAF_DEADLINE:-540}
data_args=(); [ -n "$data" ] && [ -f "$data/train.txt" ] && data_args=(--data "$data")
failed=0

# Runs one command under what is left of the deadline; a run that cannot finish is skipped.
bounded() {
  local left=$((deadline - SECONDS))
  if [ "$left" -le 10 ]; then echo "skipped (deadline): $*"; return 1; fi
  timeout "$left" "$@"
}

for step in "${steps[@]}"; do
  echo "== $step (${SECONDS}s)"
  case $step in
    build)
      { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
        lscpu | sed -n 's/^Model name: *//p'; nproc; } 2>&1 | tee "$out/device.txt"
      prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
      generator=(); keep_going=(-k)  # keep building the other targets past a failure
      command -v ninja >/dev/null && generator=(-G Ninja) && keep_going=(-k 0)
      if cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
           -DSHEAF_HANA_INCLUDE_DIR="$hdr" -DSHEAF_CLI11_INCLUDE_DIR="$hdr" -DSHEAF_CATCH2_INCLUDE_DIR="$hdr" -DSHEAF_GLOO_INCLUDE_DIR="$hdr" \
           >"$out/build.log" 2>&1 &&
         cmake --build "$build" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} -- "${keep_going[@]}" \
           >>"$out/build.log" 2>&1; then
        echo "built"
      else
        failed=1
        grep -E -A3 "error|Error" "$out/build.log" | head -60
      fi
      ;;
    test)
      bounded "$build/tests/sheaf-tests" "[cuda]" >"$out/tests-cuda.txt" 2>&1 || failed=1
      tail -25 "$out/tests-cuda.txt"
      ;;
    alltests)
      bounded "$build/tests/sheaf-tests" >"$out/tests-all.txt" 2>&1 || failed=1
      tail -8 "$out/tests-all.txt"
      ;;
    profile)
      bounded "$bench" --device cuda --profile --hidden 256 --batch 64 --trees 256 --repeat 1 \
        --systems per-example,sheaf,hand --modes train,infer "${data_args[@]}" >"$out/profile.txt" 2>&1 || failed=1
      grep -v "repeat" "$out/profile.txt"
      ;;
    calibrate)
      bounded "$bench" --workload calibrate --device cuda --threads 1 --repeat 9 >"$out/calibrate-cuda.txt" 2>&1 || failed=1
      cat "$out/calibrate-cuda.txt"
      ;;
    bench)
      res=$out/results-cuda.jsonl
      : >"$res"
      common=(--device cuda --threads 1 --repeat 3 --json)
      # Most important first: a run cut by the deadline loses only what follows it.
      for args in "treelstm --hidden 256 --batch 64" "treelstm --hidden 256 --batch 256" "shift_reduce --hidden 256 --batch 64" \
                  "gated_rvnn --hidden 128 --batch 64" "attention --hidden 128 --batch 64" "transformer --hidden 128 --batch 64" \
                  "treelstm --hidden 512 --batch 64" "treelstm --hidden 512 --batch 256"; do
        systems=(); [[ $args == treelstm* ]] && systems=(--systems per-example,sheaf:auto,sheaf:lazy,sheaf:auto+prefetch,hand)
        [[ $args == attention* ]] && systems=(--systems per-example,sheaf:auto,hand)
        # The Transformer's hand groups sentences by length (fastest on the CPU); on a GPU, where
        # that is 4 launches an op, padding all to the longest (hand:pad) may be the stronger one.
        [[ $args == transformer* ]] && systems=(--systems per-example,sheaf:auto,hand,hand:pad)
        # The gated net's hand reads its gates on the host (a wait a level on a GPU); hand:mask does not.
        [[ $args == gated_rvnn* ]] && systems=(--systems per-example,sheaf:auto,hand,hand:mask)
        # The Transformer tags sentences: --data would name a word|TAG file, not SST;
        # the attention decoder makes its digit strings (sheaf-bench refuses --data there).
        wl_data=("${data_args[@]}"); [[ $args == transformer* || $args == attention* ]] && wl_data=()
        # shellcheck disable=SC2086
        bounded "$bench" --workload $args --trees "${SHEAF_TREES:-512}" "${common[@]}" "${wl_data[@]}" "${systems[@]}" >>"$res" || failed=1
      done
      python3 - "$res" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print("%-12s %-5s h%-4d b%-4d %-12s %-7s %9.1f/s  vs hand %.2fx  vs per-ex %.1fx  launches %.0f  trace+sched %.2f ms"
              % (r["workload"], r["mode"], r["hidden"], r["batch"], r["system"], r["strategy"], r["trees_per_sec"],
                 r["ratio_vs_hand"], r["speedup_vs_per_example"], r["launches_per_batch"],
                 r["trace_ms_per_batch"] + r["sched_ms_per_batch"]))
EOF
      ;;
    *) echo "unknown step $step"; failed=1 ;;
  esac
done
echo "== done (${SECONDS}s), failed=$failed"
exit $failed
