#include "model.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/serialize.h>

#include <algorithm>

namespace sheaf::models {

namespace {

// OpenBLAS's GEMM on one row is several times slower than its GEMV, and slower on
// a few rows that are not a multiple of 4 than on the next multiple of 4: a
// careful implementation uses GEMV for one row and pads a few rows (the same
// rule as Sheaf's affine, dsl/ops/linear.h).
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t m = x.size(0);
  if (m == 1) return at::addmv(b, w, x[0]).unsqueeze(0);
  if (m < 64 && m % 4 != 0) return at::linear(at::constant_pad_nd(x, {0, 0, 0, 4 - m % 4}), w, b).narrow(0, 0, m);
  return at::linear(x, w, b);
}

at::Tensor init(std::vector<int64_t> shape, double scale) { return (at::rand(shape) * 2 - 1) * scale; }

at::Tensor leaf_ids(const data::Tree& t) {
  std::vector<int64_t> ids;
  for (int n = 0; n < t.size(); ++n)
    if (t.is_leaf(n)) ids.push_back(t.word[static_cast<size_t>(n)]);
  return at::tensor(ids, at::kLong);
}

}  // namespace

TreeLSTM::TreeLSTM(const TreeLSTMOptions& o, uint64_t seed) : options_(o) {
  if (o.vocab <= 0 || o.hidden <= 0) throw UserError("TreeLSTM: vocab and hidden must be positive");
  at::manual_seed(seed);
  const int64_t h = o.hidden;
  E = init({o.vocab, h}, 0.1).requires_grad_();
  U = init({5 * h, 2 * h}, 1.0 / std::sqrt(2.0 * h)).requires_grad_();
  b = at::zeros({5 * h}).requires_grad_();
  V = init({kClasses, h}, 1.0 / std::sqrt(static_cast<double>(h))).requires_grad_();
  v = at::zeros({kClasses}).requires_grad_();
}

void TreeLSTM::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &U, &b, &V, &v}) *p = p->detach().to(device).requires_grad_();
}

void TreeLSTM::save(const std::string& path) const {
  std::vector<at::Tensor> ps;
  for (const at::Tensor& p : parameters()) ps.push_back(p.detach().cpu());
  torch::save(ps, path);
}

void TreeLSTM::load(const std::string& path) {
  std::vector<at::Tensor> ps;
  try {
    torch::load(ps, path);
  } catch (const std::exception& e) {
    throw UserError("TreeLSTM::load: cannot read '" + path + "': " + e.what());
  }
  auto mine = parameters();
  if (ps.size() != mine.size()) throw UserError("TreeLSTM::load: '" + path + "' is not a TreeLSTM parameter file");
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].sizes() != mine[i].sizes())
      throw UserError(detail::cat("TreeLSTM::load: parameter ", i, " in '", path, "' has shape ", ps[i].sizes(),
                                  ", the model has ", mine[i].sizes(), " (different --hidden or vocabulary?)"));
    mine[i].copy_(ps[i]);
  }
}

// ---------------------------------------------------------------------------
// Sheaf: written for one tree, recursively.

TreeLSTM::State TreeLSTM::sheaf_node(Graph& g, const data::Tree& t, int n, std::vector<Expr>& losses) const {
  const auto k = static_cast<size_t>(n);
  State s;
  if (t.is_leaf(n)) {
    s.h = g.lookup(E, t.word[k], options_.sparse_embedding_grad);
    s.c = g.zeros({options_.hidden});
  } else {
    State l = sheaf_node(g, t, t.left[k], losses);
    State r = sheaf_node(g, t, t.right[k], losses);
    std::vector<Expr> gate = dsl::chunk(dsl::affine(U, dsl::concat({l.h, r.h}), b), 5);
    s.c = dsl::tanh(gate[0]) * dsl::sigmoid(gate[1]) + dsl::sigmoid(gate[2]) * l.c + dsl::sigmoid(gate[3]) * r.c;
    s.h = dsl::sigmoid(gate[4]) * dsl::tanh(s.c);
  }
  if (options_.all_nodes || n == t.root())
    losses.push_back(dsl::pick_neg_log_softmax(dsl::affine(V, s.h, v), t.label[k]));
  return s;
}

Expr TreeLSTM::sheaf_loss(Graph& g, const data::Tree& t, Expr* root_logits) const {
  std::vector<Expr> losses;
  State root = sheaf_node(g, t, t.root(), losses);
  if (root_logits != nullptr) *root_logits = dsl::affine(V, root.h, v);
  return dsl::sum(losses);
}

Expr TreeLSTM::sheaf_batch_loss(Graph& g, std::span<const data::Tree* const> trees,
                                std::vector<Expr>* root_logits) const {
  std::vector<Expr> losses;
  if (root_logits != nullptr) root_logits->assign(trees.size(), Expr());
  for (size_t i = 0; i < trees.size(); ++i) {
    auto scope = g.example(static_cast<int>(i));
    losses.push_back(sheaf_loss(g, *trees[i], root_logits != nullptr ? &(*root_logits)[i] : nullptr));
  }
  return dsl::sum(losses);
}

Expr TreeLSTM::sheaf_batch_loss(Graph& g, std::span<const data::Tree> trees) const {
  std::vector<const data::Tree*> ptrs;
  for (const data::Tree& t : trees) ptrs.push_back(&t);
  return sheaf_batch_loss(g, ptrs);
}

// ---------------------------------------------------------------------------
// Per example, eager.

std::vector<at::Tensor> TreeLSTM::per_example_states(const data::Tree& t) const {
  const int64_t h = options_.hidden;
  // One lookup for the whole sentence, as any PyTorch user writes it.
  at::Tensor emb = at::embedding(E, leaf_ids(t).to(E.device()), -1, false, options_.sparse_embedding_grad);
  const at::Tensor zero = at::zeros({h}, E.options().requires_grad(false));
  std::vector<at::Tensor> H(static_cast<size_t>(t.size())), C(H.size());
  int64_t leaf = 0;
  for (int n = 0; n < t.size(); ++n) {
    const auto k = static_cast<size_t>(n);
    if (t.is_leaf(n)) {
      H[k] = emb[leaf++];
      C[k] = zero;
      continue;
    }
    const auto l = static_cast<size_t>(t.left[k]), r = static_cast<size_t>(t.right[k]);
    at::Tensor gates = at::addmv(b, U, at::cat({H[l], H[r]}));
    at::Tensor a = at::tanh(gates.narrow(0, 0, h));
    std::vector<at::Tensor> s = at::sigmoid(gates.narrow(0, h, 4 * h)).chunk(4);
    C[k] = a * s[0] + s[1] * C[l] + s[2] * C[r];
    H[k] = s[3] * at::tanh(C[k]);
  }
  return H;
}

at::Tensor TreeLSTM::per_example_loss(const data::Tree& t) const {
  std::vector<at::Tensor> H = per_example_states(t);
  if (!options_.all_nodes) {
    at::Tensor logits = at::addmv(v, V, H.back());
    return -at::log_softmax(logits, 0)[t.label.back()];
  }
  // The classifier over all of this tree's nodes at once: natural per-example code.
  std::vector<int64_t> labels(t.label.begin(), t.label.end());
  at::Tensor logits = linear_rows(at::stack(H), V, v);
  return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(logits.device()), {},
                      at::Reduction::Sum);
}

at::Tensor TreeLSTM::per_example_root_logits(const data::Tree& t) const {
  return at::addmv(v, V, per_example_states(t).back());
}

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
