// Elementwise fusion: what fuses (launch counts), and that fused values and
// gradients equal op-by-op ones in every shape of input (the checker runs
// every program fused and unfused against each example alone, op by op).
#include <sheaf/engine/engine.h>

#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;
using sheaf::test::param;

namespace {

CheckOptions both(std::vector<at::Tensor> params = {}) { return {.params = std::move(params), .fusion = Fusion::kBoth}; }

// A Tree-LSTM-like cell: chunk of gates, gated sum with two cell inputs.
Expr cell(Expr gates, Expr cl, Expr cr) {
  std::vector<Expr> g = dsl::chunk(gates, 5);
  Expr c = dsl::tanh(g[0]) * dsl::sigmoid(g[1]) + dsl::sigmoid(g[2]) * cl + dsl::sigmoid(g[3]) * cr;
  return dsl::sigmoid(g[4]) * dsl::tanh(c);
}

}  // namespace

TEST_CASE("fusion: 64 chains of 20 elementwise ops are one launch", "[fusion][launches]") {
  Graph g;
  std::vector<Expr> outs;
  for (int i = 0; i < 64; ++i) {
    auto s = g.example(i);
    Expr h = g.input(at::randn({16}));
    for (int d = 0; d < 10; ++d) h = dsl::tanh(h * 0.9);
    outs.push_back(h);
  }
  g.forward(outs);
  CHECK(g.stats().batches == 2);  // the inputs' stack, then everything else
  CHECK(g.stats().fused_batches == 1);
  CHECK(g.stats().fused_ops == 20);
  CHECK_THAT(g.plan_str(), Contains("fused{") && Contains("tanh") && Contains("mul_scalar"));
  Graph unfused({.fuse = false});
  std::vector<Expr> ref;
  for (int i = 0; i < 64; ++i) {
    auto s = unfused.example(i);
    ref.push_back(dsl::tanh(unfused.input(at::ones({16}))));
  }
  unfused.forward(ref);
  CHECK(unfused.stats().fused_batches == 0);
}

TEST_CASE("fusion: a Tree-LSTM cell is one kernel, values and gradients equal op by op", "[fusion]") {
  const at::Tensor U = param({10, 4}, 1);
  auto program = [&](Graph& g, int i) {
    Expr x = g.input(data({4}, i)), cl = g.input(data({2}, i, 1)), cr = g.input(data({2}, i, 2));
    return cell(dsl::affine(U, x, at::zeros({10})), cl, cr);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(7, program, both({U})));
  Graph g;
  std::vector<Expr> hs;
  for (int i = 0; i < 7; ++i) {
    auto s = g.example(i);
    hs.push_back(program(g, i));
  }
  g.forward(hs);
  CHECK(g.stats().fused_batches == 1);
  CHECK(g.stats().fused_ops == 17);  // 5 slices and 12 ops
}

TEST_CASE("fusion: broadcast inputs (per-example scalars, shared vectors and scalars)", "[fusion]") {
  const at::Tensor v = param({5}, 3), s0 = param({}, 4);
  auto program = [&](Graph& g, int i) {
    Expr x = g.input(data({5}, i));
    Expr s = dsl::sum(x);                         // a per-example scalar, outside the region
    Expr y = dsl::tanh(x * s) + v;                // per-row scalar and a shared row
    Expr z = dsl::sigmoid(y) * g.param(s0) - y;   // a shared scalar
    return dsl::relu(z / (dsl::exp(y) + 1.0)) + dsl::log(dsl::exp(y) + 2.0) + (y > z) * 3.0 + (1.0 / (z * z + 1.0));
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, program, both({v, s0})));
}

TEST_CASE("fusion: a value kept inside the kernel is made when read later, with its gradient", "[fusion]") {
  const at::Tensor w = param({3}, 5);
  Graph g;
  std::vector<Expr> mids, outs;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    Expr x = g.input(data({3}, i));
    Expr mid = dsl::tanh(x * w);  // read only by the next op of its region
    mids.push_back(mid);
    outs.push_back(dsl::sigmoid(mid) * 2.0);
  }
  g.forward(outs);
  CHECK(g.stats().fused_batches == 1);
  // Recorded after forward: reads `mid`, which the kernel did not write out.
  Expr total = dsl::sum(dsl::sum(mids[2]) + dsl::sum(outs[2]));
  g.forward(total);
  const at::Tensor x = data({3}, 2);
  const at::Tensor mid = at::tanh(x * w);
  CHECK(at::allclose(mids[2].value(), mid, 1e-5, 1e-6));
  total.value().backward();
  at::Tensor wr = w.detach().clone().requires_grad_();
  at::Tensor ref = at::tanh(x * wr);
  (ref.sum() + (at::sigmoid(ref) * 2.0).sum()).backward();
  CHECK(at::allclose(w.grad(), wr.grad(), 1e-5, 1e-6));
}

TEST_CASE("fusion: regions across rounds of control flow", "[fusion][control]") {
  auto program = [](Graph& g, int i) -> Task<Expr> {
    Expr x = g.input(data({4}, i));
    Expr h = dsl::tanh(x) * dsl::sigmoid(x);
    for (int k = 0; k < 1 + i % 3; ++k) {
      const double s = co_await fetch_item(dsl::sum(h));
      h = dsl::tanh(h * s + x) - h * 0.5;  // reads h (a previous round's region) and x
    }
    co_return h;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, TaskProgram(program), both()));
}

TEST_CASE("fusion: elementwise work on an argument joins the region that reads it after a product", "[fusion]") {
  // tanh(h) * 0.5 needs only an input, but its one reader comes after a
  // product: it belongs in the reader's kernel, not in a launch of its own.
  // relu(h) is also read by a product, so it must be made before it.
  const at::Tensor W = param({4, 4}, 7), U = param({4, 4}, 8), b = param({4}, 9);
  auto program = [&](Graph& g, int i) {
    Expr x = g.input(data({4}, i)), h = g.input(data({4}, i, 1));
    Expr y = dsl::relu(dsl::affine(W, x, b)) * 0.5 + dsl::tanh(h) * 0.5;
    Expr s = dsl::relu(h);
    return dsl::tanh(dsl::affine(U, s, b)) * y + s;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, program, both({W, U, b})));
  Graph g;
  test::forward_examples(g, 5, program);
  const Stats& s = g.stats();
  // One kernel after both products: y's cell with tanh(h) * 0.5 in it, then
  // tanh, mul and add (before: tanh(h) * 0.5 was a kernel of its own).
  CHECK(s.fused_batches == 1);
  CHECK(s.fused_ops == 8);
}

TEST_CASE("fusion: a slice of a region's value, added to a scalar the region reads, makes no cycle", "[fusion]") {
  // s (one element) feeds the [4] product's kernel, and a slice of that
  // kernel's value is added to s. Joined by shape and depth alone, {s, slice,
  // add} and {tanh, mul} each read the other: the round could not be ordered.
  // Both where s is computed after a product and where it is a slice of an
  // argument (which sat early, and rose to its readers' depth).
  const at::Tensor W = param({4, 4}, 12), U = param({1, 4}, 13), b = param({4}, 14), c = param({1}, 15);
  for (const bool gate : {true, false}) {
    auto program = [&](Graph& g, int i) {
      Expr x = g.input(data({4}, i)), h = g.input(data({4}, i, 1));
      Expr s = gate ? dsl::sigmoid(dsl::affine(U, x, c)) : dsl::slice(h, 0, 1);  // [1]
      Expr v = dsl::tanh(dsl::affine(W, x, b)) * s;                                  // [4]
      return dsl::slice(v, 0, 1) + s;
    };
    REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, program, both({W, U, b, c})));
  }
}

TEST_CASE("fusion: a lone tanh or sigmoid runs as a fused kernel on the CPU, a lone relu as LibTorch's", "[fusion]") {
  // LibTorch's CPU tanh and sigmoid are several times slower than the fused
  // kernel's polynomials (PointwiseInfo::alone_on_cpu); relu is not.
  const at::Tensor W = param({4, 4}, 10), b = param({4}, 11);
  for (const bool sigmoid : {false, true}) {
    auto program = [&](Graph& g, int i) {
      Expr a = dsl::affine(W, g.input(data({4}, i)), b);
      return dsl::affine(W, sigmoid ? dsl::sigmoid(a) : dsl::tanh(a), b);
    };
    REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, program, both({W, b})));
    Graph g;
    test::forward_examples(g, 5, program);
    CHECK(g.stats().fused_batches == 1);
    CHECK(g.stats().fused_ops == 1);
  }
  Graph g;
  test::forward_examples(g, 5, [&](Graph& pg, int i) { return dsl::relu(dsl::affine(W, pg.input(data({4}, i)), b)); });
  CHECK(g.stats().fused_batches == 0);
}

TEST_CASE("fusion: a lone comparison runs fused on the CPU and, like LibTorch's, records no gradient", "[fusion]") {
  // A gate's `score > 0` alone in its round: LibTorch's comparison into floats
  // costs several times the fused kernel's launch (PointwiseInfo::alone_on_cpu).
  const at::Tensor W = param({4, 4}, 16), b = param({4}, 17);
  auto program = [&](Graph& g, int i) { return dsl::affine(W, dsl::affine(W, g.input(data({4}, i)), b) > 0.0, b); };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, program, both({W, b})));
  Graph g;
  std::vector<Expr> masks;
  test::forward_examples(g, 5, [&](Graph& pg, int i) {
    masks.push_back(dsl::affine(W, pg.input(data({4}, i)), b) > 0.0);
    return dsl::affine(W, masks.back(), b);
  });
  CHECK(g.stats().fused_batches == 1);
  CHECK(g.stats().fused_ops == 1);
  for (const Expr& mask : masks) CHECK_FALSE(mask.value().requires_grad());  // no backward node for zeros
}

TEST_CASE("fusion: what is not fused (dropout, shared-only values, different shapes) still runs", "[fusion]") {
  const at::Tensor W = param({4, 4}, 6);
  auto program = [&](Graph& g, int i) {
    Expr x = g.input(data({4}, i));
    Expr shared = dsl::tanh(g.param(W)) * 2.0;    // shared: computed once, not fused
    Expr y = dsl::dropout(dsl::tanh(x), 0.3) * 2.0;
    Expr s = dsl::sum(y) * 0.5 + 1.0;             // scalars: their own region
    return dsl::matmul(shared, y) * s;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(5, program, both({W})));
}

TEST_CASE("fusion: a cell read by two projections keeps each one's rows together, read as views", "[fusion][planner]") {
  // Both directions of a BiLSTM step: one fused batch for both cells, then each
  // direction's own projection reads its half. Rows ordered by the path ahead
  // alone interleave the directions (chains of different lengths follow);
  // grouped by reader, each half is a range (views of one split), and the cell
  // reads its two gate batches in place.
  const at::Tensor Wf = param({4, 4}, 1), Wb = param({4, 4}, 2), Uf = param({4, 4}, 3), Ub = param({4, 4}, 4);
  const at::Tensor V = param({4, 4}, 5), zero = at::zeros({4});
  auto program = [&](Graph& g, int i) {
    Expr x = g.input(data({4}, i));
    Expr a = dsl::affine(Wf, x, zero), b = dsl::affine(Wb, x, zero);
    Expr hf = dsl::tanh(a) * dsl::sigmoid(a), hb = dsl::tanh(b) * dsl::sigmoid(b);
    Expr y = dsl::tanh(dsl::affine(Uf, hf, zero)) + dsl::tanh(dsl::affine(Ub, hb, zero));
    for (int k = 0; k < i % 3; ++k) y = dsl::affine(V, y, zero);  // chains of different lengths ahead
    return y;
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(6, program, both({Wf, Wb, Uf, Ub, V})));
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    ys.push_back(program(g, i));
  }
  g.forward(ys);
  INFO(g.plan_str());
  CHECK(g.stats().gathered_inputs == 0);
  CHECK(g.stats().in_place_inputs == 1);  // the cells' gates, from two projections
}

TEST_CASE("fusion: programs are told apart by what they compute, across clear() and graphs", "[fusion]") {
  // Signature ids restart at clear(): a program cache keyed by them gave the
  // second batch the first batch's kernel (sigmoid(tanh(x)) for tanh(sigmoid(x))).
  const at::Tensor x = data({5}, 0);
  Graph g;
  for (int round = 0; round < 2; ++round) {
    g.clear();
    Expr in = g.input(x);
    Expr y = round == 0 ? dsl::sigmoid(dsl::tanh(in)) : dsl::tanh(dsl::sigmoid(in));
    g.forward(y);
    CHECK(at::allclose(y.value(), round == 0 ? at::sigmoid(at::tanh(x)) : at::tanh(at::sigmoid(x))));
  }
  // The same in a function's body, recorded again after each clear().
  bool first = true;
  auto f = function("f", [&](Expr a) { return first ? dsl::sigmoid(dsl::tanh(a)) : dsl::tanh(dsl::sigmoid(a)); });
  for (int round = 0; round < 2; ++round) {
    g.clear();
    first = round == 0;
    Expr y = f(g.input(x));
    g.forward(y);
    CHECK(at::allclose(y.value(), first ? at::sigmoid(at::tanh(x)) : at::tanh(at::sigmoid(x))));
  }
}
