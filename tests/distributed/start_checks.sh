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
args=(--train-trees 64 --hidden 16 --epochs 1 --compare-batches 0 --no-prefetch --dist-timeout 120)
expect() {  # expect NAME STATUS OUTPUT LINE...: a failure, with every line in the output
  local name=$1 status=$2 out=$3
  shift 3
  [ "$status" -ne 0 ] || { echo "start_checks.sh: $name: the workers did not fail"; cat "$out"; exit 1; }
  for line in "$@"; do
    grep -qF -- "$line" "$out" || { echo "start_checks.sh: $name: no '$line' in:"; cat "$out"; exit 1; }
  done
  ! grep -q "^epoch 1" "$out" || { echo "start_checks.sh: $name: trained before stopping"; cat "$out"; exit 1; }
}
# Worker 0 cannot write its --save: it says why, worker 1 says whose.
SECONDS=0
SHEAF_LAUNCH_GRACE=100 "$launch" 2 -- "$bin" "${args[@]}" --save "$tmp/no-such-folder/x.pt" > "$tmp/save.txt" 2>&1
expect "unwritable --save" $? "$tmp/save.txt" "--save: cannot write" "worker 0 cannot write its --save or --checkpoint"
# Worker 1 has another --seed: it names the option, worker 0 says whose.
SHEAF_LAUNCH_GRACE=100 "$launch" 2 -- bash -c 'exec "$0" "$@" --seed $((RANK + 1))' "$bin" "${args[@]}" \
  > "$tmp/seed.txt" 2>&1
expect "another --seed" $? "$tmp/seed.txt" "settings differ from worker 0's in --seed" \
  "another worker's settings differ from worker 0's"
# (Both stop at once: waiting out --dist-timeout would take minutes.)
[ "$SECONDS" -lt 100 ] || { echo "start_checks.sh: the workers took ${SECONDS} s to stop"; exit 1; }
echo "start_checks.sh: both workers stopped with their reasons (${SECONDS} s)"
