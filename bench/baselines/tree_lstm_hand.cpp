#include "tree_lstm_hand.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>

#include <common/linear_rows.h>

namespace sheaf::models {

// ---------------------------------------------------------------------------
// Hand-batched, level by level.

struct HandBatched::Run {
  std::vector<at::Tensor> H;                   // per level: [n_level, h]
  std::vector<std::vector<int64_t>> labels;    // per level, in row order
  std::vector<std::pair<int, int64_t>> roots;  // (level, row) of each tree's root
};

// Levels are heights; children are gathered from the levels below. Rows of each
// level are ordered by (parent's level, parent's row, side), so the rows that a
// later level reads from it are one contiguous block already in that level's
// order: each level's output is split ONCE into those blocks. Gathering with an
// index_select per (source level, consumer level) instead would cost, in
// backward, a zero-filled gradient of the whole source level per pair.
HandBatched::Run HandBatched::run(std::span<const data::Tree* const> trees) const {
  const int64_t h = m_.options().hidden;
  const c10::Device device = m_.E.device();
  auto upload = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };

  // ---- Host plan.
  struct Node {
    int level;
    int64_t row = 0;
    int parent = -1, side = 0;  // parent node within the tree
  };
  std::vector<std::vector<Node>> info(trees.size());
  std::vector<std::vector<std::pair<size_t, int>>> levels;  // (tree, node)
  for (size_t t = 0; t < trees.size(); ++t) {
    const data::Tree& tr = *trees[t];
    auto& nodes = info[t];
    nodes.assign(static_cast<size_t>(tr.size()), Node{0});
    for (int n = 0; n < tr.size(); ++n) {
      const auto k = static_cast<size_t>(n);
      if (!tr.is_leaf(n)) {
        const auto l = static_cast<size_t>(tr.left[k]), r = static_cast<size_t>(tr.right[k]);
        nodes[k].level = 1 + std::max(nodes[l].level, nodes[r].level);
        nodes[l].parent = nodes[r].parent = n;
        nodes[r].side = 1;
      }
      if (levels.size() <= static_cast<size_t>(nodes[k].level)) levels.resize(static_cast<size_t>(nodes[k].level) + 1);
      levels[static_cast<size_t>(nodes[k].level)].emplace_back(t, n);
    }
  }
  const int top = static_cast<int>(levels.size()) - 1;
  // Top-down, so that a parent's row is known before its children are ordered.
  auto key = [&](std::pair<size_t, int> tn) {
    const Node& x = info[tn.first][static_cast<size_t>(tn.second)];
    if (x.parent < 0) return std::tuple<int, int64_t, int>(top + 1, static_cast<int64_t>(tn.first), 0);
    const Node& p = info[tn.first][static_cast<size_t>(x.parent)];
    return std::tuple<int, int64_t, int>(p.level, p.row, x.side);
  };
  for (int k = top; k >= 0; --k) {
    auto& level = levels[static_cast<size_t>(k)];
    std::stable_sort(level.begin(), level.end(), [&](auto a, auto b) { return key(a) < key(b); });
    for (size_t i = 0; i < level.size(); ++i) info[level[i].first][static_cast<size_t>(level[i].second)].row = static_cast<int64_t>(i);
  }
  // Block sizes: rows of level j read by each later level, then the roots.
  std::vector<std::vector<int64_t>> blocks(levels.size(), std::vector<int64_t>(levels.size() + 1, 0));
  for (size_t j = 0; j < levels.size(); ++j)
    for (auto tn : levels[j]) ++blocks[j][static_cast<size_t>(std::get<0>(key(tn)))];

  Run run;
  run.labels.resize(levels.size());
  for (size_t k = 0; k < levels.size(); ++k)
    for (auto [t, n] : levels[k]) run.labels[k].push_back(trees[t]->label[static_cast<size_t>(n)]);
  for (size_t t = 0; t < trees.size(); ++t) run.roots.emplace_back(info[t].back().level, info[t].back().row);

  // ---- Launches.
  std::vector<int64_t> ids;
  for (auto [t, n] : levels[0]) ids.push_back(trees[t]->word[static_cast<size_t>(n)]);
  run.H.push_back(at::embedding(m_.E, upload(ids), -1, false, m_.options().sparse_embedding_grad));
  std::vector<at::Tensor> C{at::zeros({static_cast<int64_t>(ids.size()), h}, m_.E.options().requires_grad(false))};
  std::vector<std::vector<at::Tensor>> h_blocks, c_blocks;  // [source level][consumer level]
  auto split = [&](size_t j) {
    h_blocks.push_back(run.H[j].split_with_sizes(blocks[j]));
    c_blocks.push_back(C[j].split_with_sizes(blocks[j]));
  };
  split(0);
  for (size_t k = 1; k < levels.size(); ++k) {
    const auto n = static_cast<int64_t>(levels[k].size());
    // Children by source level, each block in this level's row order; then interleave
    // to [left_0, right_0, left_1, ...] so that a [n, 2h] view is [hl; hr] per row.
    std::vector<at::Tensor> hs, cs;
    std::vector<int64_t> seen(k, 0), offset(k + 1, 0), perm(static_cast<size_t>(2 * n));
    for (size_t j = 0; j < k; ++j) {
      offset[j + 1] = offset[j] + blocks[j][k];
      if (blocks[j][k] == 0) continue;
      hs.push_back(h_blocks[j][k]);
      cs.push_back(c_blocks[j][k]);
    }
    for (int64_t i = 0; i < n; ++i) {
      auto [t, node] = levels[k][static_cast<size_t>(i)];
      const data::Tree& tr = *trees[t];
      for (int side = 0; side < 2; ++side) {
        int child = side == 0 ? tr.left[static_cast<size_t>(node)] : tr.right[static_cast<size_t>(node)];
        const auto j = static_cast<size_t>(info[t][static_cast<size_t>(child)].level);
        perm[static_cast<size_t>(2 * i + side)] = offset[j] + seen[j]++;
      }
    }
    const at::Tensor p = upload(perm);
    at::Tensor x = (hs.size() == 1 ? hs[0] : at::cat(hs)).index_select(0, p).view({n, 2 * h});
    at::Tensor cc = (cs.size() == 1 ? cs[0] : at::cat(cs)).index_select(0, p).view({n, 2, h});
    at::Tensor gates = linear_rows(x, m_.U, m_.b);
    at::Tensor a = at::tanh(gates.narrow(1, 0, h));
    std::vector<at::Tensor> s = at::sigmoid(gates.narrow(1, h, 4 * h)).chunk(4, 1);
    at::Tensor c = a * s[0] + s[1] * cc.select(1, 0) + s[2] * cc.select(1, 1);
    run.H.push_back(s[3] * at::tanh(c));
    C.push_back(c);
    split(k);
  }
  return run;
}

at::Tensor HandBatched::loss(std::span<const data::Tree* const> trees) const {
  Run r = run(trees);
  const c10::Device device = m_.E.device();
  if (m_.options().all_nodes) {
    std::vector<int64_t> labels;
    for (const auto& l : r.labels) labels.insert(labels.end(), l.begin(), l.end());
    at::Tensor logits = at::linear(at::cat(r.H), m_.V, m_.v);
    return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(device), {}, at::Reduction::Sum);
  }
  at::Tensor logits = root_logits(trees);
  std::vector<int64_t> labels;
  for (const data::Tree* t : trees) labels.push_back(t->label.back());
  return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(device), {}, at::Reduction::Sum);
}

at::Tensor HandBatched::root_logits(std::span<const data::Tree* const> trees) const {
  Run r = run(trees);
  // Roots live in different levels: gather each level's roots, then restore tree order.
  std::vector<std::vector<int64_t>> rows(r.H.size());
  std::vector<std::pair<size_t, size_t>> pos;
  for (auto [level, row] : r.roots) {
    pos.emplace_back(static_cast<size_t>(level), rows[static_cast<size_t>(level)].size());
    rows[static_cast<size_t>(level)].push_back(row);
  }
  std::vector<at::Tensor> pieces;
  std::vector<int64_t> offset(r.H.size() + 1, 0);
  for (size_t j = 0; j < r.H.size(); ++j) {
    offset[j + 1] = offset[j] + static_cast<int64_t>(rows[j].size());
    if (!rows[j].empty()) pieces.push_back(r.H[j].index_select(0, at::tensor(rows[j], at::kLong).to(m_.E.device())));
  }
  std::vector<int64_t> order;
  for (auto [level, k] : pos) order.push_back(offset[level] + static_cast<int64_t>(k));
  at::Tensor h = at::cat(pieces).index_select(0, at::tensor(order, at::kLong).to(m_.E.device()));
  return linear_rows(h, m_.V, m_.v);
}

}  // namespace sheaf::models
