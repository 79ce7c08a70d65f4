// sheaf::Function: a body recorded once, called many times, one node per call.
// Batched calls must equal the same code written inline and each example alone
// (values and gradients, every strategy, fused or not).
#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;
using sheaf::test::param;

namespace {

constexpr int64_t kH = 6;

struct Cell {
  at::Tensor U = param({5 * kH, 2 * kH}, 11), b = param({5 * kH}, 12), V = param({3, kH}, 13), v = param({3}, 14);
  std::vector<at::Tensor> all() const { return {U, b, V, v}; }

  // A Tree-LSTM cell: h and c from the children's.
  std::array<Expr, 2> inline_cell(Expr hl, Expr cl, Expr hr, Expr cr) const {
    std::vector<Expr> g = dsl::chunk(dsl::affine(U, dsl::concat({hl, hr}), b), 5);
    Expr c = dsl::tanh(g[0]) * dsl::sigmoid(g[1]) + dsl::sigmoid(g[2]) * cl + dsl::sigmoid(g[3]) * cr;
    return {dsl::sigmoid(g[4]) * dsl::tanh(c), c};
  }
  TypedFunction<std::function<std::array<Expr, 2>(Expr, Expr, Expr, Expr)>> cell =
      function("cell", std::function<std::array<Expr, 2>(Expr, Expr, Expr, Expr)>(
                           [this](Expr hl, Expr cl, Expr hr, Expr cr) { return inline_cell(hl, cl, hr, cr); }));

  // A left-branching tree over example i's leaves (a different length per example).
  Expr tree(Graph& g, int i, bool use_function) const {
    const int leaves = 2 + i % 5;
    Expr h = g.input(data({kH}, i, 0)), c = g.zeros({kH});
    for (int k = 1; k < leaves; ++k) {
      Expr hr = g.input(data({kH}, i, k)), cr = g.zeros({kH});
      auto [h2, c2] = use_function ? cell(h, c, hr, cr) : inline_cell(h, c, hr, cr);
      h = h2;
      c = c2;
    }
    return dsl::pick_neg_log_softmax(dsl::affine(V, h, v), i % 3);
  }
};

std::vector<at::Tensor> batch_gradients(const Cell& m, int n, bool use_function, GraphOptions o = {}) {
  return test::gradients_of(m.all(), [&] {
    Graph g(o);
    std::vector<Expr> losses;
    for (int i = 0; i < n; ++i) {
      auto s = g.example(i);
      losses.push_back(m.tree(g, i, use_function));
    }
    Expr loss = dsl::sum(losses);
    g.forward(loss);
    return loss.value();
  });
}

}  // namespace

TEST_CASE("function: calls equal the same code inline, values and gradients", "[dsl][function]") {
  Cell m;
  for (bool fuse : {true, false}) {
    INFO("fuse " << fuse);
    test::require_all_close(batch_gradients(m, 13, true, {.fuse = fuse}), batch_gradients(m, 13, false, {.fuse = fuse}));
  }
}

TEST_CASE("function: batched calls equal each example alone (checker, every strategy)", "[dsl][function][checker]") {
  Cell m;
  const int n = GENERATE(1, 5, 16);
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, [&](Graph& g, int i) { return m.tree(g, i, true); }, {.params = m.all()}));
}

TEST_CASE("function: bodies of every kind batch like inline code", "[dsl][function][checker]") {
  const at::Tensor W = param({4, 4}, 21), w = param({4}, 22), M = param({3, 4}, 23);
  // Results of rank 2 and 0 next to a vector; a shared argument; a nested call;
  // a segmented sum and a payload op (pick) inside; work the results do not need.
  auto inner = function("inner", [&](Expr x) { return dsl::tanh(dsl::affine(W, x, w)) * 2.0; });
  auto outer = function("outer", [&](Expr x, Expr shared_b) {
    Expr y = inner(x) + shared_b;
    Expr unused = dsl::exp(y);
    (void)unused;
    Expr outer_product = dsl::reshape(dsl::concat({y, y, y}), Shape{3, 4}) * dsl::sigmoid(y);
    Expr total = dsl::sum(std::vector<Expr>{y, x, dsl::relu(x)});
    return std::make_tuple(total, outer_product, dsl::pick(y, 2));
  });
  auto identity = function("identity", [](Expr x) { return x; });
  // A concat of a shared argument runs once, like the call itself; so do several results of one.
  auto shared_only = function("shared_only", [&](Expr p) {
    return std::pair{dsl::sigmoid(dsl::slice(dsl::concat({p, p}), 2, 6)), dsl::tanh(p)};
  });
  // Arguments read by a fused step (in place) and put side by side by a concat (one gather).
  auto mix = function("mix", [](Expr a, Expr b) {
    return dsl::tanh(a) * b + dsl::sum(dsl::concat({a, b})) + dsl::sum(dsl::concat({b, a, b}));
  });
  for (Fusion fusion : {Fusion::kOn, Fusion::kOff}) {
    CheckReport r = check_batched(7, [&](Graph& g, int i) {
      Expr x = g.input(data({4}, i));
      auto [total, mat, scalar] = outer(x, w);
      auto [s, t] = shared_only(g.param(w));  // every argument shared: computed once
      Expr m = mix(dsl::tanh(x), dsl::sigmoid(x) * 3.0);
      return dsl::sum(dsl::matmul(M, identity(total) * s * m + t)) + dsl::sum(mat) * scalar;
    }, {.params = {W, w, M}, .fusion = fusion});
    REQUIRE_BATCHED_EQUALS_ALONE(r);
  }
}

TEST_CASE("function: the calls of all examples run as one batch per step of the chain", "[dsl][function][launches]") {
  Cell m;
  Graph g;
  std::vector<Expr> out;
  const int depth = 4;
  for (int i = 0; i < 64; ++i) {
    auto s = g.example(i);
    Expr h = g.input(data({kH}, i)), c = g.zeros({kH});
    for (int k = 0; k < depth; ++k) std::tie(h, c) = std::pair(m.cell(h, c, h, c)[0], m.cell(h, c, h, c)[1]);
    out.push_back(h);
  }
  const size_t nodes = g.size();
  g.forward(out);
  // Per example: input, zeros, then per step two calls (the same arguments:
  // equal work, separate nodes), each a call node (result 0) and a CallResult
  // node (result 1). One call batch per step, whatever the number of
  // examples: launches do not grow with them.
  CHECK(nodes == 64 * (2 + depth * 2 * 2));
  const uint64_t batches = g.stats().batches;
  Graph inline_graph;
  std::vector<Expr> inline_out;
  for (int i = 0; i < 64; ++i) {
    auto s = inline_graph.example(i);
    Expr h = inline_graph.input(data({kH}, i)), c = inline_graph.zeros({kH});
    for (int k = 0; k < depth; ++k) std::tie(h, c) = std::pair(m.inline_cell(h, c, h, c)[0], m.inline_cell(h, c, h, c)[1]);
    inline_out.push_back(h);
  }
  inline_graph.forward(inline_out);
  CHECK(inline_graph.size() > 4 * nodes);
  CHECK(batches < 6 * depth);
  for (int i = 0; i < 64; ++i) CHECK(at::allclose(out[i].value(), inline_out[i].value(), 1e-5, 1e-6));
}

TEST_CASE("function: bodies are recorded again after clear(), with the tensors the model holds then",
          "[dsl][function]") {
  at::Tensor W = at::eye(3);
  auto f = function("scale", [&](Expr x) { return dsl::matmul(W, x); });
  Graph g;
  Expr y = f(g.input(at::ones({3})));
  g.forward(y);
  CHECK(at::allclose(y.value(), at::ones({3})));
  g.clear();
  W = at::eye(3) * 2.0;  // a new tensor, as model.to(device) makes
  y = f(g.input(at::ones({3})));
  g.forward(y);
  CHECK(at::allclose(y.value(), at::full({3}, 2.0)));
}

TEST_CASE("function: calls that alternate between argument signatures each run their own body", "[dsl][function]") {
  // More signatures (shapes, and shared or per-example) than a graph remembers
  // for its last calls, in turn: each call must still find its own body.
  at::Tensor W = at::eye(3);
  auto f = function("f", [&](Expr x, Expr y) { return std::pair{x * 2.0, dsl::matmul(W, y)}; });
  Graph g;
  struct Call {
    at::Tensor x;
    bool shared;
    Expr a, b;
  };
  std::vector<Call> calls;
  for (int round = 0; round < 3; ++round)
    for (int64_t n = 1; n <= 6; ++n)
      for (bool shared : {false, true}) {
        at::Tensor x = at::arange(n * 2, at::kFloat).reshape({n, 2}) + round;
        Expr xe = shared ? g.param(x) : g.input(x);
        auto [a, b] = f(xe, g.input(at::ones({3})));
        calls.push_back({x, shared, a, b});
      }
  // And a few signatures in turn, each found again among the remembered ones:
  // per-example and shared operands of one shape, and another shape.
  for (int round = 0; round < 4; ++round)
    for (int64_t n : {2, 3})
      for (bool shared : {false, true}) {
        at::Tensor x = at::full({n, 2}, static_cast<double>(round + n + (shared ? 10 : 0)));
        Expr xe = shared ? g.param(x) : g.input(x);
        auto [a, b] = f(xe, g.input(at::ones({3})));
        calls.push_back({x, shared, a, b});
      }
  for (const Call& c : calls) {
    g.forward(c.a);
    CHECK(c.a.shape() == Shape({c.x.size(0), 2}));
    CHECK(at::equal(c.a.value(), c.x * 2.0));
    CHECK(at::allclose(c.b.value(), at::ones({3})));
  }
  // After clear(), a body reads the tensors the model holds then, whose shapes
  // may differ: the same argument shapes as a recent call get results of a new shape.
  g.clear();
  W = at::ones({2, 3});
  auto [a, b] = f(g.input(at::ones({6, 2})), g.input(at::ones({3})));
  CHECK(b.shape() == Shape({2}));
  g.forward(b);
  CHECK(at::allclose(b.value(), at::full({2}, 3.0)));
}

TEST_CASE("function: mistakes are UserErrors naming the function and the call", "[dsl][function][errors]") {
  const at::Tensor W = param({4, 4}, 31);
  Graph g;
  Expr x = g.input(at::ones({4}));
  Expr wrong = g.input(at::ones({5}));

  auto f = function("affine_cell", [&](Expr a) { return dsl::affine(W, a, at::zeros({4})); });
  const int line = __LINE__ + 1;
  CHECK_THROWS_WITH(f(wrong), Contains("affine_cell") && Contains("test_functions.cpp:" + std::to_string(line)) &&
                                   Contains("x has shape [5]"));
  CHECK_THROWS_AS(f(wrong), UserError);

  auto branchy = function("branchy", [](Expr a) {
    return dsl::cond(dsl::sum(a) > 0.0, [a] { return a; }, [a] { return -a; });
  });
  CHECK_THROWS_WITH(branchy(x), Contains("branchy") && Contains("dsl::cond or dsl::loop"));

  auto noisy = function("noisy", [](Expr a) { return dsl::dropout(a, 0.5); });
  CHECK_THROWS_WITH(noisy(x), Contains("noisy") && Contains("per example"));

  auto leaky = function("leaky", [&](Expr) { return x; });  // an Expr from outside
  CHECK_THROWS_WITH(leaky(x), Contains("leaky") && Contains("pass outside values in as arguments"));

  Function untyped("two", 2, [](std::span<const Expr> a) { return std::vector<Expr>{a[0] + a[1]}; });
  const std::array<Operand, 1> one{x};
  CHECK_THROWS_WITH(untyped.call(one), Contains("takes 2 argument(s), got 1"));
  const at::Tensor t = at::ones({4});
  const std::array<Operand, 2> tensors{t, t};
  CHECK_THROWS_WITH(untyped.call(tensors), Contains("no graph to record on"));

  std::function<Expr(Expr)> self;
  auto recursive = function("recursive", [&](Expr a) { return self(a); });
  self = [&](Expr a) { return recursive(a); };
  CHECK_THROWS_WITH(recursive(x), Contains("recursive") && Contains("deep"));
  // Said once, not once per level of nesting (32 copies, 5 KB, before).
  try {
    (void)recursive(x);
    FAIL("no error");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK(what.find("recording the body of function 'recursive'") ==
          what.rfind("recording the body of function 'recursive'"));
    CHECK(what.size() < 1000);
  }
  // Written out op by op (the checker's reference), the same Function stops
  // at the same depth: it recursed until the stack overflowed.
  {
    Graph h({.inline_functions = true});
    CHECK_THROWS_WITH(recursive(h.input(at::ones({4}))), Contains("recursive") && Contains("nested more than"));
  }
  // F calls G calls F: the error (F's call to itself) carries each one's words once.
  {
    std::function<Expr(Expr)> call_f;
    auto g_fn = function("g_fn", [&](Expr a) { return call_f(a); });
    auto f_fn = function("f_fn", [&](Expr a) { return g_fn(a); });
    call_f = [&](Expr a) { return f_fn(a); };
    try {
      (void)f_fn(x);
      FAIL("no error");
    } catch (const UserError& e) {
      const std::string what = e.what();
      for (const char* name : {"recording the body of function 'f_fn'", "recording the body of function 'g_fn'"}) {
        INFO(name);
        CHECK(what.find(name) != std::string::npos);
        CHECK(what.find(name) == what.rfind(name));
      }
    }
  }
  // Two Functions of one name, one calling the other: each adds its words
  // (they were kept once per name, and the outer call's arguments lost).
  {
    auto inner = function("cell", [&](Expr a) { return dsl::matmul(W, dsl::concat({a, a})); });
    auto outer = function("cell", [&](Expr a) { return inner(a); });
    try {
      (void)outer(x);
      FAIL("no error");
    } catch (const UserError& e) {
      const std::string what = e.what();
      CHECK(what.find("recording the body of function 'cell'") != what.rfind("recording the body of function 'cell'"));
    }
  }
  // A body's own error names the example of the call that recorded it (the
  // body's graph recorded as example 0 before).
  {
    Graph h;
    auto in_five = h.example(5);
    auto wrong_body = function("wrong_body", [&](Expr a) { return dsl::matmul(W, a); });
    CHECK_THROWS_WITH(wrong_body(h.input(at::ones({3}))),
                      Contains("op 'wrong_body' (example 5)") && Contains("op 'matmul' (example 5)") &&
                          !Contains("example 0"));
  }

  // The graph is still usable, and the function too.
  auto ok = function("ok", [](Expr a) { return dsl::tanh(a); });
  Expr y = ok(x);
  g.forward(y);
  CHECK(at::allclose(y.value(), at::tanh(at::ones({4}))));
}

TEST_CASE("function: a call site's repeated call takes a shortcut, every other call the full path",
          "[dsl][function][errors]") {
  // The body found last, its argument signature and verdict: one pass
  // (Function::call_usual). Anything else falls back before recording
  // anything, so its errors and its results are those of the full path.
  auto f = function("twice", [](Expr a, Expr b) { return std::pair{a * 2.0, a + b}; });
  Graph g, other;
  Expr x = g.input(at::full({3}, 1.0)), y = g.input(at::full({3}, 2.0));
  auto [a, b] = f(x, y);  // records the body
  auto [c, d] = f(y, x);  // the usual call
  const size_t nodes = g.size();
  // An argument from another graph: the full path's error, and nothing recorded.
  Expr z = other.input(at::ones({3}));
  CHECK_THROWS_WITH(f(x, z), Contains("twice") && Contains("different sheaf::Graph"));
  CHECK_THROWS_WITH(f(z, x), Contains("twice") && Contains("different sheaf::Graph"));
  CHECK(g.size() == nodes);
  // Another shape, a shared argument, a tensor: each its own body, then the usual call again.
  auto [e, h] = f(g.input(at::full({2}, 3.0)), g.input(at::full({2}, 1.0)));
  auto [k, m] = f(g.param(at::full({3}, 4.0)), x);
  auto [p, q] = f(at::full({3}, 5.0), y);
  auto [r, t] = f(x, x);
  g.forward(std::vector<Expr>{a, b, c, d, e, h, k, m, p, q, r, t});
  const std::pair<Expr, double> want[] = {{a, 2}, {b, 3}, {c, 4}, {d, 3}, {e, 6}, {h, 4},
                                          {k, 8}, {m, 5}, {p, 10}, {q, 7}, {r, 2}, {t, 2}};
  for (const auto& [value, all] : want) CHECK(at::allclose(value.value(), at::full_like(value.value(), all)));
  CHECK(e.shape() == Shape({2}));
  // After a clear(), an argument made before it is unusable: the full path says so.
  g.clear();
  CHECK_THROWS_WITH(f(x, y), Contains("twice"));
  CHECK_THROWS_AS(f(x, y), UserError);
}

TEST_CASE("function: calls on values downstream of a dsl::cond are recorded when their shapes are known",
          "[dsl][function][control][checker]") {
  const at::Tensor W = param({4, 8}, 41), w = param({4}, 42);
  auto cell = function("cell", [&](Expr a, Expr b) {
    const Expr x = dsl::concat({a, b});
    return std::array{dsl::tanh(dsl::affine(W, x, w)), dsl::sum(x) > 0.0};
  });
  auto grow = function("grow", [](Expr a) { return dsl::sigmoid(a) * 2.0; });
  // A chain whose every step's inputs are the previous step's cond result.
  auto program = [&](Graph& g, int i) {
    Expr h = g.input(data({4}, i));
    for (int k = 0; k < 1 + i % 4; ++k) {
      auto [y, open] = cell(h, h * 0.5);
      h = dsl::cond(open, [=] { return grow(y); }, [=] { return -y; });
    }
    return dsl::sum(h);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(9, program, {.params = {W, w}}));

  // Rounds: as many as the chain is long, as with the same code inline.
  Graph a, b({.inline_functions = true});
  for (Graph* g : {&a, &b}) {
    std::vector<Expr> out;
    for (int i = 0; i < 9; ++i) {
      auto s = g->example(i);
      out.push_back(program(*g, i));
    }
    g->forward(out);
  }
  CHECK(a.stats().rounds == b.stats().rounds);

  Function listy("listy", 1, [](std::span<const Expr> x) { return std::vector<Expr>{x[0] + 1.0}; });
  Graph g;
  Expr x = g.input(at::ones({4}));
  Expr c = dsl::cond(dsl::sum(x) > 0.0, [x] { return x; }, [x] { return -x; });
  const std::array<Operand, 1> arg{c};
  CHECK_THROWS_WITH(listy.call(arg), Contains("returns a std::vector") && Contains("dsl::cond"));
}

TEST_CASE("function: bodies of argument shapes no batch used lately are forgotten", "[dsl][function]") {
  // A function over a whole sentence: its shape changes from batch to batch.
  auto total = function("total", [](Expr sentence) { return dsl::sum(dsl::tanh(sentence)); });
  Graph g;
  for (int len = 1; len <= 1100; ++len) {  // more shapes than a graph keeps bodies at once
    g.clear();
    Expr y = total(g.input(at::ones({len, 2})));
    g.forward(y);
    if (len % 250 == 0) CHECK(y.item() == Approx(2.0 * len * std::tanh(1.0)));
  }
}

TEST_CASE("function: a body's own Exprs and outside Exprs are errors, not crashes", "[dsl][function][errors]") {
  std::vector<Expr> kept;
  auto leaky = function("leaky", [&](Expr a) {
    Expr w = dsl::tanh(a);
    kept.push_back(w);  // an intermediate kept for later: it belongs to the body
    kept.push_back(dsl::sum(w));
    return w * 2.0;
  });
  Graph g;
  Expr y = leaky(g.input(at::ones({3})));
  CHECK_THROWS_WITH(dsl::sum(kept[0] * 2.0), Contains("sheaf::Function's body"));
  CHECK_THROWS_WITH(kept[0].graph().forward(kept[0]), Contains("sheaf::Function's body"));
  // Its value, or a forward of it on the caller's graph: the body's message,
  // not "call forward()" (no forward computes it) or "a different sheaf::Graph".
  CHECK_THROWS_WITH(kept[0].value(), Contains("op 'value'") && Contains("sheaf::Function's body"));
  CHECK_THROWS_WITH(g.forward(kept[0]), Contains("op 'forward'") && Contains("sheaf::Function's body") &&
                                            !Contains("different sheaf::Graph"));
  g.forward(y);  // the calls still run
  CHECK(at::allclose(y.value(), at::tanh(at::ones({3})) * 2.0));
  {
    // A tensor operand with a body's Expr: refused, naming the op and this
    // line, before the tensor becomes a node of the body (it would stay one:
    // a shared node the body's calls then check for changes).
    const size_t body_nodes = kept[0].graph().size();
    at::Tensor t = at::ones({3});
    CHECK_THROWS_WITH(kept[0] * t, Contains("op 'mul'") && Contains("test_functions") &&
                                       Contains("sheaf::Function's body"));
    CHECK_THROWS_WITH(t * kept[0], Contains("op 'mul'") && Contains("sheaf::Function's body"));
    CHECK_THROWS_WITH(kept[0].graph().param(t), Contains("op 'param'") && Contains("sheaf::Function's body"));
    // Control flow on a body's Expr: refused before its placeholder joins the body.
    const Expr kept_sum = kept[1];
    CHECK_THROWS_WITH(dsl::cond(kept_sum, [&] { return kept_sum; }, [&] { return kept_sum; }),
                      Contains("op 'cond'") && Contains("sheaf::Function's body"));
    CHECK_THROWS_WITH(dsl::loop({kept_sum}, [](const std::vector<Expr>& s) { return s[0]; },
                                [](const std::vector<Expr>& s) { return s; }, 4),
                      Contains("op 'loop'") && Contains("sheaf::Function's body"));
    CHECK(kept[0].graph().size() == body_nodes);
    t.add_(1.0);  // an update of that tensor is nothing to the body's calls
    Graph h;
    Expr z = leaky(h.input(at::ones({3})));
    h.forward(z);
    CHECK(at::allclose(z.value(), at::tanh(at::ones({3})) * 2.0));
  }

  Graph other;
  Expr outside = other.input(at::ones({3}));
  auto side = function("side", [&](Expr a) {
    (void)dsl::sigmoid(outside);  // an outside Expr, used but not returned
    return a * 2.0;
  });
  CHECK_THROWS_WITH(side(outside), Contains("side") && Contains("used an Expr from outside"));

  // Computing a value inside the body while it records: refused (it ran on
  // uninitialised stand-ins and froze that choice into every call).
  auto peeking = function("peeking", [](Expr a) {
    Expr t = dsl::tanh(dsl::sum(a));
    t.graph().forward(t);
    return t.item() > 0 ? a : -a;
  });
  CHECK_THROWS_WITH(peeking(g.input(at::ones({3}))), Contains("peeking") && Contains("op 'forward'") &&
                                                        Contains("inside a sheaf::Function's body") &&
                                                        Contains("test_functions"));
  // A coroutine awaiting a value of the body, while it records or after:
  // refused (the body's values are never computed: it would never resume).
  std::vector<Task<double>> waiting;
  auto awaiting = function("awaiting", [&](Expr a) {
    Expr s = dsl::sum(a);
    waiting.push_back([](Expr e) -> Task<double> { co_return co_await fetch_item(e); }(s));
    return a * 2.0;
  });
  CHECK_THROWS_WITH(awaiting(g.input(at::ones({3}))), Contains("awaiting") && Contains("op 'co_await'") &&
                                                         Contains("inside a sheaf::Function's body"));
  auto late = [](Expr e) -> Task<double> { co_return co_await fetch_item(e); };
  CHECK_THROWS_WITH(late(kept[0]), Contains("sheaf::Function's body"));  // a kept body Expr, after the body froze
  auto reading = function("reading", [](Expr a) { return a * dsl::sum(a).item(); });
  CHECK_THROWS_WITH(reading(g.input(at::ones({3}))), Contains("op 'value'") && Contains("inside a sheaf::Function's body"));
  Function two("two", 1, [](std::span<const Expr> a) { return std::vector<Expr>{a[0], a[0] + 1.0}; });
  std::vector<Expr> results;
  const std::array<Operand, 1> arg{g.input(at::ones({3}))};
  CHECK_THROWS_WITH(two.call_into(arg, results, 3, std::source_location::current()),
                    Contains("returned 2 results where the call takes 3"));
}

// A round whose run fails puts the nodes it did not get to back among the
// candidates, a call's further results too: the next round places them with
// their call again (scheduler/round.cpp), and they and what reads them get values.
TEST_CASE("function: a call that a failed run did not reach runs in the next forward, its results read",
          "[dsl][function][errors]") {
  auto f = function("f", [](Expr x) { return std::pair{x * 2.0, dsl::tanh(x) + 1.0}; });
  GraphOptions o;
  o.strategy = &depth_strategy();  // the failing pick (depth 1) runs before the call (depth 3)
  Graph g(o);
  Expr picked[2], a[2], b[2], c[2];
  const at::Tensor x = at::arange(4).to(at::kFloat);
  for (int i = 0; i < 2; ++i) {
    auto scope = g.example(i);
    picked[i] = dsl::pick(g.input(x), g.input(at::full({}, i == 1 ? 9.0 : 2.0)));
    std::tie(a[i], b[i]) = f(dsl::tanh(dsl::tanh(g.input(x + i))));
    c[i] = b[i] * 3.0;  // reads the second result, which the call placed again stamps
  }
  REQUIRE_THROWS_WITH(g.forward(), Contains("op 'pick'") && Contains("out of range"));
  REQUIRE_THROWS_AS(a[0].value(), UserError);  // not run: the failure came first
  g.forward(std::vector<Expr>{a[0], a[1], c[0], c[1]});
  for (int i = 0; i < 2; ++i) {
    const at::Tensor y = at::tanh(at::tanh(x + i));
    CHECK(at::allclose(a[i].value(), y * 2.0));
    CHECK(at::allclose(b[i].value(), at::tanh(y) + 1.0));
    CHECK(at::allclose(c[i].value(), (at::tanh(y) + 1.0) * 3.0));
  }
}
