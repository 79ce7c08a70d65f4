// The attention model (examples/attention): Sheaf's per-example code, run
// batched, equals eager LibTorch one example at a time (teacher-forced loss and
// gradients; greedy decoding, token for token); batched equals alone under
// every strategy; a few training steps lower the loss; the data generator's
// contract.
#include <c10/core/GradMode.h>
#include <torch/optim/adam.h>

#include <attention/model.h>
#include <data/digits.h>

#include "../support.h"

using namespace sheaf;
using data::DigitPair;
using models::Seq2Seq;

namespace {

std::vector<const DigitPair*> pointers(const std::vector<DigitPair>& pairs) {
  std::vector<const DigitPair*> out;
  for (const DigitPair& p : pairs) out.push_back(&p);
  return out;
}

}  // namespace

TEST_CASE("digits: targets are the source reversed or sorted, then the end token", "[examples][attention]") {
  for (const data::DigitTask task : {data::DigitTask::kReverse, data::DigitTask::kSort}) {
    const auto pairs = data::synthetic_digits({.count = 50, .min_length = 2, .max_length = 7, .task = task, .seed = 3});
    REQUIRE(pairs.size() == 50);
    for (const DigitPair& p : pairs) {
      REQUIRE(p.source.size() >= 2);
      REQUIRE(p.source.size() <= 7);
      REQUIRE(p.target.size() == p.source.size() + 1);
      CHECK(p.target.back() == data::kDigitEos);
      std::vector<int64_t> expected = p.source;
      if (task == data::DigitTask::kReverse) std::reverse(expected.begin(), expected.end());
      else std::sort(expected.begin(), expected.end());
      CHECK(std::equal(expected.begin(), expected.end(), p.target.begin()));
    }
  }
  CHECK_THROWS_AS(data::synthetic_digits({.count = 1, .min_length = 4, .max_length = 3}), UserError);
  CHECK_THROWS_AS(Seq2Seq({.hidden = 7}, 1), UserError);  // odd: no even split over the two directions
}

TEST_CASE("attention: Sheaf batched equals eager per-example LibTorch (loss and gradients)", "[examples][attention]") {
  const auto pairs = data::synthetic_digits({.count = 11, .min_length = 1, .max_length = 9, .seed = 5});
  const bool sequence_op = GENERATE(false, true);  // the encoder step by step, or dsl::lstm
  const Seq2Seq m({.embed = 6, .hidden = 8, .sequence_op = sequence_op}, 2);
  const auto eager = test::gradients_of(m.parameters(), [&] {
    at::Tensor total = m.per_example_loss(pairs[0]);
    for (size_t i = 1; i < pairs.size(); ++i) total = total + m.per_example_loss(pairs[i]);
    return total;
  });
  Graph g;
  const auto sheafed = test::gradients_of(m.parameters(), [&] {
    Expr loss = m.sheaf_batch_loss(g, pointers(pairs));
    g.forward(loss);
    return loss.value();
  });
  test::require_all_close(eager, sheafed);
}

TEST_CASE("attention: greedy decoding with co_await, batched, equals eager decoding one at a time",
          "[examples][attention]") {
  const auto pairs = data::synthetic_digits({.count = 13, .min_length = 1, .max_length = 12, .seed = 6});
  const Seq2Seq m({.embed = 8, .hidden = 12, .sequence_op = GENERATE(false, true)}, 3);
  c10::NoGradGuard no_grad;
  Graph g;
  const auto decoded = m.sheaf_decode(g, pointers(pairs));
  REQUIRE(decoded.size() == pairs.size());
  size_t total = 0;
  for (size_t i = 0; i < pairs.size(); ++i) {
    INFO("example " << i);
    const std::vector<int64_t> eager = m.per_example_greedy(pairs[i].source, Seq2Seq::max_steps_for(pairs[i].source));
    CHECK(decoded[i] == eager);
    CHECK(decoded[i].size() <= static_cast<size_t>(Seq2Seq::max_steps_for(pairs[i].source)));
    total += decoded[i].size();
  }
  CHECK(total > 0);  // an untrained model still writes something: the comparison is not of empty lists
  CHECK(g.stats().rounds > 1);  // one round per decoding step
}

TEST_CASE("attention: batched equals alone under every strategy (checker)", "[examples][attention][checker]") {
  const auto pairs = data::synthetic_digits({.count = 7, .min_length = 1, .max_length = 6, .seed = 7});
  const Seq2Seq m({.embed = 5, .hidden = 6, .sequence_op = GENERATE(false, true)}, 4);
  CheckReport r = check_batched(static_cast<int>(pairs.size()),
                                [&](Graph& g, int i) { return m.sheaf_loss(g, pairs[static_cast<size_t>(i)]); },
                                {.params = m.parameters()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("attention: a few Adam steps on one batch lower the loss", "[examples][attention]") {
  const auto pairs = data::synthetic_digits({.count = 16, .min_length = 2, .max_length = 6, .seed = 8});
  const Seq2Seq m({.embed = 8, .hidden = 16}, 5);
  torch::optim::Adam opt(m.parameters(), torch::optim::AdamOptions(0.02));
  Graph g;
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    g.clear();
    Expr loss = m.sheaf_batch_loss(g, pointers(pairs));
    g.forward(loss);
    opt.zero_grad();
    loss.value().backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  CHECK(last < 0.5 * first);
}
