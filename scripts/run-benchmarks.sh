#!/usr/bin/env bash
# Runs the committed benchmark set and regenerates docs/benchmark-results.{md,png} and
# docs/results-<device>.jsonl. Usage: scripts/run-benchmarks.sh [SST_DIR] [cpu|cuda]
# (SST_DIR default ../shared/data/sst; synthetic trees if it does not exist).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-../shared/data/sst}
device=${2:-cpu}
bench=./build/bench/sheaf-bench
[ -x "$bench" ] || scripts/build.sh
args=(--device "$device" --threads 1 --repeat 5 --json)
[ -f "$data/train.txt" ] && args+=(--data "$data")
out=docs/results-$device.jsonl
{
  # auto+prefetch: Sheaf with sheaf::Prefetcher, which records and schedules the
  # next batch on a second host thread (ranked apart in the report).
  # auto+overlap: Sheaf with sheaf::Overlap, the batch as two parts on two
  # threads whose kernels take turns (control flow that decides as it runs:
  # the gated net, greedy parsing and decoding; ranked apart in the report).
  # /inline: the same model with its sheaf::Functions recorded op by op (GraphOptions::inline_functions).
  # /unpacked: every product through OpenBLAS (GraphOptions::pack_weights off),
  # to show what the weights laid out once (ops/packed_gemm.h) bring;
  # hand:sheaf-gemm: the hand version with that same product kernel, not
  # LibTorch code: a reference for how much of the lead is the kernel.
  "$bench" --workload treelstm --hidden 128,256 --batch 64 --trees 1024 "${args[@]}" \
    --systems per-example,sheaf,sheaf:auto/inline,sheaf:auto/unpacked,sheaf:auto+prefetch,hand,hand:sheaf-gemm
  # /eager: every node as soon as it can run, also while control flow waits
  # (GraphOptions::defer_unawaited off): the step losses of greedy parsing run a step at a time.
  "$bench" --workload shift_reduce --hidden 128 --batch 64 --trees 512 "${args[@]}" \
    --systems per-example,sheaf,sheaf:auto/inline,sheaf:auto/eager,sheaf:auto/unpacked,sheaf:auto+prefetch,sheaf:auto+overlap,hand
  # hand: each cell on its own rows (gates read on the host); hand:mask: both
  # cells on every row and a 0/1 mask (the issue's masked baseline; no wait
  # for the gates, which may win on a GPU).
  "$bench" --workload gated_rvnn --hidden 128 --batch 64 --trees 512 "${args[@]}" \
    --systems per-example,sheaf,sheaf:auto/inline,sheaf:auto/eager,sheaf:auto+overlap,sheaf:depth+overlap,hand,hand:mask
  # DyNet's tagger workloads, on synthetic sentences with DyNet's sizes (SST has
  # no tags). hand: one custom autograd node per LSTM direction (packed_lstm, its
  # cell in ATen ops); hand:lstm runs LibTorch's at::lstm on the packed batch
  # (bench/baselines/tagger_hand.h).
  # /seq: the same tagger with each LSTM as one dsl::lstm over the sentence's rows
  # (its cell one fused loop a step). hand:sheaf-cell: hand with that same
  # fused cell, not LibTorch code: a reference for how much of /seq's lead is the kernel.
  for w in tagger tagger-char; do
    "$bench" --workload "$w" --hidden 128 --batch 64 --trees 512 --device "$device" --threads 1 --repeat 5 --json \
      --systems per-example,sheaf:auto,sheaf:auto/inline,sheaf:auto/seq,sheaf:auto+prefetch,hand,hand:lstm,hand:sheaf-cell
  done
  # Seq2seq with attention on generated digit strings of 3-20 (infer: greedy decoding;
  # hand decodes with broadcast multiply + sum, hand:bmm with bmm). /seq: the encoder as
  # dsl::lstm and, in training, the decoder as one dsl::lstm and one dsl::attention.
  "$bench" --workload attention --hidden 128 --batch 64 --trees 512 --device "$device" --threads 1 --repeat 5 --json \
    --systems per-example,sheaf:auto,sheaf:auto/seq,sheaf:auto+prefetch,sheaf:auto+overlap,sheaf:auto+overlap/seq,hand,hand:bmm
  # One Transformer encoder layer tagging sentences of 5-40 words (--hidden: its width).
  # hand: attention in 4 length buckets; hand:pad: padded to the batch's longest;
  # hand:sheaf-attention: hand with Sheaf's CPU attention loop (a reference, not LibTorch code).
  "$bench" --workload transformer --hidden 64,128 --batch 64 --trees 512 --device "$device" --threads 1 --repeat 5 \
    --json --systems per-example,sheaf:auto,sheaf:auto+prefetch,hand,hand:pad,hand:sheaf-attention
  # Host work alone (ns per node for recording and each scheduling step).
  "$bench" --workload host --hidden 128 --batch 64 --trees 1024 "${args[@]}" --systems sheaf,sheaf:auto/inline
  # What a launch and a gathered MiB cost here (scheduler/cost.h's CostModel for this device).
  "$bench" --workload calibrate --device "$device" --threads 1 --repeat 9 --json
} > "$out"
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $("$bench" --info --threads 1)"
python3 bench/report.py docs/results-*.jsonl --markdown docs/benchmark-results.md --plot docs/benchmark-results.png \
  --title "Sheaf benchmark results" --machine "$machine" --command "scripts/run-benchmarks.sh $*"
