// The graph store: handles, incremental forward, clear, dump.
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <thread>
#include <type_traits>

#include "../support.h"

using namespace sheaf;
using Catch::Contains;

static_assert(std::is_trivially_copyable_v<Expr>, "Expr must stay a cheap handle");
static_assert(sizeof(Expr) == 12, "Expr must stay a cheap handle");

TEST_CASE("recording computes nothing, forward computes everything recorded", "[tracer]") {
  Graph g;
  Expr x = g.input(at::full({3}, 2.0));
  Expr y = dsl::tanh(x * 0.5);
  CHECK(g.stats().batches == 0);
  CHECK(y.shape() == Shape{3});
  g.forward();
  CHECK(at::allclose(y.value(), at::tanh(at::ones({3}))));
}

TEST_CASE("forward again after recording more runs only the new part", "[tracer]") {
  Graph g;
  std::vector<Expr> h;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    h.push_back(dsl::sigmoid(g.input(at::full({2}, static_cast<double>(i)))));
  }
  g.forward(h);
  const uint64_t launches = g.stats().batches;
  CHECK(launches == 2);  // input stack + sigmoid
  const at::Tensor first = h[2].value();

  std::vector<Expr> z;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    z.push_back(h[i] * 2.0);
  }
  g.forward(z);
  CHECK(g.stats().batches == launches + 1);
  CHECK(g.stats().nodes == 12);
  CHECK(at::equal(h[2].value(), first));
  CHECK(at::allclose(z[3].value(), 2.0 * at::sigmoid(at::full({2}, 3.0))));
}

// A parameter first recorded after prepare() takes a batch slot the prepared
// round's outputs were planned for: the round is planned again when it runs.
TEST_CASE("a parameter recorded after prepare() leaves the prepared round correct", "[tracer]") {
  const at::Tensor W = at::randn({3, 4}), V = at::randn({2, 3});
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::tanh(dsl::matmul(W, g.input(test::data({4}, i)))));
  }
  g.prepare(ys);
  std::vector<Expr> zs;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    zs.push_back(dsl::matmul(V, ys[static_cast<size_t>(i)]));
  }
  g.forward(zs);
  CHECK(g.stats().replans == 1);
  for (int i = 0; i < 4; ++i)
    CHECK(at::allclose(zs[static_cast<size_t>(i)].value(), at::matmul(V, at::tanh(at::matmul(W, test::data({4}, i)))), 1e-5,
                       1e-6));
}

TEST_CASE("clear forgets nodes and invalidates old handles, the graph is reusable", "[tracer]") {
  Graph g;
  for (int round = 0; round < 3; ++round) {
    Expr x = g.input(at::full({2}, static_cast<double>(round)));
    Expr y = x + 1.0;
    g.forward(y);
    CHECK(y.value()[0].item<double>() == Approx(round + 1.0));
    g.clear();
    CHECK(g.size() == 0);
    CHECK(g.stats().batches == 0);
    REQUIRE_THROWS_AS(y.value(), UserError);
  }
}

TEST_CASE("the same tensor is one shared node", "[tracer]") {
  Graph g;
  at::Tensor w = at::randn({2, 2});
  Expr a = g.param(w), b = g.param(w);
  CHECK(a == b);
  CHECK(a.example() == kSharedExample);
  Expr x = g.input(at::randn({2}));
  CHECK(x.example() == 0);
  auto s = g.example(5);
  CHECK(g.input(at::randn({2})).example() == 5);
}

// Trace::lookup reuses the last lookup's verdict for the same table node: it
// must not outlive a clear() (node ids start again: another table may get the
// same one), nor carry over between tables or gradient kinds.
TEST_CASE("lookups alternating tables and gradient kinds, and after clear(), have their own shapes and checks",
          "[tracer]") {
  Graph g;
  const at::Tensor A = at::randn({6, 3}), B = at::randn({4, 5}), C = at::randn({8, 2});
  for (int pass = 0; pass < 2; ++pass) {
    g.clear();
    const at::Tensor& first = pass == 0 ? A : C;  // after the clear, C's node has A's old id
    std::vector<Expr> xs;
    for (int64_t i = 0; i < 4; ++i) {
      auto s = g.example(i);
      xs.push_back(g.lookup(first, i % 2, /*sparse_grad=*/i % 2 == 1));
      xs.push_back(g.lookup(B, i));
    }
    Expr outside = g.lookup(first, 1);  // outside any example scope: example 0, as input() is
    CHECK(xs[0].shape() == Shape{first.size(1)});
    CHECK(xs[1].shape() == Shape{5});
    CHECK(outside.example() == 0);
    REQUIRE_THROWS_WITH(g.lookup(first, first.size(0)), Contains("op 'lookup'") && Contains("out of range"));
    REQUIRE_THROWS_WITH(g.lookup(B, 4), Contains("op 'lookup'") && Contains("id 4") && Contains("4 rows"));
    g.forward();
    for (int64_t i = 0; i < 4; ++i) {
      CHECK(at::equal(xs[static_cast<size_t>(2 * i)].value(), first[i % 2]));
      CHECK(at::equal(xs[static_cast<size_t>(2 * i + 1)].value(), B[i]));
    }
    CHECK(at::equal(outside.value(), first[1]));
  }
  // The same table again and again, the gradient kind changing: a sparse
  // gradient needs a 2-D table, checked whatever the lookup before it.
  g.clear();
  const at::Tensor T = at::randn({5, 2, 3});
  auto s = g.example(0);
  for (int64_t id = 0; id < 3; ++id) REQUIRE_NOTHROW(g.lookup(T, id));
  REQUIRE_THROWS_WITH(g.lookup(T, 3, /*sparse_grad=*/true), Contains("op 'lookup'") && Contains("2-D"));
  CHECK(g.lookup(T, 4).shape() == Shape({2, 3}));
}

TEST_CASE("an op on shared values only is shared and computed once", "[tracer]") {
  Graph g;
  at::Tensor w = at::randn({3});
  std::vector<Expr> ys;
  for (int i = 0; i < 5; ++i) {
    auto s = g.example(i);
    Expr t = dsl::tanh(g.param(w));  // same value for everyone
    CHECK(t.example() == kSharedExample);
    ys.push_back(g.input(at::ones({3})) * t);
  }
  g.forward(ys);
  for (const Expr& y : ys) CHECK(at::allclose(y.value(), at::tanh(w)));
}

// Without a gradient for the table, a lookup is a row of it: readers take the
// row from the table, and no lookup is launched.
TEST_CASE("lookups read their table's rows where no gradient goes to it", "[tracer][backend]") {
  const at::Tensor E = at::randn({10, 4}).requires_grad_();
  const at::Tensor W = at::randn({3, 4}).requires_grad_();
  const std::vector<int64_t> ids{3, 7, 3, 0, 9, 5};
  auto record = [&](Graph& g, std::vector<Expr>& words, std::vector<Expr>& ys) {
    for (size_t i = 0; i < ids.size(); ++i) {
      auto s = g.example(static_cast<int64_t>(i));
      Expr w = g.lookup(E, ids[i]);
      Expr v = g.lookup(E, (ids[i] + 1) % 10);
      words.push_back(w);
      ys.push_back(dsl::tanh(dsl::matmul(W, w) + dsl::sum(v)));
    }
  };
  auto expected = [&](size_t i) {
    return at::tanh(at::matmul(W, E[ids[i]]) + E[(ids[i] + 1) % 10].sum()).detach();
  };
  // Each example: the sum of its word's row, scaled; the table's gradient is
  // then `scale` at each id's row, once per use.
  auto record_sums = [&](Graph& g, const at::Tensor& table, double scale, bool sparse) {
    std::vector<Expr> ys;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto s = g.example(static_cast<int64_t>(i));
      ys.push_back(dsl::sum(g.lookup(table, ids[i], sparse)) * scale);
    }
    return ys;
  };
  auto gradient_of = [](const std::vector<Expr>& ys, const at::Tensor& table) {
    std::vector<at::Tensor> outs;
    for (const Expr& y : ys) outs.push_back(y.value());
    return torch::autograd::grad({at::stack(outs).sum()}, {table})[0];
  };
  auto counted = [&](double scale) {
    at::Tensor counts = at::zeros({10, 4});
    for (int64_t id : ids) counts[id] += scale;
    return counts;
  };
  SECTION("inference: no lookup launched, the same values, value() a copy") {
    c10::NoGradGuard no_grad;
    Graph g;
    std::vector<Expr> words, ys;
    record(g, words, ys);
    g.forward(ys);
    for (size_t i = 0; i < ids.size(); ++i) CHECK(at::allclose(ys[i].value(), expected(i), 1e-5, 1e-6));
    CHECK_THAT(g.plan_str(), !Contains("= lookup"));
    const at::Tensor w = words[1].value();
    CHECK(at::equal(w, E[7]));
    CHECK(!w.is_alias_of(E));
    g.clear();
    CHECK(g.plan_str().empty());  // the placed lookups are forgotten with the rest
  }
  SECTION("prepared with a frozen table that is unfrozen before it runs: the lookups run") {
    const at::Tensor table = E.detach().clone();
    Graph g;
    const std::vector<Expr> ys = record_sums(g, table, 3.0, false);
    g.prepare(ys);
    table.requires_grad_(true);
    g.forward(ys);
    CHECK(g.stats().replans == 1);
    CHECK_THAT(g.plan_str(), Contains("= lookup"));
    CHECK(at::allclose(gradient_of(ys, table), counted(3.0)));
  }
  SECTION("a frozen table with autograd on: the same, and the other weights' gradients") {
    const at::Tensor frozen = E.detach();
    Graph g;
    std::vector<Expr> ys;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto s = g.example(static_cast<int64_t>(i));
      ys.push_back(dsl::tanh(dsl::matmul(W, g.lookup(frozen, ids[i]))));
    }
    g.forward(ys);
    CHECK_THAT(g.plan_str(), !Contains("= lookup"));
    const auto d = torch::autograd::grad({at::stack({ys[0].value(), ys[4].value()}).sum()}, {W});
    const at::Tensor ref = at::stack({at::tanh(at::matmul(W, E[3].detach())), at::tanh(at::matmul(W, E[9].detach()))});
    CHECK(at::allclose(d[0], torch::autograd::grad({ref.sum()}, {W})[0], 1e-5, 1e-6));
  }
  SECTION("training: the lookups run, and the table gets its gradient") {
    Graph g;
    std::vector<Expr> words, ys;
    record(g, words, ys);
    g.forward(ys);
    CHECK_THAT(g.plan_str(), Contains("= lookup"));
    std::vector<at::Tensor> outs, refs;
    for (size_t i = 0; i < ids.size(); ++i) {
      outs.push_back(ys[i].value());
      refs.push_back(at::tanh(at::matmul(W, E[ids[i]]) + E[(ids[i] + 1) % 10].sum()));
    }
    const at::Tensor ours = torch::autograd::grad({at::stack(outs).sum()}, {E})[0];
    const at::Tensor theirs = torch::autograd::grad({at::stack(refs).sum()}, {E})[0];
    CHECK(at::allclose(ours, theirs, 1e-5, 1e-6));
  }
  SECTION("prepared without autograd, run with it: the lookups run, a sparse gradient stays sparse") {
    Graph g;
    const std::vector<Expr> ys = record_sums(g, E, 2.0, /*sparse=*/true);
    {
      c10::NoGradGuard no_grad;
      g.prepare(ys);
    }
    g.forward(ys);
    CHECK(g.stats().replans == 1);
    CHECK_THAT(g.plan_str(), Contains("= lookup"));
    const at::Tensor d = gradient_of(ys, E);
    CHECK(d.is_sparse());
    CHECK(at::allclose(d.to_dense(), counted(2.0)));
  }
  SECTION("prepared with autograd, run without: the lookups are read from the table") {
    Graph g;
    std::vector<Expr> words, ys;
    record(g, words, ys);
    g.prepare(ys);
    c10::NoGradGuard no_grad;
    g.forward(ys);
    CHECK(g.stats().replans == 1);
    CHECK_THAT(g.plan_str(), !Contains("= lookup"));
    for (size_t i = 0; i < ids.size(); ++i) CHECK(at::allclose(ys[i].value(), expected(i), 1e-5, 1e-6));
  }
  SECTION("a Prefetcher's worker records in the mode of the thread that takes: no round planned twice") {
    c10::NoGradGuard no_grad;
    Prefetcher pf({}, [&](Graph& g, size_t) {
      std::vector<Expr> words, ys;
      record(g, words, ys);
      return ys;
    });
    for (size_t k = 0; k < 3; ++k) {  // batch 0 recorded by take(), 1 and 2 by the worker
      Prefetcher::Batch batch = pf.take(k, k + 1 < 3 ? std::optional(k + 1) : std::nullopt);
      batch.graph.forward(batch.targets);
      CHECK(batch.graph.stats().replans == 0);
      CHECK_THAT(batch.graph.plan_str(), !Contains("= lookup"));
      for (size_t i = 0; i < ids.size(); ++i) CHECK(at::allclose(batch.targets[i].value(), expected(i), 1e-5, 1e-6));
    }
  }
  SECTION("what a Prefetcher's record function returns is checked, named with its batch and the user's line") {
    Graph elsewhere;
    const Expr foreign = elsewhere.param(E);
    Prefetcher pf({}, [&](Graph& g, size_t b) {
      std::vector<Expr> words, ys;
      record(g, words, ys);
      if (b == 1) ys.push_back(foreign);
      if (b == 2) ys[1] = Expr();
      return ys;
    });
    REQUIRE_NOTHROW(pf.take(0, 1));
    REQUIRE_THROWS_WITH(pf.take(1, 2), Contains("sheaf::Prefetcher's record function (batch 1)'s result " +
                                                std::to_string(ids.size())) &&
                                           Contains("belongs to another sheaf::Graph") &&
                                           Contains("test_graph.cpp") && !Contains("engine/prefetch.cpp"));
    REQUIRE_THROWS_WITH(pf.take(2), Contains("(batch 2)'s result 1 is an empty Expr"));
  }
  SECTION("a Prefetcher's last batch is cleared by take(), not by its worker: its Exprs fail as cleared") {
    Prefetcher pf({}, [&](Graph& g, size_t) {
      std::vector<Expr> words, ys;
      record(g, words, ys);
      return ys;
    });
    Prefetcher::Batch first = pf.take(0, 1);
    first.graph.forward(first.targets);
    const Expr kept = first.targets[0];
    Prefetcher::Batch second = pf.take(1, 2);  // the worker records batch 2 into the first graph meanwhile
    // Deterministically a UserError (it raced with the worker's clear before).
    REQUIRE_THROWS_WITH(kept.value(), Contains("cleared"));
    // So does the batch's own list, a copy (a view of the list the worker rewrites before).
    REQUIRE_THROWS_WITH(first.targets[0].value(), Contains("cleared"));
    second.graph.forward(second.targets);
    CHECK(at::allclose(second.targets[0].value(), expected(0), 1e-5, 1e-6));
  }
  SECTION("the checker agrees, every strategy, inference") {
    c10::NoGradGuard no_grad;
    const CheckReport r = check_batched(6, [&](Graph& g, int i) {
      Expr w = g.lookup(E, ids[static_cast<size_t>(i)]);
      return dsl::cond(dsl::sum(w) > 0.0, [&, w] { return dsl::tanh(dsl::matmul(W, w)); },
                       [&, w] { return dsl::matmul(W, g.lookup(E, 2) * w); });
    });
    REQUIRE_BATCHED_EQUALS_ALONE(r);
  }
}

TEST_CASE("dump lists every node with its op, shape and example", "[tracer]") {
  Graph g;
  auto s = g.example(1);
  Expr y = dsl::relu(g.input(at::randn({4})));
  std::string d = g.dump();
  CHECK_THAT(d, Contains("input") && Contains("relu(%0)") && Contains("[4]") && Contains("ex 1") &&
                    Contains("test_graph.cpp"));
  (void)y;
}

TEST_CASE("stats report nodes, batches, zero-copy inputs and times", "[tracer][backend]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 8; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::exp(dsl::tanh(g.input(at::randn({4})))));
  }
  g.forward(ys);
  const Stats& st = g.stats();
  CHECK(st.nodes == 24);
  CHECK(st.batches == 2);  // the inputs' stack, then tanh and exp fused
  CHECK(st.fused_batches == 1);
  CHECK(st.fused_ops == 2);
  CHECK(st.rounds == 1);
  CHECK(st.zero_copy_inputs == 1);  // the fused kernel reads the input batch as a view
  CHECK(st.gathered_inputs == 0);
  CHECK(st.execute_ms > 0);
  CHECK_THAT(st.str(), Contains("batches 2"));
}

TEST_CASE("trace_ms counts recording and control-flow callbacks, not the time after forward", "[tracer]") {
  // A coroutine records inside forward; what it records must not leave the
  // recording clock running until the next forward().
  Graph g;
  auto body = [](Graph& g) -> Task<Expr> {
    Expr x = g.input(at::ones({3}));
    const double v = co_await fetch_item(dsl::sum(x));
    co_return x * v;
  };
  Task<Expr> t = body(g);
  g.forward();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the user's own work, not recording
  Expr more = g.input(at::ones({2})) * 2.0;
  g.forward(more);
  CHECK(g.stats().trace_ms < 250.0);
  CHECK(g.stats().trace_ms > 0.0);
}
