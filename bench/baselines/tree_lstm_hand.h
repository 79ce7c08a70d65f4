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
  // How each level's product runs: LibTorch's GEMM (OpenBLAS; the baseline),
  // or Sheaf's packed-weight kernel (ops/packed_gemm.h) with U laid out once a
  // batch: not LibTorch code, a reference for how much of Sheaf's lead is that
  // kernel (sheaf-bench hand:sheaf-gemm).
  enum class Product { kLibTorch, kSheafPacked };
  explicit HandBatched(const TreeLSTM& model, Product product = Product::kLibTorch) : m_(model), product_(product) {}
  // Summed loss over the batch's labelled nodes.
  at::Tensor loss(std::span<const data::Tree* const> trees) const;
  // Root logits [trees, 5].
  at::Tensor root_logits(std::span<const data::Tree* const> trees) const;

 private:
  struct Run;
  Run run(std::span<const data::Tree* const> trees, bool want_roots) const;
  const TreeLSTM& m_;
  Product product_;
};

}  // namespace sheaf::models
