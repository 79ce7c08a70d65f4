// What every example model repeats: uniform parameter initialisation, index
// tensors for the eager forms, and recording one loss per example of a batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <sheaf/sheaf.h>

namespace sheaf::models {

// U(-scale, scale), a leaf that requires grad (on the CPU: models move after).
inline at::Tensor uniform_param(std::vector<int64_t> shape, double scale) {
  return ((at::rand(shape) * 2 - 1) * scale).requires_grad_();
}

inline at::Tensor ids_tensor(std::span<const int64_t> ids, const c10::Device& device) {
  return at::tensor(at::ArrayRef<int64_t>(ids.data(), ids.size()), at::kLong).to(device);
}

// The sum of `loss(g, item)` over a batch, each item recorded as its own
// example (the id is its position in the batch, as error messages report it).
template <class Item, class Loss>
Expr sum_over_examples(Graph& g, std::span<const Item* const> batch, Loss&& loss) {
  std::vector<Expr> losses;
  losses.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto scope = g.example(static_cast<int64_t>(i));
    losses.push_back(loss(g, *batch[i]));
  }
  return dsl::sum(losses);
}

}  // namespace sheaf::models
