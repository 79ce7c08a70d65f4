// Whether an op's forward must prepare a backward (keep what it needs, make
// its own autograd node, ask cuDNN for training mode): grad mode is on and an
// input requires a gradient. This is LibTorch's own test when it records a
// node; undefined tensors (an absent optional input) count as not requiring.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>

namespace sheaf {

template <class... T>
bool grad_wanted(const T&... inputs) {
  return c10::GradMode::is_enabled() && ((inputs.defined() && inputs.requires_grad()) || ...);
}

}  // namespace sheaf
