// Sheaf's packed product (ops/packed_gemm.h) against the BLAS, shape by shape:
// x [m, k] times a weight's W^T [k, n] plus a bias, as an affine over m rows
// runs it. The packed kernel runs on LibTorch's pool, at::addmm on the BLAS's,
// each with the threads --threads gives them (sheaf::set_threads). The
// figures behind packed_gemm_serves: which of the two a product of that size
// goes to, printed beside each row. No autograd; medians of --repeat timings
// of 20 products each.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdio>

#include <sheaf/ops/packed_gemm.h>

#include "harness.h"

namespace sheaf::bench {

int run_products(const Options& o) {
  if (!packed_gemm_available()) {
    std::printf("products: the packed product needs AVX2+FMA, which this CPU lacks: nothing to compare\n");
    return 0;
  }
  c10::NoGradGuard no_grad;
  const c10::Device cpu(c10::kCPU);
  // [k, n]: LSTM gates (h -> 4h, and their backward, 4h -> h), a TreeLSTM's
  // [256, 640], a parser's [288, 640], square and narrow weights.
  constexpr int64_t kShapes[][2] = {{128, 512}, {512, 128}, {128, 640}, {640, 128}, {256, 1024}, {1024, 256},
                                    {288, 640}, {640, 288}, {192, 512}, {128, 128},  {256, 256},  {256, 128},
                                    {128, 256}, {64, 256},  {256, 64},  {512, 2048}};
  constexpr int64_t kRows[] = {16, 32, 48, 64, 96, 128, 256};
  constexpr int kTimes = 20;
  at::manual_seed(0);
  if (!o.json) std::printf("products, %d thread(s): us a product; blas/packed < 1: the BLAS is faster\n", o.threads);
  for (const auto& [k, n] : kShapes) {
    const at::Tensor w = at::randn({n, k}), b = at::randn({n}), wt = w.t();
    const PackedMatrix packed = pack_matrix(wt);
    for (const int64_t m : kRows) {
      const at::Tensor x = at::randn({m, k});
      const double packed_us = median_ms(cpu, o.repeat, [&] {
        for (int i = 0; i < kTimes; ++i) packed_mm(x, packed, b);
      }) * 1000.0 / kTimes;
      const double blas_us = median_ms(cpu, o.repeat, [&] {
        for (int i = 0; i < kTimes; ++i) at::addmm(b, x, wt);
      }) * 1000.0 / kTimes;
      const char* chosen = packed_gemm_serves(m, k, n) ? "packed" : "blas";
      if (o.json) {
        Json j;
        j.add("workload", "products").add("threads", o.threads).add("repeat", o.repeat).add("m", m).add("k", k)
            .add("n", n).add("packed_us", packed_us).add("blas_us", blas_us).add("chosen", chosen);
        std::printf("%s\n", j.str().c_str());
      } else {
        std::printf("  m %4lld  k %4lld  n %4lld   packed %8.1f   blas %8.1f   blas/packed %5.2f   chosen: %s\n",
                    static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n), packed_us,
                    blas_us, blas_us / packed_us, chosen);
      }
    }
  }
  return 0;
}

}  // namespace sheaf::bench
