#include "attention_cpu.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <sheaf/core/cpu_features.h>
#include <sheaf/core/error.h>

#include "grad_wanted.h"
#include "pointwise_math.h"

namespace sheaf::op {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One value: its query and key rows, where they start (in q and the output;
// in k and v), and where its probabilities start (heads blocks of lq x lk).
struct Block {
  int64_t lq, lk, q0, k0, p0;
};

struct Dims {
  int64_t heads, d, dv, dk, dh;  // dk = d / heads, dh = dv / heads
  float scale;
};

struct Layout {
  std::vector<Block> blocks;
  int64_t probabilities = 0, longest_keys = 0;
  Layout(std::span<const int64_t> qc, std::span<const int64_t> kc, int64_t heads) {
    int64_t q0 = 0, k0 = 0;
    blocks.reserve(qc.size());
    for (size_t i = 0; i < qc.size(); ++i) {
      blocks.push_back(Block{qc[i], kc[i], q0, k0, probabilities});
      q0 += qc[i];
      k0 += kc[i];
      probabilities += heads * qc[i] * kc[i];
      longest_keys = std::max(longest_keys, kc[i]);
    }
  }
};

// The loops below are written so that the compiler vectorises each innermost
// one (axpys over keys or columns; no float sum across a vector's lanes,
// which it may not reorder): a query's scores come from the keys transposed
// (`t`: row c holds column c of every key), and the backward's products with
// the value rows from the values transposed. Keys are padded to a multiple of
// kLanes in the scratch rows (zero keys, scores of -inf: probability 0), so
// that loops over keys run whole vectors, with no scalar tail (sentences of
// ~20 words would otherwise spend most of a loop in its tail); sums and maxima
// over keys are kept per lane, then summed.
constexpr int64_t kLanes = 16;

int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// t [cols, lp] <- x [rows, cols] (row stride `stride`) transposed, zero past `rows`.
[[gnu::always_inline]] inline void transpose_into(float* t, const float* x, int64_t rows, int64_t lp, int64_t cols,
                                                  int64_t stride) {
  for (int64_t c = 0; c < cols; ++c) {
    float* tc = t + c * lp;
    for (int64_t j = 0; j < rows; ++j) tc[j] = x[j * stride + c];
    for (int64_t j = rows; j < lp; ++j) tc[j] = 0.0f;
  }
}

// out[0 .. lp) = sum over c < n of (x[c] * xs) * t[c * lp ..]: each block of
// kLanes outputs summed in registers over c, two chains (a sum kept in memory
// would wait on its own store at every c).
[[gnu::always_inline]] inline void combine_rows_t(float* out, const float* x, float xs, const float* t, int64_t n,
                                                  int64_t lp) {
  for (int64_t j = 0; j < lp; j += kLanes) {
    float a[kLanes] = {}, b[kLanes] = {};
    int64_t c = 0;
    for (; c + 1 < n; c += 2) {
      const float x0 = x[c] * xs, x1 = x[c + 1] * xs;
      const float *t0 = t + c * lp + j, *t1 = t0 + lp;
      for (int64_t l = 0; l < kLanes; ++l) {
        a[l] += x0 * t0[l];
        b[l] += x1 * t1[l];
      }
    }
    if (c < n) {
      const float x0 = x[c] * xs;
      for (int64_t l = 0; l < kLanes; ++l) a[l] += x0 * t[c * lp + j + l];
    }
    for (int64_t l = 0; l < kLanes; ++l) out[j + l] = a[l] + b[l];
  }
}

// o[0 .. n) = sum over rows j < m of w[j] * X[j * stride ..]: as above, per
// kLanes columns (the columns past the last whole block one by one).
[[gnu::always_inline]] inline void combine_rows(float* o, const float* w, const float* X, int64_t m, int64_t n,
                                                int64_t stride) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    float a[kLanes] = {}, b[kLanes] = {};
    int64_t j = 0;
    for (; j + 1 < m; j += 2) {
      const float *x0 = X + j * stride + c, *x1 = x0 + stride;
      for (int64_t l = 0; l < kLanes; ++l) {
        a[l] += w[j] * x0[l];
        b[l] += w[j + 1] * x1[l];
      }
    }
    if (j < m)
      for (int64_t l = 0; l < kLanes; ++l) a[l] += w[j] * X[j * stride + c + l];
    for (int64_t l = 0; l < kLanes; ++l) o[c + l] = a[l] + b[l];
  }
  for (; c < n; ++c) {
    float a = 0.0f;
    for (int64_t j = 0; j < m; ++j) a += w[j] * X[j * stride + c];
    o[c] = a;
  }
}

[[gnu::always_inline]] inline float sum_lanes(const float* a, int64_t lp) {
  float acc[kLanes] = {};
  for (int64_t j = 0; j < lp; j += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[j + l];
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// `t`: dk * lp floats, `sc`: lp.
[[gnu::always_inline]] inline void forward_block(const float* q, const float* k, const float* v, float* out, float* P,
                                                 float* t, float* sc, const Block& b, const Dims& m) {
  const int64_t lk = b.lk, lp = padded(lk);
  for (int64_t h = 0; h < m.heads; ++h) {
    const float* V = v + b.k0 * m.dv + h * m.dh;
    transpose_into(t, k + b.k0 * m.d + h * m.dk, lk, lp, m.dk, m.d);
    float* Ph = P + b.p0 + h * b.lq * lk;
    for (int64_t r = 0; r < b.lq; ++r) {
      const float* qr = q + (b.q0 + r) * m.d + h * m.dk;
      combine_rows_t(sc, qr, m.scale, t, m.dk, lp);
      for (int64_t j = lk; j < lp; ++j) sc[j] = -std::numeric_limits<float>::infinity();
      float top_lane[kLanes];
      for (int64_t l = 0; l < kLanes; ++l) top_lane[l] = sc[l];
      for (int64_t j = kLanes; j < lp; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) top_lane[l] = sc[j + l] > top_lane[l] ? sc[j + l] : top_lane[l];
      float top = top_lane[0];
      for (int64_t l = 1; l < kLanes; ++l) top = top_lane[l] > top ? top_lane[l] : top;
      for (int64_t j = 0; j < lp; ++j) sc[j] = pw::exp(sc[j] - top);  // (padding: exp(-inf) = 0)
      const float inv = 1.0f / sum_lanes(sc, lp);
      float* p = Ph + r * lk;
      for (int64_t j = 0; j < lk; ++j) p[j] = sc[j] * inv;
      combine_rows(out + (b.q0 + r) * m.dv + h * m.dh, p, V, lk, m.dh, m.dv);
    }
  }
}

// dS = P * (dP - rowsum(P * dP)) with dP = dO V^T; dq = scale dS K,
// dk += scale dS^T q, dv += P^T dO. `t`: dh * lp floats, `s` and `pr`: lp each.
[[gnu::always_inline]] inline void backward_block(const float* q, const float* k, const float* v, const float* P,
                                                  const float* dout, float* dq, float* dk, float* dv, float* t,
                                                  float* s, float* pr, const Block& b, const Dims& m) {
  const int64_t lk = b.lk, lp = padded(lk);
  for (int64_t h = 0; h < m.heads; ++h) {
    const float* K = k + b.k0 * m.d + h * m.dk;
    transpose_into(t, v + b.k0 * m.dv + h * m.dh, lk, lp, m.dh, m.dv);
    const float* Ph = P + b.p0 + h * b.lq * lk;
    for (int64_t r = 0; r < b.lq; ++r) {
      const float* g = dout + (b.q0 + r) * m.dv + h * m.dh;
      const float* p = Ph + r * lk;
      for (int64_t j = 0; j < lk; ++j) pr[j] = p[j];
      for (int64_t j = lk; j < lp; ++j) pr[j] = 0.0f;
      combine_rows_t(s, g, 1.0f, t, m.dh, lp);
      float acc[kLanes] = {};
      for (int64_t j = 0; j < lp; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) acc[l] += pr[j + l] * s[j + l];
      float dot = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) dot += acc[l];
      for (int64_t j = 0; j < lp; ++j) s[j] = pr[j] * (s[j] - dot) * m.scale;
      combine_rows(dq + (b.q0 + r) * m.d + h * m.dk, s, K, lk, m.dk, m.d);
      const float* qr = q + (b.q0 + r) * m.d + h * m.dk;
      for (int64_t j = 0; j < lk; ++j) {
        const float x = s[j];
        float* dkj = dk + (b.k0 + j) * m.d + h * m.dk;
        for (int64_t c = 0; c < m.dk; ++c) dkj[c] += x * qr[c];
        const float pj = pr[j];
        float* dvj = dv + (b.k0 + j) * m.dv + h * m.dh;
        for (int64_t c = 0; c < m.dh; ++c) dvj[c] += pj * g[c];
      }
    }
  }
}

using Forward = void (*)(const float*, const float*, const float*, float*, float*, float*, float*, const Block*,
                         int64_t, const Dims&);
using Backward = void (*)(const float*, const float*, const float*, const float*, const float*, float*, float*,
                          float*, float*, float*, float*, const Block*, int64_t, const Dims&);

#define SHEAF_ATTENTION_LOOPS(SUFFIX, ATTR)                                                                   \
  ATTR void fwd_##SUFFIX(const float* q, const float* k, const float* v, float* out, float* P, float* t,      \
                         float* sc, const Block* blocks, int64_t n, const Dims& m) {                          \
    for (int64_t i = 0; i < n; ++i) forward_block(q, k, v, out, P, t, sc, blocks[i], m);                      \
  }                                                                                                           \
  ATTR void bwd_##SUFFIX(const float* q, const float* k, const float* v, const float* P, const float* dout,  \
                         float* dq, float* dk, float* dv, float* t, float* s, float* pr, const Block* blocks, \
                         int64_t n, const Dims& m) {                                                          \
    for (int64_t i = 0; i < n; ++i) backward_block(q, k, v, P, dout, dq, dk, dv, t, s, pr, blocks[i], m);     \
  }

SHEAF_ATTENTION_LOOPS(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_ATTENTION_LOOPS(avx2, SHEAF_AVX2_TARGET)
SHEAF_ATTENTION_LOOPS(avx512, SHEAF_AVX512_TARGET)
#endif
#undef SHEAF_ATTENTION_LOOPS

struct Kernels {
  Forward fwd;
  Backward bwd;
};

const Kernels& kernels() {
  static const Kernels k{SHEAF_PICK_CLONE(fwd), SHEAF_PICK_CLONE(bwd)};
  return k;
}

Dims dims_of(const at::Tensor& q, const at::Tensor& v, int64_t heads, double scale) {
  const int64_t d = q.size(1), dv = v.size(1);
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(d / heads));
  return Dims{heads, d, dv, d / heads, dv / heads, static_cast<float>(scale)};
}

// Values in chunks over LibTorch's threads (each value's rows, probabilities
// and gradient rows are its own); each chunk its own scratch: `columns` rows
// of the longest keys padded, then two rows more.
template <class Body>
void over_values(const Layout& L, int64_t columns, Body body) {
  const auto n = static_cast<int64_t>(L.blocks.size());
  const int64_t lp = padded(L.longest_keys);
  at::parallel_for(0, n, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(lp * (columns + 2)));
    float* rows = scratch.data() + lp * columns;
    body(L.blocks.data() + begin, end - begin, scratch.data(), rows, rows + lp);
  });
}

struct PackedAttention : torch::autograd::Function<PackedAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, std::vector<int64_t> qc, std::vector<int64_t> kc, int64_t heads,
                            double scale, bool grad) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    const Layout L(qc, kc, heads);
    const Dims m = dims_of(q, v, heads, scale);
    at::Tensor out = at::empty({q.size(0), m.dv}, q.options());
    const at::Tensor P = at::empty({L.probabilities}, q.options());
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    float *op = out.data_ptr<float>(), *pp = P.data_ptr<float>();
    over_values(L, m.dk, [&](const Block* blocks, int64_t n, float* t, float* sc, float*) {
      kernels().fwd(qp, kp, vp, op, pp, t, sc, blocks, n, m);
    });
    if (grad) {
      ctx->save_for_backward({q, k, v, P});
      ctx->saved_data["qc"] = std::move(qc);
      ctx->saved_data["kc"] = std::move(kc);
      ctx->saved_data["heads"] = heads;
      ctx->saved_data["scale"] = scale;
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The gradients below are computed without autograd: they have no
    // history of their own (a second derivative would be silently wrong).
    if (c10::GradMode::is_enabled())
      throw UserError("attention on the CPU: no second derivative (a backward with create_graph)");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &P = saved[3];
    const std::vector<int64_t> qc = ctx->saved_data["qc"].toIntVector(), kc = ctx->saved_data["kc"].toIntVector();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const Layout L(qc, kc, heads);
    const Dims m = dims_of(q, v, heads, ctx->saved_data["scale"].toDouble());
    const at::Tensor dout = grads[0].contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    const float *pp = P.data_ptr<float>(), *gp = dout.data_ptr<float>();
    float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
    over_values(L, m.dh, [&](const Block* blocks, int64_t n, float* t, float* s, float* pr) {
      kernels().bwd(qp, kp, vp, pp, gp, dqp, dkp, dvp, t, s, pr, blocks, n, m);
    });
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool attention_cpu_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.is_cpu() && k.is_cpu() && v.is_cpu() && q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat &&
         v.scalar_type() == at::kFloat;
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         std::span<const int64_t> q_counts, std::span<const int64_t> k_counts, int64_t heads,
                         double scale) {
  SHEAF_ASSERT(attention_cpu_takes(q, k, v) && q.dim() == 2 && k.dim() == 2 && v.dim() == 2 &&
                   q_counts.size() == k_counts.size() && heads > 0 && q.size(1) % heads == 0 &&
                   v.size(1) % heads == 0 && k.size(1) == q.size(1) && k.size(0) == v.size(0),
               "attention_cpu: inputs of the wrong kind or shape");
  int64_t rq = 0, rk = 0;
  for (size_t i = 0; i < q_counts.size(); ++i) {
    SHEAF_ASSERT(q_counts[i] > 0 && k_counts[i] > 0, "attention_cpu: a value without queries or keys");
    rq += q_counts[i];
    rk += k_counts[i];
  }
  SHEAF_ASSERT(rq == q.size(0) && rk == k.size(0), "attention_cpu: counts that are not the inputs' rows");
  return PackedAttention::apply(q, k, v, std::vector<int64_t>(q_counts.begin(), q_counts.end()),
                                std::vector<int64_t>(k_counts.begin(), k_counts.end()), heads, scale,
                                grad_wanted(q, k, v));
}

}  // namespace sheaf::op
