// The TreeLSTM three ways (Sheaf, per example, hand-batched) computes the same
// losses and gradients, and Sheaf's batched run equals its one-at-a-time run.
#include <c10/core/GradMode.h>
#include <cmath>
#include <baselines/tree_lstm_hand.h>
#include <sheaf/ops/packed_gemm.h>
#include <tree_lstm/model.h>

#include "../support.h"

using namespace sheaf;
using models::HandBatched;
using models::TreeLSTM;

namespace {

std::vector<data::Tree> trees(int n, uint64_t seed) {
  return data::synthetic_trees({.count = n, .min_words = 1, .max_words = 14, .vocab_size = 40, .seed = seed});
}

// The parameters' gradients of Sheaf's loss over the batch.
auto sheaf_gradients(const TreeLSTM& m, const std::vector<data::Tree>& batch, GraphOptions options = {}) {
  return test::gradients_of(m.parameters(), [&] {
    Graph g(options);
    Expr total = m.sheaf_batch_loss(g, batch);
    g.forward(total);
    return total.value();
  });
}

}  // namespace

TEST_CASE("TreeLSTM: Sheaf, per-example and hand-batched agree on loss and gradients", "[examples][tree_lstm]") {
  const bool all_nodes = GENERATE(true, false);
  const std::vector<data::Tree> batch = trees(9, 3);
  std::vector<const data::Tree*> ptrs;
  for (const auto& t : batch) ptrs.push_back(&t);
  TreeLSTM m({.vocab = 40, .hidden = 12, .all_nodes = all_nodes}, 1);

  auto per_example = test::gradients_of(m.parameters(), [&] {
    at::Tensor l = at::zeros({});
    for (const auto& t : batch) l = l + m.per_example_loss(t);
    return l;
  });
  auto hand = test::gradients_of(m.parameters(), [&] { return HandBatched(m).loss(ptrs); });
  auto sheafed = sheaf_gradients(m, batch);
  test::require_all_close(per_example, hand);
  test::require_all_close(per_example, sheafed);
  // Sheaf without its packed products, and the hand version with them (sheaf-bench hand:sheaf-gemm).
  auto unpacked = sheaf_gradients(m, batch, GraphOptions{.pack_weights = false});
  test::require_all_close(per_example, unpacked);
  if (packed_gemm_available()) {
    auto hand_packed = test::gradients_of(
        m.parameters(), [&] { return HandBatched(m, HandBatched::Product::kSheafPacked).loss(ptrs); });
    test::require_all_close(per_example, hand_packed);
  }
}

TEST_CASE("TreeLSTM: root logits agree three ways", "[examples][tree_lstm]") {
  const std::vector<data::Tree> batch = trees(6, 5);
  std::vector<const data::Tree*> ptrs;
  for (const auto& t : batch) ptrs.push_back(&t);
  TreeLSTM m({.vocab = 40, .hidden = 10}, 2);
  c10::NoGradGuard no_grad;
  at::Tensor hand = HandBatched(m).root_logits(ptrs);
  Graph g;
  std::vector<Expr> logits(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto s = g.example(static_cast<int>(i));
    m.sheaf_loss(g, batch[i], &logits[i]);
  }
  g.forward(logits);
  for (size_t i = 0; i < batch.size(); ++i) {
    CHECK(at::allclose(m.per_example_root_logits(batch[i]), hand[static_cast<int64_t>(i)], 1e-4, 1e-5));
    CHECK(at::allclose(logits[i].value(), hand[static_cast<int64_t>(i)], 1e-4, 1e-5));
  }
}

TEST_CASE("TreeLSTM: batched equals alone through the checker", "[examples][tree_lstm][checker]") {
  const int n = GENERATE(1, 2, 7, 24);
  const std::vector<data::Tree> batch = trees(n, 11);
  TreeLSTM m({.vocab = 40, .hidden = 8}, 3);
  CheckReport r = check_batched(n, [&](Graph& g, int i) { return m.sheaf_loss(g, batch[static_cast<size_t>(i)]); },
                                {.params = m.parameters()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("TreeLSTM: launches grow with tree height, not with the number of trees", "[examples][tree_lstm][launches]") {
  TreeLSTM m({.vocab = 40, .hidden = 8}, 4);
  auto launches = [&](const std::vector<data::Tree>& ts) {
    Graph g;
    g.forward(m.sheaf_batch_loss(g, ts));
    return g.stats().batches;
  };
  // 64 copies of one tree take exactly the launches of one tree.
  const std::vector<data::Tree> one = trees(1, 21);
  const std::vector<data::Tree> many(64, one[0]);
  CHECK(launches(many) == launches(one));
  // A batch of different trees: per level of height one launch per cell op
  // (affine, concat, 5 slices, tanh x2, sigmoid x4, mul x4, add x2 = 19), plus
  // the leaves and the classifier, far below one launch per node.
  const std::vector<data::Tree> mixed = trees(64, 22);
  int max_height = 0;
  size_t nodes = 0;
  for (const auto& t : mixed) {
    max_height = std::max(max_height, t.height());
    nodes += static_cast<size_t>(t.size());
  }
  const uint64_t n = launches(mixed);
  CHECK(n <= static_cast<uint64_t>(19 * max_height + 8));
  CHECK(n < nodes / 4);
}

TEST_CASE("TreeLSTM: hand-batched agrees on a batch of one deep tree and shallow ones", "[examples][tree_lstm]") {
  // A caterpillar 400 levels deep beside SST-like trees: most levels are read
  // by one later level only (the hand code's blocks, tree_levels.h, are made
  // for the levels that read them, not for every pair of levels).
  constexpr int kDepth = 400;
  std::string text;
  for (int i = 0; i < kDepth; ++i) {
    text += '(';
    text += std::to_string(i % 5);
    text += " (1 w";
    text += std::to_string(i % 30 + 1);
    text += ") ";
  }
  text += "(3 w0)" + std::string(kDepth, ')');
  std::vector<data::Tree> batch = trees(5, 11);
  batch.push_back(data::parse_tree(text));
  data::Vocab vocab = data::synthetic_vocab(40);
  vocab.assign_ids(batch.back());
  REQUIRE(batch.back().height() == kDepth);
  std::vector<const data::Tree*> ptrs;
  for (const auto& t : batch) ptrs.push_back(&t);
  TreeLSTM m({.vocab = 40, .hidden = 6}, 2);
  auto hand = test::gradients_of(m.parameters(), [&] { return HandBatched(m).loss(ptrs); });
  test::require_all_close(sheaf_gradients(m, batch), hand);
}

// The model records a tree node by node, not by a recursion per level: a tree
// 30,000 deep (a right-branching sentence of 30,001 words) overflowed the
// stack (a segmentation fault in tree_lstm and sheaf-bench).
TEST_CASE("TreeLSTM: a tree thousands of levels deep records without a stack overflow", "[examples][tree_lstm]") {
  constexpr int kDepth = 30000;
  std::string text;
  for (int i = 0; i < kDepth; ++i) text += "(2 (2 w" + std::to_string(i % 30 + 1) + ") ";
  text += "(3 w0)" + std::string(kDepth, ')');
  const data::Tree deep = data::parse_tree(text);
  REQUIRE(deep.height() == kDepth);
  data::Vocab vocab = data::synthetic_vocab(40);
  data::Tree t = deep;
  vocab.assign_ids(t);
  TreeLSTM m({.vocab = 40, .hidden = 4}, 5);
  c10::NoGradGuard no_grad;  // (inference, as tree_lstm's evaluation ran it)
  Graph g;
  const Expr loss = m.sheaf_batch_loss(g, std::vector<data::Tree>{t});
  CHECK(g.size() > static_cast<size_t>(2 * kDepth));
  g.forward(loss);
  CHECK(std::isfinite(loss.item()));
}
