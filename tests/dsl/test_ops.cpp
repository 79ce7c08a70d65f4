// Every op, batched vs alone (values of every node and parameter gradients),
// for both strategies and batch sizes 1, 2, 7 and 64, with examples of different
// lengths mixed in one batch.
#include <functional>
#include <string>

#include "../support.h"

using namespace sheaf;
using sheaf::test::data;
using sheaf::test::param;

namespace {

constexpr int64_t kD = 8;
constexpr int64_t kVocab = 11;

struct Params {
  at::Tensor W = param({kD, kD}, 1), b = param({kD}, 2), U = param({kD, 2 * kD}, 3), E = param({kVocab, kD}, 4),
             v = param({kD}, 5);
  std::vector<at::Tensor> all() const { return {W, b, U, E, v}; }
};

// One step of an example's chain: maps a [kD] value to a [kD] value using the op
// under test. Examples apply it 1 + i % 3 times, so lengths differ in a batch.
using Step = std::function<Expr(Graph&, Expr h, int example, const Params&)>;

struct OpCase {
  const char* op;
  Step step;
};

const std::vector<OpCase>& cases() {
  static const std::vector<OpCase> table = {
      {"input", [](Graph& g, Expr h, int i, const Params&) { return h + g.input(data({kD}, i, 7)); }},
      {"constant", [](Graph& g, Expr h, int, const Params&) { return h * g.constant({kD}, 0.5); }},
      {"param", [](Graph& g, Expr h, int, const Params& p) { return h * g.param(p.v); }},
      {"lookup", [](Graph& g, Expr h, int i, const Params& p) { return h + g.lookup(p.E, (3 * i + 1) % kVocab); }},
      {"lookup sparse", [](Graph& g, Expr h, int i, const Params& p) { return h + g.lookup(p.E, i % kVocab, true); }},
      {"add", [](Graph& g, Expr h, int i, const Params&) { return h + g.input(data({kD}, i, 1)); }},
      {"add shared", [](Graph&, Expr h, int, const Params& p) { return h + p.v; }},
      {"sub", [](Graph& g, Expr h, int i, const Params&) { return g.input(data({kD}, i, 2)) - h; }},
      {"mul", [](Graph&, Expr h, int, const Params&) { return h * dsl::tanh(h); }},
      {"mul scalar-expr", [](Graph&, Expr h, int, const Params&) { return h * dsl::sum(h); }},
      {"div", [](Graph&, Expr h, int, const Params&) { return h / (dsl::exp(h) + 1.0); }},
      {"add_scalar", [](Graph&, Expr h, int, const Params&) { return (h + 0.25) - 0.5; }},
      {"mul_scalar", [](Graph&, Expr h, int, const Params&) { return 0.5 * h / 2.0; }},
      {"rdiv_scalar", [](Graph&, Expr h, int, const Params&) { return 1.0 / (dsl::exp(h) + 1.0); }},
      {"neg", [](Graph&, Expr h, int, const Params&) { return -h + (1.0 - h); }},
      {"greater", [](Graph& g, Expr h, int i, const Params&) { return h * (h > g.input(data({kD}, i, 3))); }},
      {"greater/less scalar", [](Graph&, Expr h, int, const Params&) { return h * (h > 0.1) + h * (h < -0.1); }},
      {"tanh", [](Graph&, Expr h, int, const Params&) { return dsl::tanh(h); }},
      {"sigmoid", [](Graph&, Expr h, int, const Params&) { return dsl::sigmoid(h); }},
      {"relu", [](Graph&, Expr h, int, const Params&) { return dsl::relu(h) - 0.5; }},
      {"exp/log", [](Graph&, Expr h, int, const Params&) { return dsl::log(dsl::exp(h) + 1.0); }},
      {"affine shared W", [](Graph&, Expr h, int, const Params& p) { return dsl::affine(p.W, h, p.b); }},
      {"affine per-example W",
       [](Graph& g, Expr h, int i, const Params& p) { return dsl::affine(g.input(data({kD, kD}, i, 4)), h, p.b); }},
      {"affine per-example b",
       [](Graph& g, Expr h, int i, const Params& p) { return dsl::affine(p.W, h, g.input(data({kD}, i, 5))); }},
      {"affine [t, in]",
       [](Graph& g, Expr h, int i, const Params& p) {
         return h * dsl::sum(dsl::affine(p.W, g.input(data({3, kD}, i, 8)), p.b)) + h;
       }},
      {"matmul shared A", [](Graph&, Expr h, int, const Params& p) { return dsl::matmul(p.W, h); }},
      {"matmul A B",
       [](Graph& g, Expr h, int i, const Params& p) {
         return h * dsl::mean(dsl::matmul(p.W, g.input(data({kD, 3}, i, 9))));
       }},
      {"matmul per-example A",
       [](Graph& g, Expr h, int i, const Params&) { return dsl::matmul(g.input(data({kD, kD}, i, 6)), h); }},
      {"concat", [](Graph&, Expr h, int, const Params& p) { return dsl::affine(p.U, dsl::concat({h, dsl::tanh(h)}), p.b); }},
      {"slice", [](Graph&, Expr h, int, const Params&) {
         return dsl::concat({dsl::slice(h, kD / 2, kD), dsl::slice(h, 0, kD / 2)});
       }},
      {"chunk", [](Graph&, Expr h, int, const Params&) {
         auto parts = dsl::chunk(h, 4);
         return dsl::concat({parts[3], parts[2] * parts[1], dsl::sigmoid(parts[0]), parts[1]});
       }},
      {"sum/mean", [](Graph&, Expr h, int, const Params&) { return h * dsl::sum(h) + dsl::mean(h); }},
      {"sum list", [](Graph&, Expr h, int i, const Params&) {
         std::vector<Expr> xs{h};
         for (int k = 0; k < i % 4; ++k) xs.push_back(dsl::tanh(xs.back()));
         return dsl::sum(xs);
       }},
      {"mean list", [](Graph&, Expr h, int i, const Params&) {
         std::vector<Expr> xs{h};
         for (int k = 0; k < i % 3; ++k) xs.push_back(dsl::sigmoid(xs.back()));
         return dsl::mean(xs);
       }},
      {"softmax", [](Graph&, Expr h, int, const Params&) { return dsl::softmax(h) * 4.0; }},
      {"log_softmax", [](Graph&, Expr h, int, const Params&) { return dsl::log_softmax(h); }},
      {"pick", [](Graph&, Expr h, int i, const Params&) { return h * dsl::pick(h, i % kD); }},
      {"pick_neg_log_softmax",
       [](Graph&, Expr h, int i, const Params&) { return h * dsl::pick_neg_log_softmax(h, (i + 3) % kD); }},
      {"dropout", [](Graph&, Expr h, int, const Params&) { return dsl::dropout(h, 0.3); }},
  };
  return table;
}

Expr chain(Graph& g, int i, const Params& p, const Step& step) {
  Expr h = dsl::tanh(dsl::affine(p.W, g.input(data({kD}, i)), p.b));
  for (int k = 0; k < 1 + i % 3; ++k) h = step(g, h, i, p);
  return h;
}

}  // namespace

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
