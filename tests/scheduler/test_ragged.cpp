// Packed batches: per-example matrices whose lengths differ share one launch
// for ops that compute row by row (OpTraits::rowwise), and every other op
// reads their rows right (scheduler/plan.h: Read::flatten, BatchArg::unpack).
#include <ATen/ops/lstm.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/op.h>

#include "../support.h"
#include "launches.h"

using namespace sheaf;
using Catch::Contains;

using test::launches_of;

namespace {

int64_t length_of(int example) { return 1 + (example * 5) % 7; }  // 1..7, most lengths twice

}  // namespace

TEST_CASE("ragged: row-by-row ops over matrices of different lengths take one launch each", "[scheduler][ragged]") {
  const at::Tensor W = test::param({6, 4}, 1), b = test::param({6}, 2), gain = test::param({6}, 3);
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name()) {
      Graph g({.fuse = false});
      std::vector<Expr> outs;
      const int n = 12;
      for (int i = 0; i < n; ++i) {
        auto s = g.example(i);
        const Expr X = g.input(test::data({length_of(i), 4}, i));
        const Expr Y = dsl::tanh(dsl::affine(W, X, b)) * 2.0 + gain;
        outs.push_back(dsl::softmax(dsl::layer_norm(Y, gain, b)));
      }
      g.forward(outs, {.strategy = strategy});
      CHECK(launches_of(g, "affine") == 1);
      CHECK(launches_of(g, "tanh") == 1);
      CHECK(launches_of(g, "mul_scalar") == 1);
      CHECK(launches_of(g, "add") == 1);
      CHECK(launches_of(g, "layer_norm") == 1);
      CHECK(launches_of(g, "softmax") == 1);
      CHECK_THAT(g.plan_str(), Contains("packed"));
      c10::NoGradGuard no_grad;
      for (int i = 0; i < n; ++i) {
        const at::Tensor X = test::data({length_of(i), 4}, i);
        const at::Tensor Y = at::tanh(at::linear(X, W, b)) * 2.0 + gain;
        const at::Tensor want = at::softmax(at::layer_norm(Y, {6}, gain, b), -1);
        INFO("example " << i);
        CHECK(at::allclose(outs[static_cast<size_t>(i)].value(), want, 1e-4, 1e-5));
      }
    }
  }
}

TEST_CASE("ragged: values and gradients equal each example alone, every strategy, fused and unfused",
          "[scheduler][ragged][checker]") {
  const at::Tensor W = test::param({6, 4}, 1), b = test::param({6}, 2), gain = test::param({6}, 3);
  const at::Tensor V = test::param({5, 6}, 4), c = test::param({5}, 5);
  // Packed values read by ops that take whole values (sum, matmul, transpose,
  // slice, concat, a list sum, a stack) and packed ops that read values that
  // are not packed (a slice's rows, a matmul's rows).
  auto program = [&](Graph& g, int i) {
    const int64_t len = length_of(i);
    const Expr X = g.input(test::data({len, 4}, i));
    const Expr H = dsl::relu(dsl::affine(W, X, b)) + dsl::affine(W, X * 0.5, b);  // packed [len, 6]
    const Expr N = dsl::layer_norm(H, gain, b);
    const Expr A = dsl::softmax(dsl::matmul(N, dsl::transpose(H)));                // [len, len]: by length
    const Expr C = dsl::matmul(A, N);                                               // not packed
    const Expr D = dsl::affine(V, C, c) * dsl::affine(V, H, c);
    const Expr first_row = dsl::affine(V, dsl::slice(H, 0, 1, 0), c);  // a slice's rows, packed again
    const Expr E = dsl::concat({dsl::slice(D, 0, 2), dsl::tanh(dsl::slice(D, 2, 5))});  // not packed, then packed
    const Expr L = dsl::log_softmax(E - dsl::sum(std::vector<Expr>{E, D * 2.0}));
    // (relu makes ties: max_dim and min_dim share the gradient between them.)
    return dsl::sum(L) + dsl::sum(dsl::sum_dim(N, 0)) + dsl::sum(dsl::stack({D, E})) + dsl::sum(first_row) +
           dsl::mean(dsl::mean_dim(D, 0) * 3.0) + dsl::mean(H) + dsl::sum(dsl::max_dim(dsl::relu(H), 0)) +
           dsl::sum(dsl::min_dim(dsl::relu(D), 0)) * 0.5 + dsl::sum(dsl::logsumexp_dim(N * 3.0, 0));
  };
  const CheckReport r = check_batched(9, program, {.params = {W, b, gain, V, c}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
  CHECK(r.batched_launches < r.alone_launches);
  // The program exercises every kind of read: packed batches, rows of values
  // that are not packed (flattened), and whole values from packed rows.
  Graph g({.fuse = false});
  test::forward_examples(g, 9, program);
  const std::string plan = g.plan_str();
  INFO(plan);
  CHECK_THAT(plan, Contains("packed"));
  CHECK_THAT(plan, Contains("flattened"));
  CHECK_THAT(plan, Contains("rows unpacked"));
}

TEST_CASE("ragged: value() of packed values, and their host values in a coroutine", "[scheduler][ragged][control]") {
  const at::Tensor W = test::param({3, 2}, 1).detach(), b = test::param({3}, 2).detach();
  Graph g({.fuse = false});
  std::vector<Expr> outs;
  for (int i = 0; i < 5; ++i) {
    auto s = g.example(i);
    outs.push_back(dsl::affine(W, g.input(test::data({length_of(i), 2}, i)), b));
  }
  g.forward(outs);
  REQUIRE(launches_of(g, "affine") == 1);
  for (int i = 0; i < 5; ++i) {
    const at::Tensor want = at::linear(test::data({length_of(i), 2}, i), W, b);
    const at::Tensor got = outs[static_cast<size_t>(i)].value();
    REQUIRE(got.sizes() == want.sizes());
    CHECK(at::allclose(got, want, 1e-4, 1e-5));
  }
  // A decision on a packed value's host copy (CPU: read in place from its rows).
  const at::Tensor V = test::param({3, 2}, 3), c = test::param({3}, 4);
  auto program = [&](Graph& pg, int i) -> Task<Expr> {
    const Expr Y = dsl::affine(V, pg.input(test::data({length_of(i), 2}, i)), c);
    const std::vector<float> v = co_await fetch_values(Y);
    const at::Tensor want = at::linear(test::data({length_of(i), 2}, i), V.detach(), c.detach()).reshape({-1});
    CHECK(static_cast<int64_t>(v.size()) == want.numel());
    for (int64_t k = 0; k < want.numel() && k < static_cast<int64_t>(v.size()); ++k)
      CHECK(v[static_cast<size_t>(k)] == Approx(want[k].item<float>()).margin(1e-5));
    co_return v.back() > 0 ? dsl::sum(dsl::tanh(Y)) : dsl::sum(Y * 3.0);
  };
  const CheckReport r = check_batched(7, TaskProgram(program), {.params = {V, c}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("ragged: a per-example vector is repeated on every row, and another length is not packed", "[scheduler][ragged]") {
  const at::Tensor W = test::param({3, 3}, 1), b = test::param({3}, 2);
  {
    Graph g({.fuse = false});
    const std::vector<Expr> outs = test::forward_examples(g, 4, [](Graph& pg, int i) {
      return pg.input(test::data({length_of(i), 3}, i)) + pg.input(test::data({3}, i, 1));  // [L, 3] + [3]
    });
    CHECK(launches_of(g, "add") == 1);  // lengths 1, 6, 4, 2: one packed launch, v repeated on each row
    for (int i = 0; i < 4; ++i)
      CHECK(at::allclose(outs[static_cast<size_t>(i)].value(), test::data({length_of(i), 3}, i) + test::data({3}, i, 1)));
  }
  {
    Graph g({.fuse = false});
    const std::vector<Expr> outs = test::forward_examples(g, 4, [](Graph& pg, int i) {
      return pg.input(test::data({length_of(i), 3}, i)) * pg.input(test::data({1, 3}, i, 1));  // [L, 3] * [1, 3]
    });
    CHECK(launches_of(g, "mul") == 4);  // a row broadcast per example: batches by length only (length 1 packs alone)
  }
  // A per-example bias of an affine and a per-example vector in a fused region, through the checker.
  const CheckReport r = check_batched(8, [&](Graph& g, int i) {
    const Expr X = g.input(test::data({length_of(i), 3}, i));
    const Expr v = dsl::tanh(g.input(test::data({3}, i, 1)));
    const Expr H = dsl::affine(W, X, v) + v;  // both packed, v repeated
    return dsl::sum(dsl::sigmoid(H) * 2.0 + v) + dsl::sum(dsl::affine(W, H, b));
  }, {.params = {W, b}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("ragged: a function whose body works on matrices, called with different lengths", "[scheduler][ragged][function]") {
  const at::Tensor W = test::param({5, 4}, 1), b = test::param({5}, 2), gain = test::param({5}, 3);
  // Calls batch by argument shapes (one length per call batch); inside the
  // body the row-by-row ops are packed batches of one value each.
  auto body = std::function<Expr(Expr)>([&](Expr X) {
    const Expr H = dsl::tanh(dsl::affine(W, X, b)) + 1.0;
    return dsl::layer_norm(H * dsl::sigmoid(H), gain, b);
  });
  auto f = function("ragged_body", body);
  auto program = [&](Graph& g, int i) {
    Expr X = g.input(test::data({length_of(i), 4}, i));
    Expr Y = f(X);
    Y = f(dsl::slice(dsl::concat({Y, Y}, 1), 2, 6, 1));  // [L, 4] again
    return dsl::sum(dsl::softmax(Y));
  };
  const CheckReport r = check_batched(10, program, {.params = {W, b, gain}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("ragged: slices of one gathered input are one gather and one split", "[scheduler][ragged][planner]") {
  const at::Tensor Wq = test::param({4, 3}, 1), Wk = test::param({4, 3}, 2), b = test::param({4}, 3);
  auto program = [&](Graph& g, int i) {
    const Expr X = g.input(test::data({length_of(i), 3}, i));
    const Expr Q = dsl::affine(Wq, X, b), K = dsl::affine(Wk, X, b);
    Expr out = g.constant({}, 0.0);
    for (int h = 0; h < 2; ++h)  // two heads: slices of Q and K batch together per head
      out = out + dsl::sum(dsl::tanh(dsl::slice(Q, 2 * h, 2 * h + 2)) * dsl::slice(K, 2 * h, 2 * h + 2));
    return out;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, program, {.params = {Wq, Wk, b}}));
  Graph g({.fuse = false});
  test::forward_examples(g, 6, program);
  const Plan& plan = *sheaf::detail::engine_of(g).last_plan();
  int slices = 0, cut_from_one_gather = 0;
  for (const PlannedBatch& pb : plan.batches)
    if (!pb.program && op_name(pb.op) == "slice") {
      ++slices;
      cut_from_one_gather += pb.split >= 0 && plan.splits[static_cast<size_t>(pb.split)].gathered >= 0;
    }
  CHECK(slices == 2);               // one per head, each over Q and K of every example
  CHECK(cut_from_one_gather == 2);  // Q and K gathered side by side once, then split
}

TEST_CASE("ragged: sums, means, maxima, minima and logsumexp over the rows of values of different lengths take one launch", "[scheduler][ragged]") {
  Graph g({.fuse = false});
  const int n = 9;
  std::vector<Expr> s, m, sd, md, mx, mn, lse;
  for (int i = 0; i < n; ++i) {
    auto scope = g.example(i);
    const Expr X = g.input(test::data({length_of(i), 3}, i));
    s.push_back(dsl::sum(X));
    m.push_back(dsl::mean(X));
    sd.push_back(dsl::sum_dim(X, 0));
    md.push_back(dsl::mean_dim(X, 0));
    mx.push_back(dsl::max_dim(X, 0));
    mn.push_back(dsl::min_dim(X, 0));
    lse.push_back(dsl::logsumexp_dim(X * 10.0, 0));  // large: the shift matters
  }
  std::vector<Expr> all = s;
  for (auto* v : {&m, &sd, &md, &mx, &mn, &lse}) all.insert(all.end(), v->begin(), v->end());
  g.forward(all);
  for (const char* op : {"sum", "mean", "sum_dim", "mean_dim", "max_dim", "min_dim", "logsumexp_dim"}) {
    INFO(op);
    CHECK(launches_of(g, op) == 1);
  }
  for (int i = 0; i < n; ++i) {
    const at::Tensor x = test::data({length_of(i), 3}, i);
    const auto k = static_cast<size_t>(i);
    CHECK(at::allclose(s[k].value(), x.sum(), 1e-4, 1e-5));
    CHECK(at::allclose(m[k].value(), x.mean(), 1e-4, 1e-5));
    CHECK(at::allclose(sd[k].value(), x.sum(0), 1e-4, 1e-5));
    CHECK(at::allclose(md[k].value(), x.mean(0), 1e-4, 1e-5));
    CHECK(at::allclose(mx[k].value(), std::get<0>(x.max(0)), 1e-4, 1e-5));
    CHECK(at::allclose(mn[k].value(), std::get<0>(x.min(0)), 1e-4, 1e-5));
    CHECK(at::allclose(lse[k].value(), (x * 10.0).logsumexp(0), 1e-4, 1e-5));
  }
}

// Dot-product attention over encodings of different lengths, as a decoder step
// writes it: a packed vector of scores (one element per row of H), a softmax
// across each value's elements, and the context as the weights times H's rows.
TEST_CASE("ragged: attention scores, softmax and context over values of different lengths take one launch each",
          "[scheduler][ragged]") {
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name()) {
      Graph g({.fuse = false});
      const int n = 12;
      std::vector<Expr> context, logp, total;
      for (int i = 0; i < n; ++i) {
        auto scope = g.example(i);
        const Expr H = g.input(test::data({length_of(i), 4}, i));
        const Expr s = g.input(test::data({4}, 100 + i));
        const Expr scores = dsl::matmul(H, s) * 0.5;  // [len]: packed, and so is the product by a scalar
        context.push_back(dsl::matmul(dsl::softmax(scores), H));
        logp.push_back(dsl::log_softmax(scores));
        total.push_back(dsl::sum(scores));
      }
      std::vector<Expr> all = context;
      all.insert(all.end(), logp.begin(), logp.end());
      all.insert(all.end(), total.begin(), total.end());
      g.forward(all, {.strategy = strategy});
      CHECK(launches_of(g, "matmul") == 2);  // the scores, the contexts
      CHECK(launches_of(g, "mul_scalar") == 1);
      CHECK(launches_of(g, "softmax") == 1);
      CHECK(launches_of(g, "log_softmax") == 1);
      CHECK(launches_of(g, "sum") == 1);
      c10::NoGradGuard no_grad;
      for (int i = 0; i < n; ++i) {
        const at::Tensor H = test::data({length_of(i), 4}, i), s = test::data({4}, 100 + i);
        const at::Tensor scores = H.mv(s) * 0.5;
        const auto k = static_cast<size_t>(i);
        INFO("example " << i);
        CHECK(at::allclose(context[k].value(), at::softmax(scores, 0).matmul(H), 1e-4, 1e-5));
        CHECK(at::allclose(logp[k].value(), at::log_softmax(scores, 0), 1e-4, 1e-5));
        CHECK(at::allclose(total[k].value(), scores.sum(), 1e-4, 1e-5));
      }
    }
  }
}

TEST_CASE("ragged: attention over values of different lengths equals each example alone, every strategy",
          "[scheduler][ragged][checker]") {
  const at::Tensor W = test::param({4, 4}, 1), b = test::param({4}, 2);
  auto program = [&](Graph& g, int i) {
    const Expr H = dsl::tanh(dsl::affine(W, g.input(test::data({length_of(i), 4}, i)), b));  // packed [len, 4]
    const Expr s = dsl::tanh(dsl::affine(W, g.input(test::data({4}, 100 + i)), b));
    const Expr a = dsl::softmax(dsl::matmul(H, s) + dsl::matmul(H, s * 2.0));
    const Expr context = dsl::matmul(a, H);
    // A packed vector read whole (pick, dot), reduced (mean) and weighing the
    // rows of a matrix that is not packed; a vector that is not packed
    // weighing the rows of a packed matrix.
    const Expr T = dsl::transpose(dsl::transpose(H));
    const Expr w = dsl::sigmoid(g.input(test::data({length_of(i)}, 200 + i)));
    return dsl::sum(context) + dsl::pick(dsl::log_softmax(a), 0) + dsl::mean(a * a) + dsl::sum(dsl::matmul(a, T)) +
           dsl::dot(a, a) + dsl::sum(dsl::matmul(w, H)) + dsl::max_dim(dsl::matmul(H, s), 0);
  };
  const CheckReport r = check_batched(9, program, {.params = {W, b}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
  CHECK(r.batched_launches < r.alone_launches);
}

TEST_CASE("ragged: attention over sentences of different lengths is one launch, whatever the keys' lengths",
          "[scheduler][ragged]") {
  const at::Tensor Wq = test::param({8, 8}, 1), Wv = test::param({4, 8}, 2), b = test::param({8}, 3),
                   c = test::param({4}, 4);
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name()) {
      Graph g({.fuse = false});
      const int n = 12;
      std::vector<Expr> outs, cross, plain;
      for (int i = 0; i < n; ++i) {
        auto scope = g.example(i);
        const Expr X = g.input(test::data({length_of(i), 8}, i));
        const Expr Q = dsl::affine(Wq, X, b), V = dsl::tanh(dsl::affine(Wv, X, c));
        outs.push_back(dsl::attention(Q, X, V, 2));  // packed: every length at once
        // Keys of another length than the queries (a decoder over an encoder):
        // the first 1..7 rows, so that pairs of lengths differ across examples.
        const int64_t keys = 1 + (i * 3) % length_of(i);
        cross.push_back(dsl::attention(Q, dsl::slice(X, 0, keys, 0), dsl::slice(V, 0, keys, 0), 4));
        plain.push_back(dsl::attention(Q, dsl::slice(X, 0, 1, 0), dsl::slice(V, 0, 1, 0), 4, 1.0));
      }
      std::vector<Expr> all = outs;
      all.insert(all.end(), cross.begin(), cross.end());
      all.insert(all.end(), plain.begin(), plain.end());
      g.forward(all, {.strategy = strategy});
      // One packed launch each: self-attention, cross-attention, plain dot products.
      CHECK(launches_of(g, "attention") == 3);
      c10::NoGradGuard no_grad;
      for (int i = 0; i < n; ++i) {
        const at::Tensor X = test::data({length_of(i), 8}, i);
        const at::Tensor Q = at::linear(X, Wq, b), V = at::tanh(at::linear(X, Wv, c));
        const auto k = static_cast<size_t>(i);
        INFO("example " << i);
        CHECK(at::allclose(outs[k].value(), test::attention_of(Q, X, V, 2), 1e-4, 1e-5));
        const int64_t keys = 1 + (i * 3) % length_of(i);
        CHECK(at::allclose(cross[k].value(), test::attention_of(Q, X.narrow(0, 0, keys), V.narrow(0, 0, keys), 4), 1e-4,
                           1e-5));
        CHECK(at::allclose(plain[k].value(), test::attention_of(Q, X.narrow(0, 0, 1), V.narrow(0, 0, 1), 4, 1.0), 1e-4,
                           1e-5));
      }
    }
  }
}

TEST_CASE("ragged: a row counted from the end is one launch over values of different lengths", "[scheduler][ragged]") {
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name()) {
      Graph g({.fuse = false});
      const int n = 12;
      std::vector<Expr> last, first, by_slice;
      for (int i = 0; i < n; ++i) {
        auto scope = g.example(i);
        const Expr X = dsl::tanh(g.input(test::data({length_of(i), 4}, i)));
        last.push_back(dsl::row(X, -1));
        first.push_back(dsl::row(X, 0));
        by_slice.push_back(dsl::slice(X, length_of(i) - 1, length_of(i), 0));
      }
      std::vector<Expr> all = last;
      all.insert(all.end(), first.begin(), first.end());
      all.insert(all.end(), by_slice.begin(), by_slice.end());
      g.forward(all, {.strategy = strategy});
      CHECK(launches_of(g, "row") == 2);    // every length at once, each end
      CHECK(launches_of(g, "slice") == 7);  // a slice's bounds differ by length
      for (int i = 0; i < n; ++i) {
        const at::Tensor X = at::tanh(test::data({length_of(i), 4}, i));
        const auto k = static_cast<size_t>(i);
        INFO("example " << i);
        CHECK(at::allclose(last[k].value(), X[length_of(i) - 1]));
        CHECK(at::allclose(first[k].value(), X[0]));
      }
    }
  }
}

TEST_CASE("ragged: self-attention equals each example alone, values and gradients, every strategy",
          "[scheduler][ragged][checker]") {
  const at::Tensor W = test::param({8, 8}, 1), b = test::param({8}, 2);
  auto program = [&](Graph& g, int i) {
    const Expr X = dsl::tanh(g.input(test::data({length_of(i), 8}, i)));
    const Expr Q = dsl::affine(W, X, b);
    // Self-attention (and the same value as queries and keys), and keys of
    // another length (two queries over all rows; all queries over the first
    // rows), on packed rows and rows that are not.
    const Expr A = dsl::attention(Q, X * 0.5, dsl::sigmoid(X), 2) + dsl::attention(X, X, Q, 1);
    const Expr C = dsl::attention(dsl::stack({dsl::sum_dim(A, 0), dsl::mean_dim(Q, 0)}), X, Q, 4);
    const int64_t keys = 1 + i % length_of(i);
    const Expr D = dsl::attention(A, dsl::slice(Q, 0, keys, 0), dsl::slice(X, 0, keys, 0), 2, 0.5);
    return dsl::sum(A) + dsl::sum(C) * 0.5 + dsl::sum(D) * 0.25;
  };
  const CheckReport r = check_batched(9, program, {.params = {W, b}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
  CHECK(r.batched_launches < r.alone_launches);
}

TEST_CASE("ragged: an LSTM over sequences of different lengths is one launch a direction, as at::lstm computes it, with and without a gradient",
          "[scheduler][ragged]") {
  const at::Tensor ih = test::param({16, 8}, 1), hh = test::param({16, 4}, 2), b = test::param({16}, 3);
  // at::lstm over one sequence [L, 8] (reverse: over the rows flipped, flipped back).
  auto reference = [&](const at::Tensor& X, bool reverse, const at::Tensor& start = {}) {
    const at::Tensor x = reverse ? X.flip(0) : X;
    const at::Tensor h0 = at::zeros({1, 1, 4});
    const at::Tensor out = std::get<0>(at::lstm(x.unsqueeze(1), {start.defined() ? start.view({1, 1, 4}) : h0, h0},
                                                {ih, hh, b, at::zeros({16})},
                                                /*has_biases=*/true, 1, 0.0, false, false, false))
                               .squeeze(1);
    return reverse ? out.flip(0) : out;
  };
  // packed_lstm with its fused cell (float on the CPU), with a gradient wanted
  // and without (then nothing is kept for a backward).
  for (const bool grad : {true, false})
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name() << (grad ? "" : ", no gradient")) {
      c10::AutoGradMode mode(grad);
      Graph g;
      const int n = 12;
      std::vector<Expr> fwd, bwd, same, from;
      for (int i = 0; i < n; ++i) {
        auto scope = g.example(i);
        const Expr X = g.input(test::data({length_of(i), 8}, i));
        from.push_back(dsl::lstm(X, ih, hh, b, g.input(test::data({4}, i, 1))));  // from a given state
        fwd.push_back(dsl::lstm(X, ih, hh, b));
        bwd.push_back(dsl::lstm(X, ih, hh, b, /*reverse=*/true));
        same.push_back(dsl::lstm(dsl::slice(X, 0, 1, 0), ih, hh, b));  // one length: by shape
      }
      std::vector<Expr> all = fwd;
      all.insert(all.end(), bwd.begin(), bwd.end());
      all.insert(all.end(), same.begin(), same.end());
      all.insert(all.end(), from.begin(), from.end());
      g.forward(all, {.strategy = strategy});
      CHECK(launches_of(g, "lstm_from") == 1);
      // One launch a direction; the one-row sequences of `same` join the
      // forward launch where the strategy runs them in one round (not depth's:
      // they come one level later).
      CHECK(launches_of(g, "lstm") == (strategy->name() == std::string("depth") ? 3 : 2));
      c10::NoGradGuard no_grad;
      for (int i = 0; i < n; ++i) {
        const at::Tensor X = test::data({length_of(i), 8}, i);
        const auto k = static_cast<size_t>(i);
        INFO("example " << i);
        CHECK(at::allclose(fwd[k].value(), reference(X, false), 1e-4, 1e-5));
        CHECK(at::allclose(bwd[k].value(), reference(X, true), 1e-4, 1e-5));
        CHECK(at::allclose(same[k].value(), reference(X.narrow(0, 0, 1), false), 1e-4, 1e-5));
        CHECK(at::allclose(from[k].value(), reference(X, false, test::data({4}, i, 1)), 1e-4, 1e-5));
      }
    }
  }
}

TEST_CASE("ragged: a packed batch's gathered input is each value's rows in row order, planned by runs",
          "[scheduler][ragged][planner]") {
  // The mul's rows follow its first argument (tanh rows for odd examples,
  // then sigmoid rows for even ones); its second argument's rows lie in two
  // other batches (relu where i % 3 == 0, abs elsewhere) in another order: a
  // gather of one read per source, a value's L rows at a time, then
  // permuted. The add reads a per-example vector once per row of its
  // example (a repeated row).
  const auto program = [](Graph& g, int i) {
    const Expr X = g.input(test::data({length_of(i), 3}, i));
    const Expr Y = i % 2 ? dsl::tanh(X) : dsl::sigmoid(X);
    const Expr V = i % 3 ? dsl::abs(X) : dsl::relu(X);
    return Y * V + dsl::tanh(g.input(test::data({3}, i, 1)));
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(9, program));
  Graph g({.fuse = false});
  test::forward_examples(g, 9, program);
  const Plan& plan = *sheaf::detail::engine_of(g).last_plan();
  const NodeStore& s = sheaf::detail::engine_of(g).store();
  // Rows (batch, row) an input gets, decoded from its reads, indices and permutation.
  auto decode = [&](const BatchArg& a) {
    std::vector<std::pair<uint32_t, int64_t>> rows;
    for (uint32_t q = a.reads_begin; q < a.reads_end; ++q) {
      const Read& r = plan.reads[q];
      for (uint32_t j = 0; j < r.len; ++j)
        rows.emplace_back(r.batch, r.index >= 0 ? plan.indices[static_cast<size_t>(r.index + j)] : r.start + j);
    }
    if (a.perm < 0) return rows;
    std::vector<std::pair<uint32_t, int64_t>> permuted;
    for (size_t j = 0; j < rows.size(); ++j) permuted.push_back(rows[static_cast<size_t>(plan.indices[a.perm + j])]);
    return permuted;
  };
  int gathered = 0, repeated = 0;
  for (const PlannedBatch& b : plan.batches) {
    const std::string_view name = op_name(b.op);
    if (b.rows == 0 || (name != "mul" && name != "add")) continue;
    for (uint32_t k = 0; k < b.arity; ++k) {
      // What row by row planning would list: each node's argument's rows in
      // turn (L rows of a packed value; a vector once per row of its reader).
      std::vector<std::pair<uint32_t, int64_t>> expected;
      for (uint32_t i = 0; i < b.n; ++i) {
        const NodeId node = plan.nodes[b.nodes_begin + i];
        const NodeId a = s.resolve(s.args_of(node)[k]);
        const auto length = static_cast<uint32_t>(s.shape_of(node)[0]);
        const bool packed = s.has(a, NodeStore::kPacked);
        for (uint32_t j = 0; j < length; ++j) expected.emplace_back(s.value_at[a].batch, s.value_at[a].row + (packed ? j : 0));
      }
      const BatchArg& arg = plan.args[b.args_begin + k];
      CHECK(decode(arg) == expected);
      gathered += arg.kind == BatchArg::kGather && arg.perm >= 0 && arg.reads_end - arg.reads_begin == 2;
      repeated += name == "add" && k == 1;
    }
  }
  CHECK(gathered == 1);  // the mul's second input: two sources, permuted
  CHECK(repeated == 1);
}

TEST_CASE("ragged: values of length 0 batch by their shape, beside values of other lengths", "[scheduler][ragged]") {
  // A packed batch's rows are its values' rows: values without any are not
  // packed (a batch of them once ran as rows that did not exist, or reshaped
  // an empty input to [-1, 0, 3]).
  const auto some_empty = [](Graph& g, int i) {
    const Expr X = g.input(test::data({i % 2 ? 0 : length_of(i), 3}, i));
    const Expr Y = i % 2 ? dsl::tanh(X) : dsl::sigmoid(X);
    return dsl::sum(dsl::exp(Y) * Y) + dsl::sum(dsl::sum_dim(Y, 0) * 2.0);
  };
  const auto all_empty = [](Graph& g, int i) {
    const Expr X = g.input(test::data({0, 3}, i));
    const Expr Y = i % 2 ? dsl::tanh(X) : dsl::sigmoid(X);
    return dsl::sum(dsl::exp(Y) * Y) + dsl::sum(dsl::sum_dim(Y, 0) * 2.0);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, some_empty));
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(4, all_empty));
  // Rows of no floats (their data pointers may be null), read in place by a
  // product when no gradient is wanted, and packed by length.
  const at::Tensor W = test::param({3, 0}, 1).detach(), b = test::param({3}, 2).detach();
  const auto no_columns = [&](Graph& g, int i) {
    const Expr X = g.input(test::data({length_of(i), 0}, i));
    const Expr v = g.input(test::data({0}, i));
    return dsl::sum(dsl::tanh(dsl::affine(W, X, b))) + dsl::sum(dsl::affine(W, v, b) * 2.0);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, no_columns));
}
