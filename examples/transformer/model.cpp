#include "model.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <cmath>
#include <numeric>
#include <string>

#include <common/model_utils.h>

namespace sheaf::models {

TransformerTagger::TransformerTagger(const TransformerOptions& o, uint64_t seed) : options_(o) {
  if (o.words <= 0 || o.tags <= 0 || o.d <= 0 || o.heads <= 0 || o.ff <= 0 || o.max_length <= 0 || o.d % o.heads != 0)
    throw UserError("TransformerTagger: sizes must be positive and d a multiple of heads");
  at::manual_seed(seed);
  const double sd = 1.0 / std::sqrt(static_cast<double>(o.d)), sf = 1.0 / std::sqrt(static_cast<double>(o.ff));
  E = uniform_param({o.words, o.d}, 0.5);
  P = uniform_param({o.max_length, o.d}, 0.1);
  for (at::Tensor* w : {&Wq, &Wk, &Wv, &Wo}) *w = uniform_param({o.d, o.d}, sd);
  for (at::Tensor* b : {&bq, &bk, &bv, &bo, &b1, &b2, &c2}) *b = at::zeros({o.d}).requires_grad_();
  g1 = at::ones({o.d}).requires_grad_();
  g2 = at::ones({o.d}).requires_grad_();
  W1 = uniform_param({o.ff, o.d}, sd);
  c1 = at::zeros({o.ff}).requires_grad_();
  W2 = uniform_param({o.d, o.ff}, sf);
  Wt = uniform_param({o.tags, o.d}, sd);
  bt = at::zeros({o.tags}).requires_grad_();
}

std::vector<at::Tensor> TransformerTagger::parameters() const {
  return {E, P, Wq, Wk, Wv, Wo, bq, bk, bv, bo, g1, b1, g2, b2, W1, c1, W2, c2, Wt, bt};
}

void TransformerTagger::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &P, &Wq, &Wk, &Wv, &Wo, &bq, &bk, &bv, &bo, &g1, &b1, &g2, &b2, &W1, &c1, &W2, &c2, &Wt, &bt})
    *p = p->detach().to(device).requires_grad_();
}

void TransformerTagger::check(const data::Sentence& s) const {
  if (s.word.empty() || s.size() > options_.max_length)
    throw UserError("TransformerTagger: a sentence of " + std::to_string(s.size()) + " words (1 to " +
                    std::to_string(options_.max_length) + " have positions)");
}

// ---------------------------------------------------------------------------
// Sheaf: written for one sentence.

Expr TransformerTagger::sheaf_logits(Graph& g, const data::Sentence& s) const {
  check(s);
  const TransformerOptions& o = options_;
  std::vector<int64_t> positions(s.word.size());
  std::iota(positions.begin(), positions.end(), int64_t{0});
  const Expr X = g.lookup(E, s.word, /*sparse_grad=*/true) + g.lookup(P, positions);  // [n, d]
  const Expr Q = dsl::affine(Wq, X, bq), K = dsl::affine(Wk, X, bk), V = dsl::affine(Wv, X, bv);
  Expr attended;  // [n, d]: the heads side by side
  if (o.attention_op) {
    attended = dsl::attention(Q, K, V, static_cast<int>(o.heads));
  } else {
    const int64_t dk = o.d / o.heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    std::vector<Expr> heads;
    for (int64_t h = 0; h < o.heads; ++h) {
      const int64_t b = h * dk, e = b + dk;
      const Expr A = dsl::softmax(dsl::matmul(dsl::slice(Q, b, e), dsl::transpose(dsl::slice(K, b, e))) * scale);
      heads.push_back(dsl::matmul(A, dsl::slice(V, b, e)));  // [n, dk]
    }
    attended = dsl::concat(heads);
  }
  const Expr X1 = dsl::layer_norm(X + dsl::affine(Wo, attended, bo), g1, b1);
  const Expr Y = dsl::layer_norm(X1 + dsl::affine(W2, dsl::relu(dsl::affine(W1, X1, c1)), c2), g2, b2);
  return dsl::affine(Wt, Y, bt);
}

Expr TransformerTagger::sheaf_loss(Graph& g, const data::Sentence& s) const {
  return dsl::pick_neg_log_softmax(sheaf_logits(g, s), s.tag);
}

Expr TransformerTagger::sheaf_batch_loss(Graph& g, std::span<const data::Sentence* const> batch) const {
  return sum_over_examples(g, batch, [this](Graph& pg, const data::Sentence& x) { return sheaf_loss(pg, x); });
}

std::vector<Expr> TransformerTagger::sheaf_batch_logits(Graph& g, std::span<const data::Sentence* const> batch) const {
  std::vector<Expr> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto scope = g.example(static_cast<int>(i));
    out.push_back(sheaf_logits(g, *batch[i]));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Eager, one sentence.

at::Tensor TransformerTagger::per_example_logits(const data::Sentence& s) const {
  check(s);
  const TransformerOptions& o = options_;
  const int64_t n = s.size(), dk = o.d / o.heads;
  const at::Tensor X = at::embedding(E, ids_tensor(s.word, E.device()), -1, false, /*sparse=*/true) + P.narrow(0, 0, n);
  auto heads_of = [&](const at::Tensor& W, const at::Tensor& b) {  // [heads, n, dk]
    return at::addmm(b, X, W.t()).view({n, o.heads, dk}).transpose(0, 1);
  };
  const at::Tensor Q = heads_of(Wq, bq), K = heads_of(Wk, bk), V = heads_of(Wv, bv);
  const at::Tensor A = at::softmax(Q.bmm(K.transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(dk))), 2);
  const at::Tensor Z = A.bmm(V).transpose(0, 1).reshape({n, o.d});
  const at::Tensor X1 = at::layer_norm(X + at::addmm(bo, Z, Wo.t()), {o.d}, g1, b1);
  const at::Tensor F = at::addmm(c2, at::relu(at::addmm(c1, X1, W1.t())), W2.t());
  const at::Tensor Y = at::layer_norm(X1 + F, {o.d}, g2, b2);
  return at::addmm(bt, Y, Wt.t());
}

at::Tensor TransformerTagger::per_example_loss(const data::Sentence& s) const {
  return at::nll_loss(at::log_softmax(per_example_logits(s), 1), ids_tensor(s.tag, E.device()), {}, at::Reduction::Sum);
}

}  // namespace sheaf::models
