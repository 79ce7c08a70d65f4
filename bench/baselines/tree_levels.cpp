#include "tree_levels.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>

namespace sheaf::models {

TreeLevels::TreeLevels(std::span<const data::Tree* const> trees) : trees_(trees) {
  info_.resize(trees.size());
  for (size_t t = 0; t < trees.size(); ++t) {
    const data::Tree& tr = *trees[t];
    auto& nodes = info_[t];
    nodes.assign(static_cast<size_t>(tr.size()), Node{});
    for (int n = 0; n < tr.size(); ++n) {
      const auto k = static_cast<size_t>(n);
      if (!tr.is_leaf(n)) {
        const auto l = static_cast<size_t>(tr.left[k]), r = static_cast<size_t>(tr.right[k]);
        nodes[k].level = 1 + std::max(nodes[l].level, nodes[r].level);
        nodes[l].parent = nodes[r].parent = n;
        nodes[r].side = 1;
      }
      if (levels_.size() <= static_cast<size_t>(nodes[k].level)) levels_.resize(static_cast<size_t>(nodes[k].level) + 1);
      levels_[static_cast<size_t>(nodes[k].level)].emplace_back(t, n);
    }
  }
  const int top = static_cast<int>(levels_.size()) - 1;
  // Top-down, so that a parent's row is known before its children are ordered.
  auto key = [&](std::pair<size_t, int> tn) {
    const Node& x = info_[tn.first][static_cast<size_t>(tn.second)];
    if (x.parent < 0) return std::tuple<int, int64_t, int>(top + 1, static_cast<int64_t>(tn.first), 0);
    const Node& p = info_[tn.first][static_cast<size_t>(x.parent)];
    return std::tuple<int, int64_t, int>(p.level, p.row, x.side);
  };
  for (int k = top; k >= 0; --k) {
    auto& level = levels_[static_cast<size_t>(k)];
    std::stable_sort(level.begin(), level.end(), [&](auto a, auto b) { return key(a) < key(b); });
    for (size_t i = 0; i < level.size(); ++i)
      info_[level[i].first][static_cast<size_t>(level[i].second)].row = static_cast<int64_t>(i);
  }
  // A level's rows are in reader order: its blocks are the runs of one reader.
  blocks_.assign(levels_.size(), {});
  sources_.assign(levels_.size() + 1, {});
  for (size_t j = 0; j < levels_.size(); ++j) {
    for (auto tn : levels_[j]) {
      const auto reader = static_cast<size_t>(std::get<0>(key(tn)));
      if (blocks_[j].empty() || blocks_[j].back().first != reader) blocks_[j].emplace_back(reader, 0);
      ++blocks_[j].back().second;
    }
    for (auto [reader, rows] : blocks_[j]) sources_[reader].emplace_back(j, rows);
  }
}

void TreeLevels::split(const at::Tensor& value, size_t j, Blocks& into) const {
  std::vector<int64_t> sizes;
  for (auto [reader, rows] : blocks_[j]) sizes.push_back(rows);
  const std::vector<at::Tensor> pieces = sizes.size() == 1 ? std::vector<at::Tensor>{value} : value.split_with_sizes(sizes);
  for (size_t b = 0; b < pieces.size(); ++b) into[blocks_[j][b].first].push_back(pieces[b]);
}

std::vector<int64_t> TreeLevels::leaf_words() const {
  std::vector<int64_t> ids;
  for (auto [t, n] : levels_[0]) ids.push_back(trees_[t]->word[static_cast<size_t>(n)]);
  return ids;
}

std::vector<int64_t> TreeLevels::child_order(size_t k) const {
  const auto n = static_cast<int64_t>(levels_[k].size());
  // Per source level (sources_[k]'s order): where its block starts, and its rows taken so far.
  const auto& sources = sources_[k];
  std::vector<int64_t> offset(sources.size() + 1, 0), seen(sources.size(), 0);
  for (size_t s = 0; s < sources.size(); ++s) offset[s + 1] = offset[s] + sources[s].second;
  std::vector<int64_t> perm(static_cast<size_t>(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    auto [t, node] = levels_[k][static_cast<size_t>(i)];
    const data::Tree& tr = *trees_[t];
    for (int side = 0; side < 2; ++side) {
      const int child = side == 0 ? tr.left[static_cast<size_t>(node)] : tr.right[static_cast<size_t>(node)];
      const auto j = static_cast<size_t>(info_[t][static_cast<size_t>(child)].level);
      const auto s = static_cast<size_t>(
          std::lower_bound(sources.begin(), sources.end(), j, [](auto a, size_t b) { return a.first < b; }) -
          sources.begin());
      perm[static_cast<size_t>(2 * i + side)] = offset[s] + seen[s]++;
    }
  }
  return perm;
}

at::Tensor TreeLevels::children_of(const Blocks& blocks, size_t k) {
  return blocks[k].size() == 1 ? blocks[k][0] : at::cat(blocks[k]);
}

at::Tensor TreeLevels::roots(const std::vector<at::Tensor>& H) const {
  const c10::Device device = H[0].device();
  std::vector<std::vector<int64_t>> rows(H.size());
  std::vector<std::pair<size_t, size_t>> pos;
  for (size_t t = 0; t < trees_.size(); ++t) {
    const Node& root = info_[t].back();
    pos.emplace_back(static_cast<size_t>(root.level), rows[static_cast<size_t>(root.level)].size());
    rows[static_cast<size_t>(root.level)].push_back(root.row);
  }
  std::vector<at::Tensor> pieces;
  std::vector<int64_t> offset(H.size() + 1, 0);
  for (size_t j = 0; j < H.size(); ++j) {
    offset[j + 1] = offset[j] + static_cast<int64_t>(rows[j].size());
    if (!rows[j].empty()) pieces.push_back(H[j].index_select(0, at::tensor(rows[j], at::kLong).to(device)));
  }
  std::vector<int64_t> order;
  for (auto [level, k] : pos) order.push_back(offset[level] + static_cast<int64_t>(k));
  return at::cat(pieces).index_select(0, at::tensor(order, at::kLong).to(device));
}

}  // namespace sheaf::models
