#include "tree_lstm_hand.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <common/linear_rows.h>
#include <sheaf/ops/packed_gemm.h>

#include "tree_levels.h"
#include "weight_grads.h"

namespace sheaf::models {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x U^T + b through U's packed panels (forward: U^T's; backward: U's for dX),
// dU and db as at::linear's backward computes them.
struct PackedLinear : torch::autograd::Function<PackedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            const at::Tensor& forward_panels, const at::Tensor& backward_panels) {
    ctx->save_for_backward({x});
    ctx->saved_data["panels"] = backward_panels;
    ctx->saved_data["k"] = w.size(0);
    ctx->saved_data["n"] = w.size(1);
    return packed_mm(x, PackedMatrix{forward_panels, w.size(1), w.size(0)}, b);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].contiguous();
    const PackedMatrix w{ctx->saved_data["panels"].toTensor(), ctx->saved_data["k"].toInt(),
                         ctx->saved_data["n"].toInt()};
    return {packed_mm(dy, w), at::mm(dy.t(), x), dy.sum(0), at::Tensor(), at::Tensor()};
  }
};

// x U^T + b for one level, U's gradient deferred to one product a batch
// (weight_grads.h; the parser's hand code does the same).
struct LevelWeights {
  at::Tensor w, b, X, G, token;  // w, b detached; X [rows, 2h], G [rows, 5h]
  int64_t used = 0;
};

struct LevelLinear : torch::autograd::Function<LevelLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& /*token*/, LevelWeights* lw) {
    const int64_t n = x.size(0), off = lw->used;
    lw->used += n;
    lw->X.narrow(0, off, n).copy_(x);
    ctx->saved_data["w"] = lw->w;
    ctx->saved_data["G"] = lw->G;
    ctx->saved_data["off"] = off;
    return at::addmm(lw->b, x, lw->w.t());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor w = ctx->saved_data["w"].toTensor(), G = ctx->saved_data["G"].toTensor();
    const at::Tensor dy = grads[0];
    G.narrow(0, ctx->saved_data["off"].toInt(), dy.size(0)).copy_(dy);
    return {at::mm(dy, w), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// ---------------------------------------------------------------------------
// Hand-batched, level by level.

struct HandBatched::Run {
  std::vector<at::Tensor> H;                 // per level: [n_level, h]
  std::vector<std::vector<int64_t>> labels;  // per level, in row order
  at::Tensor roots;                          // [trees, h], in tree order
};

// Level by level (tree_levels.h): each level's children are gathered from the
// blocks of the levels below with one permutation.
HandBatched::Run HandBatched::run(std::span<const data::Tree* const> trees, bool want_roots) const {
  const int64_t h = m_.options().hidden;
  const c10::Device device = m_.E.device();
  auto upload = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const TreeLevels levels(trees);
  // kSheafPacked: U laid out once for the batch's levels.
  const bool packed = product_ == Product::kSheafPacked;
  const bool grad = c10::GradMode::is_enabled() && m_.U.requires_grad();
  const PackedMatrix u_t = packed ? pack_matrix(m_.U.detach().t()) : PackedMatrix{};
  const PackedMatrix u = packed && grad ? pack_matrix(m_.U.detach()) : PackedMatrix{};
  LevelWeights lw;
  if (!packed && grad) {
    int64_t rows = 0;
    for (size_t k = 1; k < levels.size(); ++k) rows += static_cast<int64_t>(levels.level(k).size());
    const at::TensorOptions opts = m_.U.options().requires_grad(false);
    lw.w = m_.U.detach();
    lw.b = m_.b.detach();
    lw.X = at::empty({rows, m_.U.size(1)}, opts);
    lw.G = at::empty({rows, m_.U.size(0)}, opts);
    lw.token = DeferredWeightGrads::apply(m_.U, m_.b, lw.X, lw.G);
  }
  auto product = [&](const at::Tensor& x) {
    if (!packed) return grad ? LevelLinear::apply(x, lw.token, &lw) : linear_rows(x, m_.U, m_.b);
    return grad ? PackedLinear::apply(x, m_.U, m_.b, u_t.panels, u.panels) : packed_mm(x, u_t, m_.b);
  };

  Run run;
  run.labels.resize(levels.size());
  for (size_t k = 0; k < levels.size(); ++k)
    for (auto [t, n] : levels.level(k)) run.labels[k].push_back(trees[t]->label[static_cast<size_t>(n)]);

  const std::vector<int64_t> ids = levels.leaf_words();
  run.H.push_back(at::embedding(m_.E, upload(ids), -1, false, m_.options().sparse_embedding_grad));
  std::vector<at::Tensor> C{at::zeros({static_cast<int64_t>(ids.size()), h}, m_.E.options().requires_grad(false))};
  TreeLevels::Blocks h_blocks = levels.no_blocks(), c_blocks = levels.no_blocks();
  auto split = [&](size_t j) {
    levels.split(run.H[j], j, h_blocks);
    levels.split(C[j], j, c_blocks);
  };
  split(0);
  for (size_t k = 1; k < levels.size(); ++k) {
    const auto n = static_cast<int64_t>(levels.level(k).size());
    // [left_0, right_0, left_1, ...]: a [n, 2h] view is [hl; hr] per row.
    const at::Tensor p = upload(levels.child_order(k));
    at::Tensor x = TreeLevels::children_of(h_blocks, k).index_select(0, p).view({n, 2 * h});
    at::Tensor cc = TreeLevels::children_of(c_blocks, k).index_select(0, p).view({n, 2, h});
    at::Tensor gates = product(x);
    at::Tensor a = at::tanh(gates.narrow(1, 0, h));
    std::vector<at::Tensor> s = at::sigmoid(gates.narrow(1, h, 4 * h)).chunk(4, 1);
    at::Tensor c = a * s[0] + s[1] * cc.select(1, 0) + s[2] * cc.select(1, 1);
    run.H.push_back(s[3] * at::tanh(c));
    C.push_back(c);
    split(k);
  }
  if (want_roots) run.roots = levels.roots(run.H);
  return run;
}

at::Tensor HandBatched::loss(std::span<const data::Tree* const> trees) const {
  Run r = run(trees, !m_.options().all_nodes);
  const c10::Device device = m_.E.device();
  if (m_.options().all_nodes) {
    std::vector<int64_t> labels;
    for (const auto& l : r.labels) labels.insert(labels.end(), l.begin(), l.end());
    at::Tensor logits = at::linear(at::cat(r.H), m_.V, m_.v);
    return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(device), {}, at::Reduction::Sum);
  }
  at::Tensor logits = linear_rows(r.roots, m_.V, m_.v);
  std::vector<int64_t> labels;
  for (const data::Tree* t : trees) labels.push_back(t->label.back());
  return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(device), {}, at::Reduction::Sum);
}

at::Tensor HandBatched::root_logits(std::span<const data::Tree* const> trees) const {
  return linear_rows(run(trees, true).roots, m_.V, m_.v);
}

}  // namespace sheaf::models
