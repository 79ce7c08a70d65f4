// Ops defined outside the library (ops/user_op.h): registered at first use,
// recorded with dsl::call, checked batched vs alone like the built-in ones,
// against LibTorch's own values, and with the same errors at the user's line.
#include <ATen/ATen.h>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/user_op.h>

#include <memory>
#include <stdexcept>

#include "../support.h"

using namespace sheaf;
using sheaf::test::data;
using sheaf::test::param;

namespace {

// Elementwise: x * sigmoid(x).
struct Swish {
  static constexpr std::string_view name = "test_swish";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    c.expect_batched(0, "x");
    return c.shape(0);
  }
  static at::Tensor run(RunCtx& c) { return c.in(0) * at::sigmoid(c.in(0)); }
};

// scale * x^T A y: two per-example vectors and a shared matrix, a double
// attribute, a scalar out.
struct Bilinear {
  static constexpr std::string_view name = "test_bilinear";
  static constexpr OpTraits traits{.arity = 3};
  static Shape infer(const InferCtx& c) {
    c.expect_rank(0, 1, "x");
    c.expect_shared(1, "A");
    c.expect_rank(2, 1, "y");
    const Shape& A = c.shape(1);
    if (A.rank() != 2 || A[0] != c.shape(0)[0] || A[1] != c.shape(2)[0])
      c.fail("A has shape ", A.str(), ", x ", c.shape(0).str(), " and y ", c.shape(2).str());
    return {};
  }
  static at::Tensor run(RunCtx& c) {
    return (c.batched(0).matmul(c.in(1)) * c.batched(2)).sum(-1) * c.attr_f(0);  // [n]
  }
};

// Row by row: each row of x [L, d] scaled by its own norm (OpTraits::rowwise),
// so values of different lengths share one launch (a packed batch).
struct RowNormalise {
  static constexpr std::string_view name = "test_row_normalise";
  static constexpr OpTraits traits{.arity = 1, .rowwise = true};
  static Shape infer(const InferCtx& c) {
    c.expect_batched(0, "x");
    if (c.shape(0).rank() < 1) c.fail("needs rows, got a scalar");
    return c.shape(0);
  }
  static at::Tensor run(RunCtx& c) { return c.in(0) / (c.in(0).norm(2, -1, /*keepdim=*/true) + 1.0); }
};

// Per value, with rows of its own (OpTraits::own_rows): each row of x [Lq, d]
// plus the sum of k's rows [Lk, d], Lk any length, 0 included. Packed, k's
// rows arrive end to end, c.own_counts() rows a value.
struct KeySum {
  static constexpr std::string_view name = "test_key_sum";
  static constexpr OpTraits traits{.arity = 2, .rowwise = true, .per_value = true, .own_rows = 0b10};
  static Shape infer(const InferCtx& c) {
    c.expect_batched(0, "x");
    c.expect_batched(1, "k");
    c.expect_rank(0, 2, "x");
    c.expect_rank(1, 2, "k");
    if (c.shape(0)[1] != c.shape(1)[1]) c.fail("x has shape ", c.shape(0).str(), " and k ", c.shape(1).str());
    return c.shape(0);
  }
  static at::Tensor run(RunCtx& c) {
    if (!c.packed()) return c.in(0) + c.in(1).sum(1, /*keepdim=*/true);  // [n, Lq, d] + [n, 1, d]
    const std::span<const int64_t> counts = c.own_counts();
    std::vector<int64_t> owner;  // each row of k: its value
    for (size_t v = 0; v < counts.size(); ++v)
      owner.insert(owner.end(), static_cast<size_t>(counts[v]), static_cast<int64_t>(v));
    const at::Tensor ids = at::tensor(owner, at::TensorOptions().dtype(at::kLong)).to(c.in(1).device());
    const at::Tensor sums = at::zeros({static_cast<int64_t>(counts.size()), c.in(1).size(1)}, c.in(1).options())
                                .index_add(0, ids, c.in(1));
    return c.in(0) + sums.index_select(0, c.segment_ids());
  }
};

// A complete descriptor whose name is taken.
struct Tanh2 {
  static constexpr std::string_view name = "tanh";  // taken by the built-in op
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) { return at::tanh(c.in(0)); }
};

// Nine per-example arguments summed (more than the DSL keeps on its stack).
struct Sum9 {
  static constexpr std::string_view name = "test_sum9";
  static constexpr OpTraits traits{.arity = 9};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    at::Tensor s = c.in(0);
    for (int k = 1; k < 9; ++k) s = s + c.in(k);
    return s;
  }
};

// run() disagrees with infer(): sums the last axis away.
struct WrongRun {
  static constexpr std::string_view name = "test_wrong_run";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) { return c.in(0).sum(-1); }
};

// run() returns float64 (or int64): the right sizes, the wrong dtype.
template <at::ScalarType kType>
struct WrongDtype {
  static constexpr std::string_view name = kType == at::kDouble ? "test_double_run" : "test_long_run";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) { return c.in(0).to(kType); }
};

// Reads an attribute its calls may not pass: in infer() (kInInfer) or in run().
template <bool kInInfer>
struct ReadsAttr {
  static constexpr std::string_view name = kInInfer ? "test_attr_in_infer" : "test_attr_in_run";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    if (kInInfer) (void)c.attr(1);
    return c.shape(0);
  }
  static at::Tensor run(RunCtx& c) { return c.in(0) * static_cast<double>(c.attr(1)); }
};

// A kernel that reaches back into a graph: records into it, runs it, or
// reads one of its values (g_reach_into, g_reach_value), as a user might from
// a user op.
Graph* g_reach_into = nullptr;
Expr g_reach_value;
enum class Reach { kRecord, kForward, kValue, kClear, kPrepare };
Reach g_reach = Reach::kRecord;
struct ReachBack {
  static constexpr std::string_view name = "test_reach_back";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    if (g_reach_into != nullptr) {
      switch (g_reach) {
        case Reach::kRecord: (void)g_reach_into->input(at::ones({2})); break;
        case Reach::kForward: g_reach_into->forward(); break;
        case Reach::kValue: (void)g_reach_value.value(); break;
        case Reach::kClear: g_reach_into->clear(); break;
        case Reach::kPrepare: g_reach_into->prepare(); break;
      }
    }
    return c.in(0) * 2.0;
  }
};

// A kernel that destroys the graph whose round launched it (g_destroy), and
// then throws if g_destroy_throws.
std::unique_ptr<Graph>* g_destroy = nullptr;
bool g_destroy_throws = false;
struct DestroysItsGraph {
  static constexpr std::string_view name = "test_destroys_its_graph";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    if (g_destroy != nullptr) g_destroy->reset();
    if (g_destroy_throws) throw std::runtime_error("test_destroys_its_graph: thrown after the reset");
    return c.in(0) * 2.0;
  }
};

constexpr int64_t kD = 6;

}  // namespace

TEST_CASE("a user op: batched equals alone under every strategy, fused neighbours or not", "[dsl][user-ops][checker]") {
  const at::Tensor W = param({kD, kD}, 1), A = param({kD, kD}, 2);
  const int64_t scale = attr_of(0.5);
  for (int n : {1, 3, 16}) {
    INFO(n << " examples");
    CheckReport r = check_batched(n, [&](Graph& g, int i) {
      Expr h = dsl::tanh(dsl::matmul(W, g.input(data({kD}, i))));
      for (int k = 0; k <= i % 3; ++k) h = dsl::sigmoid(dsl::call(user_op<Swish>(), {h}) + 0.5);  // lengths differ
      Expr y = g.input(data({kD}, i, 1));
      return dsl::call(user_op<Bilinear>(), {h, A, y}, std::span(&scale, 1)) + dsl::sum(h);
    }, {.params = {W, A}});
    REQUIRE_BATCHED_EQUALS_ALONE(r);
    if (n > 1) CHECK(r.batched_launches < r.alone_launches);
  }
}

TEST_CASE("a row-by-row user op packs values of different lengths into one launch", "[dsl][user-ops][ragged]") {
  const at::Tensor W = param({kD, 3}, 1);
  auto program = [&](Graph& g, int i) {
    const Expr X = g.input(data({1 + i % 4, 3}, i));  // lengths 1 to 4
    return dsl::sum(dsl::call(user_op<RowNormalise>(), {dsl::affine(W, X, g.constant({kD}, 0.1))}));
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(8, program, {.params = {W}}));
  Graph g({.fuse = false});
  test::forward_examples(g, 8, program);
  int launches = 0;
  for (const PlannedBatch& b : sheaf::detail::engine_of(g).last_plan()->batches) launches += b.op == user_op<RowNormalise>();
  CHECK(launches == 1);
}

TEST_CASE("a per-value user op with rows of its own: of different lengths, of none, or none at all",
          "[dsl][user-ops][ragged]") {
  // A value whose own rows number 0 batches by its shape (a packed batch of
  // them once planned an input with nothing to read).
  const at::Tensor W = param({3, 3}, 1), b = param({3}, 2);
  const auto with_keys = [&](int64_t (*keys)(int)) {
    return [&, keys](Graph& g, int i) {
      const Expr X = dsl::tanh(dsl::affine(W, g.input(data({1 + i % 3, 3}, i)), b));
      const Expr K = dsl::affine(W, g.input(data({keys(i), 3}, i, 1)), b);
      return dsl::sum(dsl::call(user_op<KeySum>(), {X, K}) * X);
    };
  };
  const auto some = [](int i) -> int64_t { return 1 + i % 4; };
  const auto some_none = [](int i) -> int64_t { return i % 3; };
  const auto none = [](int) -> int64_t { return 0; };
  for (auto keys : {+some, +some_none, +none})
    REQUIRE_BATCHED_EQUALS_ALONE(check_batched(7, with_keys(keys), {.params = {W, b}}));
  // Keys of several lengths: one launch. Some of none (examples 0, 3 and 6,
  // whose x are all [1, 3]): those are one more launch, by their shape.
  for (auto [keys, want] : {std::pair{+some, 1}, std::pair{+some_none, 2}}) {
    Graph g({.fuse = false});
    test::forward_examples(g, 7, with_keys(keys));
    int launches = 0;
    for (const PlannedBatch& pb : sheaf::detail::engine_of(g).last_plan()->batches)
      launches += pb.op == user_op<KeySum>();
    CHECK(launches == want);
  }
}

TEST_CASE("a user op computes what its LibTorch call computes", "[dsl][user-ops]") {
  const at::Tensor A = param({kD, kD}, 2);
  Graph g;
  std::vector<Expr> s, b;
  const int64_t scale = attr_of(-2.0);
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    Expr x = g.input(data({kD}, i));
    s.push_back(dsl::call(user_op<Swish>(), {x}));
    b.push_back(dsl::call(user_op<Bilinear>(), {x, A, g.input(data({kD}, i, 3))}, std::span(&scale, 1)));
  }
  g.forward(b);
  g.forward(s);
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = data({kD}, i), y = data({kD}, i, 3);
    CHECK(at::allclose(s[static_cast<size_t>(i)].value(), x * at::sigmoid(x)));
    CHECK(at::allclose(b[static_cast<size_t>(i)].value(), -2.0 * x.matmul(A.detach()).dot(y)));
  }
  CHECK(g.stats().batches <= 3);  // the inputs' gathers aside: one launch per op for all four examples
  CHECK(user_op<Swish>() == user_op<Swish>());  // registered once
  CHECK(op_name(user_op<Swish>()) == "test_swish");
}

TEST_CASE("a user op of nine arguments: batched equals alone", "[dsl][user-ops][checker]") {
  const int n = GENERATE(1, 7);
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, [&](Graph& g, int i) {
    Expr x = g.input(data({kD}, i));
    return dsl::sum(dsl::call(user_op<Sum9>(), {x, x * 2.0, x, dsl::tanh(x), x, x, x + 1.0, x, dsl::sigmoid(x)}));
  }));
}

TEST_CASE("user ops: mistakes are UserErrors at the user's line", "[dsl][user-ops][errors]") {
  Graph g;
  const at::Tensor A = param({kD, kD}, 2);
  Expr x = g.input(data({kD}, 0)), short_y = g.input(data({kD - 1}, 0));
  const int64_t scale = attr_of(1.0);
  // Shape inference's own message, with op name and line.
  CHECK_THROWS_WITH(dsl::call(user_op<Bilinear>(), {x, A, short_y}, std::span(&scale, 1)),
                    Catch::Contains("test_user_ops.cpp") && Catch::Contains("op 'test_bilinear'") &&
                        Catch::Contains("A has shape [6, 6], x [6] and y [5]"));
  CHECK_THROWS_WITH(dsl::call(user_op<Bilinear>(), {x, x, x}, std::span(&scale, 1)),
                    Catch::Contains("A must be a shared tensor"));
  CHECK_THROWS_WITH(dsl::call(user_op<Swish>(), {x, x}), Catch::Contains("takes 1 arguments, got 2"));
  const std::vector<Expr> xs{x, x};
  CHECK_THROWS_WITH(dsl::call_list(user_op<Swish>(), xs), Catch::Contains("use dsl::call"));
  CHECK_THROWS_WITH(user_op<Tanh2>(), Catch::Contains("already an op named 'tanh'"));
  // A run() that returns another shape than infer() gave: the user's op named, not an internal error.
  Graph h;
  auto in_example = h.example(7);
  Expr wrong = dsl::call(user_op<WrongRun>(), {h.input(data({kD}, 0))});
  CHECK_THROWS_WITH(h.forward(wrong), Catch::Contains("op 'test_wrong_run'") && Catch::Contains("example 7") &&
                                          Catch::Contains("test_user_ops.cpp") && Catch::Contains("infer()") &&
                                          !Catch::Contains("internal"));
  // The same inside a sheaf::Function's body, read by the body's next step
  // (which broadcast [1] against [1, 6] before) and as the body's result.
  auto read_next = sheaf::function("read_next", [](Expr a) { return dsl::call(user_op<WrongRun>(), {a}) + a; });
  auto result = sheaf::function("result", [](Expr a) { return dsl::call(user_op<WrongRun>(), {a * 2.0}); });
  auto fails_named = [](Graph& b, Expr z) {
    CHECK_THROWS_WITH(b.forward(z), Catch::Contains("op 'test_wrong_run'") && Catch::Contains("infer()") &&
                                        !Catch::Contains("internal"));
  };
  Graph b1, b2;
  fails_named(b1, read_next(b1.input(data({kD}, 1))));
  fails_named(b2, result(b2.input(data({kD}, 1))));
  // Another dtype than float32, named at the op that returned it (it flowed
  // on before, to fail at whichever op read it next, or not at all).
  for (const bool fuse : {false, true}) {
    Graph d({.fuse = fuse});
    auto in_d = d.example(4);
    const Expr as_double = dsl::call(user_op<WrongDtype<at::kDouble>>(), {d.input(data({kD}, 0))});
    const Expr as_long = dsl::call(user_op<WrongDtype<at::kLong>>(), {d.input(data({kD}, 0))});
    CHECK_THROWS_WITH(d.forward(dsl::tanh(as_double) * 2.0),
                      Catch::Contains("op 'test_double_run'") && Catch::Contains("example 4") &&
                          Catch::Contains("dtype Double") && Catch::Contains("float32"));
    CHECK_THROWS_WITH(d.forward(dsl::affine(A, as_long, at::zeros({kD}))),
                      Catch::Contains("op 'test_long_run'") && Catch::Contains("dtype Long"));
  }
  // An attribute the call did not pass: an error naming the op, not a read past the list.
  const int64_t one = 3;
  CHECK_THROWS_WITH(dsl::call(user_op<ReadsAttr<true>>(), {x}, std::span(&one, 1)),
                    Catch::Contains("op 'test_attr_in_infer'") && Catch::Contains("asks for attribute 1") &&
                        Catch::Contains("passed 1"));
  Graph a;
  const Expr reads = dsl::call(user_op<ReadsAttr<false>>(), {a.input(data({kD}, 0))}, std::span(&one, 1));
  CHECK_THROWS_WITH(a.forward(reads), Catch::Contains("op 'test_attr_in_run'") &&
                                          Catch::Contains("asks for attribute 1") && Catch::Contains("passed 1"));
  // The graph is still usable.
  Expr y = dsl::call(user_op<Swish>(), {x});
  g.forward(y);
  CHECK(y.value().size(0) == kD);
}

TEST_CASE("user ops: a kernel that records into, runs, clears or reads its own graph is a UserError", "[dsl][user-ops][errors]") {
  // Recording grew the store the round was reading, and a forward planned
  // over the running round ("batch output slot mismatch", an internal error).
  for (Reach reach : {Reach::kRecord, Reach::kForward, Reach::kValue, Reach::kClear, Reach::kPrepare}) {
    INFO("reach " << static_cast<int>(reach));
    Graph g;
    Expr x = g.input(data({kD}, 0));
    g.forward(x);
    g_reach_into = &g;
    g_reach = reach;
    g_reach_value = x;
    Expr y = dsl::call(user_op<ReachBack>(), {dsl::tanh(x)});
    // Named: what the kernel called, at its line.
    const char* const names[] = {"op 'input'", "op 'forward'", "op 'value'", "op 'clear'", "op 'prepare'"};
    const char* called = names[static_cast<int>(reach)];
    CHECK_THROWS_WITH(g.forward(y), Catch::Contains(called) &&
                                        Catch::Contains("from inside one of its own kernels") &&
                                        Catch::Contains("test_user_ops.cpp") && !Catch::Contains("internal"));
    g_reach_into = nullptr;
    // The graph works on, and its kernels may use another graph.
    Graph other;
    g_reach_into = &other;
    g_reach = Reach::kRecord;
    Expr z = dsl::call(user_op<ReachBack>(), {x});
    g.forward(z);
    g_reach_into = nullptr;
    CHECK(at::allclose(z.value(), x.value() * 2.0));
    other.forward();
    CHECK(other.stats().nodes == 1);  // what the kernel recorded there
  }
}

TEST_CASE("user ops: a kernel that destroys its own graph ends that forward with a UserError, not a use after free",
          "[dsl][user-ops][errors]") {
  auto g = std::make_unique<Graph>();
  Expr x = g->input(data({kD}, 0));
  Expr y = dsl::call(user_op<DestroysItsGraph>(), {dsl::tanh(x)});
  Expr z = dsl::sum(y) * 3.0;  // a later round's, dropped with the rest of the forward
  bool branch_ran = false;
  Expr w = dsl::cond(dsl::sum(y) > -1e9, [&, y] { branch_ran = true; return y; }, [y] { return y * 0.0; });
  Graph* raw = g.get();
  g_destroy = &g;
  REQUIRE_THROWS_WITH(raw->forward({z, w}), Catch::Contains("destroyed by a kernel of one of its own rounds") &&
                                              Catch::Contains("test_user_ops.cpp") && !Catch::Contains("internal"));
  g_destroy = nullptr;
  CHECK(g == nullptr);
  CHECK_FALSE(branch_ran);  // no callback ran on the destroyed graph
  CHECK_THROWS_WITH(x.value(), Catch::Contains("was destroyed since it was made"));
  // Graphs made afterwards work.
  Graph h;
  Expr t = dsl::tanh(h.input(data({kD}, 1)));
  h.forward(t);
  CHECK(at::allclose(t.value(), at::tanh(data({kD}, 1))));

  // A kernel that destroys its graph and then throws: that error, and the
  // engine freed (its slot is free again: the next graph takes it, the free
  // slots being reused last freed first).
  auto doomed = std::make_unique<Graph>();
  const uint32_t slot = sheaf::detail::engine_of(*doomed).slot();
  Expr in = doomed->input(data({kD}, 2));
  Expr out = dsl::call(user_op<DestroysItsGraph>(), {in});
  Graph* doomed_raw = doomed.get();
  g_destroy = &doomed;
  g_destroy_throws = true;
  CHECK_THROWS_WITH(doomed_raw->forward(out), Catch::Contains("thrown after the reset"));
  g_destroy = nullptr;
  g_destroy_throws = false;
  CHECK(doomed == nullptr);
  Graph next;
  CHECK(sheaf::detail::engine_of(next).slot() == slot);  // not kept by a leaked engine
}
