// Binary Tree-LSTM (Tai et al. 2015 style) for sentiment trees, written three
// ways over the SAME parameters, so the benchmark compares like with like:
//
//   sheaf_loss      : the per-tree code a researcher writes, node by node, with Sheaf
//   per_example_loss: eager LibTorch, one tree at a time (careful: GEMV for single
//                     rows, sparse embedding gradients, one lookup per sentence)
//   HandBatched     : (bench/baselines/tree_lstm_hand.h) the best hand-batched
//                     LibTorch we could write, level by level
//
// Cell at an internal node with children (hl, cl), (hr, cr) (a sheaf::Function):
//   [a, i, fl, fr, o] = U [hl; hr] + b          (5 blocks of size h)
//   c = tanh(a) * sigmoid(i) + sigmoid(fl) * cl + sigmoid(fr) * cr
//   h = sigmoid(o) * tanh(c)
// Leaves: h = E[word], c = 0. Classifier: softmax(V h + v) over 5 labels at every
// node (or at the root only), cross-entropy summed over the batch / #trees.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <string>
#include <vector>

#include <sheaf/sheaf.h>

#include "../data/trees.h"

namespace sheaf::models {

struct TreeLSTMOptions {
  int64_t vocab = 0;
  int64_t hidden = 150;
  bool all_nodes = true;    // a loss at every node (as DyNet's benchmark), else at the root
  bool sparse_embedding_grad = true;
};

class TreeLSTM {
 public:
  static constexpr int64_t kClasses = 5;

  TreeLSTM(const TreeLSTMOptions& options, uint64_t seed);
  // The cell's body refers to this object's parameters: not copyable.
  TreeLSTM(const TreeLSTM&) = delete;
  TreeLSTM& operator=(const TreeLSTM&) = delete;
  const TreeLSTMOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const { return {E, U, b, V, v}; }
  void to(const c10::Device& device);
  void save(const std::string& path) const;  // torch::save of the parameter list
  void load(const std::string& path);        // throws UserError on a mismatched file

  // ---- Sheaf: the per-tree program. Records the tree's loss (summed over its
  // labelled nodes) and, if root_logits is given, stores the root's logits there.
  Expr sheaf_loss(Graph& g, const data::Tree& tree, Expr* root_logits = nullptr) const;
  // A batch: tree i recorded as example i of g, the sum of their losses. With
  // root_logits, it is resized to the batch and gets each tree's root logits.
  Expr sheaf_batch_loss(Graph& g, std::span<const data::Tree* const> trees, std::vector<Expr>* root_logits = nullptr) const;
  Expr sheaf_batch_loss(Graph& g, std::span<const data::Tree> trees) const;
  // Inference: tree i recorded as example i, its root logits only (no losses).
  std::vector<Expr> sheaf_batch_root_logits(Graph& g, std::span<const data::Tree* const> trees) const;

  // ---- Eager LibTorch, one tree.
  at::Tensor per_example_loss(const data::Tree& tree) const;
  at::Tensor per_example_root_logits(const data::Tree& tree) const;

  at::Tensor E, U, b, V, v;  // [vocab, h], [5h, 2h], [5h], [5, h], [5]

 private:
  struct State {
    Expr h, c;
  };
  // The cell, recorded once per batch and called at every internal node: one
  // node per call instead of one per op (dsl/function.h).
  Fn<std::array<Expr, 2>(Expr, Expr, Expr, Expr)> cell_;
  // Records every node's state, the root's returned; each node's loss goes to
  // *losses unless losses is null. `zero`: the leaves' c, one per tree.
  State sheaf_tree(Graph& g, const data::Tree& t, const Expr& zero, std::vector<Expr>* losses) const;
  std::vector<at::Tensor> per_example_states(const data::Tree& t) const;

  TreeLSTMOptions options_;
};

}  // namespace sheaf::models
