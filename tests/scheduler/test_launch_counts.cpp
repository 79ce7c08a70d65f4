// Launch counts are the scheduler's contract: stable where times are not. These
// count the strategies' batches, so they run without elementwise fusion
// (tests/scheduler/test_fusion.cpp counts what fusion does on top).
#include <map>
#include <random>
#include <set>

#include <sheaf/engine/engine.h>
#include <sheaf/scheduler/batches.h>
#include <sheaf/scheduler/round.h>
#include <sheaf/ops/op.h>

#include "../support.h"
#include "launches.h"

using namespace sheaf;
using Catch::Contains;

using test::launches_of;  // over the last round's plan (all tests here run one round)

TEST_CASE("64 chains of depth 10 of two ops take exactly 20 launches", "[scheduler][launches]") {
  for (const Strategy* strategy : all_strategies()) {
    DYNAMIC_SECTION(strategy->name()) {
      Graph g({.fuse = false});
      std::vector<Expr> outs;
      for (int i = 0; i < 64; ++i) {
        auto s = g.example(i);
        Expr h = g.input(at::randn({16}));
        for (int d = 0; d < 10; ++d) h = dsl::tanh(h * 0.9);
        outs.push_back(h);
      }
      g.forward(outs, {.strategy = strategy});
      CHECK(launches_of(g, "mul_scalar") == 10);
      CHECK(launches_of(g, "tanh") == 10);
      CHECK(g.stats().batches == 21);  // + the one launch that stacks the 64 inputs
      CHECK(g.stats().gathered_inputs == 0);  // every step reads the previous one in place
      CHECK(g.stats().nodes == 64 * 21);
    }
  }
}

TEST_CASE("examples of different structure: launches within the depth bound", "[scheduler][launches]") {
  // Each example is a random chain of ops; at depth k the depth-based schedule
  // needs one launch per distinct op found at position k: that is the bound.
  std::mt19937 rng(7);
  const int n = 48;
  std::vector<std::vector<int>> chains(n);
  std::set<std::pair<int, int>> depth_op;
  for (auto& c : chains) {
    c.resize(1 + rng() % 12);
    for (size_t k = 0; k < c.size(); ++k) {
      c[k] = static_cast<int>(rng() % 3);
      depth_op.emplace(static_cast<int>(k), c[k]);
    }
  }
  const uint64_t bound = depth_op.size() + 1;  // + the input stack
  std::map<std::string, uint64_t> launches;
  for (const Strategy* strategy : all_strategies()) {
    Graph g({.fuse = false});
    std::vector<Expr> outs;
    for (int i = 0; i < n; ++i) {
      auto s = g.example(i);
      Expr h = g.input(at::randn({8}));
      for (int op : chains[static_cast<size_t>(i)])
        h = op == 0 ? dsl::tanh(h) : op == 1 ? dsl::sigmoid(h) : dsl::relu(h);
      outs.push_back(h);
    }
    g.forward(outs, {.strategy = strategy});
    launches[std::string(strategy->name())] = g.stats().batches;
  }
  CHECK(launches["depth"] == bound);
  CHECK(launches["lazy"] <= bound);
  CHECK(launches["auto"] <= bound);
  // DyNet's agenda heuristic (shallowest signature first) is not bounded by
  // depth here: it runs one op kind at a time while chains wait for each other.
  // Recorded, not asserted: it is the baseline we beat, as DyNet implements it.
  INFO("agenda took " << launches["agenda"] << " launches; depth bound " << bound);
  CHECK(launches["agenda"] > 0);
}

TEST_CASE("agenda and lazy batch losses at different depths in one launch, depth cannot", "[scheduler][launches]") {
  // A loss at the end of chains of different lengths sits at different depths.
  std::map<std::string, uint64_t> loss_launches;
  for (const Strategy* strategy : all_strategies()) {
    Graph g({.fuse = false});
    std::vector<Expr> losses;
    for (int i = 0; i < 16; ++i) {
      auto s = g.example(i);
      Expr h = g.input(at::randn({5}));
      for (int d = 0; d < 1 + i % 4; ++d) h = dsl::tanh(h);
      losses.push_back(dsl::pick_neg_log_softmax(h, i % 5));
    }
    g.forward(dsl::sum(losses), {.strategy = strategy});
    loss_launches[std::string(strategy->name())] = launches_of(g, "pick_neg_log_softmax");
  }
  CHECK(loss_launches["depth"] == 4);
  CHECK(loss_launches["agenda"] == 1);
  CHECK(loss_launches["lazy"] == 1);
  CHECK(loss_launches["auto"] == 1);
}

TEST_CASE("strategies are found by name and every one is valid on a mixed graph", "[scheduler]") {
  CHECK(strategy_named("depth").name() == "depth");
  CHECK(strategy_named("agenda").name() == "agenda");
  CHECK(strategy_named("lazy").name() == "lazy");
  CHECK(&default_strategy() == &strategy_named("auto"));
  at::Tensor W = at::randn({6, 6});
  for (const Strategy* strategy : all_strategies()) {
    Graph g({.fuse = false});
    std::vector<Expr> outs;
    for (int i = 0; i < 10; ++i) {
      auto s = g.example(i);
      Expr a = g.input(at::randn({6}));
      Expr b = dsl::tanh(dsl::matmul(W, a));
      Expr c = i % 2 ? b * a : dsl::sigmoid(b) + a;
      outs.push_back(dsl::sum(std::vector<Expr>{a, b, c}));
    }
    g.forward(outs, {.strategy = strategy, .validate = true});  // throws InternalError if invalid
    CHECK_THAT(g.plan_str(), Contains(std::string("plan (") + std::string(strategy->name())));
  }
}

namespace {
// A user's strategy: the depth schedule with its batches run last to first
// (every node before its arguments), or with its last batch dropped.
struct BrokenStrategy : Strategy {
  bool drop = false;
  std::string_view name() const override { return drop ? "drops-a-batch" : "backwards"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    Batches depth;
    depth_strategy().schedule(dag, depth);
    out.clear();
    for (size_t i = 0; i + (drop ? 1 : 0) < depth.size(); ++i) {
      const size_t k = drop ? i : depth.size() - 1 - i;
      for (uint32_t n : depth[k]) out.nodes.push_back(n);
      out.close();
    }
  }
};
}  // namespace

TEST_CASE("a strategy of the user's own is checked every round, without validate", "[scheduler][errors]") {
  for (bool drop : {false, true}) {
    BrokenStrategy broken;
    broken.drop = drop;
    Graph g({.fuse = false});
    std::vector<Expr> outs;
    for (int i = 0; i < 4; ++i) {
      auto s = g.example(i);
      outs.push_back(dsl::tanh(dsl::sigmoid(g.input(at::randn({3})))));
    }
    CHECK_THROWS_WITH(g.forward(outs, {.strategy = &broken}),
                      Contains(std::string("strategy '") + std::string(broken.name())) &&
                          Contains(drop ? "left a node unscheduled" : "ran a node before its argument"));
    CHECK_THROWS_AS(g.forward(outs, {.strategy = &broken}), UserError);
  }
  // Sheaf's own strategies are trusted (their checks are tests, and validate).
  CHECK(built_in(strategy_named("auto")));
  CHECK_FALSE(built_in(BrokenStrategy{}));
}

namespace {
// A user's strategy that picks among others (Strategy::candidates), whose list
// may change from one round to the next.
struct Chooser : Strategy {
  std::vector<const Strategy*> list;
  std::string_view name() const override { return "chooser"; }
  void schedule(const RoundDag& dag, Batches& out) const override { depth_strategy().schedule(dag, out); }
  std::span<const Strategy* const> candidates() const override { return list; }
};
// Depth's schedule under a long name of its own (kept past the strategy's life by Stats).
struct Named : Strategy {
  std::string own = std::string(64, 'n') + "-named";
  std::string_view name() const override { return own; }
  void schedule(const RoundDag& dag, Batches& out) const override { depth_strategy().schedule(dag, out); }
};
}  // namespace

TEST_CASE("after a user's strategy fails, the round runs with another: its nodes are not lost",
          "[scheduler][errors]") {
  BrokenStrategy broken;
  Graph g({.fuse = false});
  std::vector<Expr> outs;
  std::vector<at::Tensor> want;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    const at::Tensor x = at::randn({3});
    outs.push_back(dsl::tanh(dsl::sigmoid(g.input(x))));
    want.push_back(at::tanh(at::sigmoid(x)));
  }
  CHECK_THROWS_AS(g.forward(outs, {.strategy = &broken}), UserError);
  // (Before, its nodes were gone: "could not be computed" until clear().)
  g.forward(outs, {.strategy = &depth_strategy()});
  for (size_t i = 0; i < outs.size(); ++i) CHECK(at::allclose(outs[i].value(), want[i]));
}

TEST_CASE("a user's chooser whose candidates change or hold a null pointer, and Stats after a strategy is gone",
          "[scheduler][errors]") {
  auto record = [](Graph& g) {
    std::vector<Expr> outs;
    for (int i = 0; i < 4; ++i) {
      auto s = g.example(i);
      outs.push_back(dsl::tanh(dsl::sigmoid(g.input(at::randn({3})))));
    }
    return outs;
  };
  Chooser chooser;
  chooser.list = {&depth_strategy(), &agenda_strategy(), &lazy_strategy()};
  Graph g({.strategy = &chooser});
  g.forward(record(g));
  // One candidate now: the memo's choice (up to the third) is not read past the list (a crash before).
  chooser.list = {&depth_strategy()};
  g.clear();
  std::vector<Expr> outs = record(g);
  g.forward(outs);
  CHECK(outs[0].value().size(0) == 3);
  chooser.list = {nullptr, &depth_strategy()};
  g.clear();
  CHECK_THROWS_WITH(g.forward(record(g)), Contains("'chooser'") && Contains("candidates()[0] is a null pointer"));
  // Stats keep the strategy's name, not a view of the gone strategy's.
  Graph h;
  {
    Named named;
    h.forward(record(h), {.strategy = &named});
  }
  CHECK(h.stats().strategy_used == std::string(64, 'n') + "-named");
  CHECK_THAT(h.stats().str(), Contains("-named"));
}

TEST_CASE("the plan prints its batches and how each input is obtained", "[scheduler]") {
  Graph g;
  std::vector<Expr> outs;
  for (int i = 0; i < 3; ++i) {
    auto s = g.example(i);
    outs.push_back(dsl::relu(g.input(at::randn({2}))));
  }
  g.forward(outs);
  std::string p = g.plan_str();
  CHECK_THAT(p, Contains("input x3") && Contains("relu x3") && Contains("view b"));
}

TEST_CASE("sums of lists of any length and repetition share one launch", "[scheduler][launches]") {
  Graph g;
  std::vector<Expr> outs;
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    Expr x = g.input(at::randn({3}));
    Expr y = dsl::tanh(x);
    std::vector<Expr> list{x};
    for (int k = 0; k < i; ++k) list.push_back(k % 2 ? x : y);  // x repeats in some lists
    outs.push_back(dsl::sum(list));
  }
  g.forward(outs);
  CHECK(launches_of(g, "sum_list") == 1);
}
