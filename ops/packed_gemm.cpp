#include "packed_gemm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>

#include <sheaf/core/cpu_features.h>
#include <sheaf/core/error.h>

#include "blas_threads.h"
#include "cpu_float.h"
#include "output_pool.h"

#include <algorithm>
#include <span>
#include <type_traits>

#ifdef SHEAF_HAVE_AVX2_CLONES
#include <immintrin.h>
#endif

namespace sheaf {

namespace {

constexpr int64_t kPanel = 32;  // columns a panel: two AVX-512 registers a row, or four AVX2 ones
constexpr int kRows = 6;        // rows a block: 12 accumulators, the FMA units kept busy

// Rows in blocks of kRows, then the 1-5 left as one block: run(first row,
// std::integral_constant<int, rows>) for each, the block size a template
// argument for the kernels' register arrays.
template <class Run>
void by_row_blocks(int64_t m, Run&& run) {
  int64_t i = 0;
  for (; i + kRows <= m; i += kRows) run(i, std::integral_constant<int, kRows>{});
  switch (m - i) {
    case 1: run(i, std::integral_constant<int, 1>{}); break;
    case 2: run(i, std::integral_constant<int, 2>{}); break;
    case 3: run(i, std::integral_constant<int, 3>{}); break;
    case 4: run(i, std::integral_constant<int, 4>{}); break;
    case 5: run(i, std::integral_constant<int, 5>{}); break;
    default: break;
  }
}
static_assert(kRows == 6, "by_row_blocks names the remainders 1-5");

// The rows of x a product reads: evenly spaced (a tensor's rows), or anywhere
// (rows read where they lie: packed_mm_rows). at(i): the rows from row i on.
struct StridedRows {
  const float* x;
  int64_t ld;
  const float* row(int r) const { return x + r * ld; }
  StridedRows at(int64_t i) const { return {x + i * ld, ld}; }
};
struct RowPointers {
  const float* const* p;
  const float* row(int r) const { return p[r]; }
  RowPointers at(int64_t i) const { return {p + i}; }
};

#ifdef SHEAF_HAVE_AVX2_CLONES
// A panel's two 16-column halves, as masks of its first `cols` (1-32) real columns.
struct PanelMasks {
  __mmask16 lo, hi;
  explicit PanelMasks(int64_t cols)
      : lo(static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1)),
        hi(static_cast<__mmask16>(cols <= 16 ? 0 : cols >= 32 ? 0xFFFF : (1u << (cols - 16)) - 1)) {}
};

// How many interleaved chains of accumulators a block of R rows runs over k:
// an FMA waits ~4 cycles for the one before on its accumulator, so the 2R of
// one chain keep both FMA units busy only from R = 4 on. Fewer rows (the
// last of a batch's rows, or a small batch) split k into 2 or 4 chains,
// summed at the end: throughput- instead of latency-bound. (So a row's sum
// is rounded in an order that depends on the block it falls in: the same
// row may differ in its last bits between batches of different sizes.)
template <int R>
constexpr int kChains = R == 1 ? 4 : R <= 3 ? 2 : 1;

// Row i of the panel into R rows' accumulators (a0: its first 16 columns, a1: the rest).
template <int R>
[[gnu::always_inline]] SHEAF_AVX512_TARGET inline void panel_step(__m512 (&a0)[R], __m512 (&a1)[R],
                                                                  const float* const (&xr)[R], const float* panel,
                                                                  int64_t i) {
  __m512 w0 = _mm512_loadu_ps(panel + i * kPanel), w1 = _mm512_loadu_ps(panel + i * kPanel + 16);
  // Kept in registers for R <= 3: there GCC folded the loads into every
  // FMA, R loads of each where one serves, and the load ports set the pace
  // (1.5x the time at R = 3). From R = 4 on GCC keeps them in registers itself.
  if constexpr (R <= 3) asm("" : "+v"(w0), "+v"(w1));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 xv = _mm512_set1_ps(xr[r][i]);
    a0[r] = _mm512_fmadd_ps(xv, w0, a0[r]);
    a1[r] = _mm512_fmadd_ps(xv, w1, a1[r]);
  }
}

// R rows of x times one panel: accumulators start from the bias (row stride
// ldb; 0 for one bias for every row) and run over k; stores keep to the
// panel's real columns (masks).
template <int R, class Rows>
SHEAF_AVX512_TARGET inline void block(Rows x, const float* panel, int64_t k, const float* bias, int64_t ldb, float* c,
                                      int64_t ldc, __mmask16 m0, __mmask16 m1) {
  constexpr int S = kChains<R>;
  const float* xr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) xr[r] = x.row(r);
  __m512 a0[S][R], a1[S][R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    a0[0][r] = bias ? _mm512_maskz_loadu_ps(m0, bias + r * ldb) : _mm512_setzero_ps();
    a1[0][r] = bias ? _mm512_maskz_loadu_ps(m1, bias + r * ldb + 16) : _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int s = 1; s < S; ++s) a0[s][r] = a1[s][r] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + S <= k; i += S)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) panel_step<R>(a0[s], a1[s], xr, panel, i + s);
  for (; i < k; ++i) panel_step<R>(a0[0], a1[0], xr, panel, i);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int s = 1; s < S; ++s) {
      a0[0][r] = _mm512_add_ps(a0[0][r], a0[s][r]);
      a1[0][r] = _mm512_add_ps(a1[0][r], a1[s][r]);
    }
    _mm512_mask_storeu_ps(c + r * ldc, m0, a0[0][r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, a1[0][r]);
  }
}

// Panels [p0, p1) for every row: each panel (k x 32 floats) stays in cache
// while the row blocks pass over it.
template <class Rows>
SHEAF_AVX512_TARGET void panels_avx512(Rows x, int64_t m, const float* packed, int64_t k, int64_t n,
                                       const float* bias, int64_t ldb, float* c, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t cols = std::min<int64_t>(kPanel, n - p * kPanel);
    const PanelMasks mask(cols);
    const __mmask16 m0 = mask.lo, m1 = mask.hi;
    const float* panel = packed + p * k * kPanel;
    const float* b = bias ? bias + p * kPanel : nullptr;
    float* out = c + p * kPanel;
    by_row_blocks(m, [&](int64_t i, auto rows) {
      block<rows.value>(x.at(i), panel, k, b ? b + i * ldb : nullptr, ldb, out + i * n, n, m0, m1);
    });
  }
}

// AVX2: the same panels, each as two 16-column halves: R rows x 2 registers a
// half is the 6 x 16 block of 12 accumulators that 16 registers allow. A half
// panel's row is one 64-byte line, so a half of k rows (16 KiB at k = 256) stays
// in L1 while the row blocks pass. Halves cut short (the last panel past N) load
// and store through lane masks; their panel columns are zeros.
struct HalfMasks {
  __m256i lo, hi;
  SHEAF_AVX2_TARGET explicit HalfMasks(int64_t cols) {  // cols: 1-16 real columns
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    lo = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)), lane);
    hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols) - 8), lane);
  }
};

// Row i of the half panel into R rows' accumulators (as panel_step).
template <int R>
[[gnu::always_inline]] SHEAF_AVX2_TARGET inline void half_step(__m256 (&a0)[R], __m256 (&a1)[R],
                                                               const float* const (&xr)[R], const float* half,
                                                               int64_t i) {
  __m256 w0 = _mm256_loadu_ps(half + i * kPanel), w1 = _mm256_loadu_ps(half + i * kPanel + 8);
  if constexpr (R <= 3) asm("" : "+x"(w0), "+x"(w1));  // (as panel_step's)
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 xv = _mm256_broadcast_ss(xr[r] + i);
    a0[r] = _mm256_fmadd_ps(xv, w0, a0[r]);
    a1[r] = _mm256_fmadd_ps(xv, w1, a1[r]);
  }
}

template <int R, class Rows>
SHEAF_AVX2_TARGET inline void half_block(Rows x, const float* half, int64_t k, const float* bias, int64_t ldb,
                                         float* c, int64_t ldc, int64_t cols, const HalfMasks& mask) {
  constexpr int S = kChains<R>;
  const float* xr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) xr[r] = x.row(r);
  __m256 acc0[S][R], acc1[S][R];
  __m256(&a0)[R] = acc0[0];
  __m256(&a1)[R] = acc1[0];
  // Columns 8-15 of a half with 8 or fewer are not touched at all: masked-off
  // lanes do not fault on Intel's word, and AMD's manuals are less plain.
  const bool full = cols == 16, high = cols > 8;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    if (!bias) {
      a0[r] = a1[r] = _mm256_setzero_ps();
    } else if (full) {
      a0[r] = _mm256_loadu_ps(bias + r * ldb);
      a1[r] = _mm256_loadu_ps(bias + r * ldb + 8);
    } else {
      a0[r] = _mm256_maskload_ps(bias + r * ldb, mask.lo);
      a1[r] = high ? _mm256_maskload_ps(bias + r * ldb + 8, mask.hi) : _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int s = 1; s < S; ++s) acc0[s][r] = acc1[s][r] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + S <= k; i += S)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) half_step<R>(acc0[s], acc1[s], xr, half, i + s);
  for (; i < k; ++i) half_step<R>(a0, a1, xr, half, i);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int s = 1; s < S; ++s) {
      a0[r] = _mm256_add_ps(a0[r], acc0[s][r]);
      a1[r] = _mm256_add_ps(a1[r], acc1[s][r]);
    }
    if (full) {
      _mm256_storeu_ps(c + r * ldc, a0[r]);
      _mm256_storeu_ps(c + r * ldc + 8, a1[r]);
    } else {
      _mm256_maskstore_ps(c + r * ldc, mask.lo, a0[r]);
      if (high) _mm256_maskstore_ps(c + r * ldc + 8, mask.hi, a1[r]);
    }
  }
}

template <class Rows>
SHEAF_AVX2_TARGET void panels_avx2(Rows x, int64_t m, const float* packed, int64_t k, int64_t n, const float* bias,
                                   int64_t ldb, float* c, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t h = 0; h < kPanel; h += 16) {
      const int64_t cols = std::min<int64_t>(16, n - p * kPanel - h);
      if (cols <= 0) break;
      const HalfMasks mask(cols);
      const float* half = packed + p * k * kPanel + h;
      const float* b = bias ? bias + p * kPanel + h : nullptr;
      float* out = c + p * kPanel + h;
      by_row_blocks(m, [&](int64_t i, auto rows) {
        half_block<rows.value>(x.at(i), half, k, b ? b + i * ldb : nullptr, ldb, out + i * n, n, cols, mask);
      });
    }
}

// One panel from columns of B read with a stride (W^T of a row-major W): each
// panel row is two gathers across 32 of W's rows, which stay in L1 for the
// next rows. Past `cols` the gathers are masked to zeros.
SHEAF_AVX512_TARGET void pack_strided_avx512(const float* from, int64_t sk, int64_t sn, int64_t k, int64_t cols,
                                             float* panel) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i step = _mm512_set1_epi32(static_cast<int>(sn));
  const __m512i i0 = _mm512_mullo_epi32(lane, step);
  const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(static_cast<int>(16 * sn)));
  const PanelMasks mask(cols);
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float* row = from + i * sk;
    _mm512_storeu_ps(panel + i * kPanel, _mm512_mask_i32gather_ps(zero, mask.lo, i0, row, 4));
    _mm512_storeu_ps(panel + i * kPanel + 16, _mm512_mask_i32gather_ps(zero, mask.hi, i1, row, 4));
  }
}
#endif

// The same panel from any strides, one column at a time (W^T: one row of W
// each), for CPUs without AVX-512's masked gathers.
void pack_strided(const float* from, int64_t sk, int64_t sn, int64_t k, int64_t cols, float* panel) {
  for (int64_t j = 0; j < kPanel; ++j)
    for (int64_t i = 0; i < k; ++i) panel[i * kPanel + j] = j < cols ? from[i * sk + j * sn] : 0.0f;
}

}  // namespace

bool packed_gemm_available() {
#ifdef SHEAF_HAVE_AVX2_CLONES
  return use_avx2();
#else
  return false;
#endif
}

bool packed_gemm_suits(const at::Tensor& b) {
  // Nothing beyond these sizes was measured: at k = 4096 a panel (k x 32
  // floats) is half a Zen 4 core's L2, and OpenBLAS blocks over k where this
  // kernel does not.
  return b.dim() == 2 && cpu_float(b) && b.size(0) >= 8 && b.size(0) <= 4096 &&
         b.size(1) >= 8 && b.size(0) * b.size(1) <= (int64_t{1} << 24) && b.stride(0) < (int64_t{1} << 24) &&
         b.stride(1) < (int64_t{1} << 24);  // the packing's gathers index 32 columns in int32
}

namespace {
// Large enough for OpenBLAS's own threads to pay (packed_gemm_serves).
bool blas_threads_pay(int64_t m, int64_t k, int64_t n) {
  return m >= 64 && std::min(k, n) >= 128 && std::max(k, n) >= 512;
}
}  // namespace

bool packed_gemm_serves(int64_t m, int64_t k, int64_t n, int blas_pool, int libtorch) {
  return !blas_threads_pay(m, k, n) || blas_pool <= libtorch;
}

bool packed_gemm_serves(int64_t m, int64_t k, int64_t n) {
  // (The thread counts asked only for products that large.)
  return !blas_threads_pay(m, k, n) || blas_pool_threads() <= at::get_num_threads();
}

bool packed_product_takes(const at::Tensor& x, const at::Tensor& bias) {
  return x.dim() == 2 && cpu_float(x) && (!bias.defined() || cpu_float(bias));
}

PackedMatrix pack_matrix(const at::Tensor& b_in) {
  RECORD_FUNCTION("sheaf::pack_weight", std::vector<c10::IValue>());  // a copy kernel: counted as a launch
  if (!packed_gemm_available() || !packed_gemm_suits(b_in))
    throw InternalError("pack_matrix: a matrix the packed product does not take");
  const at::Tensor b = b_in.detach();
  const int64_t k = b.size(0), n = b.size(1), panels = (n + kPanel - 1) / kPanel;
  at::Tensor out = at::empty({panels, k, kPanel}, b.options());
  const float* src = b.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t sk = b.stride(0), sn = b.stride(1);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = std::min<int64_t>(kPanel, n - p * kPanel);
    float* panel = dst + p * k * kPanel;
    const float* from = src + p * kPanel * sn;
    if (sn == 1) {  // rows of B: each panel row is a piece of one
      for (int64_t i = 0; i < k; ++i) {
        std::copy_n(from + i * sk, cols, panel + i * kPanel);
        std::fill(panel + i * kPanel + cols, panel + (i + 1) * kPanel, 0.0f);
      }
      continue;
    }
#ifdef SHEAF_HAVE_AVX2_CLONES
    if (use_avx512()) {
      pack_strided_avx512(from, sk, sn, k, cols, panel);
      continue;
    }
#endif
    pack_strided(from, sk, sn, k, cols, panel);
  }
  return {out, k, n};
}

namespace {

// c [m, N] = the rows times the packed B, plus the bias (see packed_mm).
template <class Rows>
at::Tensor product(Rows x, int64_t m, const PackedMatrix& b, const at::Tensor& bias_in,
                   const at::TensorOptions& options) {
  if (m == 0) return empty_output({0, b.n}, options);
  at::Tensor bias;
  int64_t ldb = 0;
  if (bias_in.defined()) {
    bias = bias_in.contiguous();
    const bool rows = bias.dim() == 2 && bias.size(0) == m && m > 1;
    if (bias.numel() != (rows ? m * b.n : b.n)) throw InternalError("packed_mm: a bias of the wrong size");
    ldb = rows ? b.n : 0;
  }
  at::Tensor c = empty_output({m, b.n}, options);
#ifdef SHEAF_HAVE_AVX2_CLONES
  const float* pp = b.panels.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* cp = c.data_ptr<float>();
  const int64_t panels = b.panels.size(0);
  // With more than one thread, panels split across them; a small product stays on one.
  const int64_t grain = m * b.k * b.n < (int64_t{1} << 18) ? panels : 1;
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    if (use_avx512())
      panels_avx512(x, m, pp, b.k, b.n, bp, ldb, cp, p0, p1);
    else
      panels_avx2(x, m, pp, b.k, b.n, bp, ldb, cp, p0, p1);
  });
#else
  (void)x;
#endif
  return c;
}

}  // namespace

at::Tensor packed_mm(const at::Tensor& x_in, const PackedMatrix& b, const at::Tensor& bias_in) {
  RECORD_FUNCTION("sheaf::packed_mm", std::vector<c10::IValue>());
  if (!packed_gemm_available() || !b.defined() || !packed_product_takes(x_in, bias_in) || x_in.size(1) != b.k)
    throw InternalError("packed_mm: an input the packed product does not take");
  const at::Tensor x = x_in.stride(1) == 1 && x_in.stride(0) >= b.k ? x_in : x_in.contiguous();
  return product(StridedRows{x.data_ptr<float>(), x.stride(0)}, x.size(0), b, bias_in, x.options());
}

at::Tensor packed_mm_rows(std::span<const float* const> rows, const PackedMatrix& b, const at::Tensor& bias,
                          const at::TensorOptions& options) {
  RECORD_FUNCTION("sheaf::packed_mm", std::vector<c10::IValue>());
  if (!packed_gemm_available() || !b.defined() || (bias.defined() && !cpu_float(bias)))
    throw InternalError("packed_mm_rows: an input the packed product does not take");
  return product(RowPointers{rows.data()}, static_cast<int64_t>(rows.size()), b, bias, options);
}

}  // namespace sheaf
