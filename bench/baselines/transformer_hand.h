// The Transformer tagger of examples/transformer/model.h, hand-batched with
// LibTorch, padded and masked (Matchbox's MaskedBatch by hand), with what a
// careful user adds: position-wise work (embeddings, the Q/K/V projection as
// ONE GEMM over the concatenated weights, the output projection, layer norms,
// feed-forward, tag scores and the loss) on the batch's real tokens only,
// packed; only attention runs on the padded [B, heads, N, N] layout, in two
// bmm's, with padded keys masked to -inf. With `buckets` > 1 the sentences
// are sorted by length and cut into that many groups of (nearly) equal count,
// each padded to its own longest and attended on its own: the usual
// bucketing, less padded work for a few more calls (Sheaf's attention groups
// like lengths too, ops/attention.h). With `sheaf_attention`, attention is
// instead Sheaf's CPU loop over the packed rows (ops/attention_cpu.h), no
// padding: not LibTorch code a user could write, a reference for how much of
// Sheaf's lead is that kernel (sheaf-bench's hand:sheaf-attention).
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <transformer/model.h>

namespace sheaf::models {

class HandTransformer {
 public:
  explicit HandTransformer(const TransformerTagger& model, int buckets = 1, bool sheaf_attention = false)
      : m_(model), buckets_(buckets), sheaf_attention_(sheaf_attention) {}
  at::Tensor loss(std::span<const data::Sentence* const> batch) const;    // summed over tokens
  at::Tensor logits(std::span<const data::Sentence* const> batch) const;  // [tokens, tags], sentence order

 private:
  // Self-attention of the sentences `group` (indices into the batch, tokens
  // at rows `first[i]`..) from QKV [T, 3d] rows: [tokens of the group, d] in
  // the group's sentence order.
  at::Tensor attend(const at::Tensor& QKV, std::span<const data::Sentence* const> batch,
                    std::span<const int64_t> group, std::span<const int64_t> first) const;
  // The layer after attention: output projection, norms, feed-forward, tag scores.
  at::Tensor head(const at::Tensor& X, const at::Tensor& Z) const;

  const TransformerTagger& m_;
  int buckets_;
  bool sheaf_attention_;
};

}  // namespace sheaf::models
