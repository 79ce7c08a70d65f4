// Products with a weight laid out once for many of them. A batched graph applies
// each shared weight again and again in one forward (every tree level, every
// parser step) to a few dozen rows at a time. OpenBLAS copies the weight into
// its own panel layout inside every call: a fifth to a third of such a product
// on one core (a parser step's [640, 288] weight at 45 rows: the copy is ~30%
// of the kernel's time). Here the weight is copied into that layout once (per
// graph and weight version: ops/weight_grad.h's cache) and every product reads
// it as it is.
//
// The kernel is AVX-512, or AVX2+FMA on CPUs without it (SHEAF_CPU_ISA=avx2
// picks it on either); CPUs with neither keep OpenBLAS (packed_gemm_available()).
// The AVX2 kernel is not only the copy saved: on a Zen 1 core OpenBLAS 0.3.21's
// kernel ran [100, 256] x [256, 128] at ~10 GFLOPS where this one runs ~19.
// Its sums run in a different order than OpenBLAS's: results agree to float
// rounding, not bit for bit. The order also depends on where a row falls
// among the batch's rows (the last 1-3 run split sums): the same row may
// differ in its last bits between batches, deterministically.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

namespace sheaf {

// B [K, N] (any strides) as panels of 32 columns: panels[p][k][j] = B[k][32 p + j],
// the last panel zero-filled past N.
struct PackedMatrix {
  at::Tensor panels;  // [ceil(N / 32), K, 32] float, contiguous
  int64_t k = 0, n = 0;
  bool defined() const { return panels.defined(); }
};

// Whether this CPU runs the packed kernel (AVX-512 or AVX2+FMA; SHEAF_CPU_ISA caps it) and
// the shapes suit it: float, K and N within what was measured.
bool packed_gemm_available();
bool packed_gemm_suits(const at::Tensor& b);

// Whether the packed product is the faster way to an [m, k] x [k, n] product
// with the threads at hand. It runs on LibTorch's pool; where OpenBLAS keeps
// a pool of its own with more threads (set_threads(n) with Debian's pthread
// OpenBLAS gives the n threads to OpenBLAS and one to LibTorch), a large
// product runs faster in OpenBLAS. Measured on 2 cores only (Zen 4, OpenBLAS
// 0.3.21; `sheaf-bench --workload products --threads 2`, two runs, one in
// docs/products-threads2.jsonl; docs/benchmarks.md, "Threads"): over
// 14 weights with k and n >= 128, OpenBLAS's 2 threads took 0.57-0.97x this
// kernel's time (on one) from 64 rows, 0.69-1.48x at 32-48 rows and
// 0.98-2.06x at 16; with k or n = 64, 0.77-1.08x from 64 rows. Inside
// workloads less held: from 32 rows an attention decoder's steps read 5%
// slower in inference, and sending weights narrower than 512 on both sides
// ([416, 128]) made the parser's inference 4% slower (it gathers the rows
// that the packed kernel reads in place). So: from 64 rows, k and n >= 128,
// one of them >= 512.
bool packed_gemm_serves(int64_t m, int64_t k, int64_t n);
// The same rule given the threads of the BLAS's own pool (0: none of its own)
// and of LibTorch's.
bool packed_gemm_serves(int64_t m, int64_t k, int64_t n, int blas_pool, int libtorch);

// Whether packed_mm takes this input and bias (float, on the CPU).
bool packed_product_takes(const at::Tensor& x, const at::Tensor& bias);

PackedMatrix pack_matrix(const at::Tensor& b);

// x [m, K] (rows with a unit inner stride; others are copied) times the packed
// B, plus bias: undefined, [N] (every row), or [m, N] (a bias per row).
at::Tensor packed_mm(const at::Tensor& x, const PackedMatrix& b, const at::Tensor& bias = {});

// The same product over rows read where they lie (row i: K floats from
// rows[i]; no gathered copy): [rows.size(), N] with `options` (float, CPU). No
// autograd: for products that want no gradient.
at::Tensor packed_mm_rows(std::span<const float* const> rows, const PackedMatrix& b, const at::Tensor& bias,
                          const at::TensorOptions& options);

}  // namespace sheaf
