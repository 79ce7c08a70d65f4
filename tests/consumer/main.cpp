// Builds against the installed headers and library only.
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/sigmoid.h>
#include <sheaf/ops/user_op.h>
#include <sheaf/sheaf.h>

#include <cstdio>

// An op of the user's own: x * sigmoid(x), one LibTorch call per batch.
struct Swish {
  static constexpr std::string_view name = "swish";
  static constexpr sheaf::OpTraits traits{.arity = 1};
  static sheaf::Shape infer(const sheaf::InferCtx& c) { return c.shape(0); }
  static at::Tensor run(sheaf::RunCtx& c) { return c.in(0).mul(at::sigmoid(c.in(0))); }
};

int main() {
  sheaf::Graph g;
  std::vector<sheaf::Expr> ys;
  for (int i = 0; i < 3; ++i) {
    auto scope = g.example(i);
    ys.push_back(sheaf::dsl::sum(sheaf::dsl::tanh(g.input(at::full({4}, static_cast<double>(i))))));
  }
  sheaf::Expr total = sheaf::dsl::sum(ys);
  g.forward(total);
  std::printf("installed sheaf works: total %.4f, %s\n", total.item(), g.stats().str().c_str());
  // Data parallelism links too (a world of one: no store, no peers).
  at::Tensor w = at::ones({2}).requires_grad_(true);
  sheaf::DataParallel dp({w}, sheaf::Rendezvous::from_env());
  dp.backward(w.mul(3.0).sum());
  const bool grad_ok = w.grad().defined() && w.grad()[0].item<double>() == 3.0;
  std::printf("DataParallel (world of %d): gradient %s\n", dp.world_size(), grad_ok ? "ok" : "WRONG");
  // The user's op, batched vs one at a time (values and gradients, every strategy).
  at::Tensor v = at::ones({4}).requires_grad_(true);
  const sheaf::CheckReport r = sheaf::check_batched(5, [&](sheaf::Graph& cg, int i) {
    return sheaf::dsl::sum(sheaf::dsl::call(sheaf::user_op<Swish>(), {cg.input(at::full({4}, 0.1 * i)) * v}));
  }, {.params = {v}});
  std::printf("user op 'swish': %s\n", r.ok ? "batched equals alone" : r.message.c_str());
  // A function of the user's: recorded once, one node per call.
  auto cell = sheaf::function("cell", [&](sheaf::Expr x, sheaf::Expr h) {
    return std::pair{sheaf::dsl::tanh(x * v + h), sheaf::dsl::sigmoid(h)};
  });
  const sheaf::CheckReport f = sheaf::check_batched(4, [&](sheaf::Graph& cg, int i) {
    sheaf::Expr h = cg.input(at::full({4}, 0.2 * i));
    for (int k = 0; k <= i; ++k) h = cell(cg.input(at::full({4}, 0.1 * k)), h).first;
    return sheaf::dsl::sum(h);
  }, {.params = {v}});
  std::printf("function 'cell': %s\n", f.ok ? "batched equals alone and inline" : f.message.c_str());
  return g.stats().batches == 4 && grad_ok && r.ok && f.ok ? 0 : 1;
}
