// The Transformer tagger of examples/transformer/model.h, hand-batched with
// LibTorch, padded and masked (Matchbox's MaskedBatch by hand), with what a
// careful user adds: position-wise work (embeddings, the Q/K/V projection as
// ONE GEMM over the concatenated weights, the output projection, layer norms,
// feed-forward, tag scores and the loss) on the batch's real tokens only,
// packed; only attention runs on the padded [B, heads, N, N] layout, in two
// bmm's, with padded keys masked to -inf.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <transformer/model.h>

namespace sheaf::models {

class HandTransformer {
 public:
  explicit HandTransformer(const TransformerTagger& model) : m_(model) {}
  at::Tensor loss(std::span<const data::Sentence* const> batch) const;    // summed over tokens
  at::Tensor logits(std::span<const data::Sentence* const> batch) const;  // [tokens, tags], sentence order

 private:
  const TransformerTagger& m_;
};

}  // namespace sheaf::models
