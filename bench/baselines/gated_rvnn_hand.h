// The gated recursive network of examples/gated_rvnn/model.h, hand-batched with
// LibTorch and masked: level by level (tree_levels.h), every node of a level
// computes its gate and BOTH cells, and a 0/1 mask of the gates keeps one:
// h = m * plain + (1 - m) * residual. The usual way to batch a per-node choice
// by hand (it computes both branches; the mask has no gradient, so the
// unchosen branch gets none, as with a real branch). kSplit instead reads the
// gates on the host and runs each cell on its own rows only (two smaller
// products, no mask arithmetic), then puts the rows back in order with one
// gather: less work, and on a GPU a wait for the gates every level.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <gated_rvnn/model.h>

namespace sheaf::models {

class HandGatedRvNN {
 public:
  enum class Branches { kMask, kSplit };
  explicit HandGatedRvNN(const GatedRvNN& model, Branches branches = Branches::kMask)
      : m_(model), branches_(branches) {}
  at::Tensor root_logits(std::span<const data::Tree* const> trees) const;  // [trees, 5]
  at::Tensor loss(std::span<const data::Tree* const> trees) const;         // summed over trees

 private:
  const GatedRvNN& m_;
  Branches branches_;
};

}  // namespace sheaf::models
