#include "matvec.h"

#include <ATen/Parallel.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include <sheaf/core/cpu_features.h>
#include <sheaf/core/error.h>

#ifdef SHEAF_HAVE_AVX2_CLONES
#include <immintrin.h>
#endif

#include "autograd_node.h"
#include "cpu_float.h"
#include "grad_wanted.h"
#include "output_pool.h"
#include "segments.h"

namespace sheaf {

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// a . b in 8 partial sums: the compiler vectorises them, which a single
// running sum forbids without -ffast-math. Inlined into each caller, so the
// AVX2 clones below compile it for AVX2.
[[gnu::always_inline]] inline float dot8(const float* __restrict a, const float* __restrict b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= k; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * b[j + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; j < k; ++j) s += a[j] * b[j];
  return s;
}

// Examples [b0, b1): y_b = A_b x_b.
#define SHEAF_MATVEC_LOOPS(SUFFIX, ATTR)                                                                  \
  ATTR void forward_##SUFFIX(const float* A, const float* x, float* y, int64_t b0, int64_t b1, int64_t m, \
                             int64_t k) {                                                                 \
    for (int64_t b = b0; b < b1; ++b)                                                                     \
      for (int64_t i = 0; i < m; ++i) y[b * m + i] = dot8(A + (b * m + i) * k, x + b * k, k);             \
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

// Rows [0, m) of y [m, c] = x [m, k] W^T + bias (W [c, k], row-major; bias:
// c values). Each output is a dot8: its 8 partial sums vectorise, and the c
// dots of a row are independent chains the core overlaps. (A running sum
// per output over W^T padded to 8 columns, the loop before, took 42 us for
// [64, 128] x [5, 128]^T where at::linear takes 3: 2.5% of a gated net's
// inference, for its once-a-batch classifier.)
#define SHEAF_NARROW_LOOP(SUFFIX, ATTR)                                                                     \
  ATTR void narrow_##SUFFIX(const float* x, const float* w, const float* bias, float* y, int64_t m,          \
                            int64_t k, int64_t c) {                                                         \
    for (int64_t i = 0; i < m; ++i) {                                                                       \
      const float* __restrict xi = x + i * k;                                                               \
      for (int64_t q = 0; q < c; ++q) y[i * c + q] = dot8(xi, w + q * k, k) + bias[q];                     \
    }                                                                                                       \
  }

SHEAF_NARROW_LOOP(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_NARROW_LOOP(avx2, SHEAF_AVX2_TARGET)
#endif

// y[i] = x_i . w for rows [0, m) of x (rows ldx apart): rows_dot's loop.
// Four rows at a time, each with its own accumulator register over w's
// vectors, so four independent FMA chains run where a row's single chain
// (dot8: one 8-float accumulator) waited on each FMA's latency: ~50 cycles
// a row of 256 floats. The sums come out in another order than dot8's, and
// the last 1-3 rows' in yet another: a row's last bits depend on where it
// falls in the batch.
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_AVX2_TARGET inline float sum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
// (Not _mm512_reduce_add_ps, nor the unmasked extracts: GCC 12 warns of
// an uninitialised value inside them; the zero-masked forms start from zeros.)
SHEAF_AVX512_TARGET inline float sum16(__m512 v) {
  return sum8(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, v, 0), _mm512_maskz_extractf32x8_ps(0xFF, v, 1)));
}
SHEAF_AVX512_TARGET void rows_dot_avx512(const float* x, int64_t ldx, const float* w, float* y, int64_t m,
                                         int64_t k) {
  const int64_t full = k / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (k - full)) - 1);
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const float* r0 = x + i * ldx;
    const float* r1 = r0 + ldx;
    const float* r2 = r1 + ldx;
    const float* r3 = r2 + ldx;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t j = 0; j < full; j += 16) {
      const __m512 wv = _mm512_loadu_ps(w + j);
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + j), wv, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r1 + j), wv, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(r2 + j), wv, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(r3 + j), wv, a3);
    }
    if (tail) {
      const __m512 wv = _mm512_maskz_loadu_ps(tail, w + full);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r0 + full), wv, a0);
      a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r1 + full), wv, a1);
      a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r2 + full), wv, a2);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r3 + full), wv, a3);
    }
    y[i] = sum16(a0);
    y[i + 1] = sum16(a1);
    y[i + 2] = sum16(a2);
    y[i + 3] = sum16(a3);
  }
  for (; i < m; ++i) {  // the last 1-3 rows: two chains each
    const float* r = x + i * ldx;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= full; j += 32) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + j), _mm512_loadu_ps(w + j), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r + j + 16), _mm512_loadu_ps(w + j + 16), a1);
    }
    if (j < full) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + j), _mm512_loadu_ps(w + j), a0);
    if (tail) a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r + full), _mm512_maskz_loadu_ps(tail, w + full), a1);
    y[i] = sum16(_mm512_add_ps(a0, a1));
  }
}

// The same with 8-float vectors, four rows at a time; the last k % 8 floats
// of each row by scalar steps.
SHEAF_AVX2_TARGET void rows_dot_avx2(const float* x, int64_t ldx, const float* w, float* y, int64_t m, int64_t k) {
  const int64_t full = k / 8 * 8;
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const float* r0 = x + i * ldx;
    const float* r1 = r0 + ldx;
    const float* r2 = r1 + ldx;
    const float* r3 = r2 + ldx;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t j = 0; j < full; j += 8) {
      const __m256 wv = _mm256_loadu_ps(w + j);
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r0 + j), wv, a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r1 + j), wv, a1);
      a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r2 + j), wv, a2);
      a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r3 + j), wv, a3);
    }
    float s[4] = {sum8(a0), sum8(a1), sum8(a2), sum8(a3)};
    for (int64_t j = full; j < k; ++j) {
      s[0] += r0[j] * w[j];
      s[1] += r1[j] * w[j];
      s[2] += r2[j] * w[j];
      s[3] += r3[j] * w[j];
    }
    std::copy_n(s, 4, y + i);
  }
  for (; i < m; ++i) y[i] = dot8(x + i * ldx, w, k);
}
#endif

// ---- products over rows, some read in place (dot_rows, weighted_row_sums)

// Row r of an operand: a tensor's (rows `stride` apart) or a read's pointer.
struct RowsIn {
  const float* base = nullptr;
  int64_t stride = 0;
  const float* const* ptrs = nullptr;
  const float* operator[](int64_t r) const { return ptrs ? ptrs[r] : base + r * stride; }
};

// Where row r's gradient is added: a tensor's row or a hub's (null: nowhere).
struct RowsOut {
  float* base = nullptr;
  int64_t stride = 0;
  float* const* ptrs = nullptr;
  bool any() const { return base != nullptr || ptrs != nullptr; }
  float* operator[](int64_t r) const { return ptrs ? ptrs[r] : base + r * stride; }
};

// Gradients are added, not written: rows read in place may repeat a source
// row (an encoder row read by every decoding step), so their hub rows take
// several rows' gradients.
#define SHEAF_ROW_PRODUCT_LOOPS(SUFFIX, ATTR)                                                                  \
  ATTR void dot_rows_##SUFFIX(RowsIn A, RowsIn x, float* y, int64_t r0, int64_t r1, int64_t k) {               \
    for (int64_t r = r0; r < r1; ++r) y[r] = dot8(A[r], x[r], k);                                             \
  }                                                                                                            \
  /* dA_r += g_r x_r, dx_r += g_r A_r (each where wanted). */                                                  \
  ATTR void dot_rows_backward_##SUFFIX(RowsIn A, RowsIn x, const float* g, RowsOut dA, RowsOut dx, int64_t r0, \
                                       int64_t r1, int64_t k) {                                                \
    for (int64_t r = r0; r < r1; ++r) {                                                                        \
      const float gr = g[r];                                                                                   \
      if (float* __restrict o = dA.any() ? dA[r] : nullptr) {                                                  \
        const float* __restrict xr = x[r];                                                                     \
        for (int64_t j = 0; j < k; ++j) o[j] += gr * xr[j];                                                    \
      }                                                                                                        \
      if (float* __restrict o = dx.any() ? dx[r] : nullptr) {                                                  \
        const float* __restrict a = A[r];                                                                      \
        for (int64_t j = 0; j < k; ++j) o[j] += gr * a[j];                                                     \
      }                                                                                                        \
    }                                                                                                          \
  }                                                                                                            \
  ATTR void wsum_##SUFFIX(RowsIn w, RowsIn B, float* y, const int64_t* off, int64_t p, int64_t s0,           \
                          int64_t s1) {                                                                        \
    for (int64_t s = s0; s < s1; ++s) {                                                                        \
      float* __restrict out = y + s * p;                                                                       \
      for (int64_t j = 0; j < p; ++j) out[j] = 0;                                                              \
      for (int64_t r = off[s]; r < off[s + 1]; ++r) {                                                         \
        const float wr = *w[r];                                                                                \
        const float* __restrict row = B[r];                                                                    \
        for (int64_t j = 0; j < p; ++j) out[j] += wr * row[j];                                                 \
      }                                                                                                        \
    }                                                                                                          \
  }                                                                                                            \
  /* dw_r += g_s . B_r (when dw), dB_r += w_r g_s (when dB). */                                                \
  ATTR void wsum_backward_##SUFFIX(RowsIn w, RowsIn B, const float* g, RowsOut dw, RowsOut dB,                  \
                                   const int64_t* off, int64_t p, int64_t s0, int64_t s1) {                    \
    for (int64_t s = s0; s < s1; ++s) {                                                                        \
      const float* __restrict gs = g + s * p;                                                                  \
      for (int64_t r = off[s]; r < off[s + 1]; ++r) {                                                         \
        if (float* d = dw.any() ? dw[r] : nullptr) *d += dot8(gs, B[r], p);                                     \
        if (float* __restrict out = dB.any() ? dB[r] : nullptr) {                                              \
          const float wr = *w[r];                                                                              \
          for (int64_t j = 0; j < p; ++j) out[j] += wr * gs[j];                                                \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
  }

SHEAF_ROW_PRODUCT_LOOPS(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_ROW_PRODUCT_LOOPS(avx2, SHEAF_AVX2_TARGET)
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
    detail::once_differentiable(*this, grads, out, "sheaf::MatvecBackward");
    return out;
  }
};

// An operand of a row product, ready for the loops.
struct Prepared {
  at::Tensor tensor;  // contiguous (a tensor operand)
  const RowReads* reads = nullptr;
  RowsIn rows;
  int64_t count = 0, width = 0;
  bool grad = false;  // a gradient to take
};

Prepared prepare(const RowOperand& o) {
  Prepared p;
  if (o.reads) {
    p.reads = o.reads;
    p.rows = RowsIn{nullptr, 0, o.reads->data().data()};
    p.count = static_cast<int64_t>(o.reads->rows());
    p.width = o.reads->width();
    p.grad = c10::GradMode::is_enabled() && o.reads->needs_grad();
    return p;
  }
  SHEAF_ASSERT(cpu_float(o.tensor) && o.tensor.dim() >= 1, "a row product's operand of ", o.tensor.sizes());
  p.tensor = o.tensor.contiguous();
  p.count = p.tensor.size(0);
  p.width = 1;
  for (int64_t d = 1; d < p.tensor.dim(); ++d) p.width *= p.tensor.size(d);
  p.rows = RowsIn{p.tensor.data_ptr<float>(), p.width, nullptr};
  p.grad = grad_wanted(p.tensor);
  return p;
}

// The backward of dot_rows (no offsets) or weighted_row_sums (segment offsets).
// A tensor operand has one edge; rows read in place have one per hub their
// gradients go to, and those edges' outputs stay undefined (the hubs hold the
// gradients).
struct RowProductNode : torch::autograd::Node {
  struct Operand {
    SavedVariable tensor;
    size_t edges = 0;            // this operand's edges (a read in place: one per hub, or none)
    std::vector<int64_t> sizes;  // the tensor's (its gradient's, without unpacking it)
    at::TensorOptions options;
    std::shared_ptr<const RowReads> reads;  // rows read in place (then no tensor)
    int64_t width = 0;
    size_t first_edge = 0;
  };
  std::array<Operand, 2> in;  // A, x (dot_rows); w, B (weighted_row_sums)
  std::vector<int64_t> off;   // weighted_row_sums' segment offsets; empty: dot_rows
  bool released = false;

  std::string name() const override {
    return off.empty() ? "sheaf::DotRowsBackward" : "sheaf::WeightedRowSumsBackward";
  }
  void release_variables() override {
    for (Operand& o : in) {
      o.tensor.reset_data();
      released = released || o.reads != nullptr;
      o.reads.reset();
    }
  }
  variable_list apply(variable_list&& grads) override {
    variable_list out(num_outputs());
    if (!grads[0].defined()) return out;
    if (released)  // as SavedVariable::unpack says it for a tensor
      throw std::runtime_error("Trying to backward through the graph a second time (a product's rows read in place "
                               "were freed): use retain_graph=true");
    // The gradients autograd asks for. An operand's rows are read only for
    // the other's (dA = g x, dx = g A): only those are unpacked, and checked
    // for changes, as LibTorch's own nodes unpack a saved tensor only for a
    // gradient that needs it.
    std::array<bool, 2> wanted{};
    for (size_t i = 0; i < 2; ++i) {
      const Operand& o = in[i];
      for (size_t k = 0; k < o.edges && !wanted[i]; ++k) wanted[i] = task_should_compute_output(o.first_edge + k);
    }
    if (!wanted[0] && !wanted[1]) return out;
    for (size_t i = 0; i < 2; ++i)
      if (in[i].reads && wanted[1 - i]) in[i].reads->check_unchanged("its backward");
    RECORD_FUNCTION(off.empty() ? "sheaf::dot_rows_backward" : "sheaf::weighted_row_sums_backward",
                    std::vector<c10::IValue>());
    const at::Tensor g = grads[0].contiguous();
    std::array<at::Tensor, 2> value, grad;
    std::array<RowsIn, 2> rows;
    std::array<RowsOut, 2> to;
    std::vector<const RowReads*> reads;
    std::vector<size_t> read_of;  // operand of each entry of `reads`
    for (size_t i = 0; i < 2; ++i) {
      const Operand& o = in[i];
      if (o.reads) {
        if (wanted[1 - i]) rows[i] = RowsIn{nullptr, 0, o.reads->data().data()};
        if (wanted[i]) {
          reads.push_back(o.reads.get());
          read_of.push_back(i);
        }
        continue;
      }
      if (wanted[1 - i]) {
        value[i] = o.tensor.unpack();
        rows[i] = RowsIn{value[i].data_ptr<float>(), o.width, nullptr};
      }
      if (wanted[i]) {
        grad[i] = at::zeros(o.sizes, o.options);
        to[i] = RowsOut{grad[i].data_ptr<float>(), o.width, nullptr};
      }
    }
    // Hubs locked until the loop is done; only those autograd asked for.
    RowReads::GradRows hub = RowReads::grad_rows(reads, [&](size_t q, size_t k) {
      return task_should_compute_output(in[read_of[q]].first_edge + k);
    });
    for (size_t q = 0; q < reads.size(); ++q) to[read_of[q]] = RowsOut{nullptr, 0, hub.rows[q].data()};
    const float* gp = g.data_ptr<float>();
    // Two rows may add into one hub row: serial then.
    const bool serial = !reads.empty();
    const int64_t width = in[1].width;
    if (off.empty()) {
      const int64_t R = g.size(0);
      auto body = [&](int64_t r0, int64_t r1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
        if (use_avx2()) return dot_rows_backward_avx2(rows[0], rows[1], gp, to[0], to[1], r0, r1, width);
#endif
        dot_rows_backward_base(rows[0], rows[1], gp, to[0], to[1], r0, r1, width);
      };
      if (serial) body(0, R);
      else at::parallel_for(0, R, grain(1, width), body);
    } else {
      const auto n = static_cast<int64_t>(off.size()) - 1;
      auto body = [&](int64_t s0, int64_t s1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
        if (use_avx2()) return wsum_backward_avx2(rows[0], rows[1], gp, to[0], to[1], off.data(), width, s0, s1);
#endif
        wsum_backward_base(rows[0], rows[1], gp, to[0], to[1], off.data(), width, s0, s1);
      };
      if (serial) body(0, n);
      else at::parallel_for(0, n, segment_grain(off.back(), n, width), body);
    }
    for (size_t i = 0; i < 2; ++i)
      if (!in[i].reads) out[in[i].first_edge] = std::move(grad[i]);
    detail::once_differentiable(*this, grads, out, "sheaf::RowProductBackward");
    return out;
  }
};

// Gives y the node's history when either operand wants a gradient.
void attach(at::Tensor& y, std::array<const Prepared*, 2> ops, std::vector<int64_t> off) {
  if (!ops[0]->grad && !ops[1]->grad) return;
  auto node = detail::make_node<RowProductNode>();
  std::vector<torch::autograd::Edge> edges;
  for (size_t i = 0; i < 2; ++i) {
    const Prepared& p = *ops[i];
    RowProductNode::Operand& o = node->in[i];
    o.width = p.width;
    o.first_edge = edges.size();
    if (p.reads) {
      if (p.grad) p.reads->append_edges(edges);
      o.reads = p.reads->shared_from_this();
      o.edges = edges.size() - o.first_edge;
    } else {
      o.edges = 1;
      edges.push_back(torch::autograd::impl::gradient_edge(p.tensor));
      o.tensor = SavedVariable(p.tensor, /*is_output=*/false);
      o.sizes = p.tensor.sizes().vec();
      o.options = p.tensor.options();
    }
  }
  node->off = std::move(off);
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(y, node);
}

}  // namespace

at::Tensor rows_dot(const at::Tensor& X, const at::Tensor& v, const at::Tensor& bias) {
  const at::Tensor x = X.contiguous(), w = v.contiguous();
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  const int64_t m = x.size(0), k = x.size(1);
  SHEAF_ASSERT(w.numel() == k, "rows_dot: a vector of ", w.numel(), " elements for rows of ", k);
  SHEAF_ASSERT(!b.defined() || b.numel() == 1 || b.numel() == m, "rows_dot: a bias of ", b.numel(), " for ", m, " rows");
  at::Tensor y = empty_output({m, 1}, x.options());
  float* yv = y.data_ptr<float>();
#ifdef SHEAF_HAVE_AVX2_CLONES
  if (use_avx512()) rows_dot_avx512(x.data_ptr<float>(), k, w.data_ptr<float>(), yv, m, k);
  else if (use_avx2()) rows_dot_avx2(x.data_ptr<float>(), k, w.data_ptr<float>(), yv, m, k);
  else
#endif
    forward_base(x.data_ptr<float>(), w.data_ptr<float>(), yv, 0, 1, m, k);  // (one "example" whose matrix is X)
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
  std::array<float, kNarrowRows> b{};
  if (bias.defined()) {
    const at::Tensor bc = bias.contiguous();
    std::copy_n(bc.data_ptr<float>(), c, b.begin());
  }
  const float* wv = w.data_ptr<float>();
  at::Tensor y = empty_output({m, c}, x.options());
#ifdef SHEAF_HAVE_AVX2_CLONES
  if (use_avx2()) narrow_avx2(x.data_ptr<float>(), wv, b.data(), y.data_ptr<float>(), m, k, c);
  else
#endif
    narrow_base(x.data_ptr<float>(), wv, b.data(), y.data_ptr<float>(), m, k, c);
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

at::Tensor dot_rows(const RowOperand& A, const RowOperand& x) {
  if (!A.reads && !x.reads && !(cpu_float(A.tensor) && cpu_float(x.tensor)))
    return batched_matvec(A.tensor.unsqueeze(1), x.tensor).view({-1});
  RECORD_FUNCTION("sheaf::dot_rows", std::vector<c10::IValue>());
  const Prepared a = prepare(A), xv = prepare(x);
  // The loop indexes both by row: a mismatch would read past one.
  SHEAF_ASSERT(a.count == xv.count && a.width == xv.width, "dot_rows of ", a.count, " x ", a.width, " and ", xv.count,
               " x ", xv.width);
  at::Tensor y = empty_output({a.count}, at::TensorOptions().dtype(at::kFloat));
  float* yv = y.data_ptr<float>();
  at::parallel_for(0, a.count, grain(1, a.width), [&](int64_t r0, int64_t r1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
    if (use_avx2()) return dot_rows_avx2(a.rows, xv.rows, yv, r0, r1, a.width);
#endif
    dot_rows_base(a.rows, xv.rows, yv, r0, r1, a.width);
  });
  attach(y, {&a, &xv}, {});
  return y;
}

at::Tensor weighted_row_sums(const RowOperand& w, const RowOperand& B, std::span<const int64_t> counts) {
  RECORD_FUNCTION("sheaf::weighted_row_sums", std::vector<c10::IValue>());
  const Prepared wv = prepare(w), b = prepare(B);
  std::vector<int64_t> off = segment_offsets(counts);
  SHEAF_ASSERT(wv.width == 1 && wv.count == b.count && off.back() == b.count, "weighted_row_sums of ", wv.count,
               " weights of ", wv.width, ", ", b.count, " rows and segments of ", off.back());
  const auto n = static_cast<int64_t>(counts.size());
  const int64_t p = b.width;
  at::Tensor y = empty_output({n, p}, at::TensorOptions().dtype(at::kFloat));
  float* yv = y.data_ptr<float>();
  at::parallel_for(0, n, segment_grain(b.count, n, p), [&](int64_t s0, int64_t s1) {
#ifdef SHEAF_HAVE_AVX2_CLONES
    if (use_avx2()) return wsum_avx2(wv.rows, b.rows, yv, off.data(), p, s0, s1);
#endif
    wsum_base(wv.rows, b.rows, yv, off.data(), p, s0, s1);
  });
  attach(y, {&wv, &b}, std::move(off));
  return y;
}

}  // namespace sheaf
