// LSTM pieces shared by the examples' models: weights in LibTorch's layout, the
// per-example Sheaf cell, and LibTorch's fused at::lstm for eager baselines.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <span>
#include <utility>
#include <vector>

#include <sheaf/sheaf.h>

namespace sheaf::models {

// One LSTM direction's weights, in at::lstm's layout ([i, f, g, o] gate
// blocks) with one bias (at::lstm's second bias is the constant `zero`).
struct LstmWeights {
  at::Tensor ih, hh, b;  // [4h, in], [4h, h], [4h]
  at::Tensor zero;       // [4h] zeros, no gradient: at::lstm's b_hh
  int64_t hidden() const { return hh.size(1); }
};

// LibTorch's initialisation: U(-1/sqrt(h), 1/sqrt(h)), on the CPU.
LstmWeights lstm_weights(int64_t in, int64_t h);
void move_to(LstmWeights& w, const c10::Device& device);

// Both directions' weights for at::lstm: {fwd: ih, hh, b, zero, bwd: ...}.
std::vector<at::Tensor> lstm_params(const LstmWeights& fwd, const LstmWeights& bwd);

// A cell's state; an undefined h or c stands for zeros (the first step).
struct LstmState {
  Expr h, c;
};

// Sheaf, one step for one example: the state after reading x.
LstmState sheaf_lstm_step(const LstmWeights& w, const Expr& x, const LstmState& prev);

// Sheaf: one direction over xs from a zero state; the hidden state at every
// position, in the order of xs. The input projections do not depend on the
// recurrence, so the scheduler runs all of them (every example, every
// position) as one GEMM.
std::vector<Expr> sheaf_lstm(const LstmWeights& w, std::span<const Expr> xs, bool reverse);

// Sheaf, the rows form: dsl::lstm with these weights over X [n, in], every
// position's hidden state [n, h] (one launch for the batch's sequences).
Expr sheaf_lstm_rows(const LstmWeights& w, const Expr& X, bool reverse);
// A BiLSTM's final states from its two directions' rows F and B [n, h]: the
// forward one's last row and the backward one's first, as one [2h] vector.
Expr bilstm_ends(const Expr& F, const Expr& B);

// Eager: at::lstm over one sequence [n, in], both directions; (outputs [n, 2h],
// final states [2h]: the forward direction's last and the backward's first).
std::pair<at::Tensor, at::Tensor> eager_bilstm(const LstmWeights& f, const LstmWeights& b, const at::Tensor& xs);

}  // namespace sheaf::models
