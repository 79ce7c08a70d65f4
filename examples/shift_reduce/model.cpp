#include "model.h"

#include <ATen/ATen.h>

#include <common/model_utils.h>

namespace sheaf::models {

std::vector<int> gold_transitions(const data::Tree& tree) {
  std::vector<int> out;
  for (int n = 0; n < tree.size(); ++n) out.push_back(tree.is_leaf(n) ? kShift : kReduce);
  return out;
}

int choose_transition(float shift_score, float reduce_score, size_t stack_size, size_t buffer_left) {
  const bool can_shift = buffer_left > 0, can_reduce = stack_size >= 2;
  if (!can_reduce) return kShift;
  if (!can_shift) return kReduce;
  return reduce_score > shift_score ? kReduce : kShift;
}

ShiftReduce::ShiftReduce(const ShiftReduceOptions& o, uint64_t seed)
    : track_("spinn_tracking",
             [this](Expr buffer_top, Expr top0, Expr top1, Expr h, Expr c) {
               std::vector<Expr> gate = dsl::chunk(dsl::affine(T, dsl::concat({buffer_top, top0, top1, h}), t), 4);
               Expr c2 = dsl::sigmoid(gate[1]) * c + dsl::sigmoid(gate[0]) * dsl::tanh(gate[3]);
               return std::array{dsl::sigmoid(gate[2]) * dsl::tanh(c2), c2};
             }),
      compose_("spinn_compose",
               [this](Expr lh, Expr lc, Expr rh, Expr rc, Expr track_h) {
                 std::vector<Expr> c5 = dsl::chunk(dsl::affine(U, dsl::concat({lh, rh, track_h}), u), 5);
                 Expr c = dsl::tanh(c5[0]) * dsl::sigmoid(c5[1]) + dsl::sigmoid(c5[2]) * lc + dsl::sigmoid(c5[3]) * rc;
                 return std::array{dsl::sigmoid(c5[4]) * dsl::tanh(c), c};
               }),
      options_(o) {
  if (o.vocab <= 0 || o.hidden <= 0 || o.tracking <= 0) throw UserError("ShiftReduce: sizes must be positive");
  at::manual_seed(seed);
  const int64_t h = o.hidden, k = o.tracking;
  E = uniform_param({o.vocab, h}, 0.1);
  T = uniform_param({4 * k, 3 * h + k}, 1.0 / std::sqrt(3.0 * h + k));
  t = at::zeros({4 * k}).requires_grad_();
  A = uniform_param({2, k}, 1.0 / std::sqrt(static_cast<double>(k)));
  a = at::zeros({2}).requires_grad_();
  U = uniform_param({5 * h, 2 * h + k}, 1.0 / std::sqrt(2.0 * h + k));
  u = at::zeros({5 * h}).requires_grad_();
  V = uniform_param({kClasses, h}, 1.0 / std::sqrt(static_cast<double>(h)));
  v = at::zeros({kClasses}).requires_grad_();
}

void ShiftReduce::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &T, &t, &A, &a, &U, &u, &V, &v}) *p = p->detach().to(device).requires_grad_();
}

// ---------------------------------------------------------------------------
// Sheaf: the per-sentence program. The stack and buffer are ordinary vectors of
// Exprs; only the decision in predict mode waits for a computed value.

Task<ParseResult> ShiftReduce::parse(Graph& g, const data::Tree& tree, bool predict) const {
  struct Item {
    Expr h, c;
  };
  const int64_t h = options_.hidden, k = options_.tracking;
  std::vector<Item> buffer;
  for (int n = 0; n < tree.size(); ++n)
    if (tree.is_leaf(n))
      buffer.push_back({g.lookup(E, tree.word[static_cast<size_t>(n)], options_.sparse_embedding_grad), g.zeros({h})});
  const Expr none = g.zeros({h});
  const std::vector<int> gold = gold_transitions(tree);
  std::vector<Item> stack;
  Item track{g.zeros({k}), g.zeros({k})};
  std::vector<Expr> losses;
  ParseResult result;
  size_t next = 0;
  for (size_t step = 0; step < gold.size(); ++step) {
    auto top = [&](size_t i) { return stack.size() > i ? stack[stack.size() - 1 - i].h : none; };
    const auto [th, tc] = track_(next < buffer.size() ? buffer[next].h : none, top(0), top(1), track.h, track.c);
    track = {th, tc};
    // Outside the cell: following gold transitions nothing waits for the scores,
    // and the scheduler runs every step's as one GEMM.
    const Expr scores = dsl::affine(A, th, a);

    int action = gold[step];
    if (predict) {
      const std::vector<float> s = co_await fetch_values(scores);
      action = choose_transition(s[kShift], s[kReduce], stack.size(), buffer.size() - next);
    } else {
      losses.push_back(dsl::pick_neg_log_softmax(scores, action));
    }
    result.transitions.push_back(action);
    if (action == kShift) {
      stack.push_back(buffer[next++]);
      continue;
    }
    Item r = stack.back();
    stack.pop_back();
    Item l = stack.back();
    stack.pop_back();
    const auto [ch, cc] = compose_(l.h, l.c, r.h, r.c, track.h);
    stack.push_back({ch, cc});
  }
  result.logits = dsl::affine(V, stack.back().h, v);
  losses.push_back(dsl::pick_neg_log_softmax(result.logits, tree.label.back()));
  result.loss = dsl::sum(losses);
  co_return result;
}

// ---------------------------------------------------------------------------
// Eager, one sentence: the same computation with LibTorch calls (GEMV for single rows).

ShiftReduce::EagerResult ShiftReduce::parse_eager(const data::Tree& tree, bool predict) const {
  struct Item {
    at::Tensor h, c;
  };
  const int64_t h = options_.hidden, k = options_.tracking;
  const at::TensorOptions opts = E.options().requires_grad(false);
  std::vector<int64_t> ids;
  for (int n = 0; n < tree.size(); ++n)
    if (tree.is_leaf(n)) ids.push_back(tree.word[static_cast<size_t>(n)]);
  at::Tensor emb = at::embedding(E, at::tensor(ids, at::kLong).to(E.device()), -1, false, options_.sparse_embedding_grad);
  const std::vector<at::Tensor> words = emb.unbind(0);  // (one backward node, not one per row)
  const at::Tensor none = at::zeros({h}, opts);
  const std::vector<int> gold = gold_transitions(tree);
  std::vector<Item> stack;
  Item track{at::zeros({k}, opts), at::zeros({k}, opts)};
  // Training: the gold actions' scores, scored at the end in one log_softmax
  // (each step's action is the gold one whatever its scores say).
  std::vector<at::Tensor> step_scores;
  EagerResult result;
  size_t next = 0;
  for (size_t step = 0; step < gold.size(); ++step) {
    auto top = [&](size_t i) { return stack.size() > i ? stack[stack.size() - 1 - i].h : none; };
    at::Tensor x = at::cat({next < ids.size() ? words[next] : none, top(0), top(1), track.h});
    std::vector<at::Tensor> gate = at::addmv(t, T, x).chunk(4);
    track.c = at::sigmoid(gate[1]) * track.c + at::sigmoid(gate[0]) * at::tanh(gate[3]);
    track.h = at::sigmoid(gate[2]) * at::tanh(track.c);
    at::Tensor scores = at::addmv(a, A, track.h);
    int action = gold[step];
    if (predict) {
      // One sync per step: per-example code has no way around it.
      const at::Tensor s = scores.detach().cpu();
      const float* p = s.data_ptr<float>();
      action = choose_transition(p[kShift], p[kReduce], stack.size(), ids.size() - next);
    } else {
      step_scores.push_back(scores);
    }
    result.transitions.push_back(action);
    if (action == kShift) {
      stack.push_back({words[next++], at::zeros({h}, opts)});
      continue;
    }
    Item r = stack.back();
    stack.pop_back();
    Item l = stack.back();
    stack.pop_back();
    std::vector<at::Tensor> c5 = at::addmv(u, U, at::cat({l.h, r.h, track.h})).chunk(5);
    at::Tensor c = at::tanh(c5[0]) * at::sigmoid(c5[1]) + at::sigmoid(c5[2]) * l.c + at::sigmoid(c5[3]) * r.c;
    stack.push_back({at::sigmoid(c5[4]) * at::tanh(c), c});
  }
  result.logits = at::addmv(v, V, stack.back().h);
  result.loss = -at::log_softmax(result.logits, 0)[tree.label.back()];
  if (!step_scores.empty()) {
    const std::vector<int64_t> actions(result.transitions.begin(), result.transitions.end());
    result.loss = result.loss + at::nll_loss(at::log_softmax(at::stack(step_scores), 1),
                                             at::tensor(actions, at::kLong).to(E.device()), {}, at::Reduction::Sum);
  }
  return result;
}

}  // namespace sheaf::models
