// User mistakes give a UserError naming the op, the example and the user's line;
// the graph and the process stay usable afterwards.
#include <sheaf/engine/engine.h>
#include <sheaf/ops/user_op.h>

#include <optional>

#include "../scheduler/launches.h"
#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::param;

namespace {

at::Tensor W() {
  static at::Tensor w = param({4, 3}, 1);
  return w;
}
at::Tensor B() {
  static at::Tensor b = param({4}, 2);
  return b;
}

// A launch that fails while `failing` is set (a kernel's own error, as a
// LibTorch op throws on what its checks refuse).
bool failing = false;
// Sets `failing` while alive: a failed REQUIRE does not leave it set for later tests.
struct Failing {
  Failing() { failing = true; }
  ~Failing() { failing = false; }
  Failing(const Failing&) = delete;
  Failing& operator=(const Failing&) = delete;
};
struct Fails {
  static constexpr std::string_view name = "test_fails";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    if (failing) throw std::runtime_error("the kernel refused its input");
    return c.in(0) * 2.0;
  }
};
Expr fails(Expr x) { return dsl::call(user_op<Fails>(), {x}); }

}  // namespace

TEST_CASE("shape mismatch names op, example and line", "[dsl][errors]") {
  Graph g;
  auto scope = g.example(3);
  Expr x = g.input(at::randn({5}));
  REQUIRE_THROWS_AS(dsl::affine(W(), x, B()), UserError);
  REQUIRE_THROWS_WITH(dsl::affine(W(), x, B()), Contains("test_errors.cpp:") && Contains("op 'affine'") &&
                                                    Contains("example 3") && Contains("[5]"));
  Expr y = g.input(at::randn({4}));
  REQUIRE_THROWS_WITH(x + y, Contains("op 'add'") && Contains("example 3") && Contains("[5] and [4]") &&
                                 Contains("do not broadcast"));
  REQUIRE_THROWS_WITH(g.input(at::randn({2, 3})) * g.input(at::randn({2})), Contains("op 'mul'") &&
                                                                             Contains("[2, 3] and [2]"));
  REQUIRE_THROWS_WITH(dsl::concat({x, g.input(at::randn({2, 2}))}), Contains("op 'concat'") && Contains("example 3"));
  REQUIRE_THROWS_WITH(dsl::slice(x, 3, 9), Contains("op 'slice'") && Contains("outside"));
  REQUIRE_THROWS_WITH(dsl::chunk(x, 2), Contains("op 'chunk'") && Contains("equal chunks"));
  REQUIRE_THROWS_WITH(dsl::pick(x, 5), Contains("op 'pick'") && Contains("out of range"));
  REQUIRE_THROWS_WITH(dsl::row(x, 5), Contains("op 'row'") && Contains("row 5 is out of range"));
  REQUIRE_THROWS_WITH(dsl::row(x, -6), Contains("op 'row'") && Contains("row -6 is out of range"));
  REQUIRE_THROWS_WITH(dsl::row(dsl::sum(x), 0), Contains("op 'row'") && Contains("rank >= 1"));
  REQUIRE_THROWS_WITH(dsl::pick(x, x), Contains("op 'pick'") && Contains("index must be a scalar"));
  REQUIRE_THROWS_WITH(dsl::argmax(dsl::sum(x)), Contains("op 'argmax'") && Contains("scalar"));
  const at::Tensor table = at::randn({6, 4});
  REQUIRE_THROWS_WITH(dsl::lookup(table, x), Contains("op 'lookup'") && Contains("id must be a scalar"));
  REQUIRE_THROWS_WITH(dsl::lookup(x, dsl::sum(x)), Contains("op 'lookup'") && Contains("the table"));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(x, -1), Contains("label -1"));
  REQUIRE_THROWS_WITH(dsl::softmax(dsl::sum(x)), Contains("op 'softmax'") && Contains("scalar"));
  REQUIRE_THROWS_WITH(dsl::dropout(x, 1.5), Contains("op 'dropout'") && Contains("p must be"));
  REQUIRE_THROWS_WITH(dsl::reshape(x, {2, 3}), Contains("op 'reshape'") && Contains("cannot reshape [5]"));
  REQUIRE_THROWS_WITH(dsl::reshape(x, {-1, 2}), Contains("op 'reshape'") && Contains("not a multiple of 2"));
  REQUIRE_THROWS_WITH(dsl::transpose(x), Contains("op 'transpose'") && Contains("out of range"));
  REQUIRE_THROWS_WITH(dsl::stack({x, y}), Contains("op 'stack'") && Contains("argument 1 has shape [4]"));
  REQUIRE_THROWS_WITH(dsl::sum_dim(x, 1), Contains("op 'sum_dim'") && Contains("out of range"));
  REQUIRE_THROWS_WITH(dsl::dot(x, y), Contains("op 'dot'") && Contains("[5] and [4]"));
  {
    const Expr M = dsl::stack({x, x}), N = dsl::stack({y, y, y});  // [2, 5], [3, 4]
    REQUIRE_THROWS_WITH(dsl::attention(x, M, M), Contains("op 'attention'") && Contains("needs matrices"));
    REQUIRE_THROWS_WITH(dsl::attention(M, N, N), Contains("op 'attention'") && Contains("the same width"));
    REQUIRE_THROWS_WITH(dsl::attention(M, M, N), Contains("op 'attention'") && Contains("the same number of rows"));
    REQUIRE_THROWS_WITH(dsl::attention(M, M, M, 2), Contains("op 'attention'") && Contains("2 heads must divide"));
    REQUIRE_THROWS_WITH(dsl::attention(g.input(at::randn({0, 5})), M, M),
                        Contains("op 'attention'") && Contains("at least one query and one key"));
  }
  {
    const Expr X = dsl::stack({x, x});  // [2, 5]
    const at::Tensor ih = at::randn({8, 5}), hh = at::randn({8, 2}), b = at::zeros({8});
    REQUIRE_THROWS_WITH(dsl::lstm(x, ih, hh, b), Contains("op 'lstm'") && Contains("needs a sequence as a matrix"));
    REQUIRE_THROWS_WITH(dsl::lstm(g.input(at::randn({0, 5})), ih, hh, b),
                        Contains("op 'lstm'") && Contains("at least one step"));
    REQUIRE_THROWS_WITH(dsl::lstm(X, ih, at::randn({8, 3}), b), Contains("op 'lstm'") && Contains("hidden size 3"));
    REQUIRE_THROWS_WITH(dsl::lstm(X, at::randn({8, 4}), hh, b), Contains("op 'lstm'") && Contains("does not take rows"));
    REQUIRE_THROWS_WITH(dsl::lstm(X, ih, hh, dsl::tanh(X)), Contains("op 'lstm'") && Contains("a bias [4h]"));
    REQUIRE_THROWS_WITH(dsl::lstm(X, ih, hh, b, x), Contains("op 'lstm_from'") && Contains("initial state"));
    REQUIRE_THROWS_WITH(dsl::lstm(X, ih, hh, dsl::concat({x, dsl::slice(x, 0, 3)})),
                        Contains("op 'lstm'") && Contains("shared by every example"));
  }
  REQUIRE_THROWS_WITH(dsl::matmul(x, x), Contains("op 'matmul'") && Contains("[5] and [5]") && Contains("dsl::dot"));
  REQUIRE_THROWS_WITH(dsl::matmul(x, dsl::stack({y, y})), Contains("op 'matmul'") && Contains("[5] and [2, 4]"));
  REQUIRE_THROWS_WITH(dsl::matmul(dsl::stack({x, x}), y), Contains("op 'matmul'") && Contains("do not multiply"));
  REQUIRE_THROWS_WITH(dsl::layer_norm(x, at::ones({4}), at::zeros({5})), Contains("op 'layer_norm'") &&
                      Contains("the gain has shape [4]"));
  REQUIRE_THROWS_WITH(dsl::layer_norm(x, x, at::zeros({5})), Contains("op 'layer_norm'") && Contains("gain"));
}

TEST_CASE("rank above four and check_batched without examples and max_rounds below one and a resized input",
          "[dsl][errors]") {
  Graph g;
  auto scope = g.example(2);
  // A braced shape of rank 5 is refused where it is written (it overran a fixed array before).
  REQUIRE_THROWS_WITH(g.zeros({2, 2, 2, 2, 2}), Contains("rank at most 4") && Contains("rank 5") &&
                                                   Contains("test_errors"));
  Expr x = g.input(at::ones({4}));
  REQUIRE_THROWS_WITH(dsl::reshape(x, {1, 1, 1, 1, 4}), Contains("rank at most 4") && Contains("test_errors"));
  REQUIRE_THROWS_WITH(dsl::cond(dsl::sum(x) > 0.0, [x] { return x; }, [x] { return x; }, Shape{1, 1, 1, 1, 4}),
                      Contains("rank at most 4"));
  REQUIRE_THROWS_AS(check_batched(0, [](Graph& h, int) { return h.zeros({1}); }), UserError);
  REQUIRE_THROWS_WITH(check_batched(-1, [](Graph& h, int) { return h.zeros({1}); }), Contains("at least one example"));
  REQUIRE_THROWS_WITH(g.forward(x, {.max_rounds = 0}), Contains("max_rounds must be >= 1") && Contains("test_errors"));
  // An input's tensor resized between recording and forward: the error names
  // its example and line (example 1 here), not the batch's first (example 2).
  at::Tensor buffer = at::ones({3});
  Expr before = dsl::tanh(g.input(at::ones({3})));
  Expr y;
  {
    auto other = g.example(1);
    y = dsl::tanh(g.input(buffer));
  }
  buffer.resize_({5});
  REQUIRE_THROWS_WITH(g.forward({before, y}), Contains("op 'input' (example 1)") &&
                                                  Contains("sizes changed after it was recorded") && Contains("[3]"));
  // The graph is still usable.
  g.forward(x);
  CHECK(at::equal(x.value(), at::ones({4})));
}

TEST_CASE("a parameter resized or converted after it was recorded is a UserError at forward", "[dsl][errors]") {
  // Its readers were inferred (and batched) for the sizes it had: without the
  // check, forward read the new tensor (a LibTorch error, or a wrong answer
  // where the new sizes broadcast).
  at::Tensor w = at::ones({3});
  Graph g;
  auto scope = g.example(1);
  Expr x = g.input(at::ones({3}));
  const int line = __LINE__ + 1;
  Expr y = x * g.param(w);
  w.resize_({1});
  REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'param'") && Contains("sizes changed after it was recorded") &&
                                        Contains("[3]") && Contains("test_errors.cpp:" + std::to_string(line)));
  REQUIRE_THROWS_WITH(g.prepare(std::span(&y, 1)), Contains("sizes changed"));
  // Back to its sizes: the graph runs.
  w.resize_({3}).fill_(2.0);
  g.forward(y);
  CHECK(at::equal(y.value(), at::full({3}, 2.0)));
  // Another dtype under the same tensor (set_data keeps the TensorImpl the graph holds).
  Graph h;
  at::Tensor v = at::ones({2});
  Expr z = dsl::tanh(h.param(v));
  v.set_data(at::ones({2}, at::kDouble));
  REQUIRE_THROWS_WITH(h.forward(z), Contains("op 'param'") && Contains("Double"));
  // A parameter a function's body reads: its steps read it as the graph does.
  at::Tensor u = at::ones({3});
  const int body_line = __LINE__ + 1;
  auto scale = sheaf::function("scale", [u](Expr a) { return a * u; });
  Graph f;
  Expr out = scale(f.input(at::ones({3})));
  u.resize_({1});
  REQUIRE_THROWS_WITH(f.forward(out), Contains("op 'param'") && Contains("sizes changed") &&
                                          Contains("test_errors.cpp:" + std::to_string(body_line)));
  u.resize_({3}).fill_(3.0);
  f.forward(out);
  CHECK(at::equal(out.value(), at::full({3}, 3.0)));
  // Two levels: a body that calls that function (its body is recorded in the
  // outer body's graph, and was not checked).
  auto twice = sheaf::function("twice", [&scale](Expr a) { return scale(a) + 1.0; });
  Graph k;
  Expr out2 = twice(k.input(at::ones({3})));
  u.resize_({1});
  REQUIRE_THROWS_WITH(k.forward(out2), Contains("op 'param'") && Contains("sizes changed") &&
                                           Contains("test_errors.cpp:" + std::to_string(body_line)));
  u.resize_({3}).fill_(2.0);
  k.forward(out2);
  CHECK(at::equal(out2.value(), at::full({3}, 3.0)));
}

TEST_CASE("check_batched names a cond's result by its cond", "[dsl][errors]") {
  // A program that records differently on its first run (the reference,
  // alone) than later (batched): node 3 is the cond's result alone, a tanh batched.
  int calls = 0;
  const CheckReport r = check_batched(1, [&calls](Graph& g, int) {
    Expr x = g.input(at::ones({2}));
    if (calls++ == 0) return dsl::cond(dsl::sum(x) > 0.0, [x] { return dsl::tanh(x); }, [x] { return x; });
    [[maybe_unused]] Expr unused = dsl::sum(x) > 0.0;
    return dsl::tanh(dsl::tanh(x));
  });
  INFO(r.message);
  CHECK(!r.ok);
  CHECK_THAT(r.message, Contains("but op 'cond' recorded at") && Contains("test_errors.cpp"));
}

TEST_CASE("a shape read from an Expr stays valid while the graph records new shapes", "[dsl][errors]") {
  // Expr::shape() gives a copy: a reference into the graph's table of shapes
  // dangled once new shapes grew it (ASan's stage catches a regression).
  Graph g;
  Expr x = g.input(at::ones({3}));
  const Shape& s = x.shape();
  for (int64_t k = 1; k <= 300; ++k) g.zeros({k, 2});
  CHECK(s == Shape{3});
  // A range-for over the copy's sizes reads sizes, not a view into the gone copy.
  std::vector<int64_t> seen;
  for (int64_t d : x.shape().dims()) {
    for (int64_t k = 301; k <= 310; ++k) g.zeros({k, 3});
    seen.push_back(d);
  }
  CHECK(seen == std::vector<int64_t>{3});
}

TEST_CASE("the source line is the user's line, also through operators", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({5}));
  Expr y = g.input(at::randn({4}));
  int line = __LINE__ + 2;
  try {
    Expr z = x * y;
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Contains("test_errors.cpp:" + std::to_string(line) + ":"));
  }
}

TEST_CASE("id out of range in a lookup", "[dsl][errors]") {
  Graph g;
  at::Tensor E = param({10, 4}, 3);
  auto scope = g.example(7);
  REQUIRE_THROWS_WITH(g.lookup(E, 10), Contains("op 'lookup'") && Contains("example 7") && Contains("id 10") &&
                                           Contains("10 rows"));
  REQUIRE_THROWS_WITH(g.lookup(E, -2), Contains("id -2"));
  REQUIRE_THROWS_WITH(g.lookup(E, {3, 10, 1}), Contains("op 'lookup'") && Contains("example 7") &&
                                                   Contains("id 10 (position 1 of 3)") && Contains("10 rows"));
  REQUIRE_THROWS_WITH(g.lookup(E, std::vector<int64_t>{}), Contains("op 'lookup'") && Contains("at least one id"));
  REQUIRE_THROWS_WITH(g.lookup(at::randn({3, 2, 4}), {1, 2}, /*sparse_grad=*/true), Contains("2-D"));
}

// The tracer reuses one inference for nodes that differ only in an index
// payload (OpTraits::payload_index): each index must still be checked.
TEST_CASE("an index out of range after the same op was recorded in range", "[dsl][errors]") {
  Graph g;
  at::Tensor E = param({10, 4}, 3);
  auto scope = g.example(2);
  Expr v = g.lookup(E, 9);
  for (int64_t id : {0, 5, 9}) REQUIRE_NOTHROW(g.lookup(E, id));
  REQUIRE_THROWS_WITH(g.lookup(E, 10), Contains("op 'lookup'") && Contains("id 10") && Contains("10 rows"));
  REQUIRE_THROWS_WITH(g.lookup(E, -1), Contains("op 'lookup'") && Contains("id -1"));
  REQUIRE_NOTHROW(dsl::pick(v, 3));
  REQUIRE_THROWS_WITH(dsl::pick(v, 4), Contains("op 'pick'") && Contains("out of range for a vector of 4"));
  REQUIRE_NOTHROW(dsl::pick_neg_log_softmax(v, 0));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(v, 4),
                      Contains("op 'pick_neg_log_softmax'") && Contains("label 4") && Contains("vector of 4"));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(v, -3), Contains("label -3"));
  // In range again after the errors: nothing was recorded by them.
  const size_t before = g.size();
  REQUIRE_NOTHROW(dsl::pick(v, 1));
  REQUIRE(g.size() == before + 1);
}

// A list too long for a word per element in the tracer's memo is keyed by one
// word when its elements are alike (Trace::list_key): lists of any length hit
// one entry, and a list that is not alike must still be checked.
TEST_CASE("long lists: alike ones share one inference, an unlike one is still refused", "[dsl][errors]") {
  Graph g;
  std::vector<at::Tensor> totals;
  std::vector<Expr> sums;
  for (int e = 0; e < 3; ++e) {
    auto scope = g.example(e);
    std::vector<Expr> list;
    totals.push_back(at::zeros({4}));
    for (int i = 0; i < 20 + 7 * e; ++i) {
      const at::Tensor x = at::randn({4});
      list.push_back(g.input(x));
      totals.back() += x;
    }
    sums.push_back(dsl::sum(list));
    CHECK(sums.back().shape() == Shape{4});
  }
  {
    auto scope = g.example(0);
    std::vector<Expr> unlike;
    for (int i = 0; i < 20; ++i) unlike.push_back(g.input(at::randn({4})));
    unlike.push_back(g.input(at::randn({5})));
    const size_t before = g.size();
    REQUIRE_THROWS_WITH(dsl::sum(unlike), Contains("op 'sum_list'") && Contains("list element 20 has shape [5]"));
    REQUIRE(g.size() == before);
    unlike.back() = g.input(at::randn({4}));
    unlike.push_back(g.param(param({4}, 4)));  // a shared element among per-example ones
    REQUIRE_THROWS_WITH(dsl::sum(unlike), Contains("op 'sum_list'") && Contains("per-example values or all shared"));
  }
  g.forward(sums);
  CHECK(test::launches_of(g, "sum_list") == 1);  // lists of 20, 27 and 34 elements: one signature
  for (size_t e = 0; e < 3; ++e) CHECK(at::allclose(sums[e].value(), totals[e], 1e-5, 1e-5));
}

TEST_CASE("Exprs from a cleared or destroyed graph, or from another graph", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({4}));
  g.clear();
  REQUIRE_THROWS_WITH(dsl::tanh(x), Contains("op 'tanh'") && Contains("was cleared since it was made"));
  REQUIRE_THROWS_WITH(x.value(), Contains("was cleared since it was made"));

  Expr dead;
  uint32_t dead_slot = 0;
  {
    Graph tmp;
    dead = tmp.input(at::randn({4}));
    dead_slot = sheaf::detail::engine_of(tmp).slot();
  }
  REQUIRE_THROWS_WITH(dsl::sigmoid(dead), Contains("was destroyed since it was made"));
  REQUIRE_THROWS_WITH(dsl::sigmoid(Expr()), Contains("empty Expr"));
  {
    // A graph made after `dead`'s was destroyed takes its slot (the free
    // slots are reused last freed first): `dead` is not from before this
    // graph's clear(), nor from a live graph. Checked, not assumed: with
    // another reuse order this block would test a graph of another slot.
    Graph heir;
    REQUIRE(sheaf::detail::engine_of(heir).slot() == dead_slot);
    Expr mine = heir.input(at::randn({4}));
    REQUIRE_THROWS_WITH(mine + dead, Contains("op 'add'") && Contains("was destroyed since it was made") &&
                                         !Contains("clear()"));
    REQUIRE_THROWS_WITH(dead.value(), Contains("was destroyed since it was made"));
    REQUIRE_THROWS_WITH(dsl::sigmoid(dead), Contains("was destroyed since it was made"));
  }

  Graph other;
  Expr a = g.input(at::randn({4}));
  Expr b = other.input(at::randn({4}));
  REQUIRE_THROWS_WITH(a + b, Contains("op 'add'") && Contains("different sheaf::Graph"));
  REQUIRE_THROWS_WITH(dsl::sum(std::vector<Expr>{a, b}), Contains("different sheaf::Graph"));

  // A stale Expr after a live one of the same graph: the graph is found from
  // the first, so the second is caught when its node is read.
  Expr stale = g.input(at::randn({4}));
  g.clear();
  Expr live = g.input(at::randn({4}));
  (void)g.input(at::randn({4}));  // stale's id now names a live node: only its generation tells them apart
  REQUIRE_THROWS_WITH(live + stale, Contains("op 'add'") && Contains("was cleared since it was made"));
  REQUIRE_THROWS_WITH(live + Expr(), Contains("op 'add'") && Contains("empty Expr"));
}

TEST_CASE("values before forward, bad tensors, ops on tensors only", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({4}));
  REQUIRE_THROWS_WITH(x.value(), Contains("op 'input'") && Contains("forward"));
  REQUIRE_THROWS_WITH(g.param(at::randn({4}, at::kDouble)), Contains("op 'param'") && Contains("float32"));
  REQUIRE_THROWS_WITH(g.param(at::Tensor()), Contains("op 'param'") && Contains("undefined"));
  REQUIRE_THROWS_WITH(g.input(at::ones({4}, at::kLong)), Contains("floating-point"));
  REQUIRE_THROWS_WITH(g.input(at::randn({1, 1, 1, 1, 1})), Contains("rank at most 4"));
  REQUIRE_THROWS_WITH(dsl::affine(W(), W(), B()), Contains("op 'affine'") && Contains("no graph"));
  REQUIRE_THROWS_WITH(strategy_named("fastest"), Contains("'fastest'") && Contains("agenda") && Contains("depth"));
  // A sparse tensor: refused where it comes in (it failed in the first
  // batched op that read it, with LibTorch's list of backends).
  const at::Tensor sparse = at::randn({4}).to_sparse();
  REQUIRE_THROWS_WITH(g.input(sparse), Contains("op 'input'") && Contains("Sparse") && Contains("to_dense()"));
  REQUIRE_THROWS_WITH(g.param(sparse), Contains("op 'param'") && Contains("Sparse"));
  REQUIRE_THROWS_WITH(x * sparse, Contains("op 'param'") && Contains("Sparse"));
  // An op code that names no op: the user's mistake, not an internal error.
  REQUIRE_THROWS_WITH(dsl::call(OpCode{60000}, {x}), Contains("op 'call'") && Contains("op code 60000 names no op") &&
                                                         !Contains("internal"));
  REQUIRE_THROWS_WITH(dsl::call_list(OpCode{60000}, std::vector<Expr>{x}), Contains("names no op"));
}

TEST_CASE("split, chunk and a loss over no rows name themselves, not the op they record", "[dsl][errors]") {
  Graph g;
  auto scope = g.example(2);
  const Expr x = g.input(at::randn({4}));
  REQUIRE_THROWS_WITH(dsl::split(x, std::vector<int64_t>{0, 4}), Contains("op 'split'") && Contains("example 2") &&
                                                                     Contains("piece 0 has size 0") &&
                                                                     !Contains("'slice'"));
  REQUIRE_THROWS_WITH(dsl::split(x, std::vector<int64_t>{5, -1}), Contains("op 'split'") &&
                                                                      Contains("piece 1 has size -1"));
  REQUIRE_THROWS_WITH(dsl::chunk(g.input(at::randn({0})), 4), Contains("op 'chunk'") && Contains("size 0") &&
                                                                 !Contains("'slice'"));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(g.input(at::randn({0, 5})), std::vector<int64_t>{}),
                      Contains("op 'pick_neg_log_softmax'") && Contains("no rows") && !Contains("'lookup'"));
  // Pieces that cover the axis still split it.
  const std::vector<Expr> parts = dsl::split(x, std::vector<int64_t>{1, 3});
  g.forward(parts[1]);
  CHECK(parts[1].value().size(0) == 3);
}

TEST_CASE("a dsl::loop given an empty std::function is a UserError, as a dsl::cond's", "[dsl][errors]") {
  Graph g;
  auto scope = g.example(2);
  const Expr x = g.input(at::ones({3}));
  const std::function<Expr(Expr)> none;
  REQUIRE_THROWS_WITH(dsl::loop(x, none, [](Expr s) { return s - 1.0; }),
                      Contains("op 'loop'") && Contains("example 2") && Contains("must be callable"));
  REQUIRE_THROWS_WITH(dsl::loop(x, [](Expr s) { return dsl::sum(s) > 0.0; }, none), Contains("must be callable"));
}

TEST_CASE("check_batched says which example's result is not an Expr of the program's graph", "[dsl][errors][checker]") {
  Graph other;
  const Expr foreign = other.input(at::ones({2}));
  CHECK_THROWS_WITH(check_batched(3, [&](Graph& g, int i) { return i == 1 ? foreign : g.input(at::ones({2})); }),
                    Contains("check_batched") && Contains("example 1") && Contains("another sheaf::Graph") &&
                        !Contains("check.cpp"));
  CHECK_THROWS_WITH(check_batched(2, [&](Graph& g, int i) { return i == 0 ? Expr() : g.input(at::ones({2})); }),
                    Contains("example 0") && Contains("empty Expr"));
  CHECK_THROWS_WITH(check_batched(2,
                                  [&](Graph& g, int i) {
                                    const Expr y = g.input(at::ones({2}));
                                    if (i == 1) g.clear();
                                    return y;
                                  }),
                    Contains("check_batched") && Contains("cleared since it was made"));
}

TEST_CASE("a failed launch names op and examples, and the graph stays usable", "[dsl][errors][backend]") {
  Graph g;
  Expr y;
  {
    auto scope = g.example(2);
    y = fails(dsl::affine(W(), g.input(at::randn({3})), B()));
  }
  {
    const Failing on;
    REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'test_fails'") && Contains("batched launch") &&
                                          Contains("examples 2") && Contains("refused its input") &&
                                          Contains("test_errors.cpp"));
  }
  // The failed launch is not retried: other work runs; what needs it says so.
  Expr z = dsl::tanh(g.input(at::ones({3})));
  g.forward(z);
  CHECK(at::allclose(z.value(), at::tanh(at::ones({3}))));
  REQUIRE_THROWS_WITH(g.forward(y), Contains("could not be computed") && Contains("op 'test_fails'") &&
                                        Contains("test_errors.cpp"));
  g.clear();  // and after clear() everything works again
  auto scope = g.example(2);
  Expr y2 = fails(dsl::affine(W(), g.input(at::randn({3})), B()));
  g.forward(y2);
  CHECK(y2.value().sizes() == at::IntArrayRef({4}));
}

TEST_CASE("a coroutine or cond awaiting a value that cannot be computed makes forward say so", "[dsl][errors][backend]") {
  Graph g;
  Expr y = fails(g.input(at::ones({3})));
  {
    const Failing on;
    REQUIRE_THROWS_WITH(g.forward(y), Contains("batched launch"));
  }
  // Awaited after the failure: forward used to end quietly, leaving a task
  // that "has not finished" and a cond whose result is never computed.
  const int line = __LINE__ + 2;
  auto await_sum = [](Expr v) -> Task<Expr> {
    const double s = co_await fetch_item(dsl::sum(v));
    co_return v * s;
  };
  std::optional<Task<Expr>> t;
  t.emplace(await_sum(y));  // (the sum is y's example's: 0)
  REQUIRE_THROWS_WITH(g.forward(), Contains("1 awaited value(s) that could not be computed") &&
                                       Contains("example 0 on op 'sum'") &&
                                       Contains("test_errors.cpp:" + std::to_string(line)));
  CHECK_FALSE(t->done());
  // Said once: a later forward of other work runs.
  Expr other = dsl::tanh(g.input(at::ones({2})));
  g.forward(other);
  CHECK(at::allclose(other.value(), at::tanh(at::ones({2}))));
  t.reset();
  // A cond waiting on it: no target, so only the waits can tell.
  const int cond_line = __LINE__ + 1;
  Expr c = dsl::cond(dsl::sum(y) > 0.0, [y] { return y; }, [y] { return -y; });
  REQUIRE_THROWS_WITH(g.forward(), Contains("1 awaited value(s)") && Contains("on op 'greater_scalar'") &&
                                       Contains("test_errors.cpp:" + std::to_string(cond_line)));
  (void)c;
  g.clear();  // and afresh
  Expr z = fails(g.input(at::ones({3})));
  g.forward(z);
  CHECK(at::equal(z.value(), at::full({3}, 2.0)));
}

TEST_CASE("a cond whose predicate ran before a failed launch of its round is served by the next forward",
          "[dsl][errors][backend][control]") {
  Graph g;
  const at::Tensor M = at::randn({3, 3});
  Expr y, c;
  {
    auto scope = g.example(2);
    Expr deep = g.input(at::randn({3}));
    for (int k = 0; k < 3; ++k) deep = dsl::matmul(M, deep);  // deeper than the predicate: its launch comes later
    y = fails(deep);
  }
  {
    auto scope = g.example(0);
    Expr x = g.input(at::ones({3}));
    c = dsl::cond(dsl::sum(x) > 0.0, [x] { return x * 2.0; }, [x] { return x; });
  }
  {
    const Failing on;  // the op's launch fails, after the predicate's ran
    REQUIRE_THROWS_WITH(g.forward(std::vector<Expr>{c, y}), Contains("op 'test_fails'") &&
                                                               Contains("batched launch"));
  }
  g.forward(c);  // the predicate is computed: its cond resolves and the branch runs
  CHECK(at::allclose(c.value(), at::full({3}, 2.0)));
}

TEST_CASE("pick at a computed index out of range or not whole: a UserError when the batch runs", "[dsl][errors]") {
  for (const double bad : {4.0, -1.0, 1.5}) {
    Graph g;
    Expr picked[2];
    for (int i = 0; i < 2; ++i) {
      auto scope = g.example(i);
      const Expr x = g.input(at::arange(4).to(at::kFloat));
      picked[i] = dsl::pick(x, g.input(at::full({}, i == 1 ? bad : 2.0)));
    }
    REQUIRE_THROWS_WITH(g.forward(std::vector<Expr>{picked[0], picked[1]}),
                        Contains("op 'pick' (example 1)") && Contains("out of range for a vector of 4") &&
                            Contains("test_errors.cpp"));
  }
  Graph g;  // in range: the value, and a gradient to x only
  const at::Tensor w = at::arange(4).to(at::kFloat).requires_grad_();
  auto scope = g.example(0);
  const Expr y = dsl::pick(dsl::tanh(g.param(w)) + g.input(at::zeros({4})), dsl::argmax(g.input(at::tensor({0.f, 3.f, 1.f}))));
  g.forward(y);
  CHECK(y.value().item<float>() == Approx(std::tanh(1.0f)));
}

TEST_CASE("lookup at a computed index out of range or not whole: a UserError when the batch runs", "[dsl][errors]") {
  const at::Tensor table = at::arange(12).to(at::kFloat).reshape({3, 4});
  for (const double bad : {3.0, -1.0, 0.5}) {
    Graph g;
    Expr rows[2];
    for (int i = 0; i < 2; ++i) {
      auto scope = g.example(i);
      rows[i] = dsl::lookup(table, g.input(at::full({}, i == 1 ? bad : 2.0)));
    }
    REQUIRE_THROWS_WITH(g.forward(std::vector<Expr>{rows[0], rows[1]}),
                        Contains("op 'lookup' (example 1)") && Contains("out of range for a table of 3 rows") &&
                            Contains("test_errors.cpp"));
  }
  Graph g;  // in range: the row
  auto scope = g.example(0);
  const Expr row = dsl::lookup(table, dsl::argmax(g.input(at::tensor({0.f, 3.f, 1.f}))));
  g.forward(row);
  CHECK(at::equal(row.value(), table[1]));
}

TEST_CASE("after an error the graph records and runs normally", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::ones({3}));
  REQUIRE_THROWS_AS(dsl::affine(W(), g.input(at::ones({2})), B()), UserError);
  CHECK_THAT(g.dump(), !Contains("affine"));  // the failed op recorded nothing
  Expr y = dsl::affine(W(), x, B());
  g.forward(y);
  CHECK(at::allclose(y.value(), at::mv(W(), at::ones({3})) + B()));
}

namespace {

// The message names this file and exactly `line`.
auto at_line(int line) { return Contains("test_errors.cpp:" + std::to_string(line) + ":"); }

}  // namespace

TEST_CASE("errors from forward, prepare, value, shape and item name the caller's line", "[dsl][errors]") {
  Graph g, other;
  Expr x = g.input(at::randn({4}));
  const int recorded = __LINE__ - 1;
  Expr elsewhere = other.input(at::randn({4}));
  int line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(g.forward(elsewhere), at_line(line) && Contains("op 'forward'") && Contains("different"));
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(g.prepare(std::vector<Expr>{elsewhere}), at_line(line) && Contains("op 'prepare'"));
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(x.value(), at_line(line) && Contains("not been computed") && Contains("op 'input'"));
  g.forward(x);
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(x.item(), at_line(line) && Contains("4 elements") &&
                                    Contains("test_errors.cpp:" + std::to_string(recorded) + ")"));
  g.clear();
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(x.value(), at_line(line) && Contains("was cleared since it was made"));
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(x.shape(), at_line(line) && Contains("was cleared since it was made"));
  line = __LINE__ + 1;
  REQUIRE_THROWS_WITH((void)g.example(-1), at_line(line) && Contains("example ids are >= 0"));
}

TEST_CASE("the shape of a cond result names the reader's line and the recording line", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({3}));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, [=] { return x; }, [=] { return -x; });
  const int recorded = __LINE__ - 1;
  const int line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(y.shape(), at_line(line) && Contains("test_errors.cpp:" + std::to_string(recorded)) &&
                                     Contains("not known yet"));
  REQUIRE_THROWS_WITH(dsl::chunk(y, 3), Contains("op 'chunk'") && Contains("dsl::cond"));
  g.forward(y);
  CHECK(y.shape() == Shape{3});
}

TEST_CASE("a target that cannot be computed names its op and line", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({3}));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, [=]() -> Expr { throw std::runtime_error("boom"); },
                     [=]() -> Expr { throw std::runtime_error("boom"); });
  const int recorded = __LINE__ - 2;
  REQUIRE_THROWS_WITH(g.forward(y), Contains("boom"));  // the branch's own error first
  const int line = __LINE__ + 1;
  REQUIRE_THROWS_WITH(g.forward(y), at_line(line) && Contains("could not be computed") && Contains("op 'cond'") &&
                                        Contains("test_errors.cpp:" + std::to_string(recorded)));
}

TEST_CASE("fetch_item and fetch_argmax of a wrong value name the co_await's line and the recording line",
          "[dsl][errors]") {
  Graph g;
  int line = 0, recorded = 0;
  auto item = [&](Graph& g) -> Task<double> {
    Expr v = g.input(at::ones({3}));
    recorded = __LINE__ - 1;
    line = __LINE__ + 1;
    co_return co_await fetch_item(v);
  };
  Task<double> t = item(g);
  try {
    g.forward();
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), at_line(line) && Contains("3 elements") && Contains("op 'input'") &&
                             Contains("test_errors.cpp:" + std::to_string(recorded) + ")"));
  }
}

TEST_CASE("co_await on a value of a cleared graph names the co_await's line", "[dsl][errors]") {
  Graph g;
  Expr x = g.input(at::randn({3}));
  g.clear();
  int line = 0;
  auto task = [&]() -> Task<double> {
    line = __LINE__ + 1;
    co_return co_await fetch_item(x);
  };
  try {
    Task<double> t = task();
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), at_line(line) && Contains("was cleared since it was made"));
  }
}

TEST_CASE("an input on another device than the graph's is refused when recorded", "[dsl][errors]") {
  if (!at::hasCUDA()) {
    Graph g;  // CPU inputs are fine for any graph (uploaded); a CUDA one needs a GPU to make
    CHECK_NOTHROW(g.input(at::randn({2})));
    return;
  }
  Graph g;
  REQUIRE_THROWS_WITH(g.input(at::randn({2}, at::kCUDA)), Contains("op 'input'") && Contains("device"));
}

TEST_CASE("lookup: any rank >= 1 works, a sparse gradient needs a 2-D table", "[dsl][errors]") {
  Graph g;
  const at::Tensor T3 = at::randn({4, 2, 3});
  Expr row = g.lookup(T3, 2);
  CHECK(row.shape() == Shape{2, 3});
  REQUIRE_THROWS_WITH(g.lookup(T3, 1, /*sparse_grad=*/true), Contains("op 'lookup'") && Contains("2-D"));
  g.forward(row);
  CHECK(at::equal(row.value(), T3[2]));
}

TEST_CASE("pick_neg_log_softmax of rows: rank, label count and range are errors naming op, example and labels",
          "[dsl][errors]") {
  Graph g;
  auto scope = g.example(3);
  const Expr x = g.input(at::randn({2, 5}));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(x, std::vector<int64_t>{1}),
                      Contains("op 'pick_neg_log_softmax'") && Contains("example 3") && Contains("1 labels for 2 rows"));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(x, std::vector<int64_t>{1, 5}),
                      Contains("label 5 (row 1)") && Contains("5 classes"));
  REQUIRE_THROWS_WITH(dsl::pick_neg_log_softmax(g.input(at::randn({5})), std::vector<int64_t>{1}),
                      Contains("[rows, classes]"));
  // The sum of the rows' losses, as LibTorch's cross-entropy.
  const Expr loss = dsl::pick_neg_log_softmax(x, std::vector<int64_t>{4, 0});
  g.forward(loss);
  const at::Tensor expected = at::nll_loss(at::log_softmax(x.value(), 1), at::tensor({4, 0}, at::kLong), {},
                                           at::Reduction::Sum);
  CHECK(at::allclose(loss.value(), expected));
}
