// Property: for random per-example programs (random DAGs over mixed ops and
// shapes, a different structure for every example), batched == alone for every
// node and every parameter gradient, under every strategy.
#include <random>

#include "../support.h"

using namespace sheaf;

namespace {

constexpr int64_t kDims[] = {2, 3, 5};
constexpr int64_t kVocab = 7;

struct Params {
  // W[a][b]: [kDims[a], kDims[b]], one bias per output size, one embedding table per size.
  at::Tensor W[3][3], b[3], E[3];
  Params() {
    uint64_t seed = 100;
    for (int a = 0; a < 3; ++a) {
      for (int c = 0; c < 3; ++c) W[a][c] = test::param({kDims[a], kDims[c]}, seed++);
      b[a] = test::param({kDims[a]}, seed++);
      E[a] = test::param({kVocab, kDims[a]}, seed++);
    }
  }
  std::vector<at::Tensor> all() const {
    std::vector<at::Tensor> v;
    for (int a = 0; a < 3; ++a) {
      for (int c = 0; c < 3; ++c) v.push_back(W[a][c]);
      v.push_back(b[a]);
      v.push_back(E[a]);
    }
    return v;
  }
};

int dim_index(int64_t d) { return d == 2 ? 0 : d == 3 ? 1 : 2; }

// One random program: values are kept in a pool; each step applies a random op
// to random pool members (adapting shapes through affine maps) and adds the
// result. Output: the sum of a few pool members' sums.
Expr random_program(Graph& g, const Params& p, uint64_t program_seed, int example) {
  std::mt19937_64 rng(program_seed * 1000003 + static_cast<uint64_t>(example));
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<Expr> pool;
  auto to_dim = [&](Expr x, int64_t d) {
    if (x.shape().rank() == 0) x = x * g.constant({kDims[0]}, 1.0);
    int64_t have = x.shape()[0];
    if (have == d) return x;
    return dsl::affine(p.W[dim_index(d)][dim_index(have)], x, p.b[dim_index(d)]);
  };
  const int n_inputs = 1 + static_cast<int>(pick(3));
  for (int k = 0; k < n_inputs; ++k) {
    int64_t d = kDims[pick(3)];
    pool.push_back(pick(4) == 0 ? g.lookup(p.E[dim_index(d)], static_cast<int64_t>(pick(kVocab)), pick(2) == 0)
                                : g.input(test::data({d}, example, k)));
  }
  const int steps = 3 + static_cast<int>(pick(18));
  for (int s = 0; s < steps; ++s) {
    Expr x = pool[pick(pool.size())];
    if (x.shape().rank() == 0) x = to_dim(x, kDims[pick(3)]);
    const int64_t d = x.shape()[0];
    Expr y = pool[pick(pool.size())];
    y = to_dim(y, d);
    Expr r;
    switch (pick(20)) {
      case 0: r = dsl::tanh(x); break;
      case 1: r = dsl::sigmoid(x); break;
      case 2: r = dsl::relu(x) + 0.1; break;
      case 3: r = x + y; break;
      case 4: r = x - y * 0.5; break;
      case 5: r = x * dsl::tanh(y); break;
      case 6: r = x / (dsl::exp(y) + 1.0); break;
      case 7: r = dsl::log(dsl::sigmoid(x) + 0.5); break;
      case 8: r = to_dim(x, kDims[pick(3)]); break;
      case 9: r = to_dim(dsl::slice(dsl::concat({x, dsl::tanh(y)}), 1, 1 + d), kDims[pick(3)]); break;
      case 10: r = dsl::softmax(x) * y; break;
      case 11: r = dsl::log_softmax(x); break;
      case 12: r = dsl::sum(x); break;
      case 13: r = dsl::mean(x * y); break;
      case 14: r = dsl::pick(x, static_cast<int64_t>(pick(static_cast<size_t>(d)))); break;
      case 15: r = dsl::pick_neg_log_softmax(x, static_cast<int64_t>(pick(static_cast<size_t>(d)))); break;
      case 16: r = dsl::dropout(x, 0.25); break;
      case 17: {
        std::vector<Expr> list{x, y};
        for (size_t k = 0; k < pick(3); ++k) list.push_back(dsl::sigmoid(list.back()));
        r = pick(2) ? dsl::sum(list) : dsl::mean(list);
        break;
      }
      case 18: r = x * (y > 0.0) - 1.0 / (dsl::exp(x) + 2.0); break;
      default: r = dsl::affine(g.input(test::data({d, d}, example, 50 + s)), x, p.b[dim_index(d)]); break;
    }
    pool.push_back(r);
  }
  std::vector<Expr> outs;
  for (size_t k = 0; k < 1 + pick(3); ++k) outs.push_back(dsl::sum(pool[pool.size() - 1 - pick(pool.size())]));
  return dsl::sum(outs);
}

}  // namespace

TEST_CASE("random programs: batched equals alone under every strategy", "[dsl][property][checker]") {
  const Params p;
  const int programs = 300;
  size_t compared = 0;
  for (int prog = 0; prog < programs; ++prog) {
    const int examples = 1 + prog % 9;
    CheckReport r = check_batched(examples, [&](Graph& g, int i) { return random_program(g, p, prog, i); },
                                  {.params = p.all()});
    INFO("program " << prog << " with " << examples << " examples");
    REQUIRE_BATCHED_EQUALS_ALONE(r);
    compared += r.values_compared;
  }
  CHECK(compared > 10000);
}

TEST_CASE("random programs: lazy and auto never take more launches than depth", "[scheduler][property]") {
  const Params p;
  for (int prog = 0; prog < 100; ++prog) {
    uint64_t launches[3];
    const Strategy* strategies[3] = {&depth_strategy(), &lazy_strategy(), &auto_strategy()};
    for (int k = 0; k < 3; ++k) {
      Graph g;
      std::vector<Expr> outs;
      for (int i = 0; i < 12; ++i) {
        auto s = g.example(i);
        outs.push_back(random_program(g, p, 5000 + prog, i));
      }
      g.forward(outs, {.strategy = strategies[k], .validate = true});
      launches[k] = g.stats().batches;
    }
    INFO("program " << prog);
    CHECK(launches[1] <= launches[0]);
    CHECK(launches[2] <= launches[1]);
  }
}
