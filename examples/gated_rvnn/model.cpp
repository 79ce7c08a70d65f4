#include "model.h"

#include <ATen/ATen.h>

#include <cmath>

#include <common/model_utils.h>

namespace sheaf::models {

GatedRvNN::GatedRvNN(const GatedRvNNOptions& o, uint64_t seed)
    : gate_("gated_rvnn_gate",
            [this](Expr hl, Expr hr) {
              const Expr x = dsl::concat({hl, hr});
              return std::array{x, dsl::sum(dsl::affine(A, x, a)) > 0.0};
            }),
      plain_("gated_rvnn_plain", [this](Expr x) { return dsl::tanh(dsl::affine(W1, x, b1)); }),
      mixed_("gated_rvnn_mixed", [this](Expr x, Expr hl) { return dsl::relu(dsl::affine(W2, x, b2)) * 0.5 + hl * 0.5; }),
      options_(o) {
  if (o.vocab <= 0 || o.hidden <= 0) throw UserError("GatedRvNN: vocab and hidden must be positive");
  at::manual_seed(seed);
  const int64_t h = o.hidden;
  const double s = 1.0 / std::sqrt(2.0 * h);
  E = uniform_param({o.vocab, h}, 0.5);
  A = uniform_param({1, 2 * h}, s);
  a = at::zeros({1}).requires_grad_();
  W1 = uniform_param({h, 2 * h}, s);
  b1 = at::zeros({h}).requires_grad_();
  W2 = uniform_param({h, 2 * h}, s);
  b2 = at::zeros({h}).requires_grad_();
  V = uniform_param({kClasses, h}, 1.0 / std::sqrt(static_cast<double>(h)));
  v = at::zeros({kClasses}).requires_grad_();
}

void GatedRvNN::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &A, &a, &W1, &b1, &W2, &b2, &V, &v}) *p = p->detach().to(device).requires_grad_();
}

// ---------------------------------------------------------------------------
// Sheaf: written for one tree; the choice at each node is a dsl::cond on a value
// computed from the children (so a tree takes as many rounds as it is high).

Expr GatedRvNN::sheaf_root(Graph& g, const data::Tree& t) const {
  std::vector<Expr> h(static_cast<size_t>(t.size()));
  for (int n = 0; n < t.size(); ++n) {  // post-order: children first
    const auto k = static_cast<size_t>(n);
    if (t.is_leaf(n)) {
      h[k] = g.lookup(E, t.word[k], options_.sparse_embedding_grad);
      continue;
    }
    const Expr hl = h[static_cast<size_t>(t.left[k])];
    const auto [x, open] = gate_(hl, h[static_cast<size_t>(t.right[k])]);
    // Both cells return [hidden]: declared, the parent's gate call records now
    // instead of waiting for this node's branch (dsl/control.h).
    h[k] = dsl::cond(open, [=, this] { return plain_(x); }, [=, this] { return mixed_(x, hl); },
                     Shape{options_.hidden});
  }
  return h.back();
}

Expr GatedRvNN::sheaf_loss(Graph& g, const data::Tree& t) const {
  return dsl::pick_neg_log_softmax(dsl::affine(V, sheaf_root(g, t), v), t.label.back());
}

Expr GatedRvNN::sheaf_batch_loss(Graph& g, std::span<const data::Tree* const> trees) const {
  return sum_over_examples(g, trees, [this](Graph& pg, const data::Tree& x) { return sheaf_loss(pg, x); });
}

std::vector<Expr> GatedRvNN::sheaf_batch_root_logits(Graph& g, std::span<const data::Tree* const> trees) const {
  std::vector<Expr> logits;
  for (size_t i = 0; i < trees.size(); ++i) {
    auto scope = g.example(static_cast<int64_t>(i));
    logits.push_back(dsl::affine(V, sheaf_root(g, *trees[i]), v));
  }
  return logits;
}

// ---------------------------------------------------------------------------
// Eager, one tree: the decision is a host read per node, as per-example code must.

at::Tensor GatedRvNN::per_example_root(const data::Tree& t) const {
  std::vector<int64_t> ids;
  for (int n = 0; n < t.size(); ++n)
    if (t.is_leaf(n)) ids.push_back(t.word[static_cast<size_t>(n)]);
  const at::Tensor emb =
      at::embedding(E, at::tensor(ids, at::kLong).to(E.device()), -1, false, options_.sparse_embedding_grad);
  const std::vector<at::Tensor> words = emb.unbind(0);  // (one backward node, not one per row)
  std::vector<at::Tensor> h(static_cast<size_t>(t.size()));
  int64_t leaf = 0;
  for (int n = 0; n < t.size(); ++n) {
    const auto k = static_cast<size_t>(n);
    if (t.is_leaf(n)) {
      h[k] = words[static_cast<size_t>(leaf++)];
      continue;
    }
    const at::Tensor& hl = h[static_cast<size_t>(t.left[k])];
    const at::Tensor x = at::cat({hl, h[static_cast<size_t>(t.right[k])]});
    const bool plain = at::addmv(a, A, x).item<float>() > 0;
    h[k] = plain ? at::tanh(at::addmv(b1, W1, x)) : at::relu(at::addmv(b2, W2, x)) * 0.5 + hl * 0.5;
  }
  return h.back();
}

at::Tensor GatedRvNN::per_example_root_logits(const data::Tree& t) const {
  return at::addmv(v, V, per_example_root(t));
}

at::Tensor GatedRvNN::per_example_loss(const data::Tree& t) const {
  return -at::log_softmax(per_example_root_logits(t), 0)[t.label.back()];
}

}  // namespace sheaf::models
