#include "matvec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <array>
#include <vector>

#include <sheaf/core/cpu_features.h>
#include <sheaf/core/error.h>

#include "autograd_node.h"
#include "grad_wanted.h"
#include "output_pool.h"

namespace sheaf {

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Examples [b0, b1): y_b = A_b x_b (8 partial sums per row: the compiler
// vectorises them, which a single running sum forbids without -ffast-math).
#define SHEAF_MATVEC_LOOPS(SUFFIX, ATTR)                                                                  \
  ATTR void forward_##SUFFIX(const float* A, const float* x, float* y, int64_t b0, int64_t b1, int64_t m, \
                             int64_t k) {                                                                 \
    for (int64_t b = b0; b < b1; ++b) {                                                                   \
      const float* __restrict xb = x + b * k;                                                             \
      for (int64_t i = 0; i < m; ++i) {                                                                   \
        const float* __restrict row = A + (b * m + i) * k;                                                \
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                          \
        int64_t j = 0;                                                                                    \
        for (; j + 8 <= k; j += 8)                                                                        \
          for (int l = 0; l < 8; ++l) acc[l] += row[j + l] * xb[j + l];                                   \
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));      \
        for (; j < k; ++j) s += row[j] * xb[j];                                                           \
        y[b * m + i] = s;                                                                                 \
      }                                                                                                   \
    }                                                                                                     \
  }                                                                                                       \
  /* dA_b = g_b x_b^T (when dA), dx_b = A_b^T g_b (when dx). */                                           \
  ATTR void backward_##SUFFIX(const float* A, const float* x, const float* g, float* dA, float* dx,      \
                              int64_t b0, int64_t b1, int64_t m, int64_t k) {                             \
    for (int64_t b = b0; b < b1; ++b) {                                                                   \
      const float* __restrict xb = x + b * k;                                                             \
      float* __restrict dxb = dx ? dx + b * k : nullptr;                                                  \
      if (dxb)                                                                                            \
        for (int64_t j = 0; j < k; ++j) dxb[j] = 0;                                                       \
      for (int64_t i = 0; i < m; ++i) {                                                                   \
        const float gi = g[b * m + i];                                                                    \
        if (dA) {                                                                                         \
          float* __restrict out = dA + (b * m + i) * k;                                                   \
          for (int64_t j = 0; j < k; ++j) out[j] = gi * xb[j];                                            \
        }                                                                                                 \
        if (dxb) {                                                                                        \
          const float* __restrict row = A + (b * m + i) * k;                                              \
          for (int64_t j = 0; j < k; ++j) dxb[j] += gi * row[j];                                          \
        }                                                                                                 \
      }                                                                                                   \
    }                                                                                                     \
  }

SHEAF_MATVEC_LOOPS(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_MATVEC_LOOPS(avx2, SHEAF_AVX2_TARGET)
#endif

// Rows [0, m) of y [m, c] = x [m, k] W^T + bias, with W^T padded to
// kNarrowRows columns (wt: k rows of 8; bias: 8 values, zero past c). The
// inner loop over the 8 columns is one vector multiply-add.
#define SHEAF_NARROW_LOOP(SUFFIX, ATTR)                                                                     \
  ATTR void narrow_##SUFFIX(const float* x, const float* wt, const float* bias, float* y, int64_t m,          \
                            int64_t k, int64_t c) {                                                         \
    for (int64_t i = 0; i < m; ++i) {                                                                       \
      const float* __restrict xi = x + i * k;                                                               \
      float acc[kNarrowRows];                                                                               \
      for (int q = 0; q < kNarrowRows; ++q) acc[q] = bias[q];                                               \
      for (int64_t j = 0; j < k; ++j) {                                                                     \
        const float s = xi[j];                                                                              \
        const float* __restrict w = wt + j * kNarrowRows;                                                   \
        for (int q = 0; q < kNarrowRows; ++q) acc[q] += s * w[q];                                           \
      }                                                                                                     \
      for (int64_t q = 0; q < c; ++q) y[i * c + q] = acc[q];                                                \
    }                                                                                                       \
  }

SHEAF_NARROW_LOOP(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_NARROW_LOOP(avx2, SHEAF_AVX2_TARGET)
#endif

// Examples per task when split across threads: enough work to pay for a task.
int64_t grain(int64_t m, int64_t k) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, m * k)); }

at::Tensor run_forward(const at::Tensor& A, const at::Tensor& x) {
  const int64_t B = A.size(0), m = A.size(1), k = A.size(2);
  at::Tensor y = empty_output({B, m}, A.options());
  const float* a = A.data_ptr<float>();
  const float* xv = x.data_ptr<float>();
  float* yv = y.data_ptr<float>();
  at::parallel_for(0, B, grain(m, k), [&](int64_t b0, int64_t b1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
    if (use_avx2()) return forward_avx2(a, xv, yv, b0, b1, m, k);
#endif
    forward_base(a, xv, yv, b0, b1, m, k);
  });
  return y;
}

struct MatvecNode : torch::autograd::Node {
  SavedVariable A, x;
  std::string name() const override { return "sheaf::MatvecBackward"; }
  void release_variables() override {
    A.reset_data();
    x.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    variable_list out(2);
    if (!grads[0].defined()) return out;
    RECORD_FUNCTION("sheaf::matvec_backward", std::vector<c10::IValue>());
    const at::Tensor a = A.unpack(), xv = x.unpack(), g = grads[0].contiguous();
    const int64_t B = a.size(0), m = a.size(1), k = a.size(2);
    at::Tensor dA, dx;
    if (should_compute_output(0)) dA = at::empty_like(a);
    if (should_compute_output(1)) dx = at::empty_like(xv);
    const float* av = a.data_ptr<float>();
    const float* xp = xv.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* dAp = dA.defined() ? dA.data_ptr<float>() : nullptr;
    float* dxp = dx.defined() ? dx.data_ptr<float>() : nullptr;
    at::parallel_for(0, B, grain(m, k), [&](int64_t b0, int64_t b1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
      if (use_avx2()) return backward_avx2(av, xp, gp, dAp, dxp, b0, b1, m, k);
#endif
      backward_base(av, xp, gp, dAp, dxp, b0, b1, m, k);
    });
    out[0] = dA;
    out[1] = dx;
    return out;
  }
};

}  // namespace

at::Tensor rows_dot(const at::Tensor& X, const at::Tensor& v, const at::Tensor& bias) {
  const at::Tensor x = X.contiguous(), w = v.contiguous();
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  const int64_t m = x.size(0), k = x.size(1);
  SHEAF_ASSERT(w.numel() == k, "rows_dot: a vector of ", w.numel(), " elements for rows of ", k);
  SHEAF_ASSERT(!b.defined() || b.numel() == 1 || b.numel() == m, "rows_dot: a bias of ", b.numel(), " for ", m, " rows");
  at::Tensor y = empty_output({m, 1}, x.options());
  float* yv = y.data_ptr<float>();
  // One "example" whose matrix is X: forward_*'s loop with B = 1.
#ifdef SHEAF_HAVE_AVX2_CLONES
  if (use_avx2()) forward_avx2(x.data_ptr<float>(), w.data_ptr<float>(), yv, 0, 1, m, k);
  else
#endif
    forward_base(x.data_ptr<float>(), w.data_ptr<float>(), yv, 0, 1, m, k);
  if (b.defined()) {
    const float* bv = b.data_ptr<float>();
    const bool per_row = b.numel() == m && m > 1;
    for (int64_t i = 0; i < m; ++i) yv[i] += bv[per_row ? i : 0];
  }
  return y;
}

at::Tensor narrow_product(const at::Tensor& X, const at::Tensor& W, const at::Tensor& bias) {
  const at::Tensor x = X.contiguous(), w = W.contiguous();
  const int64_t m = x.size(0), k = x.size(1), c = w.size(0);
  SHEAF_ASSERT(w.dim() == 2 && c >= 1 && c <= kNarrowRows && w.size(1) == k, "narrow_product of ", x.sizes(), " and ",
               w.sizes());
  SHEAF_ASSERT(!bias.defined() || bias.numel() == c, "narrow_product: a bias of ", bias.numel(), " for ", c, " outputs");
  // W^T padded to 8 columns, on the stack for the usual widths (a k of up to
  // 1024: 32 KiB), on the heap past that.
  constexpr int64_t kStack = 1024;
  std::array<float, kStack * kNarrowRows> stack_wt;
  std::vector<float> heap_wt;
  float* wt = stack_wt.data();
  if (k > kStack) {
    heap_wt.resize(static_cast<size_t>(k * kNarrowRows));
    wt = heap_wt.data();
  }
  const float* wv = w.data_ptr<float>();
  for (int64_t j = 0; j < k; ++j)
    for (int64_t q = 0; q < kNarrowRows; ++q) wt[j * kNarrowRows + q] = q < c ? wv[q * k + j] : 0.0f;
  std::array<float, kNarrowRows> b{};
  if (bias.defined()) {
    const at::Tensor bc = bias.contiguous();
    std::copy_n(bc.data_ptr<float>(), c, b.begin());
  }
  at::Tensor y = empty_output({m, c}, x.options());
#ifdef SHEAF_HAVE_AVX2_CLONES
  if (use_avx2()) narrow_avx2(x.data_ptr<float>(), wt, b.data(), y.data_ptr<float>(), m, k, c);
  else
#endif
    narrow_base(x.data_ptr<float>(), wt, b.data(), y.data_ptr<float>(), m, k, c);
  return y;
}

at::Tensor batched_matvec(const at::Tensor& A, const at::Tensor& x) {
  if (!A.device().is_cpu() || A.scalar_type() != at::kFloat || x.scalar_type() != at::kFloat)
    return at::bmm(A, x.unsqueeze(2)).squeeze(2);
  RECORD_FUNCTION("sheaf::matvec", std::vector<c10::IValue>());
  // The loops index both by example: a mismatch would read past x.
  SHEAF_ASSERT(A.dim() == 3 && x.dim() == 2 && A.size(0) == x.size(0) && A.size(2) == x.size(1),
               "batched_matvec of ", A.sizes(), " and ", x.sizes());
  const at::Tensor a = A.contiguous(), xv = x.contiguous();
  const bool track = grad_wanted(A, x);
  at::Tensor y;
  {
    c10::AutoGradMode no_grad(false);
    y = run_forward(a, xv);
  }
  if (!track) return y;
  auto node = detail::make_node<MatvecNode>();
  node->A = SavedVariable(a, /*is_output=*/false);
  node->x = SavedVariable(xv, /*is_output=*/false);
  node->set_next_edges({torch::autograd::impl::gradient_edge(a), torch::autograd::impl::gradient_edge(xv)});
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace sheaf
