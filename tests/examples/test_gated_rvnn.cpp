// The gated recursive network three ways (Sheaf with dsl::cond at every node,
// per example, hand-batched with a mask or with each cell on its own rows)
// computes the same values and gradients.
#include <c10/core/GradMode.h>

#include <baselines/gated_rvnn_hand.h>
#include <gated_rvnn/model.h>

#include "../support.h"

using namespace sheaf;
using models::GatedRvNN;
using models::HandGatedRvNN;


TEST_CASE("gated RvNN: Sheaf, per-example and hand-batched agree on logits, loss and gradients",
          "[examples][gated_rvnn]") {
  const std::vector<data::Tree> trees = data::synthetic_trees({.count = 24, .seed = 5});
  std::vector<const data::Tree*> batch;
  for (const auto& t : trees) batch.push_back(&t);
  const GatedRvNN m({.vocab = 5000, .hidden = 16}, 3);

  auto g_per_example = test::gradients_of(m.parameters(), [&] {
    at::Tensor total = m.per_example_loss(*batch[0]);
    for (size_t i = 1; i < batch.size(); ++i) total = total + m.per_example_loss(*batch[i]);
    return total;
  });
  auto g_hand = test::gradients_of(m.parameters(), [&] { return HandGatedRvNN(m).loss(batch); });
  auto g_split = test::gradients_of(m.parameters(), [&] {
    return HandGatedRvNN(m, HandGatedRvNN::Branches::kSplit).loss(batch);
  });
  Graph g;
  auto g_sheaf = test::gradients_of(m.parameters(), [&] {
    g.clear();
    Expr loss = m.sheaf_batch_loss(g, batch);
    g.forward(loss);
    CHECK(g.stats().rounds > 5);  // one per level of decisions
    return loss.value();
  });
  for (size_t i = 0; i < g_per_example.size(); ++i) {
    INFO("parameter " << i);
    CHECK(at::allclose(g_hand[i], g_per_example[i], 1e-4, 1e-5));
    CHECK(at::allclose(g_split[i], g_per_example[i], 1e-4, 1e-5));
    CHECK(at::allclose(g_sheaf[i], g_per_example[i], 1e-4, 1e-5));
  }
  c10::NoGradGuard no_grad;
  const at::Tensor hand = HandGatedRvNN(m).root_logits(batch);
  CHECK(at::allclose(HandGatedRvNN(m, HandGatedRvNN::Branches::kSplit).root_logits(batch), hand, 1e-5, 1e-6));
  g.clear();
  const std::vector<Expr> roots = m.sheaf_batch_root_logits(g, batch);
  g.forward(roots);
  for (size_t i = 0; i < batch.size(); ++i) {
    CHECK(at::allclose(m.per_example_root_logits(*batch[i]), hand[static_cast<int64_t>(i)], 1e-4, 1e-5));
    CHECK(at::allclose(roots[i].value(), hand[static_cast<int64_t>(i)], 1e-4, 1e-5));
  }
}

TEST_CASE("gated RvNN: batched equals alone under every strategy", "[examples][gated_rvnn][checker]") {
  const std::vector<data::Tree> trees = data::synthetic_trees({.count = 9, .seed = 8});
  const GatedRvNN m({.vocab = 5000, .hidden = 8}, 4);
  CheckReport r = check_batched(static_cast<int>(trees.size()),
                                [&](Graph& g, int i) { return m.sheaf_loss(g, trees[static_cast<size_t>(i)]); },
                                {.params = m.parameters()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}
