// Helpers shared by the tests. Its includes are sheaf-tests' precompiled
// header (tests/CMakeLists.txt): change them together.
#pragma once

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <sheaf/sheaf.h>

#include <cmath>
#include <functional>
#include <vector>

namespace sheaf::test {

// Parameters that require grad, deterministic per seed.
inline at::Tensor param(std::vector<int64_t> shape, uint64_t seed, double scale = 0.5) {
  at::manual_seed(seed);
  return (at::randn(shape) * scale).requires_grad_();
}

// A per-example input, deterministic per (example, salt).
inline at::Tensor data(std::vector<int64_t> shape, int example, int salt = 0) {
  at::manual_seed(1000 + 31 * example + salt);
  return at::randn(shape);
}

// The gradients of `params` from one backward of loss() (dense copies; zeros
// for a parameter the loss does not reach), then the loss itself. Earlier
// gradients are dropped first, so calls do not accumulate.
inline std::vector<at::Tensor> gradients_of(const std::vector<at::Tensor>& params,
                                            const std::function<at::Tensor()>& loss) {
  for (const at::Tensor& p : params) at::Tensor(p).mutable_grad() = at::Tensor();
  const at::Tensor l = loss();
  l.backward();
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params)
    out.push_back(!p.grad().defined() ? at::zeros_like(p) : p.grad().is_sparse() ? p.grad().to_dense() : p.grad().clone());
  out.push_back(l.detach());
  return out;
}

// Element by element within LibTorch's allclose(1e-4, 1e-5), naming the first
// tensor that differs and by how much.
inline void require_all_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>());
    CHECK(at::allclose(a[i], b[i], 1e-4, 1e-5));
  }
}

// Runs the checker and fails the test with its message.
#define REQUIRE_BATCHED_EQUALS_ALONE(report) \
  do {                                       \
    const auto& r_ = (report);               \
    INFO(r_.message);                        \
    REQUIRE(r_.ok);                          \
    REQUIRE(r_.values_compared > 0);         \
  } while (0)

inline bool cuda_available() { return at::hasCUDA(); }

// LibTorch's scaled dot-product attention of one example, head by head (what
// dsl::attention computes): q [Lq, d], k [Lk, d], v [Lk, dv] -> [Lq, dv];
// scale 0: 1 / sqrt(d / heads).
inline at::Tensor attention_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                               double scale = 0) {
  std::vector<at::Tensor> out;
  const int64_t dk = q.size(1) / heads, dv = v.size(1) / heads;
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(dk));
  for (int64_t h = 0; h < heads; ++h) {
    const at::Tensor qh = q.narrow(1, h * dk, dk), kh = k.narrow(1, h * dk, dk), vh = v.narrow(1, h * dv, dv);
    out.push_back(at::softmax(qh.mm(kh.t()) * scale, 1).mm(vh));
  }
  return at::cat(out, 1);
}

// Records program(g, i) for examples 0..n-1 and runs them in one forward.
template <class Program>
std::vector<Expr> forward_examples(Graph& g, int n, Program&& program) {
  std::vector<Expr> outs;
  for (int i = 0; i < n; ++i) {
    auto scope = g.example(i);
    outs.push_back(program(g, i));
  }
  g.forward(outs);
  return outs;
}

// CUDA-tagged tests pass without running where there is no GPU, and say so.
#define SHEAF_SKIP_WITHOUT_CUDA()                              \
  do {                                                         \
    if (!::sheaf::test::cuda_available()) {                    \
      WARN("CUDA is not available: skipping this CUDA check"); \
      return;                                                  \
    }                                                          \
  } while (0)

}  // namespace sheaf::test
