// Weight gradients of a round, one product per weight.
//
// Every batch of a round that applies the same shared weight (a Tree-LSTM's U
// at each tree level, a parser's cell at each step) gets its input's gradient
// in backward as usual; the weight's gradient (and a shared bias's) is
// computed once, after all of theirs, as ONE product over all their rows:
// dW = [dY_1; ...; dY_k]^T [X_1; ...; X_k]. Batch by batch, each product's
// inner dimension is that batch's few rows and each rewrites all of dW;
// together they are one GEMM with a long inner dimension. The executor keeps
// one batcher per round; ops with a shared weight ask RunCtx for it.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

namespace sheaf {

class WeightGradBatcher {
 public:
  WeightGradBatcher();
  ~WeightGradBatcher();
  // x W^T (+ b) for rows x [..., k], W [m, k], b [m] or undefined. With
  // autograd on W, its gradient (and b's) joins this batcher's product for W.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

 private:
  struct Tap;
  std::vector<std::pair<std::pair<const void*, const void*>, std::shared_ptr<Tap>>> taps_;
};

// The product alone, with GEMV for one row and, for large enough weights, a
// few rows padded to a multiple of 4 (OpenBLAS: one row through GEMM is
// several times slower than GEMV, and 7 rows of a [640, 288] weight take
// 76 us where 8 take 52 us).
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);

}  // namespace sheaf
