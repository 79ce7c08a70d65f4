// The fused CPU kernels' float math (ops/pointwise_math.h) against the exact
// value (double precision), over a sweep of float bit patterns: every
// positive and negative float in the range a function is defined on, in
// steps of a few thousand patterns (every exponent, a thousand mantissas
// each), plus the special values. Error in ulps of the float result; outputs
// below the smallest normal float (1.18e-38) are held to that as an absolute
// bound instead: exp clamps its input there and sigmoid follows it, and a
// relative measure of subnormal results says little. The bounds hold for the
// baseline x86-64 code and for the FMA clones (tanh: 5.3 and 4.6 ulps).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <sheaf/ops/pointwise_math.h>

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// |got - want| in units of the float spacing at want.
double ulps(float got, double want) {
  const auto w = static_cast<float>(want);
  if (got == w) return 0.0;
  const float a = std::fabs(w);
  const double spacing = static_cast<double>(std::nextafter(a, kInf)) - a;
  return std::fabs(static_cast<double>(got) - want) / spacing;
}

struct Worst {
  double ulps = 0.0;
  float at = 0.0f;
};

// The largest error of f against ref over floats in [lo, hi].
template <class F, class R>
Worst sweep(F f, R ref, float lo, float hi) {
  Worst worst;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4093) {
    const auto x = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (!(x >= lo && x <= hi)) continue;
    const double want = ref(static_cast<double>(x));
    const float got = f(x);
    double err;
    if (std::fabs(want) < std::numeric_limits<float>::min()) {
      err = std::fabs(static_cast<double>(got) - want) <= 1.01 * std::numeric_limits<float>::min() ? 0.0 : 1e9;
    } else {
      err = ulps(got, want);
    }
    if (err > worst.ulps) worst = {err, x};
  }
  return worst;
}

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("pointwise math is within its documented ulps of the exact value", "[backend][fused]") {
  const float big = std::numeric_limits<float>::max();
  const Worst e = sweep([](float x) { return sheaf::pw::exp(x); }, [](double x) { return std::exp(x); }, -103.9f, 88.7f);
  INFO("exp: " << e.ulps << " ulps at " << e.at);
  CHECK(e.ulps <= 1.0);
  const Worst s = sweep([](float x) { return sheaf::pw::sigmoid(x); }, sigmoid_ref, -big, big);
  INFO("sigmoid: " << s.ulps << " ulps at " << s.at);
  CHECK(s.ulps <= 2.5);
  const Worst t = sweep([](float x) { return sheaf::pw::tanh(x); }, [](double x) { return std::tanh(x); }, -big, big);
  INFO("tanh: " << t.ulps << " ulps at " << t.at);
  CHECK(t.ulps <= 6.0);
  const Worst l = sweep([](float x) { return sheaf::pw::log(x); }, [](double x) { return std::log(x); }, 1e-30f, big);
  INFO("log: " << l.ulps << " ulps at " << l.at);
  CHECK(l.ulps <= 1.0);
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
}
