// The gated recursive network of examples/gated_rvnn/model.h, hand-batched with
// LibTorch and masked: level by level (tree_levels.h), every node of a level
// computes its gate and BOTH cells, and a 0/1 mask of the gates keeps one:
// h = m * plain + (1 - m) * residual. The usual way to batch a per-node choice
// by hand (it computes both branches; the mask has no gradient, so the
// unchosen branch gets none, as with a real branch).
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <gated_rvnn/model.h>

namespace sheaf::models {

class HandGatedRvNN {
 public:
  explicit HandGatedRvNN(const GatedRvNN& model) : m_(model) {}
  at::Tensor root_logits(std::span<const data::Tree* const> trees) const;  // [trees, 5]
  at::Tensor loss(std::span<const data::Tree* const> trees) const;         // summed over trees

 private:
  const GatedRvNN& m_;
};

}  // namespace sheaf::models
