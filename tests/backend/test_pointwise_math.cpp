// The fused CPU kernels' float math (ops/pointwise_math.h) against the exact
// value (double precision), over a sweep of float bit patterns: every float in
// the range a function is defined on, in steps of 4,093 patterns (every
// exponent, ~2,000 mantissas each), and every 7th pattern where tanh switches
// between its two forms and saturates (|x| in [0.5, 9]); plus the special values. Error in ulps of the
// float result; outputs below the smallest normal float (1.18e-38) are held to
// that as an absolute bound instead: exp clamps its input there and sigmoid
// follows it, and a relative measure of subnormal results says little. A NaN
// where the exact value is a number counts as a failure.
//
// The kernels run the math as compiled for their AVX2+FMA and AVX-512 clones,
// where the compiler contracts a * b + c into one rounding: the sweeps run
// through clones of the same targets too, where the CPU has them (this file is
// compiled with the kernels' -fno-trapping-math: tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <sheaf/core/cpu_features.h>
#include <sheaf/ops/pointwise_math.h>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The inputs of a sweep: every `step`-th bit pattern whose float is in [lo, hi].
std::vector<float> inputs(float lo, float hi, uint64_t step) {
  std::vector<float> xs;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += step) {
    const auto x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (x >= lo && x <= hi) xs.push_back(x);
  }
  return xs;
}

// One loop over the inputs, as the kernels' loops are compiled for each target.
#define SHEAF_PW_EVAL(SUFFIX, ATTR)                                                        \
  template <class F>                                                                       \
  ATTR void eval_##SUFFIX(F f, const float* __restrict x, float* __restrict y, size_t n) { \
    for (size_t i = 0; i < n; ++i) y[i] = f(x[i]);                                         \
  }
SHEAF_PW_EVAL(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_PW_EVAL(avx2, SHEAF_AVX2_TARGET)
SHEAF_PW_EVAL(avx512, SHEAF_AVX512_TARGET)
#endif

// |got - want| in units of the float spacing at want; subnormal results: 0 or
// 1e9 by the absolute bound; a NaN anywhere but where want is NaN: 1e9.
double error(float got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : 1e9;
  if (std::isnan(got)) return 1e9;
  if (std::fabs(want) < std::numeric_limits<float>::min())
    return std::fabs(static_cast<double>(got) - want) <= 1.01 * std::numeric_limits<float>::min() ? 0.0 : 1e9;
  const auto w = static_cast<float>(want);  // finite here: the sweeps stay where results are floats
  if (got == w) return 0.0;
  const float a = std::fabs(w);
  const double spacing = static_cast<double>(std::nextafter(a, kInf)) - a;
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

// The largest error of f (as each available target compiles it) against ref.
template <class F, class R>
void check(const char* name, F f, R ref, const std::vector<float>& xs, double bound) {
  std::vector<double> want(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) want[i] = ref(static_cast<double>(xs[i]));
  std::vector<float> ys(xs.size());
  std::vector<std::pair<std::string, void (*)(F, const float*, float*, size_t)>> targets{{"baseline", &eval_base<F>}};
#ifdef SHEAF_HAVE_AVX2_CLONES
  if (sheaf::use_avx2()) targets.emplace_back("avx2+fma", &eval_avx2<F>);
  if (sheaf::use_avx512()) targets.emplace_back("avx512", &eval_avx512<F>);
#endif
  for (const auto& [target, eval] : targets) {
    eval(f, xs.data(), ys.data(), xs.size());
    double worst = 0.0;
    float at = 0.0f;
    for (size_t i = 0; i < xs.size(); ++i) {
      const double e = error(ys[i], want[i]);
      if (!(e <= worst)) {
        worst = e;
        at = xs[i];
      }
    }
    INFO(name << " (" << target << "): " << worst << " ulps at " << at);
    CHECK(worst <= bound);
  }
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("pointwise math is within its documented ulps of the exact value", "[backend][fused]") {
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  check("exp", [](float x) { return sheaf::pw::exp(x); }, [](double x) { return std::exp(x); },
        inputs(-103.9f, 88.72f, 4093), 1.05);
  check("sigmoid", [](float x) { return sheaf::pw::sigmoid(x); }, sigmoid_ref, inputs(-big, big, 4093), 2.5);
  const auto tanh = [](float x) { return sheaf::pw::tanh(x); };
  const auto tanh_ref = [](double x) { return std::tanh(x); };
  check("tanh", tanh, tanh_ref, inputs(-big, big, 4093), 1.5);
  check("tanh", tanh, tanh_ref, inputs(0.5f, 9.0f, 7), 1.5);
  check("tanh", tanh, tanh_ref, inputs(-9.0f, -0.5f, 7), 1.5);
  check("log", [](float x) { return sheaf::pw::log(x); }, [](double x) { return std::log(x); },
        inputs(tiny, big, 4093), 1.0);
}

TEST_CASE("pointwise math keeps the C library's special values", "[backend][fused]") {
  CHECK(sheaf::pw::exp(kInf) == kInf);
  CHECK(sheaf::pw::exp(-kInf) == 0.0f);
  CHECK(sheaf::pw::exp(89.0f) == kInf);
  CHECK(std::isnan(sheaf::pw::exp(kNaN)));
  CHECK(sheaf::pw::sigmoid(kInf) == 1.0f);
  CHECK(sheaf::pw::sigmoid(-kInf) == 0.0f);
  CHECK(sheaf::pw::sigmoid(0.0f) == 0.5f);
  CHECK(std::isnan(sheaf::pw::sigmoid(kNaN)));
  CHECK(sheaf::pw::tanh(kInf) == 1.0f);
  CHECK(sheaf::pw::tanh(-kInf) == -1.0f);
  CHECK(sheaf::pw::tanh(20.0f) == 1.0f);
  CHECK(std::signbit(sheaf::pw::tanh(-0.0f)));
  CHECK(std::isnan(sheaf::pw::tanh(kNaN)));
  CHECK(sheaf::pw::log(0.0f) == -kInf);
  CHECK(sheaf::pw::log(kInf) == kInf);
  CHECK(std::isnan(sheaf::pw::log(-1.0f)));
  CHECK(std::isnan(sheaf::pw::log(kNaN)));
  CHECK(std::fabs(sheaf::pw::log(std::numeric_limits<float>::denorm_min()) - std::log(1.4012984643e-45)) < 1e-4);
  // pow's, as std::pow's (and LibTorch's): 1^c and (-1)^(+-inf) are 1 whatever c is.
  CHECK(sheaf::pw::pow(1.0f, kNaN) == 1.0f);
  CHECK(sheaf::pw::pow(1.0f, kInf) == 1.0f);
  CHECK(sheaf::pw::pow(1.0f, -kInf) == 1.0f);
  CHECK(sheaf::pw::pow(-1.0f, kInf) == 1.0f);
  CHECK(sheaf::pw::pow(-1.0f, -kInf) == 1.0f);
  CHECK(std::isnan(sheaf::pw::pow(-1.0f, kNaN)));
  CHECK(sheaf::pw::pow(kNaN, 0.0f) == 1.0f);
  CHECK(sheaf::pw::pow(0.0f, 0.0f) == 1.0f);
  CHECK(sheaf::pw::pow(0.5f, kInf) == 0.0f);
  CHECK(sheaf::pw::pow(2.0f, kInf) == kInf);
  CHECK(sheaf::pw::pow(0.5f, -kInf) == kInf);
  CHECK(std::fabs(sheaf::pw::pow(-2.0f, 3.0f) + 8.0f) < 1e-5f);
  CHECK(std::isnan(sheaf::pw::pow(-2.0f, 0.5f)));
}
