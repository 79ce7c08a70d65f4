// The level-by-level plan of a batch of trees, shared by the hand-batched
// baselines: levels are heights (leaves 0); within a level, rows are ordered by
// (parent's level, parent's row, side), so the rows a later level reads from a
// level are ONE contiguous block of it, in that later level's order. Each
// level's output is then split once into its blocks (split_with_sizes), and a
// level's children are those blocks concatenated and permuted once. Gathering
// with an index_select per (source level, consumer level) instead would cost,
// in backward, a zero-filled gradient of the whole source level per pair.
// Only the blocks that hold rows are made: a level has one per level that
// reads it (a view each), so a batch costs views in proportion to its nodes,
// not to its depth squared (a tree 3,000 deep had 9 million empty views).
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
  // The words of the leaves (level 0), in row order.
  std::vector<int64_t> leaf_words() const;
  // Per reading level, the blocks of earlier levels' values it reads, in
  // level order: Blocks(size() + 1) (the last reads the roots), filled by split().
  using Blocks = std::vector<std::vector<at::Tensor>>;
  Blocks no_blocks() const { return Blocks(levels_.size() + 1); }
  // Level j's value cut into its blocks, each appended to its reader's list
  // (levels split in order: each list is in level order).
  void split(const at::Tensor& value, size_t j, Blocks& into) const;
  // For level k >= 1: with the blocks it reads concatenated (children_of),
  // the rows [left_0, right_0, left_1, right_1, ...] of its nodes' children.
  std::vector<int64_t> child_order(size_t k) const;
  // The blocks level k reads, concatenated.
  static at::Tensor children_of(const Blocks& blocks, size_t k);
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
  // Per level, its blocks: (reading level, rows), in row order (the readers' order).
  std::vector<std::vector<std::pair<size_t, int64_t>>> blocks_;
  // Per level, the blocks it reads: (source level, rows), in source order.
  std::vector<std::vector<std::pair<size_t, int64_t>>> sources_;
};

}  // namespace sheaf::models
