// An LSTM over one example's sequence: X [L, d] -> every step's hidden state
// [L, h], from a zero state, with shared weights W_ih [4h, d], W_hh [4h, h]
// and a bias b [4h] (gates [i, f, g, o], as LibTorch's); attribute 0: 1 runs
// the sequence backward (the second half of a BiLSTM).
//
// Why one op: written step by step (an LSTM cell per element), a sequence is
// L dependent steps, each a batch per step of every example (the autobatched
// form: it works, and takes a launch or two per step and op). Here the whole
// batch of sequences, of any lengths, is ONE packed launch (OpTraits::per_value):
// the values' rows are reordered time-major, longest first, and run through
// packed_lstm on the CPU (ops/packed_lstm.h: a GEMM a step and the cell's
// math as one fused loop, ops/lstm_cell.h; one autograd node whose backward
// computes each weight's gradient as one GEMM), through at::lstm on CUDA.
#pragma once

#include <ATen/ops/lstm.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common.h"
#include "grad_wanted.h"
#include "map_rows.h"
#include "packed_lstm.h"

namespace sheaf::op {

// attrs: reverse (0 or 1). LstmFrom (below): from a given initial state.
struct Lstm {
  static constexpr std::string_view name = "lstm";
  static constexpr OpTraits traits{.arity = 4, .rowwise = true, .weights = 0b0110, .per_value = true};
  static Shape infer(const InferCtx& c) { return infer_lstm(c); }

  static Shape infer_lstm(const InferCtx& c) {
    const Shape &x = c.shape(0), &ih = c.shape(1), &hh = c.shape(2), &b = c.shape(3);
    if (x.rank() != 2) c.fail("needs a sequence as a matrix X [L, d] (one row a step), got ", x.str());
    if (x[0] == 0) c.fail("needs a sequence of at least one step, got X ", x.str());
    if (ih.rank() != 2 || hh.rank() != 2 || b.rank() != 1)
      c.fail("needs weights W_ih [4h, d], W_hh [4h, h] and a bias [4h], got ", ih.str(), ", ", hh.str(), " and ",
             b.str());
    const int64_t h = hh[1];
    if (hh[0] != 4 * h || ih[0] != 4 * h || b[0] != 4 * h)
      c.fail("W_hh ", hh.str(), " makes the hidden size ", h, ": W_ih and the bias need ", 4 * h, " rows, got ",
             ih.str(), " and ", b.str());
    if (ih[1] != x[1]) c.fail("W_ih ", ih.str(), " does not take rows of X ", x.str());
    if (!c.shared(1) || !c.shared(2) || !c.shared(3))
      c.fail("needs its weights and bias shared by every example (parameters, or values computed from them only)");
    if (c.arity() > 4 && c.shape(4) != Shape{h})
      c.fail("the initial state must be a vector of the hidden size [", h, "], got ", c.shape(4).str());
    return Shape{x[0], h};
  }
  static at::Tensor run(RunCtx& c) { return run_lstm(c, c.attr(0) != 0, false); }

  // Shared with LstmFrom: from a zero state, or from argument 4's rows.
  static at::Tensor run_lstm(RunCtx& c, bool reverse, bool from_h0) {
    std::vector<int64_t> lengths(c.segment_counts().begin(), c.segment_counts().end());
    at::Tensor rows = c.in(0);
    const bool by_shape = lengths.empty();  // values of one shape: [n, L, d]
    if (by_shape) {
      rows = c.batched(0);
      lengths.assign(static_cast<size_t>(rows.size(0)), rows.size(1));
      rows = rows.reshape({-1, rows.size(2)});
    }
    // On the CPU in float, packed_lstm with the fused cell (ops/lstm_cell.h),
    // with or without a gradient: its input projection is one GEMM and its
    // cell one loop a step, where at::lstm's CPU kernel projects each step's
    // input apart and runs the cell op by op. Other CPU types: packed_lstm's
    // ATen form when a gradient is wanted (one autograd node, weight gradients
    // one GEMM each), else at::lstm. Off the CPU: at::lstm (cuDNN). at::lstm
    // runs each sequence forward: reversed, its rows are taken last first.
    // Its train flag must be set for a backward (cuDNN refuses one otherwise;
    // with no dropout it changes nothing else but what cuDNN keeps for one).
    const bool cpu_float = rows.is_cpu() && rows.scalar_type() == at::kFloat;
    const bool libtorch = !rows.is_cpu() || (!cpu_float && !c10::GradMode::is_enabled());
    const bool flip = reverse && libtorch;
    // Time-major, longest first: step t holds row t of every value longer than t.
    std::vector<size_t> order(lengths.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
    std::vector<int64_t> start(lengths.size());
    for (size_t k = 1; k < lengths.size(); ++k) start[k] = start[k - 1] + lengths[k - 1];
    const int64_t longest = lengths.empty() ? 0 : lengths[order[0]];
    std::vector<int64_t> sizes, perm;
    perm.reserve(static_cast<size_t>(rows.size(0)));
    for (int64_t t = 0; t < longest; ++t) {
      int64_t active = 0;
      for (size_t k : order) {
        if (lengths[k] <= t) break;
        const int64_t r = start[k] + (flip ? lengths[k] - 1 - t : t);
        perm.push_back(r);
        ++active;
      }
      sizes.push_back(active);
    }
    const auto device = rows.device();
    const auto total = static_cast<int64_t>(perm.size());
    const RowMap to_steps(perm, total, device), to_values = to_steps.inverse();
    const at::Tensor data = map_rows(rows, to_steps);
    // The initial states in step 0's order: packed, argument 4 is repeated on
    // each of a value's rows (its first is taken); by shape, one row a value.
    // A shared one (a learned start) is the same row for every value.
    at::Tensor h0;
    const auto n = static_cast<int64_t>(order.size());
    if (from_h0 && c.shared(4)) {
      h0 = c.in(4).reshape({1, -1}).expand({n, -1});
    } else if (from_h0) {
      const at::Tensor given = by_shape ? c.batched(4) : c.in(4);
      std::vector<int64_t> first(order.size());
      for (size_t k = 0; k < order.size(); ++k) {
        first[k] = by_shape ? static_cast<int64_t>(order[k]) : start[order[k]];
        SHEAF_ASSERT(first[k] < given.size(0), "lstm_from: value ", k, "'s first row ", first[k], " of ",
                     given.size(0));
      }
      h0 = map_rows(given, RowMap(first, given.size(0), device));
    }
    at::Tensor packed;
    if (libtorch) {
      const at::Tensor &ih = c.in(1), &hh = c.in(2), &b = c.in(3);
      const at::Tensor zero = at::zeros({1, sizes.empty() ? 0 : sizes[0], hh.size(1)}, data.options());
      const bool grad = grad_wanted(data, ih, hh, b, h0);
      packed = std::get<0>(at::lstm(data, at::tensor(sizes, at::kLong), {h0.defined() ? h0.unsqueeze(0) : zero, zero},
                                    {ih, hh, b, at::zeros_like(b)}, /*has_biases=*/true, /*num_layers=*/1,
                                    /*dropout=*/0.0, /*train=*/grad, /*bidirectional=*/false));
    } else {
      // packed_lstm itself runs the ATen cell where the fused one cannot run.
      packed = packed_lstm(data, c.in(1), c.in(2), c.in(3), sizes, reverse, h0, LstmCell::kFused);
    }
    const at::Tensor out = map_rows(packed, to_values);
    return by_shape ? out.view({static_cast<int64_t>(lengths.size()), longest, -1}) : out;
  }
};

// The same from a given initial hidden state h0 [h] (a decoder started from
// an encoder's state), forward only; the cell state starts at zero.
struct LstmFrom {
  static constexpr std::string_view name = "lstm_from";
  static constexpr OpTraits traits{.arity = 5, .rowwise = true, .weights = 0b0110, .per_value = true};
  static Shape infer(const InferCtx& c) { return Lstm::infer_lstm(c); }
  static at::Tensor run(RunCtx& c) { return Lstm::run_lstm(c, false, true); }
};

}  // namespace sheaf::op
