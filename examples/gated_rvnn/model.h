// A recursive network over sentiment trees whose cell is chosen at every node by
// a value the model computes (the cond-heavy workload of sheaf-bench):
//
//   leaf:      h = E[word]
//   internal:  x = [hl; hr],  g = A x + a  (a scalar)
//              h = g > 0 ? tanh(W1 x + b1)                      (a plain cell)
//                        : relu(W2 x + b2) * 0.5 + hl * 0.5     (a residual cell)
//   root:      loss = -log softmax(V h + v)[label]
//
// Written three ways over the same parameters: with Sheaf (per tree, recursive,
// dsl::cond at each node: examples that take the same cell at the same step run
// it together), eagerly per example (a host decision per node), and
// hand-batched (bench/baselines/gated_rvnn_hand.h: both cells for every node of
// a level, mixed by a 0/1 mask).
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <string>
#include <vector>

#include <sheaf/sheaf.h>

#include "../data/trees.h"

namespace sheaf::models {

struct GatedRvNNOptions {
  int64_t vocab = 0;
  int64_t hidden = 64;
  bool sparse_embedding_grad = true;
};

class GatedRvNN {
 public:
  static constexpr int64_t kClasses = 5;
  GatedRvNN(const GatedRvNNOptions& options, uint64_t seed);
  // The cells' bodies refer to this object's parameters: not copyable.
  GatedRvNN(const GatedRvNN&) = delete;
  GatedRvNN& operator=(const GatedRvNN&) = delete;
  const GatedRvNNOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const { return {E, A, a, W1, b1, W2, b2, V, v}; }
  void to(const c10::Device& device);

  // Sheaf: one tree's root state, its loss, and a batch (tree i as example i).
  Expr sheaf_root(Graph& g, const data::Tree& tree) const;
  Expr sheaf_loss(Graph& g, const data::Tree& tree) const;
  Expr sheaf_batch_loss(Graph& g, std::span<const data::Tree* const> trees) const;
  std::vector<Expr> sheaf_batch_root_logits(Graph& g, std::span<const data::Tree* const> trees) const;

  // Eager LibTorch, one tree: a host decision per node (one .item() each).
  at::Tensor per_example_loss(const data::Tree& tree) const;
  at::Tensor per_example_root_logits(const data::Tree& tree) const;

  at::Tensor E;      // [vocab, h]
  at::Tensor A, a;   // gate: [1, 2h], [1]
  at::Tensor W1, b1; // plain cell: [h, 2h], [h]
  at::Tensor W2, b2; // residual cell: [h, 2h], [h]
  at::Tensor V, v;   // classifier: [5, h], [5]

 private:
  // The node's gate (children -> their concatenation x, and whether the gate
  // is open) and the two cells, as sheaf::Functions (dsl/function.h).
  Fn<std::array<Expr, 2>(Expr, Expr)> gate_;
  Fn<Expr(Expr)> plain_;
  Fn<Expr(Expr, Expr)> mixed_;
  at::Tensor per_example_root(const data::Tree& tree) const;
  GatedRvNNOptions options_;
};

}  // namespace sheaf::models
