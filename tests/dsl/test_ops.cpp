// Every op, batched vs alone (values of every node and parameter gradients),
// for every strategy and batch sizes 1, 2, 7 and 64, with examples of different
// lengths mixed in one batch.
#include <string>

#include "op_cases.h"

using namespace sheaf;
using namespace sheaf::test::ops;
using sheaf::test::data;

TEST_CASE("every op: batched equals alone, values and gradients", "[dsl][ops][checker]") {
  const int n = GENERATE(1, 2, 7, 64);
  Params p;
  for (const OpCase& c : cases()) {
    DYNAMIC_SECTION(c.op << ", " << n << " examples") {
      CheckReport r = check_batched(n, [&](Graph& g, int i) { return chain(g, i, p, c.step); }, {.params = p.all()});
      REQUIRE_BATCHED_EQUALS_ALONE(r);
      if (n > 1) CHECK(r.batched_launches < r.alone_launches);
    }
  }
}

TEST_CASE("the checker catches a difference", "[dsl][checker]") {
  // A program that is not the same alone and batched (it peeks at how many
  // examples the graph holds) must be reported, naming example and node.
  Params p;
  CheckReport r = check_batched(3, [&](Graph& g, int i) {
    Expr h = dsl::tanh(dsl::affine(p.W, g.input(data({kD}, i)), p.b));
    return h * static_cast<double>(g.size() > 8 ? 2.0 : 1.0);
  }, {.params = p.all()});
  REQUIRE_FALSE(r.ok);
  CHECK(r.example >= 0);
  CHECK_THAT(r.message, Catch::Contains("mul_scalar") && Catch::Contains("example"));
}

TEST_CASE("the checker leaves the user's gradients alone", "[dsl][checker]") {
  Params p;
  p.W.mutable_grad() = at::full_like(p.W, 3.0);
  check_batched(2, [&](Graph& g, int i) { return dsl::affine(p.W, g.input(data({kD}, i)), p.b); },
                {.params = p.all()});
  REQUIRE(p.W.grad().defined());
  CHECK(at::allclose(p.W.grad(), at::full_like(p.W, 3.0)));
  CHECK_FALSE(p.b.grad().defined());
}

TEST_CASE("dropout masks agree alone and batched, and differ across examples", "[dsl][ops]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::dropout(g.constant({64}, 1.0), 0.5));
  }
  g.forward(ys);
  CHECK_FALSE(at::equal(ys[0].value(), ys[1].value()));
  double kept = ys[0].value().gt(0).sum().item<double>() / 64.0;
  CHECK(kept > 0.25);
  CHECK(kept < 0.75);
  g.set_train(false);
  Expr z = dsl::dropout(g.constant({4}, 1.0), 0.5);
  g.forward(z);
  CHECK(at::equal(z.value(), at::ones({4})));
}
