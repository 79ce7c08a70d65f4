// Builds against the installed headers and library only.
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <sheaf/sheaf.h>

#include <cstdio>

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
  return g.stats().batches == 4 && grad_ok ? 0 : 1;
}
