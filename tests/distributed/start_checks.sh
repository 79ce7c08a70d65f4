#!/usr/bin/env bash
# The TreeLSTM demo's start-up checks with two workers: every worker stops,
# each with its reason, before training (one collective for both checks), not
# only the worker at fault while the other waits out its timeout.
#   tests/distributed/start_checks.sh TREE_LSTM_BINARY LAUNCH_SH
set -uo pipefail
bin=$1
launch=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--train-trees 64 --hidden 16 --epochs 1 --compare-batches 0 --no-prefetch --dist-timeout 60)
export SHEAF_LAUNCH_GRACE=25  # (a worker left waiting is killed this long after the first one fails)
# check NAME LINE... -- COMMAND...: two workers of the command fail within
# 20 s (waiting out --dist-timeout takes 60), before training, printing every line.
check() {
  local name=$1 lines=()
  shift
  while [ "$1" != "--" ]; do lines+=("$1"); shift; done
  shift
  SECONDS=0
  "$launch" 2 -- "$@" > "$tmp/out.txt" 2>&1
  local status=$? took=$SECONDS
  [ "$status" -ne 0 ] || { echo "start_checks.sh: $name: the workers did not fail"; cat "$tmp/out.txt"; exit 1; }
  [ "$took" -lt 20 ] || { echo "start_checks.sh: $name: the workers took $took s to stop"; cat "$tmp/out.txt"; exit 1; }
  for line in "${lines[@]}"; do
    grep -qF -- "$line" "$tmp/out.txt" || { echo "start_checks.sh: $name: no '$line' in:"; cat "$tmp/out.txt"; exit 1; }
  done
  ! grep -q "^epoch 1" "$tmp/out.txt" || { echo "start_checks.sh: $name: trained first"; cat "$tmp/out.txt"; exit 1; }
  echo "start_checks.sh: $name: both workers stopped with their reasons ($took s)"
}
# Worker 0 cannot write its --save: it says why, worker 1 says whose.
check "unwritable --save" "--save: cannot write" "worker 0 cannot write its --save or --checkpoint" -- \
  "$bin" "${args[@]}" --save "$tmp/no-such-folder/x.pt"
# Worker 1 has another --seed: it names the option, worker 0 says whose.
check "another --seed" "settings differ from worker 0's in --seed" \
  "another worker's settings differ from worker 0's" -- \
  bash -c 'exec "$0" "$@" --seed $((RANK + 1))' "$bin" "${args[@]}"
# Both at once: each worker gives its own reason.
check "both" "--save: cannot write" "settings differ from worker 0's in --seed" -- \
  bash -c 'exec "$0" "$@" --seed $((RANK + 1))' "$bin" "${args[@]}" --save "$tmp/no-such-folder/x.pt"
