#!/usr/bin/env bash
# DyNet's autobatching side by side with Sheaf (issue 16): DyNet 2.2 from PyPI
# (the dyNET38 wheel: DyNet with Eigen, AVX2 + FMA, one thread) in a virtual
# environment, and sheaf-bench's taggers (Sheaf auto and hand-batched), on the
# same data file, interleaved three times on this machine. The data file is
# sheaf-bench's synthetic corpus (--write-data). Writes JSON lines to OUT
# (default docs/dynet/results-tagger.jsonl). Needs PyPI the first time.
#   scripts/dynet-bench.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
bench=./build/bench/sheaf-bench
[ -x "$bench" ] || scripts/build.sh
venv=${DYNET_VENV:-build/dynet-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q dyNET38==2.2
fi
data=build/tagger-synthetic.txt
"$bench" --workload tagger --write-data "$data" > /dev/null
out=${1:-docs/dynet/results-tagger.jsonl}
mkdir -p "$(dirname "$out")"
{
  for round in 1 2 3; do
    for w in tagger tagger-char; do
      chars=(); [ "$w" = tagger-char ] && chars=(--chars)
      "$venv/bin/python" bench/dynet/bilstm_tagger.py --data "$data" "${chars[@]}" --sentences 512 --batch 64 \
        --repeat 5 --json 2> /dev/null
      "$bench" --workload "$w" --data "$data" --hidden 128 --batch 64 --trees 512 --threads 1 --repeat 5 --json \
        --systems sheaf:auto,hand
    done
  done
} > "$out"
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    name = r["system"] + (":" + r["strategy"] if r.get("strategy") else "")
    by.setdefault((r["workload"], r["mode"]), {}).setdefault(name, []).append(r["trees_per_sec"])
for (w, mode), systems in sorted(by.items()):
    med = {k: statistics.median(v) for k, v in systems.items()}
    dynet = med.get("dynet:autobatch")
    line = ", ".join(f"{k} {v:.0f}" + (f" ({v / dynet:.2f}x DyNet)" if dynet and k != "dynet:autobatch" else "")
                     for k, v in med.items())
    print(f"{w} {mode} (sentences/s, median of 3 rounds): {line}")
PY
