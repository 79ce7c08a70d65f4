// The level-by-level plan of a batch of trees, shared by the hand-batched
// baselines: levels are heights (leaves 0); within a level, rows are ordered by
// (parent's level, parent's row, side), so the rows a later level reads from a
// level are ONE contiguous block of it, in that later level's order. Each
// level's output is then split once into blocks (split_with_sizes), and a
// level's children are those blocks concatenated and permuted once. Gathering
// with an index_select per (source level, consumer level) instead would cost,
// in backward, a zero-filled gradient of the whole source level per pair.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <data/trees.h>

namespace sheaf::models {

class TreeLevels {
 public:
  explicit TreeLevels(std::span<const data::Tree* const> trees);

  size_t size() const { return levels_.size(); }
  // Level k's nodes in row order: (tree index, node).
  const std::vector<std::pair<size_t, int>>& level(size_t k) const { return levels_[k]; }
  // Rows of level j read by each later level k (k < size()), then by nobody (the roots).
  const std::vector<int64_t>& blocks(size_t j) const { return blocks_[j]; }
  // The words of the leaves (level 0), in row order.
  std::vector<int64_t> leaf_words() const;
  // For level k >= 1: with the blocks [j][k] of every level j < k concatenated,
  // the rows [left_0, right_0, left_1, right_1, ...] of its nodes' children.
  std::vector<int64_t> child_order(size_t k) const;
  // The blocks [j][k] of per-level tensors already split by blocks(j), concatenated.
  static at::Tensor children_of(const std::vector<std::vector<at::Tensor>>& split, size_t k);
  // Each tree's root row, in tree order, from per-level values H (one gather per level, one permutation).
  at::Tensor roots(const std::vector<at::Tensor>& H) const;

 private:
  struct Node {
    int level = 0;
    int64_t row = 0;
    int parent = -1, side = 0;  // parent node within the tree
  };
  std::span<const data::Tree* const> trees_;
  std::vector<std::vector<Node>> info_;
  std::vector<std::vector<std::pair<size_t, int>>> levels_;
  std::vector<std::vector<int64_t>> blocks_;
};

}  // namespace sheaf::models
