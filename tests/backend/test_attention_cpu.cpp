// The CPU attention loop (ops/attention_cpu.h) against LibTorch's formula,
// value by value and head by head: outputs and the gradients of queries, keys
// and values, at lengths around the vector width (tails), one key, queries
// and keys of different counts, a given scale, and values end to end.
#include <sheaf/ops/attention_cpu.h>

#include <torch/csrc/autograd/autograd.h>

#include "../support.h"

using namespace sheaf;

namespace {

struct Case {
  std::vector<int64_t> qc, kc;
  int64_t d, dv, heads;
  double scale;
};

void check_case(const Case& c) {
  int64_t rq = 0, rk = 0;
  for (size_t i = 0; i < c.qc.size(); ++i) {
    rq += c.qc[i];
    rk += c.kc[i];
  }
  at::manual_seed(static_cast<uint64_t>(rq * 31 + rk));
  const at::Tensor q = at::randn({rq, c.d}).requires_grad_(), k = at::randn({rk, c.d}).requires_grad_(),
                   v = at::randn({rk, c.dv}).requires_grad_();
  const at::Tensor out = op::attention_cpu(q, k, v, c.qc, c.kc, c.heads, c.scale);
  REQUIRE(out.sizes() == at::IntArrayRef({rq, c.dv}));
  const at::Tensor w = at::randn({rq, c.dv});  // a loss that weighs every output differently
  const auto grads = torch::autograd::grad({(out * w).sum()}, {q, k, v});
  std::vector<at::Tensor> want;
  for (size_t i = 0, q0 = 0, k0 = 0; i < c.qc.size(); q0 += c.qc[i], k0 += c.kc[i], ++i)
    want.push_back(test::attention_of(q.narrow(0, q0, c.qc[i]), k.narrow(0, k0, c.kc[i]), v.narrow(0, k0, c.kc[i]), c.heads,
                             c.scale));
  const at::Tensor expect = at::cat(want);
  const auto expect_grads = torch::autograd::grad({(expect * w).sum()}, {q, k, v});
  CHECK(at::allclose(out, expect, 1e-4, 1e-5));
  for (size_t g = 0; g < 3; ++g) {
    INFO("gradient of " << "qkv"[g]);
    CHECK(at::allclose(grads[g], expect_grads[g], 1e-4, 1e-5));
  }
}

}  // namespace

TEST_CASE("attention_cpu: values and gradients equal LibTorch's formula", "[attention][backend]") {
  const std::vector<Case> cases = {
      {{5, 1, 17, 33, 8}, {5, 1, 17, 33, 8}, 64, 64, 4, 0},  // self-attention, lengths around the vector width
      {{3, 7, 2}, {9, 1, 16}, 32, 48, 2, 0},                 // queries over keys of other counts, dv != d
      {{4, 4}, {6, 6}, 12, 8, 1, 0.7},                       // one head, a given scale
      {{40}, {40}, 128, 128, 4, 0},                          // one long value, d = 128
      {{1}, {1}, 8, 8, 4, 1.0},                              // one query, one key: its value row
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    check_case(cases[i]);
  }
}

// Values of one shape (every example's length alike) are packed rows too,
// with equal counts: batched equals alone, values and gradients.
TEST_CASE("attention_cpu: values of one shape through the DSL, batched equals alone", "[attention][backend]") {
  at::manual_seed(5);
  const at::Tensor W = (at::randn({8, 8}) * 0.3).requires_grad_(), b = (at::randn({8}) * 0.1).requires_grad_();
  std::vector<at::Tensor> inputs;
  for (int i = 0; i < 6; ++i) inputs.push_back(at::randn({3, 8}));
  auto program = [&](Graph& g, int i) {
    const Expr X = g.input(inputs[static_cast<size_t>(i)]);
    const Expr Q = dsl::tanh(dsl::affine(W, X, b));
    return dsl::sum(dsl::attention(Q, X, Q, 2) * X);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, program, {.params = {W, b}}));
}

TEST_CASE("attention_cpu: a second derivative is refused, not wrong", "[attention][backend]") {
  const at::Tensor q = at::randn({4, 8}).requires_grad_(), k = at::randn({4, 8}), v = at::randn({4, 8});
  const std::vector<int64_t> counts{4};
  const at::Tensor out = op::attention_cpu(q, k, v, counts, counts, 2, 0);
  CHECK_THROWS_AS(torch::autograd::grad({out.sum()}, {q}, {}, /*retain_graph=*/true, /*create_graph=*/true), UserError);
}

TEST_CASE("attention_cpu: no gradient kept without one wanted, and large scores stay finite", "[attention][backend]") {
  c10::NoGradGuard no_grad;
  const at::Tensor q = at::randn({6, 8}) * 100, k = at::randn({6, 8}) * 100, v = at::randn({6, 8});
  const std::vector<int64_t> counts{2, 4};
  const at::Tensor out = op::attention_cpu(q, k, v, counts, counts, 2, 0);
  CHECK(!out.requires_grad());
  CHECK(at::isfinite(out).all().item<bool>());
  const at::Tensor expect = at::cat({test::attention_of(q.narrow(0, 0, 2), k.narrow(0, 0, 2), v.narrow(0, 0, 2), 2, 0),
                                     test::attention_of(q.narrow(0, 2, 4), k.narrow(0, 2, 4), v.narrow(0, 2, 4), 2, 0)});
  CHECK(at::allclose(out, expect, 1e-4, 1e-5));
}
