// Float math that compilers vectorise: plain branch-free code (selects, bit
// casts, polynomials; Cephes' coefficients), so a loop over a tile of floats
// becomes SIMD code with no library call per element. Used by the fused
// elementwise kernels (backend/fused_cpu*.cpp) through the ops' Pointwise
// forms. Accuracy against the exact value, as compiled for the baseline
// x86-64 and for the FMA clones (which contract a * b + c): exp within 1.05
// ulp, log within 1, tanh within 1.5, sigmoid within 2.5 (results below the
// smallest normal float: within it, absolutely); tests/backend/
// test_pointwise_math.cpp sweeps them both ways. NaN and infinities behave as
// the C library's.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace sheaf::pw {

inline float select(bool c, float a, float b) { return c ? a : b; }

// 2^n for an integral float n in [-126, 127].
inline float pow2i(float n) { return std::bit_cast<float>(static_cast<int32_t>(n + 127.0f) << 23); }

// Round to nearest integer (default rounding mode), valid for |x| < 2^22.
inline float round_near(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

namespace detail {

constexpr float kExpLo = -87.3365447504f;          // ln of the smallest normal float
constexpr float kExpMax = 88.72283935546875f;      // ln of the largest float

// e^x = (1 + r + r^2 p(r)) 2^n for x in [kExpLo, ln of the largest float]:
// returns the first factor and sets n (Cody and Waite's reduction: ln 2 in two
// parts, the first with few enough bits that x - n * 0.693359375 is exact).
inline float exp_reduced(float x, float& n) {
  n = round_near(x * 1.44269504088896341f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}

}  // namespace detail

// exp(x) for x clamped to [-87.34, 88.38] (where 2^n stays a normal float):
// always finite and positive, with no tails to select (sigmoid does not need
// them). Within 1 ulp inside the clamp.
inline float exp_clamped(float x) {
  constexpr float kHi = 88.3762626647949f;
  const float xc = x > kHi ? kHi : (x < detail::kExpLo ? detail::kExpLo : x);
  float n;
  const float m = detail::exp_reduced(xc, n);
  return m * pow2i(n);
}

inline float exp(float x) {
  const float xc = x > detail::kExpMax ? detail::kExpMax : (x < detail::kExpLo ? detail::kExpLo : x);
  float n;
  const float m = detail::exp_reduced(xc, n);
  // From 88.38 on n is 128 and 2^128 is no float: scale by 2^127, then 2.
  const float y = m * pow2i(n > 127.0f ? 127.0f : n) * (n > 127.0f ? 2.0f : 1.0f);
  const float big = select(x > detail::kExpMax, std::numeric_limits<float>::infinity(), y);
  const float out = select(x < -103.972076416015625f, 0.0f, big);
  return select(x != x, x, out);
}

// Below -88.72 sigmoid is subnormal (< 3e-39): 0 here, as 1 / (1 + expf(-x))
// gives in C once expf overflows.
inline float sigmoid(float x) { return select(x < -detail::kExpMax, 0.0f, 1.0f / (1.0f + exp_clamped(-x))); }

// Small |x|: an odd polynomial; larger: 1 - 2 / (e^2|x| + 1); then x's sign.
// Both are computed for every element (no branch in a vector loop). Within 1.5
// ulp. (A rational function without exp, Eigen's and XLA's form, ran 2x
// faster but to 7 ulp, and the checker's batched-equals-alone test failed
// with it in the sanitizer build: docs/benchmarks.md, 2026-11-27.)
inline float tanh(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * ax + ax;
  // 2|x| <= 18 is inside exp's range: the reduction alone, no clamps or tails.
  float n;
  const float m = detail::exp_reduced(2.0f * (ax > 9.0f ? 9.0f : ax), n);
  const float large = select(ax > 9.0f, 1.0f, 1.0f - 2.0f / (m * pow2i(n) + 1.0f));
  const float t = select(ax < 0.625f, small, large);
  // x's sign bit onto t (-0 stays -0); NaN stays NaN.
  const uint32_t sign = std::bit_cast<uint32_t>(x) & 0x80000000u;
  return select(x != x, x, std::bit_cast<float>(std::bit_cast<uint32_t>(t) | sign));
}

// The sqrt instruction; a negative x gives NaN, as the C library's.
inline float sqrt(float x) { return __builtin_sqrtf(x); }

inline float log(float x) {
  // A subnormal x is scaled by 2^23 into the normal range first (its exponent
  // field is 0: read as it is, log(1.4e-45) came out -88 instead of -103).
  const bool subnormal = x > 0.0f && x < std::numeric_limits<float>::min();
  const int32_t bits = std::bit_cast<int32_t>(select(subnormal, x * 8388608.0f, x));
  float e = static_cast<float>(((bits >> 23) & 0xFF) - 126) - select(subnormal, 23.0f, 0.0f);
  float m = std::bit_cast<float>((bits & 0x007FFFFF) | 0x3F000000);  // in [0.5, 1)
  const bool lowm = m < 0.707106781186547524f;
  e = select(lowm, e - 1.0f, e);
  m = select(lowm, m + m - 1.0f, m - 1.0f);
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  float y = p * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  const float r = m + y + e * 0.693359375f;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float out = select(x == inf, inf, r);
  out = select(x == 0.0f, -inf, out);
  out = select(x < 0.0f || x != x, nan, out);
  return out;
}

// log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large |x|.
inline float softplus(float x) {
  const float ax = x < 0.0f ? -x : x;
  return (x > 0.0f ? x : 0.0f) + pw::log(1.0f + pw::exp(-ax));
}

// a^c as LibTorch's pow: exp(c log|a|), exact for c = 0 and c = 2; a negative
// base gives the sign of an odd integral c, NaN for a non-integral c. As IEEE
// (and LibTorch) have it, 1^c is 1 and (-1)^(+-inf) is 1 whatever c is, NaN
// included, where exp(c log 1) would be exp(NaN).
inline float pow(float a, float c) {
  const float aa = a < 0.0f ? -a : a;
  const float ac = c < 0.0f ? -c : c;
  float r = pw::exp(c * pw::log(aa));
  r = select(c == 0.0f, 1.0f, select(c == 2.0f, a * a, r));
  const bool integral = ac >= 4194304.0f || round_near(c) == c;  // every float from 2^22 on is integral
  const float half = c * 0.5f;
  const bool odd = integral && ac < 16777216.0f && round_near(half) != half;
  const float negative = select(integral, select(odd, -r, r), std::numeric_limits<float>::quiet_NaN());
  const bool one = a == 1.0f || (a == -1.0f && ac == std::numeric_limits<float>::infinity());
  return select(one, 1.0f, select(a < 0.0f && c != 0.0f && c != 2.0f, negative, r));
}

// GELU, tanh form (LibTorch's approximate="tanh"): 0.5 x (1 + tanh(k (x + 0.044715 x^3))).
inline constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
inline float gelu_tanh(float x) { return 0.5f * x * (1.0f + pw::tanh(kGeluK * (x + 0.044715f * x * x * x))); }
inline float gelu_tanh_grad(float x) {
  const float t = pw::tanh(kGeluK * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace sheaf::pw
