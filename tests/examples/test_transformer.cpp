// The Transformer encoder layer tagger (examples/transformer): Sheaf's
// per-sentence code run batched, eager LibTorch one sentence at a time, and the
// padded-and-masked hand-batched version agree on logits, loss and gradients;
// batched equals alone under every strategy; sentences it has no positions for
// are user errors.
#include <c10/core/GradMode.h>

#include <baselines/transformer_hand.h>
#include <data/tagging.h>
#include <transformer/model.h>

#include "../support.h"

using namespace sheaf;
using data::Sentence;
using models::HandTransformer;
using models::TransformerTagger;

namespace {

struct Corpus {
  data::TaggingVocab vocab;
  std::vector<Sentence> sentences;
  std::vector<const Sentence*> batch;
};

Corpus corpus(int n, int max_words, uint64_t seed) {
  const auto train = data::synthetic_tagged({.count = 200, .min_words = 1, .max_words = 9, .vocab_size = 60, .tags = 5, .seed = 1});
  Corpus c{data::TaggingVocab::build(train, 1), {}, {}};
  c.sentences = c.vocab.encode(
      data::synthetic_tagged({.count = n, .min_words = 1, .max_words = max_words, .vocab_size = 80, .tags = 5, .seed = seed}));
  for (const Sentence& s : c.sentences) c.batch.push_back(&s);
  return c;
}

TransformerTagger model_for(const Corpus& c, uint64_t seed) {
  return TransformerTagger({.words = static_cast<int64_t>(c.vocab.words.size()),
                            .tags = static_cast<int64_t>(c.vocab.tags.size()), .d = 8, .heads = 2, .ff = 12,
                            .max_length = 16},
                           seed);
}

}  // namespace

TEST_CASE("transformer: Sheaf, per-example and hand-batched agree on logits, loss and gradients",
          "[examples][transformer]") {
  const Corpus c = corpus(10, 9, 4);
  const TransformerTagger m = model_for(c, 2);
  const auto eager = test::gradients_of(m.parameters(), [&] {
    at::Tensor total = m.per_example_loss(*c.batch[0]);
    for (size_t i = 1; i < c.batch.size(); ++i) total = total + m.per_example_loss(*c.batch[i]);
    return total;
  });
  const auto hand = test::gradients_of(m.parameters(), [&] { return HandTransformer(m).loss(c.batch); });
  // In length buckets: 3 of 3-4 of the 10 sentences, 9 (most alone).
  const auto bucketed = test::gradients_of(m.parameters(), [&] { return HandTransformer(m, 3).loss(c.batch); });
  const auto each = test::gradients_of(m.parameters(), [&] { return HandTransformer(m, 9).loss(c.batch); });
  Graph g;
  const auto sheafed = test::gradients_of(m.parameters(), [&] {
    Expr loss = m.sheaf_batch_loss(g, c.batch);
    g.forward(loss);
    return loss.value();
  });
  test::require_all_close(eager, hand);
  test::require_all_close(eager, bucketed);
  test::require_all_close(eager, each);
  test::require_all_close(eager, sheafed);

  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> rows;
  for (const Sentence* s : c.batch) rows.push_back(m.per_example_logits(*s));
  const at::Tensor expected = at::cat(rows);
  CHECK(at::allclose(HandTransformer(m).logits(c.batch), expected, 1e-4, 1e-5));
  CHECK(at::allclose(HandTransformer(m, 3).logits(c.batch), expected, 1e-4, 1e-5));
  g.clear();
  const std::vector<Expr> logits = m.sheaf_batch_logits(g, c.batch);
  g.forward(logits);
  std::vector<at::Tensor> sheaf_rows;
  for (const Expr& e : logits) sheaf_rows.push_back(e.value());
  CHECK(at::allclose(at::cat(sheaf_rows), expected, 1e-4, 1e-5));
}

TEST_CASE("transformer: batched equals alone under every strategy (checker)", "[examples][transformer][checker]") {
  const Corpus c = corpus(6, 5, 7);
  const TransformerTagger m = model_for(c, 3);
  CheckReport r = check_batched(static_cast<int>(c.sentences.size()),
                                [&](Graph& g, int i) { return m.sheaf_loss(g, c.sentences[static_cast<size_t>(i)]); },
                                {.params = m.parameters()});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("transformer: a sentence longer than its positions, or empty, is a user error", "[examples][transformer]") {
  const Corpus c = corpus(1, 3, 9);
  const TransformerTagger m = model_for(c, 4);
  Sentence longer = c.sentences[0];
  while (longer.size() <= 16) {
    longer.word.push_back(longer.word[0]);
    longer.tag.push_back(longer.tag[0]);
  }
  Graph g;
  CHECK_THROWS_AS(m.sheaf_loss(g, longer), UserError);
  CHECK_THROWS_AS(m.per_example_loss(Sentence{}), UserError);
  CHECK_THROWS_AS(TransformerTagger({.words = 5, .tags = 3, .d = 6, .heads = 4}, 1), UserError);
}
