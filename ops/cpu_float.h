// What Sheaf's own CPU loops take: float32 tensors on the CPU. Anything else
// goes to LibTorch's kernels.
#pragma once

#include <ATen/core/Tensor.h>

namespace sheaf {

inline bool cpu_float(const at::Tensor& t) { return t.is_cpu() && t.scalar_type() == at::kFloat; }

}  // namespace sheaf
