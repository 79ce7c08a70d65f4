// Elementwise ops. Arguments whose shapes broadcast as LibTorch's do (equal, a
// scalar, or dims of 1 and missing leading dims); a shared argument (a
// parameter) also broadcasts over the batch axis.
#pragma once

#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log_sigmoid.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/tanh.h>

#include "common.h"

namespace sheaf::op {

template <at::Tensor (*F)(const at::Tensor&, const at::Tensor&)>
struct Binary {
  static constexpr OpTraits traits{.arity = 2, .rowwise = true};
  static Shape infer(const InferCtx& c) { return infer_elementwise(c); }
  static at::Tensor run(RunCtx& c) {
    int rank = c.out_shape().rank();
    return F(c.aligned(0, rank), c.aligned(1, rank));
  }
};

inline at::Tensor add2(const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }
inline at::Tensor sub2(const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); }
inline at::Tensor mul2(const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }
inline at::Tensor div2(const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); }
// Comparisons give 0/1 floats; they have no gradient. Written straight into a
// float tensor: one launch, where a bool result and its conversion were two.
// (The out= call sizes `out` to the broadcast shape.) Even so LibTorch takes
// ~16 us a launch on a few hundred values (a gate's per round; Zen 1 core), the
// fused kernel ~5: the scalar comparisons run fused when alone too (alone_on_cpu).
template <class Compare>
at::Tensor as_floats(const at::Tensor& like, Compare compare) {
  at::Tensor out = at::empty({0}, like.options().requires_grad(false));
  at::NoGradGuard no_grad;  // no gradient to record; out= calls may refuse inputs that need one
  compare(out);
  return out;
}
inline at::Tensor gt2(const at::Tensor& a, const at::Tensor& b) {
  return as_floats(a, [&](at::Tensor& out) { at::gt_out(out, a, b); });
}

struct Add : Binary<add2> {
  static constexpr std::string_view name = "add";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2, .cuda_fwd = "a + b", .cuda_da = "1.f", .cuda_db = "1.f"};
    static float fwd(float a, float b, float) { return a + b; }
    static float da(float, float, float, float) { return 1.0f; }
    static float db(float, float, float, float) { return 1.0f; }
  };
};
struct Sub : Binary<sub2> {
  static constexpr std::string_view name = "sub";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2, .cuda_fwd = "a - b", .cuda_da = "1.f", .cuda_db = "-1.f"};
    static float fwd(float a, float b, float) { return a - b; }
    static float da(float, float, float, float) { return 1.0f; }
    static float db(float, float, float, float) { return -1.0f; }
  };
};
struct Mul : Binary<mul2> {
  static constexpr std::string_view name = "mul";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2, .cuda_fwd = "a * b", .cuda_da = "b", .cuda_db = "a"};
    static float fwd(float a, float b, float) { return a * b; }
    static float da(float, float b, float, float) { return b; }
    static float db(float a, float, float, float) { return a; }
  };
};
struct Div : Binary<div2> {
  static constexpr std::string_view name = "div";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2, .cuda_fwd = "a / b", .cuda_da = "1.f / b", .cuda_db = "-a / (b * b)"};
    static float fwd(float a, float b, float) { return a / b; }
    static float da(float, float b, float, float) { return 1.0f / b; }
    static float db(float a, float b, float, float) { return -a / (b * b); }
  };
};
inline at::Tensor max2(const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }
inline at::Tensor min2(const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }

// Elementwise larger / smaller; where a == b the gradient is split evenly,
// and where either is NaN both take all of it (as LibTorch's maximum/minimum
// do: the loser's gradient is masked off, not multiplied by 0).
struct Maximum : Binary<max2> {
  static constexpr std::string_view name = "maximum";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2,
                                        .cuda_fwd = "(a > b || a != a ? a : b)",
                                        .cuda_da = "(a < b ? 0.f : (a == b ? 0.5f : 1.f))",
                                        .cuda_db = "(a > b ? 0.f : (a == b ? 0.5f : 1.f))",
                                        .cuda_mask_a = "a < b",
                                        .cuda_mask_b = "a > b"};
    static float fwd(float a, float b, float) { return a > b || a != a ? a : b; }
    static float da(float a, float b, float, float) { return a < b ? 0.0f : (a == b ? 0.5f : 1.0f); }
    static float db(float a, float b, float, float) { return a > b ? 0.0f : (a == b ? 0.5f : 1.0f); }
    static bool mask_a(float a, float b, float, float) { return a < b; }
    static bool mask_b(float a, float b, float, float) { return a > b; }
  };
};
struct Minimum : Binary<min2> {
  static constexpr std::string_view name = "minimum";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2,
                                        .cuda_fwd = "(a < b || a != a ? a : b)",
                                        .cuda_da = "(a > b ? 0.f : (a == b ? 0.5f : 1.f))",
                                        .cuda_db = "(a < b ? 0.f : (a == b ? 0.5f : 1.f))",
                                        .cuda_mask_a = "a > b",
                                        .cuda_mask_b = "a < b"};
    static float fwd(float a, float b, float) { return a < b || a != a ? a : b; }
    static float da(float a, float b, float, float) { return a > b ? 0.0f : (a == b ? 0.5f : 1.0f); }
    static float db(float a, float b, float, float) { return a < b ? 0.0f : (a == b ? 0.5f : 1.0f); }
    static bool mask_a(float a, float b, float, float) { return a > b; }
    static bool mask_b(float a, float b, float, float) { return a < b; }
  };
};
struct Greater : Binary<gt2> {
  static constexpr std::string_view name = "greater";
  struct Pointwise {
    static constexpr PointwiseInfo info{.operands = 2, .differentiable = false, .cuda_fwd = "(a > b ? 1.f : 0.f)"};
    static float fwd(float a, float b, float) { return a > b ? 1.0f : 0.0f; }
    static float da(float, float, float, float) { return 0.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};

// x (op) c, with c a double attribute (part of the signature: x + 1 and x + 2 do
// not share a launch).
template <at::Tensor (*F)(const at::Tensor&, const at::Scalar&)>
struct WithScalar {
  static constexpr OpTraits traits{.arity = 1, .rowwise = true};
  static Shape infer(const InferCtx& c) { return infer_same(c); }
  static at::Tensor run(RunCtx& c) { return F(c.in(0), scalar_attr(c)); }
};

inline at::Tensor add_s(const at::Tensor& x, const at::Scalar& s) { return at::add(x, s); }
inline at::Tensor mul_s(const at::Tensor& x, const at::Scalar& s) { return at::mul(x, s); }
inline at::Tensor rdiv_s(const at::Tensor& x, const at::Scalar& s) { return at::mul(at::reciprocal(x), s); }
inline at::Tensor gt_s(const at::Tensor& x, const at::Scalar& s) {
  return as_floats(x, [&](at::Tensor& out) { at::gt_out(out, x, s); });
}
inline at::Tensor lt_s(const at::Tensor& x, const at::Scalar& s) {
  return as_floats(x, [&](at::Tensor& out) { at::lt_out(out, x, s); });
}

struct AddScalar : WithScalar<add_s> {
  static constexpr std::string_view name = "add_scalar";
  struct Pointwise {
    static constexpr PointwiseInfo info{.scalar = true, .cuda_fwd = "a + c", .cuda_da = "1.f"};
    static float fwd(float a, float, float c) { return a + c; }
    static float da(float, float, float, float) { return 1.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct MulScalar : WithScalar<mul_s> {
  static constexpr std::string_view name = "mul_scalar";
  struct Pointwise {
    static constexpr PointwiseInfo info{.scalar = true, .cuda_fwd = "a * c", .cuda_da = "c"};
    static float fwd(float a, float, float c) { return a * c; }
    static float da(float, float, float, float c) { return c; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct RDivScalar : WithScalar<rdiv_s> {
  static constexpr std::string_view name = "rdiv_scalar";
  struct Pointwise {
    static constexpr PointwiseInfo info{.scalar = true, .cuda_fwd = "(1.f / a) * c", .cuda_da = "-c / (a * a)"};
    static float fwd(float a, float, float c) { return (1.0f / a) * c; }
    static float da(float a, float, float, float c) { return -c / (a * a); }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
// x^c for a constant c (LibTorch's pow with a scalar exponent).
inline at::Tensor pow_s(const at::Tensor& x, const at::Scalar& s) { return at::pow(x, s); }
struct PowScalar : WithScalar<pow_s> {
  static constexpr std::string_view name = "pow_scalar";
  struct Pointwise {
    // (The gradient of a^0 is 0, as LibTorch's: 0 * 0^-1 would be NaN at a =
    // 0, and so is the incoming gradient times 0 where that is infinite.)
    static constexpr PointwiseInfo info{.scalar = true, .cuda_fwd = "powf(a, c)",
                                        .cuda_da = "(c == 0.f ? 0.f : c * powf(a, c - 1.f))", .cuda_mask_a = "c == 0.f"};
    static float fwd(float a, float, float c) { return pw::pow(a, c); }
    static float da(float a, float, float, float c) { return pw::select(c == 0.0f, 0.0f, c * pw::pow(a, c - 1.0f)); }
    static bool mask_a(float, float, float, float c) { return c == 0.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct GreaterScalar : WithScalar<gt_s> {
  static constexpr std::string_view name = "greater_scalar";
  struct Pointwise {
    static constexpr PointwiseInfo info{.scalar = true, .differentiable = false, .alone_on_cpu = true, .cuda_fwd = "(a > c ? 1.f : 0.f)"};
    static float fwd(float a, float, float c) { return a > c ? 1.0f : 0.0f; }
    static float da(float, float, float, float) { return 0.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct LessScalar : WithScalar<lt_s> {
  static constexpr std::string_view name = "less_scalar";
  struct Pointwise {
    static constexpr PointwiseInfo info{.scalar = true, .differentiable = false, .alone_on_cpu = true, .cuda_fwd = "(a < c ? 1.f : 0.f)"};
    static float fwd(float a, float, float c) { return a < c ? 1.0f : 0.0f; }
    static float da(float, float, float, float) { return 0.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};

inline at::Tensor neg1(const at::Tensor& x) { return at::neg(x); }
inline at::Tensor tanh1(const at::Tensor& x) { return at::tanh(x); }
inline at::Tensor sigmoid1(const at::Tensor& x) { return at::sigmoid(x); }
inline at::Tensor relu1(const at::Tensor& x) { return at::relu(x); }
inline at::Tensor exp1(const at::Tensor& x) { return at::exp(x); }
inline at::Tensor log1(const at::Tensor& x) { return at::log(x); }

struct Neg : Unary<neg1> {
  static constexpr std::string_view name = "neg";
  struct Pointwise {
    static constexpr PointwiseInfo info{.cuda_fwd = "-a", .cuda_da = "-1.f"};
    static float fwd(float a, float, float) { return -a; }
    static float da(float, float, float, float) { return -1.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Tanh : Unary<tanh1> {
  static constexpr std::string_view name = "tanh";
  struct Pointwise {
    static constexpr PointwiseInfo info{.alone_on_cpu = true, .cuda_fwd = "tanhf(a)", .cuda_da = "1.f - y * y"};
    static float fwd(float a, float, float) { return pw::tanh(a); }
    static float da(float, float, float y, float) { return 1.0f - y * y; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Sigmoid : Unary<sigmoid1> {
  static constexpr std::string_view name = "sigmoid";
  struct Pointwise {
    static constexpr PointwiseInfo info{.alone_on_cpu = true, .cuda_fwd = "1.f / (1.f + expf(-a))",
                                        .cuda_da = "(1.f - y) * y"};
    static float fwd(float a, float, float) { return pw::sigmoid(a); }
    static float da(float, float, float y, float) { return (1.0f - y) * y; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Relu : Unary<relu1> {
  static constexpr std::string_view name = "relu";
  struct Pointwise {
    // (A NaN passes its gradient, as LibTorch's: masked where y <= 0 only.)
    static constexpr PointwiseInfo info{.cuda_fwd = "(a < 0.f ? 0.f : a)", .cuda_da = "(y <= 0.f ? 0.f : 1.f)",
                                        .cuda_mask_a = "y <= 0.f"};
    static float fwd(float a, float, float) { return a < 0.0f ? 0.0f : a; }
    static float da(float, float, float y, float) { return y <= 0.0f ? 0.0f : 1.0f; }
    static bool mask_a(float, float, float y, float) { return y <= 0.0f; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Exp : Unary<exp1> {
  static constexpr std::string_view name = "exp";
  struct Pointwise {
    static constexpr PointwiseInfo info{.cuda_fwd = "expf(a)", .cuda_da = "y"};
    static float fwd(float a, float, float) { return pw::exp(a); }
    static float da(float, float, float y, float) { return y; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Log : Unary<log1> {
  static constexpr std::string_view name = "log";
  struct Pointwise {
    static constexpr PointwiseInfo info{.cuda_fwd = "logf(a)", .cuda_da = "1.f / a"};
    static float fwd(float a, float, float) { return pw::log(a); }
    static float da(float a, float, float, float) { return 1.0f / a; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};

inline at::Tensor abs1(const at::Tensor& x) { return at::abs(x); }
inline at::Tensor sqrt1(const at::Tensor& x) { return at::sqrt(x); }
inline at::Tensor softplus1(const at::Tensor& x) { return at::softplus(x); }
inline at::Tensor log_sigmoid1(const at::Tensor& x) { return at::log_sigmoid(x); }
inline at::Tensor gelu1(const at::Tensor& x) { return at::gelu(x, "tanh"); }

struct Abs : Unary<abs1> {
  static constexpr std::string_view name = "abs";
  struct Pointwise {  // gradient 0 at 0, as LibTorch's
    static constexpr PointwiseInfo info{.cuda_fwd = "fabsf(a)", .cuda_da = "(a > 0.f ? 1.f : (a < 0.f ? -1.f : 0.f))"};
    static float fwd(float a, float, float) { return a < 0.0f ? -a : a; }
    static float da(float a, float, float, float) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
struct Sqrt : Unary<sqrt1> {
  static constexpr std::string_view name = "sqrt";
  struct Pointwise {
    static constexpr PointwiseInfo info{.cuda_fwd = "sqrtf(a)", .cuda_da = "0.5f / y"};
    static float fwd(float a, float, float) { return pw::sqrt(a); }
    static float da(float, float, float y, float) { return 0.5f / y; }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
// log(1 + e^x); as LibTorch's (beta 1, threshold 20): x itself above 20.
struct Softplus : Unary<softplus1> {
  static constexpr std::string_view name = "softplus";
  struct Pointwise {
    static constexpr PointwiseInfo info{
        .cuda_fwd = "(a > 20.f ? a : fmaxf(a, 0.f) + logf(1.f + expf(-fabsf(a))))",
        .cuda_da = "(a > 20.f ? 1.f : 1.f / (1.f + expf(-a)))"};
    static float fwd(float a, float, float) { return a > 20.0f ? a : pw::softplus(a); }
    static float da(float a, float, float, float) { return a > 20.0f ? 1.0f : pw::sigmoid(a); }
    static float db(float, float, float, float) { return 0.0f; }
  };
};
// log(sigmoid(x)) = -softplus(-x), without overflow either way.
struct LogSigmoid : Unary<log_sigmoid1> {
  static constexpr std::string_view name = "log_sigmoid";
  struct Pointwise {
    static constexpr PointwiseInfo info{.cuda_fwd = "(fminf(a, 0.f) - logf(1.f + expf(-fabsf(a))))",
                                        .cuda_da = "1.f / (1.f + expf(a))"};
    static float fwd(float a, float, float) { return -pw::softplus(-a); }
    static float da(float a, float, float, float) { return pw::sigmoid(-a); }
    static float db(float, float, float, float) { return 0.0f; }
  };
};

// GELU in its tanh form (LibTorch's approximate="tanh", as GPT-2 and BERT's code use it).
struct Gelu : Unary<gelu1> {
  static constexpr std::string_view name = "gelu";
  struct Pointwise {
    static constexpr PointwiseInfo info{
        .cuda_fwd = "(0.5f * a * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))))",
        .cuda_da = "(0.5f * (1.f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a))) + 0.5f * a * "
                   "(1.f - tanhf(0.7978845608f * (a + 0.044715f * a * a * a)) * tanhf(0.7978845608f * (a + 0.044715f * "
                   "a * a * a))) * 0.7978845608f * (1.f + 0.134145f * a * a))"};
    static float fwd(float a, float, float) { return pw::gelu_tanh(a); }
    static float da(float a, float, float, float) { return pw::gelu_tanh_grad(a); }
    static float db(float, float, float, float) { return 0.0f; }
  };
};

// Uniform [0, 1) numbers that depend only on (seed, key, element index): the same
// example gets the same dropout mask alone or in any batch, on any device. A
// splitmix64-style hash in int64 tensor ops (wrapping multiply, shifts, xor).
inline at::Tensor keyed_uniform(const at::Tensor& keys, int64_t per_row, uint64_t seed) {
  auto opts = keys.options();
  at::Tensor x = keys.unsqueeze(1) * static_cast<int64_t>(0x9E3779B97F4A7C15ull) +
                 (at::arange(1, per_row + 1, opts) * static_cast<int64_t>(0xD1B54A32D192ED03ull) +
                  static_cast<int64_t>(seed));
  for (int64_t m : {static_cast<int64_t>(0xBF58476D1CE4E5B9ull), static_cast<int64_t>(0x94D049BB133111EBull)}) {
    x = at::bitwise_xor(x, at::bitwise_right_shift(x, 31));
    x = x * m;
  }
  x = at::bitwise_xor(x, at::bitwise_right_shift(x, 29));
  // 24 low bits -> [0, 1): exact in float.
  return at::bitwise_and(x, (1 << 24) - 1).to(at::kFloat) * (1.0f / static_cast<float>(1 << 24));
}

// attr: p (double); payload: the per-example key (see OpTraits::keyed).
struct Dropout {
  static constexpr std::string_view name = "dropout";
  static constexpr OpTraits traits{.arity = 1, .keyed = true};
  static Shape infer(const InferCtx& c) {
    double p = c.attr_f(0);
    if (!(p >= 0.0 && p < 1.0)) c.fail("p must be in [0, 1), got ", p);
    return infer_same(c);
  }
  static at::Tensor run(RunCtx& c) {
    const at::Tensor& x = c.in(0);
    double p = c.attr_f(0);
    if (!c.train() || p == 0.0) return x;
    int64_t per_row = c.out_shape().numel();
    at::Tensor keep = at::ge(keyed_uniform(c.payload(), per_row, c.seed()), p).to(x.scalar_type());
    return x * (keep.view(x.sizes()) * (1.0 / (1.0 - p)));
  }
};

}  // namespace sheaf::op
