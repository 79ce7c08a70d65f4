// Compiled with -fno-trapping-math (CMakeLists.txt), as backend/fused_cpu.cpp:
// without it the compiler keeps pointwise_math's selects as branches and the
// loops do not vectorise.
#include "lstm_cell.h"

#include <sheaf/core/cpu_features.h>

#include "pointwise_math.h"

namespace sheaf::op::lstm_cell {

namespace {

using Fwd = void (*)(float*, float*, float*, const float*, int64_t, int64_t, int64_t);
using Bwd = void (*)(const float*, const float*, const float*, const float*, const float*, const float*, float*,
                     float*, int64_t, int64_t, int64_t, int64_t);

// One row per call, the four gates as four restrict pointers (one pointer
// with offsets would make the compiler assume they overlap). kPrev: the row
// continues a sequence (a previous cell state); kNext: a later step sent
// gradients back into it.
#define SHEAF_LSTM_LOOPS(SUFFIX, ATTR)                                                                          \
  template <bool kPrev>                                                                                          \
  ATTR inline void fwd_row_##SUFFIX(float* __restrict ai, float* __restrict af, float* __restrict ag,             \
                                    float* __restrict ao, float* __restrict c, float* __restrict h,               \
                                    const float* __restrict cp, int64_t n) {                                      \
    for (int64_t j = 0; j < n; ++j) {                                                                            \
      const float i = pw::sigmoid(ai[j]), f = pw::sigmoid(af[j]), g = pw::tanh(ag[j]), o = pw::sigmoid(ao[j]);  \
      ai[j] = i, af[j] = f, ag[j] = g, ao[j] = o;                                                                \
      const float cv = kPrev ? i * g + f * cp[j] : i * g;                                                        \
      c[j] = cv;                                                                                                 \
      h[j] = o * pw::tanh(cv);                                                                                   \
    }                                                                                                            \
  }                                                                                                              \
  ATTR void fwd_##SUFFIX(float* a, float* c, float* h, const float* cprev, int64_t rows, int64_t carried,       \
                         int64_t n) {                                                                            \
    for (int64_t r = 0; r < rows; ++r) {                                                                         \
      float* ar = a + r * 4 * n;                                                                                 \
      if (r < carried)                                                                                           \
        fwd_row_##SUFFIX<true>(ar, ar + n, ar + 2 * n, ar + 3 * n, c + r * n, h + r * n, cprev + r * n, n);      \
      else                                                                                                       \
        fwd_row_##SUFFIX<false>(ar, ar + n, ar + 2 * n, ar + 3 * n, c + r * n, h + r * n, nullptr, n);           \
    }                                                                                                            \
  }                                                                                                              \
  template <bool kPrev, bool kNext>                                                                              \
  ATTR inline void bwd_row_##SUFFIX(const float* __restrict ai, const float* __restrict af,                      \
                                    const float* __restrict ag, const float* __restrict ao,                      \
                                    const float* __restrict c, const float* __restrict cp,                       \
                                    const float* __restrict dh, const float* __restrict dhn,                     \
                                    const float* __restrict dcn, float* __restrict dai, float* __restrict daf,   \
                                    float* __restrict dag, float* __restrict dao, float* __restrict dcp,         \
                                    int64_t n) {                                                                 \
    for (int64_t j = 0; j < n; ++j) {                                                                            \
      const float i = ai[j], f = af[j], g = ag[j], o = ao[j];                                                    \
      const float tc = pw::tanh(c[j]);                                                                           \
      const float dhv = kNext ? dh[j] + dhn[j] : dh[j];                                                          \
      const float dc = (kNext ? dcn[j] : 0.0f) + dhv * o * (1.0f - tc * tc);                                     \
      dai[j] = dc * g * i * (1.0f - i);                                                                          \
      daf[j] = kPrev ? dc * cp[j] * f * (1.0f - f) : 0.0f;                                                       \
      dag[j] = dc * i * (1.0f - g * g);                                                                          \
      dao[j] = dhv * tc * o * (1.0f - o);                                                                        \
      if (kPrev) dcp[j] = dc * f;                                                                                \
    }                                                                                                            \
  }                                                                                                              \
  ATTR void bwd_##SUFFIX(const float* a, const float* c, const float* cprev, const float* dh, const float* dh_next, \
                         const float* dc_next, float* da, float* dc_prev, int64_t rows, int64_t carried,          \
                         int64_t continued, int64_t n) {                                                         \
    for (int64_t r = 0; r < rows; ++r) {                                                                         \
      const float* ar = a + r * 4 * n;                                                                           \
      float* dar = da + r * 4 * n;                                                                               \
      const float *cr = c + r * n, *dhr = dh + r * n;                                                            \
      const bool prev = r < carried, next = r < continued;                                                       \
      const float* cpr = prev ? cprev + r * n : nullptr;                                                         \
      float* dcpr = prev ? dc_prev + r * n : nullptr;                                                            \
      const float* dhnr = next ? dh_next + r * n : nullptr;                                                      \
      const float* dcnr = next ? dc_next + r * n : nullptr;                                                      \
      if (prev && next)                                                                                          \
        bwd_row_##SUFFIX<true, true>(ar, ar + n, ar + 2 * n, ar + 3 * n, cr, cpr, dhr, dhnr, dcnr, dar, dar + n,  \
                                     dar + 2 * n, dar + 3 * n, dcpr, n);                                         \
      else if (prev)                                                                                             \
        bwd_row_##SUFFIX<true, false>(ar, ar + n, ar + 2 * n, ar + 3 * n, cr, cpr, dhr, dhnr, dcnr, dar, dar + n, \
                                      dar + 2 * n, dar + 3 * n, dcpr, n);                                        \
      else if (next)                                                                                             \
        bwd_row_##SUFFIX<false, true>(ar, ar + n, ar + 2 * n, ar + 3 * n, cr, cpr, dhr, dhnr, dcnr, dar, dar + n, \
                                      dar + 2 * n, dar + 3 * n, dcpr, n);                                        \
      else                                                                                                       \
        bwd_row_##SUFFIX<false, false>(ar, ar + n, ar + 2 * n, ar + 3 * n, cr, cpr, dhr, dhnr, dcnr, dar,         \
                                       dar + n, dar + 2 * n, dar + 3 * n, dcpr, n);                              \
    }                                                                                                            \
  }

SHEAF_LSTM_LOOPS(base, )
#ifdef SHEAF_HAVE_AVX2_CLONES
SHEAF_LSTM_LOOPS(avx2, SHEAF_AVX2_TARGET)
SHEAF_LSTM_LOOPS(avx512, SHEAF_AVX512_TARGET)
#endif

struct Kernels {
  Fwd fwd;
  Bwd bwd;
};

const Kernels& kernels() {
  static const Kernels k{SHEAF_PICK_CLONE(fwd), SHEAF_PICK_CLONE(bwd)};
  return k;
}

}  // namespace

void forward(float* a, float* c, float* h, const float* cprev, int64_t rows, int64_t carried, int64_t hidden) {
  kernels().fwd(a, c, h, cprev, rows, carried, hidden);
}

void backward(const float* a, const float* c, const float* cprev, const float* dh, const float* dh_next,
              const float* dc_next, float* da, float* dc_prev, int64_t rows, int64_t carried, int64_t continued,
              int64_t hidden) {
  kernels().bwd(a, c, cprev, dh, dh_next, dc_next, da, dc_prev, rows, carried, continued, hidden);
}

}  // namespace sheaf::op::lstm_cell
