// An LSTM over sequences packed time-major, longest first (at::lstm's packed
// layout): step t's rows are [offset_t, offset_t + sizes[t]) with offset_t the
// sum of the sizes before t, and a step's first rows continue the previous
// step's sequences. Gates [i, f, g, o] as LibTorch's. The initial hidden
// state is zero, or h0 [sizes[0], h] (one row a sequence, in step 0's order;
// forward only: reversed, sequences start at different steps); the initial
// cell state is zero.
//
//   x [rows, in], ih [4h, in], hh [4h, h], b [4h] -> every step's h, [rows, h]
//
// ONE autograd node with a hand-written backward: forward, the input
// projection of all rows as one GEMM, then per step one GEMM on the active
// rows and the cell's math in place; backward through time per step, then each
// weight's gradient as ONE GEMM over all rows (autograd through the same loop
// would make a node per op per step, and a weight gradient per step).
// `reverse` runs each sequence from its last element to its first. Used by
// dsl::lstm (ops/lstm.h) and by the hand-batched tagger and seq2seq baselines.
//
// The cell's elementwise math per step: kAten, with ATen ops (~8 launches a
// step forward, ~20 backward): what LibTorch code can write, and what the
// hand-batched baselines use, so that they stay code a LibTorch user could
// ship. kFused: one vectorised loop a step forward and one backward
// (ops/lstm_cell.h), Sheaf's own kernel, as the fused elementwise groups of
// the step-by-step form are; dsl::lstm runs it. Float32 on the CPU; anything
// else runs kAten.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

namespace sheaf::op {

enum class LstmCell { kAten, kFused };

at::Tensor packed_lstm(const at::Tensor& x, const at::Tensor& ih, const at::Tensor& hh, const at::Tensor& b,
                       std::span<const int64_t> sizes, bool reverse, const at::Tensor& h0 = {},
                       LstmCell cell = LstmCell::kAten);

}  // namespace sheaf::op
