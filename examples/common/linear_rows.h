// The careful way to apply a weight to a few rows with OpenBLAS, shared by the
// per-example and hand-batched baselines: Sheaf's own (ops/weight_grad.h), which
// uses GEMV for one row and pads a few rows to a multiple of 4.
#pragma once

#include <sheaf/ops/weight_grad.h>

namespace sheaf::models {

using sheaf::linear_rows;

}  // namespace sheaf::models
