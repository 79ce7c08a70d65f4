// The shift-reduce parser: Sheaf equals the eager per-sentence version, batched
// equals alone (gold and predicted transitions), and predicted parsing of a batch
// takes 2n - 1 batched steps for the longest sentence of n words.
#include <shift_reduce/model.h>

#include "../support.h"

using namespace sheaf;
using models::ShiftReduce;

namespace {

std::vector<data::Tree> trees(int n, uint64_t seed) {
  return data::synthetic_trees({.count = n, .min_words = 1, .max_words = 12, .vocab_size = 30, .seed = seed});
}

ShiftReduce model(uint64_t seed) { return ShiftReduce({.vocab = 30, .hidden = 8, .tracking = 4}, seed); }

TaskProgram program(const ShiftReduce& m, const std::vector<data::Tree>& ts, bool predict) {
  return [&m, &ts, predict](Graph& g, int i) -> Task<Expr> {
    models::ParseResult r = co_await m.parse(g, ts[static_cast<size_t>(i)], predict);
    co_return r.loss;
  };
}

}  // namespace

TEST_CASE("gold transitions and masking", "[examples][shift_reduce]") {
  for (const data::Tree& t : trees(20, 1)) {
    std::vector<int> gold = models::gold_transitions(t);
    REQUIRE(gold.size() == static_cast<size_t>(2 * t.num_words() - 1));
    int depth = 0;
    for (int a : gold) {
      depth += a == models::kShift ? 1 : -1;
      REQUIRE(depth >= 1);
    }
    CHECK(depth == 1);
  }
  CHECK(models::choose_transition(0.f, 5.f, 1, 3) == models::kShift);   // one item: cannot reduce
  CHECK(models::choose_transition(5.f, 0.f, 2, 0) == models::kReduce);  // empty buffer: cannot shift
  CHECK(models::choose_transition(0.f, 5.f, 2, 3) == models::kReduce);
  CHECK(models::choose_transition(5.f, 0.f, 2, 3) == models::kShift);
}

TEST_CASE("Sheaf parse equals the eager parse", "[examples][shift_reduce]") {
  const bool predict = GENERATE(false, true);
  const std::vector<data::Tree> ts = trees(5, 2);
  ShiftReduce m = model(3);
  Graph g;
  std::vector<Task<models::ParseResult>> tasks;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto s = g.example(static_cast<int>(i));
    tasks.push_back(m.parse(g, ts[i], predict));
  }
  g.forward();
  for (size_t i = 0; i < ts.size(); ++i) {
    ShiftReduce::EagerResult eager = m.parse_eager(ts[i], predict);
    models::ParseResult& r = tasks[i].result();
    CHECK(r.transitions == eager.transitions);
    CHECK(at::allclose(r.logits.value(), eager.logits, 1e-4, 1e-5));
    CHECK(at::allclose(r.loss.value(), eager.loss, 1e-4, 1e-5));
  }
}

TEST_CASE("shift-reduce: batched equals alone, gold and predicted", "[examples][shift_reduce][checker]") {
  const int n = GENERATE(1, 2, 7, 24);
  const bool predict = GENERATE(false, true);
  const std::vector<data::Tree> ts = trees(n, 4);
  ShiftReduce m = model(5);
  CheckReport r = check_batched(n, program(m, ts, predict), {.params = m.parameters()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("predicted parsing takes 2n-1 batched steps for the longest sentence", "[examples][shift_reduce][launches]") {
  const std::vector<data::Tree> ts = trees(64, 6);
  ShiftReduce m = model(7);
  int longest = 0;
  for (const data::Tree& t : ts) longest = std::max(longest, t.num_words());
  Graph g;
  std::vector<Task<models::ParseResult>> tasks;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto s = g.example(static_cast<int>(i));
    tasks.push_back(m.parse(g, ts[i], true));
  }
  g.forward();
  CHECK(g.stats().fetches == static_cast<uint64_t>(2 * longest - 1));
  CHECK(g.stats().rounds == static_cast<uint64_t>(2 * longest));  // + the final sentiment layer
  for (auto& t : tasks) CHECK(t.done());
}
