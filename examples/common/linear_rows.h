// The careful way to apply a weight to a few rows with OpenBLAS, shared by the
// per-example and hand-batched baselines (Sheaf's affine does the same,
// ops/linear.h): GEMM on one row is several times slower than GEMV, and a few
// rows that are not a multiple of 4 are slower than the next multiple of 4
// (h=128: 7 rows 104 us, 8 rows 69 us), so they are padded with zero rows.
#pragma once

#include <ATen/ATen.h>

namespace sheaf::models {

inline at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t m = x.size(0);
  if (m == 1) return at::addmv(b, w, x[0]).unsqueeze(0);
  if (m < 64 && m % 4 != 0) return at::linear(at::constant_pad_nd(x, {0, 0, 0, 4 - m % 4}), w, b).narrow(0, 0, m);
  return at::linear(x, w, b);
}

}  // namespace sheaf::models
