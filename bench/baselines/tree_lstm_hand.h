// The TreeLSTM of examples/tree_lstm/model.h, hand-batched with LibTorch: the
// best batched version we could write by hand, to compare Sheaf against.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <tree_lstm/model.h>

namespace sheaf::models {

// The hand-batched version: a host-side plan per batch (levels, gather indices),
// then one launch per cell op per level.
class HandBatched {
 public:
  explicit HandBatched(const TreeLSTM& model) : m_(model) {}
  // Summed loss over the batch's labelled nodes.
  at::Tensor loss(std::span<const data::Tree* const> trees) const;
  // Root logits [trees, 5].
  at::Tensor root_logits(std::span<const data::Tree* const> trees) const;

 private:
  struct Run;
  Run run(std::span<const data::Tree* const> trees, bool want_roots) const;
  const TreeLSTM& m_;
};

}  // namespace sheaf::models
