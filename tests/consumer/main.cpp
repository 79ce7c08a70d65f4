// Builds against the installed headers and library only.
#include <ATen/ops/full.h>
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
  return g.stats().batches == 4 ? 0 : 1;
}
