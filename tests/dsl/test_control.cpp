// Control flow on computed values: dsl::cond, dsl::loop and coroutines, batched
// across examples, equal to running each example alone (values and gradients).
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <coroutine>
#include <future>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <thread>

#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;
using sheaf::test::param;

namespace {

struct P {
  at::Tensor W = param({6, 6}, 1), b = param({6}, 2), V = param({6, 6}, 3);
  std::vector<at::Tensor> all() const { return {W, b, V}; }
};

uint64_t launches_of(const Graph& g) { return g.stats().batches; }

}  // namespace

TEST_CASE("cond: each example takes its branch, batched equals alone", "[dsl][control][checker]") {
  const int n = GENERATE(1, 2, 7, 64);
  P p;
  CheckReport r = check_batched(n, [&](Graph& g, int i) {
    Expr x = dsl::tanh(dsl::affine(p.W, g.input(data({6}, i)), p.b));
    Expr y = dsl::cond(dsl::sum(x) > 0.0, [&, x] { return dsl::tanh(dsl::matmul(p.V, x)); },
                       [x] { return dsl::sigmoid(x) * 2.0; });
    return dsl::affine(p.W, y, p.b);  // used downstream: its shape is inferred once the branch is known
  }, {.params = p.all()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("cond: examples that take the same branch share launches", "[dsl][control][launches]") {
  P p;
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 64; ++i) {
    auto s = g.example(i);
    Expr x = g.input(at::full({6}, i % 2 ? 1.0 : -1.0));
    ys.push_back(dsl::cond(dsl::sum(x) > 0.0, [&, x] { return dsl::tanh(dsl::matmul(p.V, x)); },
                           [&, x] { return dsl::relu(x) + 1.0; }));
  }
  g.forward(ys);
  // Round 1: input, sum, greater (3). Round 2: matmul + tanh for 32 (2), relu + add_scalar
  // for the other 32: one fused launch.
  CHECK(launches_of(g) == 6);
  CHECK(g.stats().rounds == 2);
  CHECK(g.stats().fetches == 1);
  CHECK(at::allclose(ys[0].value(), at::ones({6})));
  CHECK(ys[1].shape() == Shape{6});
}

TEST_CASE("cond: callbacks run once each and in the order their conds were recorded", "[dsl][control]") {
  Graph g;
  const Expr x = g.input(at::ones({2}));
  const Expr p = dsl::sum(x) > 0.0;
  g.forward({p});  // computed: conds on it are due before any launch
  std::vector<int> ran;
  auto branch = [&](int k) {
    return [&ran, k, x] {
      ran.push_back(k);
      return x * static_cast<double>(k + 1);
    };
  };
  // c0 waits for a value of the next round; c1 and c2 wait for p, due twice
  // (each was computed when registered): listed twice, run once.
  const Expr c0 = dsl::cond(dsl::sum(x) < 10.0, branch(0), branch(0));
  const Expr c1 = dsl::cond(p, branch(1), branch(1));
  const Expr c2 = dsl::cond(p, branch(2), branch(2));
  g.forward({c0, c1, c2});
  CHECK(ran == std::vector<int>{0, 1, 2});
  CHECK(at::allclose(c2.value(), at::full({2}, 3.0)));
}

TEST_CASE("cond: recursion through cond (countdown by recursion)", "[dsl][control]") {
  std::function<Expr(Expr)> down = [&](Expr x) -> Expr {
    return dsl::cond(x > 0.0, [&, x] { return down(x - 1.0); }, [x] { return x * 10.0; });
  };
  CheckReport r = check_batched(9, [&](Graph& g, int i) { return down(g.input(at::full({}, i * 1.0))); });
  REQUIRE_BATCHED_EQUALS_ALONE(r);
  Graph g;
  Expr y = down(g.input(at::full({}, 3.0)));
  g.forward(y);
  CHECK(y.item() == 0.0);
  CHECK(g.stats().rounds == 5);  // four predicates (3, 2, 1, 0), then the else branch
}

TEST_CASE("cond with a declared shape: batched equals alone, and what reads it records at once",
          "[dsl][control][checker]") {
  const int n = GENERATE(1, 7, 64);
  P p;
  auto cell = sheaf::function("declared_cell", [&](Expr a, Expr b) { return dsl::tanh(dsl::affine(p.W, a + b, p.b)); });
  // A chain of declared conds, each deciding on the one before, read by a function call.
  auto program = [&](Graph& g, int i) {
    Expr x = dsl::tanh(dsl::affine(p.W, g.input(data({6}, i)), p.b));
    for (int k = 0; k < 4; ++k) {
      Expr y = dsl::cond(dsl::sum(x) > 0.0, [&, x] { return dsl::tanh(dsl::matmul(p.V, x)); },
                         [x] { return dsl::sigmoid(x) * 2.0 - 1.0; }, Shape{6});
      x = cell(y, x);
    }
    return x;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, program, {.params = p.all()}));

  Graph g;
  Expr x = g.input(data({6}, 3));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, [x] { return x * 2.0; }, [x] { return x - 1.0; }, Shape{6});
  CHECK(y.shape() == Shape{6});  // known before forward: no waiting on the branch
  Expr z = cell(y, x);
  CHECK(z.shape() == Shape{6});  // the call was recorded now, not left pending with unknown results
  Expr undeclared = dsl::cond(dsl::sum(x) > 0.0, [x] { return x * 2.0; }, [x] { return x - 1.0; });
  REQUIRE_THROWS_WITH(cell(undeclared, x).shape(), Contains("not known yet"));
  g.forward(z);
  const at::Tensor xv = data({6}, 3);
  const at::Tensor yv = xv.sum().item<double>() > 0 ? xv * 2.0 : xv - 1.0;
  CHECK(at::allclose(z.value(), at::tanh(at::addmv(p.b, p.W, yv + xv)), 1e-5, 1e-6));
}

TEST_CASE("cond with a declared shape: a branch of another shape is a UserError naming the cond",
          "[dsl][control][errors]") {
  {
    Graph g;
    auto s = g.example(5);
    Expr x = g.input(at::ones({3}));
    Expr y = dsl::cond(dsl::sum(x) > 0.0, [x] { return dsl::concat({x, x}); }, [x] { return x; }, Shape{3});
    REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'cond'") && Contains("example 5") && Contains("then branch") &&
                                          Contains("[6]") && Contains("declares [3]") && Contains("test_control"));
  }
  {
    // The branch's own shape waits on another (undeclared) cond: checked when that one is known.
    Graph g;
    Expr x = g.input(at::ones({3}));
    Expr first = dsl::cond(dsl::sum(x) > 0.0, [x] { return x; }, [x] { return -x; });  // known after round 1
    Expr inner = dsl::cond(dsl::sum(first) > 0.0, [x] { return dsl::concat({x, x}); }, [x] { return x; });  // round 2
    Expr y = dsl::cond(dsl::sum(x) > 0.0, [inner] { return inner * 2.0; }, [x] { return x; }, Shape{3});
    REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'cond'") && Contains("[6]") && Contains("[3]") &&
                                          Contains("was declared") && Contains("test_control"));
  }
  Graph g;
  Expr x = g.input(at::ones({3}));
  REQUIRE_THROWS_WITH(dsl::cond(dsl::sum(x) > 0.0, [x] { return x; }, [x] { return x; }, Shape{-1}),
                      Contains("op 'cond'") && Contains("negative"));
  // Branches of any callable kind: an empty std::function is an error at the call.
  const std::function<Expr()> none;
  const std::function<Expr()> same = [x] { return x; };
  REQUIRE_THROWS_WITH(dsl::cond(dsl::sum(x) > 0.0, none, same), Contains("op 'cond'") && Contains("callable"));
  Expr (*null_fn)() = nullptr;
  REQUIRE_THROWS_WITH(dsl::cond(dsl::sum(x) > 0.0, same, null_fn, Shape{3}), Contains("callable"));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, same, same, Shape{3});  // lvalue std::functions, copied
  g.forward(y);
  CHECK(at::equal(y.value(), at::ones({3})));
}

TEST_CASE("loop: 64 countdowns take as many steps as the longest, not the sum", "[dsl][control][launches]") {
  Graph g;
  std::vector<Expr> out;
  for (int i = 1; i <= 64; ++i) {
    auto s = g.example(i - 1);
    out.push_back(dsl::loop(g.input(at::full({}, static_cast<double>(i))), [](Expr x) { return x > 0.0; },
                            [](Expr x) { return x - 1.0; }));
  }
  g.forward(out);
  for (const Expr& e : out) CHECK(e.item() == 0.0);
  // The condition runs 65 times (the last one says stop), the body 64 times:
  // one launch per step for all examples still running, never one per example.
  // A body and the next condition are recorded together and fuse into one launch.
  CHECK(g.stats().rounds == 65);
  CHECK(g.stats().fetches == 65);
  CHECK(launches_of(g) == 1 + 1 + 64);  // inputs, the first condition, body + condition
  CHECK(g.stats().nodes < 64 + 2 * (64 * 65 / 2) + 64 * 3);  // no work for finished examples
}

TEST_CASE("loop: a vector state with gradients, different trip counts", "[dsl][control][checker]") {
  const int n = GENERATE(1, 7, 32);
  P p;
  CheckReport r = check_batched(n, [&](Graph& g, int i) {
    Expr h0 = g.input(data({6}, i));
    Expr k0 = g.input(at::full({}, static_cast<double>(i % 5)));
    std::vector<Expr> out = dsl::loop(
        {h0, k0}, [](const std::vector<Expr>& s) { return s[1] > 0.5; },
        [&](const std::vector<Expr>& s) {
          return std::vector<Expr>{dsl::tanh(dsl::affine(p.W, s[0], p.b)), s[1] - 1.0};
        });
    return dsl::sum(out[0] * out[0]);
  }, {.params = p.all()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

// A lookup's backward reads the ids the round handed its launch (a view of
// the round's index buffer); later rounds of the same forward must not write
// over them (the executor reuses the buffer only when nothing holds it).
TEST_CASE("loop: embedding gradients after rounds that follow the lookups", "[dsl][control][checker]") {
  P p;
  const at::Tensor E = param({40, 6}, 4);
  CheckReport r = check_batched(24, [&](Graph& g, int i) {
    Expr h0 = g.lookup(E, (i * 7) % 40) + g.lookup(E, (i * 13 + 5) % 40);
    Expr k0 = g.input(at::full({}, static_cast<double>(i % 4)));
    std::vector<Expr> out = dsl::loop(
        {h0, k0}, [](const std::vector<Expr>& s) { return s[1] > 0.5; },
        [&p, &E, &g, i](const std::vector<Expr>& s) {  // runs during forward: i by value
          return std::vector<Expr>{dsl::tanh(dsl::affine(p.W, s[0], p.b)) + g.lookup(E, (i * 3 + 1) % 40),
                                   s[1] - 1.0};
        });
    return dsl::sum(out[0] * out[0]);
  }, {.params = {p.W, p.b, E}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("cond: a batch read in several rounds gets one gradient buffer, not one per round",
          "[dsl][control][checker]") {
  // The words are read by round 1 (the product) and, after the cond, by
  // round 2 (either branch), both times a few rows of the lookup batch.
  P p;
  const at::Tensor E = param({40, 6}, 5);
  auto program = [&](Graph& g, int i) {
    const Expr a = g.lookup(E, (i * 7) % 40), b = g.lookup(E, (i * 11 + 3) % 40);
    const Expr h = dsl::tanh(dsl::affine(p.W, a * b, p.b));
    const Expr out = dsl::cond(dsl::sum(h) > 0.0, [=] { return h * a; }, [=] { return h - b; });
    return dsl::sum(out * out);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(16, program, {.params = {p.W, p.b, E}}));

  Graph g;
  Expr word;  // example 0's first word: a row of the lookup batch
  const std::vector<Expr> losses = test::forward_examples(g, 16, [&](Graph& pg, int i) {
    if (i == 0) word = pg.lookup(E, 0);
    return program(pg, i);
  });
  REQUIRE(g.stats().rounds >= 2);
  // Every hub in the autograd graph hands its buffer to a different place,
  // and each reader node of a hub is counted.
  at::Tensor total = losses[0].value();
  for (size_t i = 1; i < losses.size(); ++i) total = total + losses[i].value();
  std::vector<torch::autograd::Node*> stack{total.grad_fn().get()}, seen;
  std::map<std::pair<torch::autograd::Node*, uint32_t>, int> hubs_into;
  std::map<torch::autograd::Node*, std::set<torch::autograd::Node*>> readers;
  while (!stack.empty()) {
    torch::autograd::Node* f = stack.back();
    stack.pop_back();
    if (f == nullptr || std::find(seen.begin(), seen.end(), f) != seen.end()) continue;
    seen.push_back(f);
    if (f->name() == "sheaf::GatherHub") ++hubs_into[{f->next_edges()[0].function.get(), f->next_edges()[0].input_nr}];
    for (const torch::autograd::Edge& e : f->next_edges()) {
      if (e.function && e.function->name() == "sheaf::GatherHub") readers[e.function.get()].insert(f);
      stack.push_back(e.function.get());
    }
  }
  REQUIRE_FALSE(hubs_into.empty());
  for (const auto& [into, count] : hubs_into) CHECK(count == 1);
  // The lookup batch's one hub has readers from both rounds: round 1's
  // product reads both words, round 2's branches one each (either branch
  // taken by some example), so more readers than one round makes.
  torch::autograd::Node* lookups = word.value().grad_fn()->next_edges()[0].function.get();
  torch::autograd::Node* hub = nullptr;
  for (const auto& [h, rs] : readers)
    if (h->next_edges()[0].function.get() == lookups) hub = h;
  REQUIRE(hub != nullptr);
  CHECK(readers[hub].size() >= 3);
}

TEST_CASE("loop: halting on a computed probability", "[dsl][control][checker]") {
  // Adaptive computation: keep transforming until a sigmoid readout passes 0.8.
  P p;
  CheckReport r = check_batched(12, [&](Graph& g, int i) {
    Expr h = g.input(data({6}, i));
    return dsl::loop(h, [&](Expr s) { return dsl::sigmoid(dsl::sum(s)) < 0.8; },
                     [&](Expr s) { return s + dsl::sigmoid(dsl::matmul(p.V, s)) * 0.5 + 0.1; }, 200);
  }, {.params = p.all()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("a cond or loop whose result is a shared value in some examples batches with per-example ones",
          "[dsl][control][checker]") {
  // One example's branch returns a parameter (a learned default), another's
  // its own value: what reads the result is one batch, and each row must read
  // its own example's value, not the first row's shared one.
  const int n = GENERATE(2, 7, 64);
  P p;
  const at::Tensor h0 = param({6}, 9);
  std::vector<at::Tensor> params = p.all();
  params.push_back(h0);
  auto declared = [&](Graph& g, int i) {
    Expr x = g.input(data({6}, i));
    Expr d = g.param(h0);
    Expr h = dsl::cond(dsl::sum(x) > 0.0, [x] { return dsl::tanh(x); }, [d] { return d; }, Shape{6});
    return dsl::affine(p.W, h, p.b);  // recorded before the branch is known: its signature reads h as per-example
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, declared, {.params = params}));
  auto undeclared = [&](Graph& g, int i) {
    Expr x = g.input(data({6}, i));
    Expr d = g.param(h0);
    Expr h = dsl::cond(dsl::sum(x) > 0.0, [d] { return d; }, [x] { return dsl::tanh(x); });
    return dsl::affine(p.W, h, p.b) + dsl::tanh(h);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, undeclared, {.params = params}));
  // The result itself as the output (read by the checker's gradient seed
  // after forward, once resolved). The declared and loop cases are the ones
  // that failed without the per-example copy.
  auto bare = [&](Graph& g, int i) {
    Expr x = g.input(data({6}, i));
    Expr d = g.param(h0);
    return dsl::cond(dsl::sum(x) > 0.0, [d] { return d; }, [x] { return dsl::tanh(x); });
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, bare, {.params = params}));
  // A loop that runs no step in some examples ends on its shared initial state.
  auto looped = [&](Graph& g, int i) {
    Expr x = g.input(data({6}, i));
    Expr steps = dsl::sum(x);
    std::vector<Expr> out = dsl::loop(
        {g.param(h0), steps}, [](const std::vector<Expr>& s) { return s[1] > 0.0; },
        [&](const std::vector<Expr>& s) { return std::vector<Expr>{dsl::tanh(dsl::affine(p.W, s[0], p.b)), s[1] - 1.0}; });
    return dsl::affine(p.V, out[0], p.b);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, looped, {.params = params}));
}

TEST_CASE("a cond whose branch returns the cond's own result is a UserError and not a hang",
          "[dsl][control][errors]") {
  Graph g;
  auto s = g.example(3);
  Expr x = g.input(at::ones({3}));
  Expr h = x;
  h = dsl::cond(dsl::sum(x) > 0.0, [&h] { return h; }, [x] { return -x; });  // [&h]: h is the cond by then
  REQUIRE_THROWS_WITH(g.forward(h), Contains("op 'cond'") && Contains("example 3") && Contains("its own result") &&
                                        Contains("test_control"));
  Graph k;
  Expr y = k.input(at::ones({3}));
  Expr a, b;
  a = dsl::cond(dsl::sum(y) > 0.0, [&b] { return b; }, [y] { return y; }, Shape{3});
  b = dsl::cond(dsl::sum(y) > 0.0, [&a] { return a; }, [y] { return y; }, Shape{3});  // a -> b -> a
  REQUIRE_THROWS_WITH(k.forward(a), Contains("op 'cond'") && Contains("its own result"));
}

TEST_CASE("split of a cond's result: sizes that do not cover the axis are an error once the branch is known",
          "[dsl][control][errors]") {
  Graph g;
  auto s = g.example(1);
  Expr x = g.input(at::arange(5, at::kFloat));
  Expr c = dsl::cond(dsl::sum(x) > 0.0, [x] { return x * 2.0; }, [x] { return -x; });  // [5], known at forward
  std::vector<Expr> short_parts = dsl::split(c, std::vector<int64_t>{2, 2});  // the fifth element left out
  REQUIRE_THROWS_WITH(g.forward(short_parts[0]), Contains("op 'split'") && Contains("example 1") &&
                                                     Contains("add up to 4") && Contains("[5]") &&
                                                     Contains("test_control"));
  // Sizes that cover it, along axis 0 or -1: the pieces (refused before with a positive axis).
  for (int axis : {0, -1}) {
    Graph k;
    Expr y = k.input(at::arange(5, at::kFloat));
    Expr d = dsl::cond(dsl::sum(y) > 0.0, [y] { return y * 2.0; }, [y] { return -y; });
    std::vector<Expr> parts = dsl::split(d, std::vector<int64_t>{2, 3}, axis);
    k.forward(parts);
    CHECK(at::equal(parts[1].value(), at::arange(2, 5, at::kFloat) * 2.0));
  }
}

TEST_CASE("forward inside a cond branch of the same graph's forward is a UserError", "[dsl][control][errors]") {
  // The outer forward is still delivering this round's values (on a GPU, host
  // copies that a nested forward's fetch would free).
  Graph g;
  auto s = g.example(2);
  Expr x = g.input(at::ones({3}));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, [&g, x] {
    Expr t = dsl::tanh(x);
    g.forward(t);
    return t;
  }, [x] { return -x; });
  REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'forward'") && Contains("inside a dsl::cond branch") &&
                                        Contains("test_control"));
  Graph k;  // another graph's forward inside a branch is that graph's business
  Graph other;
  Expr o = dsl::tanh(other.input(at::ones({2})));
  Expr z = k.input(at::ones({3}));
  Expr w = dsl::cond(dsl::sum(z) > 0.0, [&other, o, z] {
    other.forward(o);
    return z * o.value().sum().item<double>();
  }, [z] { return -z; });
  k.forward(w);
  CHECK(at::allclose(w.value(), at::ones({3}) * std::tanh(1.0) * 2.0));
}

TEST_CASE("a cond whose branch computes from the cond's own result is a UserError naming the cond",
          "[dsl][control][errors]") {
  // (Not a hang before either: the round finds nothing it can compute.)
  Graph g;
  Expr x = g.input(at::ones({3}));
  Expr h = x;
  h = dsl::cond(dsl::sum(x) > 0.0, [&h] { return h * 2.0; }, [x] { return -x; });  // reads itself
  REQUIRE_THROWS_WITH(g.forward(h), Contains("could not be computed") && Contains("dsl::cond") &&
                                        Contains("test_control"));
}

TEST_CASE("control flow errors name op, example and line", "[dsl][control][errors]") {
  Graph g;
  auto s = g.example(4);
  Expr x = g.input(at::ones({3}));
  REQUIRE_THROWS_WITH(dsl::cond(x, [x] { return x; }, [x] { return x; }),
                      Contains("op 'cond'") && Contains("example 4") && Contains("scalar") && Contains("test_control"));
  Expr forever = dsl::loop(dsl::sum(x), [](Expr v) { return v > -1.0; }, [](Expr v) { return v + 1.0; }, 10);
  REQUIRE_THROWS_WITH(g.forward(forever), Contains("op 'loop'") && Contains("example 4") && Contains("max_iterations = 10"));

  Graph h;
  Expr y = h.input(at::ones({3}));
  Expr bad = dsl::loop(y, [](Expr v) { return dsl::sum(v) > 0.0; }, [](Expr v) { return dsl::sum(v) - 5.0; });
  REQUIRE_THROWS_WITH(h.forward(bad), Contains("op 'loop'") && Contains("shape []") && Contains("[3]"));

  Graph k;
  Expr z = k.input(at::ones({3}));
  Expr c = dsl::cond(dsl::sum(z) > 0.0, [z] { return dsl::concat({z, z}); }, [z] { return z; });
  REQUIRE_THROWS_WITH(c.shape(), Contains("not known yet"));
  Expr w = dsl::affine(param({2, 3}, 7), c, param({2}, 8));  // wrong once the branch gives [6]
  REQUIRE_THROWS_WITH(k.forward(w), Contains("op 'affine'") && Contains("[6]") && Contains("test_control"));
}

namespace {

// A per-example coroutine: host code branches on computed values.
Task<Expr> collatz_like(Graph& g, Expr x, const P& p) {
  Expr h = x;
  for (int step = 0; step < 6; ++step) {
    double v = co_await fetch_item(dsl::sum(h));
    if (v > 0) h = dsl::tanh(dsl::affine(p.W, h, p.b));
    else h = dsl::sigmoid(dsl::matmul(p.V, h)) - 0.25;
    if (std::abs(v) > 2.5) break;  // an example-dependent trip count
  }
  (void)g;
  co_return h;
}

Task<Expr> tree_sum(Graph& g, int depth, Expr x) {
  // Recursion through co_await of sub-tasks, with a computed decision at each level.
  if (depth == 0) co_return x;
  int64_t which = co_await fetch_argmax(x);
  Expr left = co_await tree_sum(g, depth - 1, x * 0.5);
  Expr right = co_await tree_sum(g, depth - 1, dsl::tanh(x));
  co_return which % 2 ? left + right : left - right;
}

}  // namespace

TEST_CASE("tasks: host code following computed values, batched equals alone", "[dsl][control][task][checker]") {
  const int n = GENERATE(1, 5, 33);
  P p;
  TaskProgram prog = [&](Graph& g, int i) { return collatz_like(g, g.input(data({6}, i) * 2.0), p); };
  CheckReport r = check_batched(n, prog, {.params = p.all()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);

  TaskProgram rec = [&](Graph& g, int i) { return tree_sum(g, 3, g.input(data({6}, i))); };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, rec));
}

namespace {

// An awaiter of the user's own that can be neither copied nor moved, which
// suspends and is resumed by hand: a Task awaits it where it lies (named or
// a temporary of the co_await), not a copy.
std::coroutine_handle<> g_parked;
struct Parked {
  int value;
  bool alive = true;  // a temporary destroyed before its co_await resumed reads -1
  explicit Parked(int v) : value(v) {}
  Parked(const Parked&) = delete;
  Parked& operator=(const Parked&) = delete;
  ~Parked() { alive = false; }
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) noexcept { g_parked = h; }
  int await_resume() const noexcept { return alive ? value : -1; }
};

// Resumes a task parked on a Parked awaiter `parks` times by hand: it must
// stay unfinished until the last.
void resume_parked(const Task<int>& t, int parks) {
  for (int k = 0; k < parks; ++k) {
    REQUIRE(!t.done());
    std::exchange(g_parked, {}).resume();
  }
  REQUIRE(t.done());
}

Task<int> await_parked() {
  Parked named(3);
  const int a = co_await named;
  const int b = co_await Parked(4);
  co_return 10 * a + b;
}

// Awaitables with an operator co_await of their own: co_await applies it, as
// the standard says, even to one that is an awaiter itself, and awaits what
// it returns; the awaitable need not be copyable.
struct Ready {
  int value;
  bool await_ready() const noexcept { return true; }
  void await_suspend(std::coroutine_handle<>) const noexcept {}
  int await_resume() const noexcept { return value; }
};
struct Both : Ready {  // an awaiter whose operator co_await gives another
  Ready operator co_await() const noexcept { return {value + 1}; }
};
struct Holder {  // neither copyable nor movable; its operator hands out the awaiter it holds
  Parked inner;
  explicit Holder(int v) : inner(v) {}
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  Parked& operator co_await() noexcept { return inner; }
};
struct Unmovable {  // an awaiter returned by value that cannot be moved
  int value;
  explicit Unmovable(int v) : value(v) {}
  Unmovable(const Unmovable&) = delete;
  Unmovable& operator=(const Unmovable&) = delete;
  bool await_ready() const noexcept { return true; }
  void await_suspend(std::coroutine_handle<>) const noexcept {}
  int await_resume() const noexcept { return value; }
};
struct Maker {
  int value;
  Unmovable operator co_await() const { return Unmovable(value); }
};
struct Twice {  // its operator returns an awaiter with an operator of its own: not applied again
  Both operator co_await() const noexcept { return Both{{10}}; }
};
struct Token {  // awaited through a free operator co_await
  int value;
};
Ready operator co_await(Token t) noexcept { return {t.value * 10}; }

Task<int> await_through_operators() {
  const int a = co_await Both{{1}};  // 2: the operator's awaiter, not Both's own await_resume
  Holder named(3);
  const int b = co_await named;       // parks
  const int c = co_await Holder(4);   // parks; the temporary lives until it resumes
  const int d = co_await Token{5};
  const int e = co_await Maker{6};
  const int f = co_await Twice{};  // 10: Both awaited as the awaiter it is
  co_return 1000000 * f + 10000 * a + 1000 * b + 100 * c + 10 * d + e;
}

}  // namespace

TEST_CASE("tasks: an awaiter of the user's own, neither copyable nor movable, is awaited in place", "[dsl][control][task]") {
  Task<int> t = await_parked();
  resume_parked(t, 2);
  CHECK(t.result() == 34);
}

namespace {
// A helper that returns a named fetch awaiter: moved out, before it is awaited.
auto fetch_sum(Expr e) {
  auto a = fetch_item(dsl::sum(e));
  return a;
}
}  // namespace

TEST_CASE("tasks: a fetch awaiter returned by name from a helper is awaited", "[dsl][control][task]") {
  Graph g;
  auto body = [](Graph& g, double k) -> Task<double> {
    Expr x = g.input(at::ones({3}) * k);  // (GCC 12: no braced list inside a co_await)
    co_return co_await fetch_sum(x);
  };
  std::vector<Task<double>> tasks;
  for (int i = 0; i < 3; ++i) {
    auto scope = g.example(i);
    tasks.push_back(body(g, i + 1.0));
  }
  g.forward();
  for (int i = 0; i < 3; ++i) {
    REQUIRE(tasks[static_cast<size_t>(i)].done());
    CHECK(tasks[static_cast<size_t>(i)].result() == 3.0 * (i + 1));
  }
  // The awaiter moved from waits for nothing: awaiting it is an error.
  auto twice = [](Graph& g) -> Task<double> {
    Expr x = g.input(at::ones({3}));
    auto a = fetch_item(dsl::sum(x));
    auto b = std::move(a);
    co_return co_await a + co_await b;
  };
  REQUIRE_THROWS_WITH(twice(g), Contains("fetch awaiter that was moved from"));
}

TEST_CASE("tasks: an awaitable's own operator co_await is applied and what it returns awaited in place",
          "[dsl][control][task]") {
  Task<int> t = await_through_operators();
  resume_parked(t, 2);  // named and temporary Holder
  CHECK(t.result() == 10 * 1000000 + 2 * 10000 + 3 * 1000 + 4 * 100 + 50 * 10 + 6);
}

TEST_CASE("tasks: one fetch per step for all examples, result() before forward is an error", "[dsl][control][task]") {
  P p;
  Graph g;
  std::vector<Task<Expr>> tasks;
  for (int i = 0; i < 16; ++i) {
    auto s = g.example(i);
    tasks.push_back(collatz_like(g, g.input(data({6}, i) * 2.0), p));
  }
  REQUIRE_THROWS_WITH(tasks[0].result(), Contains("has not finished"));
  g.forward();
  for (auto& t : tasks) CHECK(t.done());
  CHECK(g.stats().fetches <= 6);
  CHECK(g.stats().rounds <= 7);
  CHECK(tasks[3].result().example() == 3);
}

TEST_CASE("tasks: result() of a task whose wait went with its graph's clear() or destruction says so",
          "[dsl][control][task][errors]") {
  auto waits = [](Expr x) -> Task<double> { co_return co_await fetch_item(dsl::sum(x)); };
  auto outer = [&](Expr x) -> Task<double> { co_return co_await waits(x); };
  Graph g;
  Task<double> direct = waits(g.input(at::ones({3})));
  Task<double> nested = outer(g.input(at::ones({3})));
  std::optional<Task<double>> orphan;
  {
    Graph gone;
    orphan.emplace(waits(gone.input(at::ones({3}))));
  }
  CHECK_THROWS_WITH(direct.result(), Contains("has not finished") && Contains("forward"));
  g.clear();
  g.forward();  // nothing left to run: the waits went with the clear
  for (Task<double>* t : {&direct, &nested, &*orphan}) {
    CHECK_FALSE(t->done());
    CHECK_THROWS_WITH(t->result(), Contains("will never finish") && Contains("cleared or destroyed"));
  }
}

TEST_CASE("tasks: an error inside a task surfaces from forward", "[dsl][control][task][errors]") {
  Graph g;
  auto body = [](Graph& g) -> Task<Expr> {
    Expr x = g.input(at::ones({3}));
    double v = co_await fetch_item(dsl::sum(x));
    co_return dsl::pick(x, static_cast<int64_t>(v));  // index 3 of a [3] vector
  };
  Task<Expr> t = body(g);
  REQUIRE_THROWS_WITH(g.forward(), Contains("op 'pick'") && Contains("out of range"));
}

TEST_CASE("tasks: an error before a task's first co_await surfaces from the call, and nothing is freed twice",
          "[dsl][control][task][errors]") {
  Graph g;
  auto body = [](Graph& g, int64_t id) -> Task<Expr> {
    Expr x = g.input(at::ones({3}));
    Expr y = dsl::pick(x, id);  // id 3 is out of range: throws during the first run
    co_return dsl::sum(y) + co_await fetch_item(dsl::sum(x));
  };
  std::vector<Task<Expr>> tasks;
  for (int i = 0; i < 3; ++i) {
    auto scope = g.example(i);
    if (i == 1) REQUIRE_THROWS_WITH(tasks.push_back(body(g, 3)), Contains("op 'pick'") && Contains("example 1"));
    else tasks.push_back(body(g, 0));
  }
  g.forward();  // the other examples finish
  for (Task<Expr>& t : tasks) {
    REQUIRE(t.done());
    CHECK(t.result().value().item<double>() == 4.0);
  }
}

TEST_CASE("tasks: values fetched in one round stay valid while earlier callbacks record new shapes",
          "[dsl][control][task]") {
  // Every example's callback records a node of a shape never seen before, which
  // grows the graph's shape table while later examples' fetched values are
  // still to be handed over (a dangling shape once read garbage here).
  Graph g;
  auto body = [](Graph& g, int64_t i) -> Task<Expr> {
    Expr x = g.input(at::arange(3 + i, at::kFloat));
    at::Tensor v = co_await fetch(x);
    if (v.numel() != 3 + i || v[v.numel() - 1].item<double>() != 2.0 + static_cast<double>(i))
      throw std::runtime_error("fetched a wrong value");
    Expr grown = g.zeros({static_cast<int64_t>(100 + i)});  // a new shape per example
    co_return dsl::sum(x) + dsl::sum(grown);
  };
  std::vector<Task<Expr>> tasks;
  for (int64_t i = 0; i < 40; ++i) {
    auto scope = g.example(i);
    tasks.push_back(body(g, i));
  }
  g.forward();
  for (int64_t i = 0; i < 40; ++i) {
    REQUIRE(tasks[static_cast<size_t>(i)].done());
    CHECK(tasks[static_cast<size_t>(i)].result().item() == Approx((2.0 + static_cast<double>(i)) * (3.0 + static_cast<double>(i)) / 2));
  }
}

namespace {

// A greedy decoder's shape: each step's state is awaited (the host decides
// whether to go on), each step's loss is not (it is only summed at the end).
// The word vectors are recorded up front, one read per step.
Task<Expr> decode(Graph& g, int example, const P& p) {
  std::vector<Expr> words;
  for (int t = 0; t < 8; ++t) words.push_back(g.input(data({6}, 100 * example + t)));
  Expr h = words[0];
  std::vector<Expr> losses;
  for (int t = 1; t < 8; ++t) {
    h = dsl::tanh(dsl::affine(p.W, h, p.b) + words[static_cast<size_t>(t)]);
    losses.push_back(dsl::sum(dsl::sigmoid(dsl::matmul(p.V, h)) * h));
    const double v = co_await fetch_item(dsl::sum(h));
    if (t >= 2 + example % 5 && v > -100.0) break;  // an example-dependent trip count, on a fetched value
  }
  co_return dsl::sum(losses);
}

}  // namespace

TEST_CASE("deferral: what control flow does not await waits, and batches across steps", "[dsl][control][task][launches]") {
  P p;
  auto run = [&](bool defer) {
    Graph g(GraphOptions{.defer_unawaited = defer});
    std::vector<Task<Expr>> tasks;
    for (int i = 0; i < 16; ++i) {
      auto s = g.example(i);
      tasks.push_back(decode(g, i, p));
    }
    g.forward();
    std::vector<at::Tensor> out;
    for (auto& t : tasks) out.push_back(t.result().value());
    return std::pair{at::stack(out), g.stats()};
  };
  const auto [eager, eager_stats] = run(false);
  const auto [deferred, stats] = run(true);
  CHECK(at::allclose(eager, deferred, 1e-6, 1e-6));
  CHECK(eager_stats.deferred == 0);
  CHECK(stats.deferred > 0);
  CHECK(stats.rounds <= eager_stats.rounds + 1);
  // Eager, each of the 6 steps launches its losses (and the last steps' sums);
  // deferred, they run together at the end. The word vectors, recorded up
  // front, still run in the first round: deferring them would cost a launch
  // per step instead.
  INFO("eager " << eager_stats.str() << "\ndeferred " << stats.str());
  CHECK(stats.batches + 4 <= eager_stats.batches);
}

TEST_CASE("deferral: batched equals alone, values and gradients", "[dsl][control][task][checker]") {
  const int n = GENERATE(1, 9, 32);
  P p;
  TaskProgram prog = [&](Graph& g, int i) { return decode(g, i, p); };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, prog, {.params = p.all()}));
}

TEST_CASE("deferral: a cond's branch, recorded while control flow waits, runs when what awaits it can",
          "[dsl][control][launches]") {
  // The branch, recorded by the cond's callback, feeds what the coroutine
  // awaits through the cond's result (a placeholder). That await registers
  // only once the placeholder's shape is known, so the branch's round runs
  // with no waiter live: this checks values and rounds; the walk through a
  // resolved placeholder in mark_runnable is the next test's.
  P p;
  uint64_t eager_rounds = 0;
  for (const bool defer : {false, true}) {
    Graph g(GraphOptions{.defer_unawaited = defer});
    std::vector<Task<Expr>> tasks;
    auto body = [&](Graph& g, int i) -> Task<Expr> {
      Expr x = g.input(data({6}, i));
      Expr y = dsl::cond(dsl::sum(x) > 0.0, [&, x] { return dsl::tanh(dsl::matmul(p.V, x)); },
                         [x] { return dsl::sigmoid(x); });
      Expr side = dsl::sum(y * y);  // not awaited
      const double v = co_await fetch_item(dsl::sum(y));
      (void)g;
      co_return v > 0 ? side : side * 2.0;
    };
    for (int i = 0; i < 8; ++i) {
      auto s = g.example(i);
      tasks.push_back(body(g, i));
    }
    g.forward();
    for (int i = 0; i < 8; ++i) {
      const at::Tensor x = data({6}, i);
      const at::Tensor y = x.sum().item<double>() > 0 ? at::tanh(at::mv(p.V, x)) : at::sigmoid(x);
      const double expected = (y * y).sum().item<double>() * (y.sum().item<double>() > 0 ? 1.0 : 2.0);
      CHECK(tasks[static_cast<size_t>(i)].result().item() == Approx(expected).epsilon(1e-5));
    }
    // The branch runs in the round after the cond, as eagerly: deferring it
    // until nothing else can run would cost a round.
    if (!defer) eager_rounds = g.stats().rounds;
    else CHECK(g.stats().rounds == eager_rounds);
  }
}

TEST_CASE("deferral: a loop's result, awaited before the loop ends, runs what it resolves to",
          "[dsl][control][task][launches]") {
  // The await on a loop's result (a placeholder of known shape) registers at
  // once; the loop's predicate reads only the counter, so each iteration's
  // accumulator is deferred. Odd examples loop long first and short after
  // their await, even ones the other way round. When an even example's loop
  // resolves, mark_runnable walks on from its placeholder to the deferred
  // accumulator, which runs at once while the odd loops go on: the rounds stay
  // eager's. Without that walk it would wait for a round in which no waiter is
  // served, after the odd loops (24 rounds against 17 when it was taken out).
  auto body = [](Graph& g, int i) -> Task<Expr> {
    const double trips = i % 2 ? 8.0 : 1.0, trips_after = i % 2 ? 1.0 : 12.0;
    auto count_down = [](const std::vector<Expr>& s) { return s[0] > 0.0; };
    auto step = [](const std::vector<Expr>& s) { return std::vector<Expr>{s[0] - 1.0, s[1] * 0.5 + 1.0}; };
    std::vector<Expr> out = dsl::loop({g.input(at::full({}, trips)), g.input(data({6}, i))}, count_down, step);
    const double v = co_await fetch_item(dsl::sum(out[1]));
    std::vector<Expr> again =
        dsl::loop({g.input(at::full({}, trips_after)), out[1] * (v > 0 ? 1.0 : 2.0)}, count_down, step);
    co_return dsl::sum(again[1]);
  };
  auto expected = [](int i) {
    at::Tensor a = data({6}, i);
    for (int t = 0; t < (i % 2 ? 8 : 1); ++t) a = a * 0.5 + 1.0;
    if (a.sum().item<double>() <= 0) a = a * 2.0;
    for (int t = 0; t < (i % 2 ? 1 : 12); ++t) a = a * 0.5 + 1.0;
    return a.sum().item<double>();
  };
  uint64_t eager_rounds = 0;
  for (const bool defer : {false, true}) {
    Graph g(GraphOptions{.defer_unawaited = defer});
    std::vector<Task<Expr>> tasks;
    for (int i = 0; i < 8; ++i) {
      auto s = g.example(i);
      tasks.push_back(body(g, i));
    }
    g.forward();
    for (int i = 0; i < 8; ++i)
      CHECK(tasks[static_cast<size_t>(i)].result().item() == Approx(expected(i)).epsilon(1e-5));
    INFO((defer ? "deferred " : "eager ") << g.stats().str());
    if (!defer) eager_rounds = g.stats().rounds;
    else {
      CHECK(g.stats().deferred > 0);
      CHECK(g.stats().rounds == eager_rounds);
    }
  }
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(8, TaskProgram(body)));
}

TEST_CASE("deferral: value() of an unawaited node inside a coroutine says to await it", "[dsl][control][task][errors]") {
  P p;
  Graph g;
  auto body = [&](Graph& g) -> Task<Expr> {
    Expr h = g.input(data({6}, 1));
    const double v0 = co_await fetch_item(dsl::sum(h));
    Expr side = dsl::sum(h * h);  // recorded by control flow, never awaited: deferred
    Expr h2 = dsl::tanh(dsl::affine(p.W, h, p.b));
    const double v1 = co_await fetch_item(dsl::sum(h2));
    (void)v0;
    (void)v1;
    (void)side.item();  // not run yet
    co_return h2;
  };
  Task<Expr> t = body(g);
  REQUIRE_THROWS_WITH(g.forward(), Contains("only awaited values have run") && Contains("defer_unawaited"));
}

TEST_CASE("tasks: what a task records after awaiting another graph's value keeps its example in every graph",
          "[dsl][control][task]") {
  Graph a, b;  // a: the task's own graph; b: another graph whose values it awaits
  auto awaited = [](Graph& b, int i, double v) {
    auto in_b = b.example(100 + i);
    return dsl::sum(b.input(at::full({2}, v)));
  };
  auto body = [&](Graph& a, Graph& b, int i) -> Task<Expr> {
    const double v = co_await fetch_item(awaited(b, i, i));  // resumed by b's forward, under b's example
    Expr x = a.input(at::full({3}, v));                       // recorded into a: still example i
    const double w = co_await fetch_item(awaited(b, i, v));  // resumed by b again: a's scope carried on
    co_return x + a.input(at::full({3}, w));
  };
  std::vector<Task<Expr>> tasks;
  for (int i = 1; i <= 3; ++i) {
    auto in_a = a.example(i);
    tasks.push_back(body(a, b, i));
  }
  b.forward();  // resumes each task twice: it records into a
  CHECK(a.current_example() == 0);  // the scopes a task resumed under are gone again
  CHECK(b.current_example() == 0);
  a.forward();
  for (int i = 1; i <= 3; ++i) {
    const Expr r = tasks[static_cast<size_t>(i - 1)].result();
    CHECK(r.example() == i);
    CHECK(r.value()[0].item<double>() == Approx(6.0 * i));  // v = 2i, w = 2v
  }
}

TEST_CASE("tasks: a task started in a cond's branch keeps the branch's example after awaiting another graph",
          "[dsl][control][task]") {
  Graph a, b;
  auto body = [](Graph& a, Graph& b, Expr x) -> Task<Expr> {
    Expr y = dsl::sum(b.input(at::ones({2})));
    const double v = co_await fetch_item(y);
    Expr one = a.input(at::ones({1}));  // a source node: tagged with a's current example
    co_return x * v + one;              // recorded into a, by b's forward
  };
  std::vector<Task<Expr>> tasks;
  for (int i = 1; i <= 3; ++i) {
    auto in_a = a.example(i);
    Expr x = a.input(at::full({1}, static_cast<double>(i)));
    (void)dsl::cond(dsl::sum(x) > 0.0, [&, x] {
      tasks.push_back(body(a, b, x));  // run by a's forward, in example i
      return x;
    }, [x] { return x; });
  }
  a.forward();  // the branches start the tasks
  REQUIRE(tasks.size() == 3);
  b.forward();  // resumes them: each records into a
  a.forward();
  for (int i = 1; i <= 3; ++i) {
    CHECK(tasks[static_cast<size_t>(i - 1)].result().example() == i);
    CHECK(tasks[static_cast<size_t>(i - 1)].result().item() == Approx(2.0 * i + 1.0));
  }
}

// A task made on one thread with a scope of graph g in its frame, finished on
// another (as a Prefetcher's worker makes tasks that forward finishes): the
// scope stays listed on the first thread. After g.clear() it must not come
// back: a task made there later, not in any scope of g, records into g under
// g's own example, not the old scope's.
TEST_CASE("tasks: a scope that ended on another thread is forgotten when its graph is cleared",
          "[dsl][control][task]") {
  Graph g, b, c;
  Expr bx = b.input(at::ones({1}));
  Expr cx = c.input(at::ones({1}));
  std::optional<Task<int>> first, second;
  Expr recorded;
  std::promise<void> made, finished, made_second;
  std::thread other([&] {
    first = [](Graph& g, Expr bx) -> Task<int> {
      auto in_g = g.example(5);  // in the frame: ends where the task ends
      co_await fetch_item(bx);
      co_return 0;
    }(g, bx);
    made.set_value();
    finished.get_future().wait();  // finished on the main thread
    g.clear();
    second = [](Graph& g, Expr cx, Expr& recorded) -> Task<int> {
      co_await fetch_item(cx);
      recorded = g.input(at::ones({1}));  // in g's example when it suspended: 0
      co_return 0;
    }(g, cx, recorded);
    made_second.set_value();
  });
  made.get_future().wait();
  b.forward();
  CHECK(first->done());
  finished.set_value();
  made_second.get_future().wait();
  other.join();
  c.forward();
  REQUIRE(second->done());
  CHECK(recorded.example() == 0);
}

// A scope that ended on another thread stays listed on its own (above); a
// later scope made at its address there, whose listing is dropped while it
// lives (its graph cleared, then a task suspends), must end only itself. A
// scope named by its address ended the older listing instead, and set its
// graph's example back.
TEST_CASE("tasks: a scope ends its own listing, not an older one left at its address by another thread",
          "[dsl][control][task]") {
  Graph g, h, c;
  Expr cx = c.input(at::ones({1}));
  struct Held {
    Graph::ExampleScope scope;
    Held(Graph& graph, int64_t id) : scope(graph.example(id)) {}
  };
  alignas(Held) unsigned char at[sizeof(Held)];  // both scopes live here: one address
  std::optional<Task<int>> waits;
  int64_t after = -1;
  std::promise<void> made, ended;
  std::thread other([&] {
    new (at) Held(g, 5);
    made.set_value();
    ended.get_future().wait();  // ended on the main thread: its listing stays here
    Held* second = new (at) Held(h, 7);
    h.clear();
    waits = [](Expr cx) -> Task<int> {  // suspends: the cleared graph's listing is dropped
      co_await fetch_item(cx);
      co_return 0;
    }(cx);
    second->~Held();
    after = g.current_example();
  });
  made.get_future().wait();
  std::launder(reinterpret_cast<Held*>(at))->~Held();
  ended.set_value();
  other.join();
  CHECK(after == 5);  // the first scope's, in force until g's next clear()
  c.forward();
  CHECK(waits->done());
}

TEST_CASE("a graph destroyed by a callback of its own forward is a UserError and not a use after free",
          "[dsl][control][task]") {
  auto g = std::make_unique<Graph>();
  Expr x = g->input(at::ones({2}));
  Expr y = g->input(at::ones({3}));
  bool second_ran = false, stale = false;
  auto destroys = [&]() -> Task<double> {
    const double v = co_await fetch_item(dsl::sum(x));
    g.reset();  // inside g's forward
    try {
      (void)x.graph();  // its Exprs are stale at once, not a way to the freed Graph
    } catch (const UserError& e) {
      stale = std::string_view(e.what()).find("was destroyed since it was made") != std::string_view::npos;
    }
    co_return v;
  };
  auto after = [&]() -> Task<double> {  // due in the same delivery: dropped with the rest of the forward
    const double v = co_await fetch_item(dsl::sum(y));
    second_ran = true;
    co_return v;
  };
  Task<double> t = destroys();
  Task<double> u = after();
  Graph* raw = g.get();
  REQUIRE_THROWS_WITH(raw->forward(), Contains("destroyed by a callback of its own forward()"));
  CHECK(g == nullptr);
  REQUIRE(t.done());
  CHECK(t.result() == 2.0);
  CHECK_FALSE(second_ran);
  CHECK(stale);
  // A graph made now may take the freed one's slot: the dropped task's wait is not its.
  Graph h;
  h.forward(dsl::sum(h.input(at::ones({1}))));
  CHECK_FALSE(u.done());
}

TEST_CASE("tasks: an example scope kept in a task's frame may end after its graph", "[dsl][control][task]") {
  auto run = [](Graph& g, Expr x) -> Task<double> {
    auto scope = g.example(3);  // kept in the frame while the task waits
    co_return co_await fetch_item(dsl::sum(x));
  };
  std::vector<Task<double>> tasks;
  auto g = std::make_unique<Graph>();
  {
    Expr x = g->input(at::ones({2}));
    tasks.push_back(run(*g, x));
  }
  CHECK(g->current_example() == 3);  // the waiting task's scope is in force
  g.reset();
  tasks.clear();  // the scope ends now: its graph is gone, so nothing is set back (ASan's stage reads freed memory)
  // A scope whose graph lives on ends as before.
  Graph h;
  {
    Expr y = h.input(at::ones({2}));
    tasks.push_back(run(h, y));
  }
  CHECK(h.current_example() == 3);
  tasks.clear();
  CHECK(h.current_example() == 0);
}

// A scope kept in a suspended task's frame, begun inside an outer scope that
// ends first: the scopes end out of order. The example in force is the
// innermost listed scope's, and the one from before them all once every
// scope has ended (before, each end set back its own previous example: the
// outer's end set 0 while the task's scope was in force, and the tasks'
// ends, first to last, left example 3 current for good).
TEST_CASE("tasks: example scopes that end out of order leave the innermost in force and then none",
          "[dsl][control][task]") {
  auto run = [](Graph& g, Expr x, Expr& after) -> Task<double> {
    auto scope = g.example(7);  // kept in the frame while the task waits
    const double v = co_await fetch_item(dsl::sum(x));
    after = g.input(at::ones({1}));  // a source: tagged with the example in force
    co_return v;
  };
  for (const bool resumed : {false, true}) {
    Graph g;
    Expr x = g.input(at::ones({2}));
    std::vector<Expr> after(3);
    std::vector<Task<double>> tasks;
    for (int i = 1; i <= 3; ++i) {
      auto outer = g.example(i);
      tasks.push_back(run(g, x, after[static_cast<size_t>(i - 1)]));
      CHECK(g.current_example() == 7);
    }
    CHECK(g.current_example() == 7);  // the outer scopes ended; the waiting tasks' scopes are in force
    if (resumed) {
      g.forward();  // each task ends inside the forward's delivery
      for (size_t i = 0; i < 3; ++i) {
        CHECK(tasks[i].done());
        CHECK(after[i].example() == 7);
      }
    }
    tasks.clear();  // (not resumed: destroyed while waiting, first to last)
    CHECK(g.current_example() == 0);
    CHECK(g.input(at::ones({1})).example() == 0);
  }
}

TEST_CASE("tasks: a graph destroyed by a task while it runs under that graph's scope is left alone",
          "[dsl][control][task]") {
  auto a = std::make_unique<Graph>();
  Graph b;
  auto body = [&](Graph& b) -> Task<double> {
    Expr x = b.input(at::ones({2}));  // (GCC 12: no braced list inside a co_await)
    const double v = co_await fetch_item(dsl::sum(x));
    a.reset();  // resumed under a's scope too (held when it suspended)
    // Suspends again: the scopes it holds now name no freed graph (ASan's stage).
    const double w = co_await fetch_item(dsl::sum(x * 2.0));
    co_return v + w;
  };
  Task<double> t = [&] {
    auto in_a = a->example(5);
    return body(b);
  }();
  b.forward();
  CHECK(t.result() == 6.0);
  CHECK(a == nullptr);
}
