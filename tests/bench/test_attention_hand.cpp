// The hand-batched seq2seq baseline computes what the eager per-example model
// computes, losses and every parameter's gradient, with either LSTM kernel
// (at::lstm, or op::packed_lstm with the decoder started from the encoder's
// states), and greedy decoding gives the eager outputs.
#include <c10/core/GradMode.h>

#include <baselines/attention_hand.h>
#include <data/digits.h>
#include <attention/model.h>

#include "../support.h"

using namespace sheaf;
using models::HandSeq2Seq;
using models::Seq2Seq;

TEST_CASE("hand-batched seq2seq equals the eager model, losses and gradients, either LSTM kernel",
          "[examples][attention][hand]") {
  const auto kernel = GENERATE(HandSeq2Seq::Lstm::kLstmCall, HandSeq2Seq::Lstm::kFused);
  const auto pairs = data::synthetic_digits({.count = 9, .min_length = 1, .max_length = 7, .seed = 4});
  std::vector<const data::DigitPair*> batch;
  for (const data::DigitPair& p : pairs) batch.push_back(&p);
  const Seq2Seq m({.embed = 6, .hidden = 8}, 2);
  const auto eager = test::gradients_of(m.parameters(), [&] {
    at::Tensor total = m.per_example_loss(*batch[0]);
    for (size_t i = 1; i < batch.size(); ++i) total = total + m.per_example_loss(*batch[i]);
    return total;
  });
  const HandSeq2Seq hand(m, HandSeq2Seq::Products::kBmm, kernel);
  const auto batched = test::gradients_of(m.parameters(), [&] { return hand.loss(batch); });
  test::require_all_close(eager, batched);
  {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> losses;
    for (const data::DigitPair* p : batch) losses.push_back(m.per_example_loss(*p));
    CHECK(at::allclose(hand.example_losses(batch), at::stack(losses), 1e-4, 1e-5));
  }
  c10::NoGradGuard no_grad;
  const auto outputs = hand.greedy(batch);
  for (size_t i = 0; i < batch.size(); ++i)
    CHECK(outputs[i] == m.per_example_greedy(batch[i]->source, Seq2Seq::max_steps_for(batch[i]->source)));
}
