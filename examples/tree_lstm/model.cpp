#include "model.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <common/linear_rows.h>
#include <common/model_utils.h>
#include <common/parameter_file.h>

namespace sheaf::models {

namespace {

at::Tensor leaf_ids(const data::Tree& t) {
  std::vector<int64_t> ids;
  for (int n = 0; n < t.size(); ++n)
    if (t.is_leaf(n)) ids.push_back(t.word[static_cast<size_t>(n)]);
  return at::tensor(ids, at::kLong);
}

}  // namespace

TreeLSTM::TreeLSTM(const TreeLSTMOptions& o, uint64_t seed)
    : cell_("tree_lstm_cell",
            [this](Expr hl, Expr cl, Expr hr, Expr cr) {
              std::vector<Expr> gate = dsl::chunk(dsl::affine(U, dsl::concat({hl, hr}), b), 5);
              Expr c = dsl::tanh(gate[0]) * dsl::sigmoid(gate[1]) + dsl::sigmoid(gate[2]) * cl +
                       dsl::sigmoid(gate[3]) * cr;
              return std::array{dsl::sigmoid(gate[4]) * dsl::tanh(c), c};
            }),
      options_(o) {
  if (o.vocab <= 0 || o.hidden <= 0) throw UserError("TreeLSTM: vocab and hidden must be positive");
  at::manual_seed(seed);
  const int64_t h = o.hidden;
  E = uniform_param({o.vocab, h}, 0.1);
  U = uniform_param({5 * h, 2 * h}, 1.0 / std::sqrt(2.0 * h));
  b = at::zeros({5 * h}).requires_grad_();
  V = uniform_param({kClasses, h}, 1.0 / std::sqrt(static_cast<double>(h)));
  v = at::zeros({kClasses}).requires_grad_();
}

void TreeLSTM::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &U, &b, &V, &v}) *p = p->detach().to(device).requires_grad_();
}

void TreeLSTM::save(const std::string& path) const { save_parameters(parameters(), path); }

void TreeLSTM::load(const std::string& path) { load_parameters(parameters(), path, "TreeLSTM"); }

// ---------------------------------------------------------------------------
// Sheaf: written for one tree, node by node.

// Nodes come in post-order (children before parents): one pass in index
// order is the recursion's order (left subtree, right subtree, node), without
// a stack frame per level (a tree 30,000 deep overflowed the stack).
TreeLSTM::State TreeLSTM::sheaf_tree(Graph& g, const data::Tree& t, const Expr& zero,
                                     std::vector<Expr>* losses) const {
  thread_local std::vector<State> states;  // (kept: a tree's states, no allocation per tree)
  states.resize(static_cast<size_t>(t.size()));
  for (int n = 0; n < t.size(); ++n) {
    const auto k = static_cast<size_t>(n);
    State& s = states[k];
    if (t.is_leaf(n)) {
      s.h = g.lookup(E, t.word[k], options_.sparse_embedding_grad);
      s.c = zero;
    } else {
      const State& l = states[static_cast<size_t>(t.left[k])];
      const State& r = states[static_cast<size_t>(t.right[k])];
      const auto [h, c] = cell_(l.h, l.c, r.h, r.c);
      s.h = h;
      s.c = c;
    }
    if (losses != nullptr && (options_.all_nodes || n == t.root()))
      losses->push_back(dsl::pick_neg_log_softmax(dsl::affine(V, s.h, v), t.label[k]));
  }
  return states[static_cast<size_t>(t.root())];
}

Expr TreeLSTM::sheaf_loss(Graph& g, const data::Tree& t, Expr* root_logits) const {
  std::vector<Expr> losses;
  State root = sheaf_tree(g, t, g.zeros({options_.hidden}), &losses);
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

std::vector<Expr> TreeLSTM::sheaf_batch_root_logits(Graph& g, std::span<const data::Tree* const> trees) const {
  std::vector<Expr> logits;
  for (size_t i = 0; i < trees.size(); ++i) {
    auto scope = g.example(static_cast<int64_t>(i));
    logits.push_back(dsl::affine(V, sheaf_tree(g, *trees[i], g.zeros({options_.hidden}), nullptr).h, v));
  }
  return logits;
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
  // Its rows in one call (one backward node that stacks their gradients; a
  // select per row would make a gradient of the whole sentence's rows each).
  const std::vector<at::Tensor> words = emb.unbind(0);
  const at::Tensor zero = at::zeros({h}, E.options().requires_grad(false));
  std::vector<at::Tensor> H(static_cast<size_t>(t.size())), C(H.size());
  int64_t leaf = 0;
  for (int n = 0; n < t.size(); ++n) {
    const auto k = static_cast<size_t>(n);
    if (t.is_leaf(n)) {
      H[k] = words[static_cast<size_t>(leaf++)];
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

}  // namespace sheaf::models
