// auto's choice by cost (scheduler/cost.h): the plans it compares, what each
// costs, and that the CostModel, not the launch count alone, decides.
#include <c10/core/GradMode.h>

#include <cmath>
#include <random>

#include "../support.h"

using namespace sheaf;

namespace {

// Examples that interleave a one-op and a two-op step at random (a parser's
// SHIFT and REDUCE): depth-based and agenda schedules differ, and here neither
// wins on both counts (checked below).
struct Steps {
  at::Tensor W = test::param({8, 8}, 3), U = test::param({8, 8}, 4);
  std::vector<at::Tensor> inputs;
  Steps() {
    for (int i = 0; i < 16; ++i) inputs.push_back(test::param({8}, 100 + static_cast<uint64_t>(i)));
  }
  // The loss; `cost` unset: the device's calibrated model.
  Expr record(Graph& g) const {
    std::mt19937 rng(1);
    std::vector<Expr> outs;
    for (int i = 0; i < 16; ++i) {
      auto s = g.example(i);
      Expr x = g.input(inputs[static_cast<size_t>(i)]);
      const int steps = 6 + static_cast<int>(rng() % 6);
      for (int k = 0; k < steps; ++k)
        x = rng() % 2 ? dsl::tanh(dsl::matmul(W, x)) : dsl::sigmoid(dsl::matmul(U, dsl::tanh(dsl::matmul(W, x))));
      outs.push_back(dsl::sum(x));
    }
    return dsl::sum(outs);
  }
};

struct Run {
  std::vector<Stats::Candidate> compared;
  std::string picked;
  uint64_t batches;
  double loss;
  at::Tensor grad_W;
};

Run run(const Steps& p, std::optional<CostModel> cost) {
  Graph g({.fuse = false, .cost = cost});
  Expr loss = p.record(g);
  g.forward(loss);
  p.W.mutable_grad() = at::Tensor();
  loss.value().backward();
  return {g.stats().compared, std::string(g.stats().strategy_used), g.stats().batches, loss.item(), p.W.grad().clone()};
}

}  // namespace

TEST_CASE("auto keeps the plan its CostModel finds cheaper, and says what it compared", "[scheduler][cost]") {
  Steps p;
  const Run by_default = run(p, std::nullopt);
  REQUIRE(by_default.compared.size() == 2);
  CHECK(by_default.compared[0].name == "lazy");
  CHECK(by_default.compared[1].name == "agenda");
  const CostModel cpu = CostModel::for_device(c10::kCPU);
  for (const Stats::Candidate& c : by_default.compared)
    CHECK(c.cost_us == Approx(cpu.of(c.launches, c.gathers, c.gathered_bytes)));
  const Stats::Candidate& a = by_default.compared[0];
  const Stats::Candidate& b = by_default.compared[1];
  // The program trades launches for gathers: the two counts disagree on the winner.
  REQUIRE(a.launches != b.launches);
  REQUIRE((a.launches < b.launches) != (a.gathered_bytes < b.gathered_bytes));
  const std::string fewer_launches(a.launches < b.launches ? a.name : b.name);
  const std::string fewer_bytes(a.gathered_bytes < b.gathered_bytes ? a.name : b.name);
  CHECK(by_default.picked == std::string(a.cost_us <= b.cost_us ? a.name : b.name));

  const Run launches_only = run(p, CostModel{.launch_us = 1, .gather_us_per_mb = 0});
  const Run bytes_only = run(p, CostModel{.launch_us = 0, .gather_us_per_mb = 1});
  CHECK(launches_only.picked == fewer_launches);
  CHECK(bytes_only.picked == fewer_bytes);
  // The plan it costed is the plan that ran.
  for (const Run* r : {&by_default, &launches_only, &bytes_only}) {
    const Stats::Candidate& used = r->compared[r->compared[0].name == r->picked ? 0 : 1];
    CHECK(r->batches == used.launches);
  }
  // Whichever it picks, the same values.
  CHECK(launches_only.loss == Approx(bytes_only.loss).epsilon(1e-6));
  // (Sums in another order: float rounding apart.)
  const double scale = launches_only.grad_W.abs().max().item<double>();
  CHECK((launches_only.grad_W - bytes_only.grad_W).abs().max().item<double>() <= 1e-5 * scale);
}

TEST_CASE("a plan counts the bytes of the rows it cannot read as views", "[scheduler][cost]") {
  at::Tensor W = test::param({8, 8}, 5);
  Graph g({.fuse = false});
  std::vector<Expr> outs;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    Expr a = dsl::tanh(g.input(test::param({8}, 10 + static_cast<uint64_t>(i))));
    Expr b = i % 2 ? dsl::sigmoid(a) : a;  // rows of two batches, interleaved
    outs.push_back(dsl::matmul(W, b));
  }
  g.forward(outs);
  REQUIRE(g.stats().compared.size() == 2);
  for (const Stats::Candidate& c : g.stats().compared) {
    CHECK(c.gathers == 1);
    CHECK(c.gathered_bytes == 4 * 8 * sizeof(float));
  }
  CHECK(g.stats().gathered_bytes == 4 * 8 * sizeof(float));  // what the executor copied
}

TEST_CASE("a CostModel with a negative or non-finite figure is a user error", "[scheduler][cost][errors]") {
  CHECK_THROWS_AS(Graph({.cost = CostModel{.launch_us = -1, .gather_us_per_mb = 1}}), UserError);
  CHECK_THROWS_AS(Graph({.cost = CostModel{.launch_us = 1, .gather_us = -2}}), UserError);
  CHECK_THROWS_WITH(Graph({.cost = CostModel{.launch_us = 1, .gather_us_per_mb = std::nan("")}}),
                    Catch::Matchers::Contains("GraphOptions::cost"));
  CHECK_NOTHROW(Graph({.cost = CostModel{.launch_us = 0, .gather_us_per_mb = 0}}));
}

TEST_CASE("auto compares less often while one plan keeps winning: 16 rounds after the pick changes, then doubling",
          "[scheduler][cost]") {
  c10::NoGradGuard no_grad;
  Steps p;
  // Gathered bytes alone decide: on Steps the candidates differ (the test
  // above), on a plain chain they tie and the first (lazy) wins.
  Graph g({.fuse = false, .cost = CostModel{.launch_us = 0, .gather_us_per_mb = 1}});
  auto chain = [&] {
    std::vector<Expr> outs;
    for (int i = 0; i < 4; ++i) {
      auto s = g.example(i);
      outs.push_back(dsl::sum(dsl::tanh(dsl::matmul(p.W, g.input(p.inputs[static_cast<size_t>(i)])))));
    }
    return dsl::sum(outs);
  };
  // Runs `rounds` one-round graphs; returns the rounds that compared and what each picked.
  auto run_rounds = [&](int rounds, bool steps) {
    std::vector<std::pair<int, std::string>> compared;
    for (int r = 0; r < rounds; ++r) {
      g.clear();
      Expr loss = steps ? p.record(g) : chain();
      g.forward(loss);
      if (!g.stats().compared.empty()) compared.emplace_back(r, std::string(g.stats().strategy_used));
    }
    return compared;
  };
  const auto first = run_rounds(300, true);
  REQUIRE(first.size() == 5);
  const std::string steps_pick = first[0].second;
  REQUIRE(steps_pick == "agenda");  // fewer bytes on Steps, so the chain's tie changes the pick
  const int expected[] = {0, 16, 48, 112, 240};  // 16, 32, 64, then at most 128 apart
  for (size_t k = 0; k < first.size(); ++k) {
    CHECK(first[k].first == expected[k]);
    CHECK(first[k].second == steps_pick);
  }
  // The next comparison is due 128 rounds after 240: the 69th round from here.
  // The pick changes there, so the one after comes 16 rounds later, then 32.
  const auto second = run_rounds(120, false);
  REQUIRE(second.size() == 3);
  CHECK(second[0] == std::pair<int, std::string>(68, "lazy"));
  CHECK(second[1] == std::pair<int, std::string>(84, "lazy"));
  CHECK(second[2] == std::pair<int, std::string>(116, "lazy"));
}
