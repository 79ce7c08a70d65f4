#include "lstm.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <tuple>

#include "model_utils.h"

namespace sheaf::models {

LstmWeights lstm_weights(int64_t in, int64_t h) {
  const double s = 1.0 / std::sqrt(static_cast<double>(h));
  return {uniform_param({4 * h, in}, s), uniform_param({4 * h, h}, s), uniform_param({4 * h}, s), at::zeros({4 * h})};
}

void move_to(LstmWeights& w, const c10::Device& device) {
  for (at::Tensor* p : {&w.ih, &w.hh, &w.b}) *p = p->detach().to(device).requires_grad_();
  w.zero = w.zero.to(device);
}

std::vector<at::Tensor> lstm_params(const LstmWeights& fwd, const LstmWeights& bwd) {
  return {fwd.ih, fwd.hh, fwd.b, fwd.zero, bwd.ih, bwd.hh, bwd.b, bwd.zero};
}

namespace {

// The recurrent part of a step: (x's projection, h, c, W_hh) -> (h, c). One
// Function for every LSTM: W_hh comes in as a shared argument, so calls with
// different weights (two directions) are separate batches of the same body.
// The input's projection stays outside: it does not depend on the recurrence,
// and the scheduler runs all of them (every example, every position) as one GEMM.
const Fn<std::array<Expr, 2>(Expr, Expr, Expr, Expr)> lstm_cell(
    "lstm_cell", [](Expr xw, Expr h, Expr c, Expr hh) {
      const std::vector<Expr> g = dsl::chunk(dsl::affine(hh, h, xw), 4);  // x's projection as the bias: no add
      const Expr next_c = dsl::sigmoid(g[1]) * c + dsl::sigmoid(g[0]) * dsl::tanh(g[2]);  // i, f, g, o
      return std::array{dsl::sigmoid(g[3]) * dsl::tanh(next_c), next_c};
    });

}  // namespace

LstmState sheaf_lstm_step(const LstmWeights& w, const Expr& x, const LstmState& prev) {
  const Expr xw = dsl::affine(w.ih, x, w.b);
  if (prev.h.defined() && prev.c.defined()) {
    const auto [h, c] = lstm_cell(xw, prev.h, prev.c, w.hh);
    return {h, c};
  }
  // A first step (zero h, c; or a given h and a zero c): once per sequence, inline.
  const Expr gates = prev.h.defined() ? dsl::affine(w.hh, prev.h, xw) : xw;
  const std::vector<Expr> g = dsl::chunk(gates, 4);
  const Expr c = dsl::sigmoid(g[0]) * dsl::tanh(g[2]);
  return {dsl::sigmoid(g[3]) * dsl::tanh(c), c};
}

std::vector<Expr> sheaf_lstm(const LstmWeights& w, std::span<const Expr> xs, bool reverse) {
  const size_t n = xs.size();
  std::vector<Expr> hs(n);
  LstmState s;
  for (size_t k = 0; k < n; ++k) {
    const size_t t = reverse ? n - 1 - k : k;
    s = sheaf_lstm_step(w, xs[t], s);
    hs[t] = s.h;
  }
  return hs;
}

Expr sheaf_lstm_rows(const LstmWeights& w, const Expr& X, bool reverse) {
  return dsl::lstm(X, w.ih, w.hh, w.b, reverse);
}

Expr bilstm_ends(const Expr& F, const Expr& B) {
  // dsl::row counts from the end: the batch's sources of every length share one launch.
  return dsl::concat({dsl::row(F, -1), dsl::row(B, 0)});  // [2h]
}

std::pair<at::Tensor, at::Tensor> eager_bilstm(const LstmWeights& f, const LstmWeights& b, const at::Tensor& xs) {
  const at::Tensor h0 = at::zeros({2, 1, f.hidden()}, xs.options().requires_grad(false));
  auto [out, hn, cn] = at::lstm(xs.unsqueeze(1), {h0, h0}, lstm_params(f, b), /*has_biases=*/true, /*num_layers=*/1,
                                /*dropout=*/0.0, /*train=*/c10::GradMode::is_enabled(), /*bidirectional=*/true,
                                /*batch_first=*/false);
  return {out.squeeze(1), hn.reshape({-1})};
}

}  // namespace sheaf::models
