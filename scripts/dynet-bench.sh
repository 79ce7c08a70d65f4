#!/usr/bin/env bash
# DyNet's autobatching side by side with Sheaf: DyNet 2.2 from PyPI (the
# dyNET38 wheel: DyNet with Eigen, AVX2 + FMA, one thread; driven from Python,
# as DyNet's own Python benchmark) in a virtual environment, and sheaf-bench
# (Sheaf auto and hand-batched), on the same data, interleaved three times on
# this machine: the BiLSTM taggers (issue 16) on sheaf-bench's synthetic corpus
# (--write-data), and, when SST_DIR has SST's train trees, the Tree-LSTM at
# h=128 and 256 and the shift-reduce parser. Writes JSON lines to OUT (default
# docs/dynet/results.jsonl) only when every run succeeded; DyNet's messages go
# to OUT.log. Needs PyPI the first time (DYNET_VENV: another environment).
# ROUNDS (default 3): interleaved rounds; SST_DIR "none": the taggers only.
#   scripts/dynet-bench.sh [SST_DIR] [OUT]     (SST_DIR default ../shared/data/sst)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d build ]; then cmake --build build -j"$(nproc)" --target sheaf-bench > /dev/null; else scripts/build.sh; fi
bench=./build/bench/sheaf-bench
venv=${DYNET_VENV:-build/dynet-venv}
if ! "$venv/bin/python" -c 'import dynet_config, dynet' > /dev/null 2>&1; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q dyNET38==2.2
fi
sst=${1:-../shared/data/sst}
out=${2:-docs/dynet/results.jsonl}
mkdir -p "$(dirname "$out")"
data=build/tagger-synthetic.txt
"$bench" --workload tagger --write-data "$data" > /dev/null
tmp="$out.tmp"
log="$out.log"
: > "$log"
dynet() { "$venv/bin/python" "bench/dynet/$1" "${@:2}" --json 2>> "$log"; }
# A subshell with its own errexit (an `|| ...` after it would switch that off inside).
set +e
(
  set -e
  for round in $(seq "${ROUNDS:-3}"); do
    for w in tagger tagger-char; do
      chars=""
      [ "$w" = tagger-char ] && chars=--chars
      dynet bilstm_tagger.py --data "$data" $chars --sentences 512 --batch 64 --repeat 5
      "$bench" --workload "$w" --data "$data" --hidden 128 --batch 64 --trees 512 --threads 1 --repeat 5 --json \
        --systems sheaf:auto,sheaf:auto/seq,hand
    done
    if [ -f "$sst/train.txt" ]; then
      for h in 128 256; do
        dynet tree_lstm.py --data "$sst" --hidden "$h" --trees 1024 --batch 64 --repeat 5
        "$bench" --workload treelstm --data "$sst" --hidden "$h" --batch 64 --trees 1024 --threads 1 --repeat 5 --json \
          --systems sheaf:auto,hand
      done
      dynet shift_reduce.py --data "$sst" --hidden 128 --trees 512 --batch 64 --repeat 5
      "$bench" --workload shift_reduce --data "$sst" --hidden 128 --batch 64 --trees 512 --threads 1 --repeat 5 \
        --json --systems sheaf:auto,hand
    fi
  done
) > "$tmp"
status=$?
set -e
if [ "$status" -ne 0 ]; then
  echo "dynet-bench: a run failed (see $log); $out left as it was" >&2
  rm -f "$tmp"
  exit 1
fi
mv "$tmp" "$out"
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    name = r["system"] + (":" + r["strategy"] if r.get("strategy") else "")
    by.setdefault((r["workload"], r["mode"], r["hidden"]), {}).setdefault(name, []).append(r["trees_per_sec"])
for (w, mode, hidden), systems in sorted(by.items()):
    med = {k: statistics.median(v) for k, v in systems.items()}
    dynet = med.get("dynet:autobatch")
    line = ", ".join(f"{k} {v:.0f}" + (f" ({v / dynet:.2f}x DyNet)" if dynet and k != "dynet:autobatch" else "")
                     for k, v in med.items())
    rounds = max(len(v) for v in systems.values())
    print(f"{w} {mode} h={hidden} (items/s, median of {rounds} rounds): {line}")
PY
