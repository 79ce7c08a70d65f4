// The executor: views instead of copies, one output tensor per batch, devices.
#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;
using sheaf::test::param;

TEST_CASE("node values are rows of one batch tensor", "[backend]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::tanh(g.input(data({3}, i))));
  }
  g.forward(ys);
  const void* base = ys[0].value().data_ptr();
  for (int i = 1; i < 4; ++i)
    CHECK(static_cast<const char*>(ys[static_cast<size_t>(i)].value().data_ptr()) ==
          static_cast<const char*>(base) + i * 3 * sizeof(float));
}

TEST_CASE("inputs already in order are used as views, others gathered", "[backend]") {
  Graph g;
  std::vector<Expr> ys;
  std::vector<Expr> xs;
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    xs.push_back(g.input(data({3}, i)));
  }
  // Reversed pairing: example i adds x_i and x_{5-i}; the second operand must be gathered.
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    ys.push_back(xs[static_cast<size_t>(i)] + xs[static_cast<size_t>(5 - i)]);
  }
  g.forward(ys);
  CHECK(g.stats().zero_copy_inputs == 1);
  CHECK(g.stats().gathered_inputs == 1);
  CHECK(g.stats().gather_launches == 1);  // one index_select
  for (int i = 0; i < 6; ++i)
    CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), data({3}, i) + data({3}, 5 - i)));
}

TEST_CASE("gradients reach parameters through batched launches", "[backend]") {
  at::Tensor W = param({3, 3}, 9);
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 5; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::sum(dsl::affine(W, g.input(data({3}, i)), at::zeros({3}))));
  }
  Expr loss = dsl::sum(ys);
  g.forward(loss);
  loss.value().backward();
  at::Tensor expected = at::zeros({3, 3});
  for (int i = 0; i < 5; ++i) expected += at::ones({3, 1}) * data({3}, i).unsqueeze(0);
  CHECK(at::allclose(W.grad(), expected, 1e-5, 1e-5));
}

TEST_CASE("parameters on another device are refused with a clear error", "[backend][errors]") {
  if (!test::cuda_available()) {
    Graph g({.device = c10::Device(c10::kCUDA)});
    REQUIRE_THROWS_WITH(g.param(at::randn({2})), Contains("op 'param'") && Contains("graph runs on cuda"));
    return;
  }
  Graph g;
  REQUIRE_THROWS_WITH(g.param(at::randn({2}, at::kCUDA)), Contains("graph runs on cpu"));
}
