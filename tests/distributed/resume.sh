#!/usr/bin/env bash
# The TreeLSTM demo's data-parallel checkpoints: epoch 1 on two workers with
# --checkpoint, epoch 2 resumed on one worker, against two epochs on one
# worker. The losses must agree (to rounding: the two runs sum gradients in
# different orders).
#   tests/distributed/resume.sh TREE_LSTM_BINARY LAUNCH_SH
set -euo pipefail
bin=$1
launch=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--train-trees 300 --hidden 32 --compare-batches 0 --quiet --no-prefetch)
"$launch" 2 -- "$bin" "${args[@]}" --epochs 1 --checkpoint "$tmp/ck" > "$tmp/two.txt"
"$bin" "${args[@]}" --epochs 2 --resume "$tmp/ck" > "$tmp/resumed.txt"
"$bin" "${args[@]}" --epochs 2 > "$tmp/one.txt"
loss() { sed -nE "s/^epoch $1: loss ([0-9.]+) .*/\1/p" "$2"; }
same() {
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-3) }' ||
    { echo "resume.sh: $3: $1 vs $2"; cat "$tmp"/*.txt; exit 1; }
}
grep -q "resuming after epoch 1" "$tmp/resumed.txt" || { echo "resume.sh: did not resume"; cat "$tmp/resumed.txt"; exit 1; }
same "$(loss 1 "$tmp/two.txt")" "$(loss 1 "$tmp/one.txt")" "epoch 1, two workers vs one"
same "$(loss 2 "$tmp/resumed.txt")" "$(loss 2 "$tmp/one.txt")" "epoch 2, resumed vs one worker throughout"
echo "resume.sh: epoch 1 loss $(loss 1 "$tmp/two.txt") (2 workers) = $(loss 1 "$tmp/one.txt") (1); epoch 2 $(loss 2 "$tmp/resumed.txt") (resumed) = $(loss 2 "$tmp/one.txt")"
