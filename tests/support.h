// Helpers shared by the tests.
#pragma once

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <sheaf/sheaf.h>

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

// Runs the checker and fails the test with its message.
#define REQUIRE_BATCHED_EQUALS_ALONE(report) \
  do {                                       \
    const auto& r_ = (report);               \
    INFO(r_.message);                        \
    REQUIRE(r_.ok);                          \
    REQUIRE(r_.values_compared > 0);         \
  } while (0)

inline bool cuda_available() { return at::hasCUDA(); }

// CUDA-tagged tests pass without running where there is no GPU, and say so.
#define SHEAF_SKIP_WITHOUT_CUDA()                              \
  do {                                                         \
    if (!::sheaf::test::cuda_available()) {                    \
      WARN("CUDA is not available: skipping this CUDA check"); \
      return;                                                  \
    }                                                          \
  } while (0)

}  // namespace sheaf::test
