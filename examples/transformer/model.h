// A Transformer encoder layer as a tagger over sentences of different lengths
// (the model Matchbox's own example batches), written for ONE sentence:
//
//   X      = E[words] + P[positions]                       [n, d]
//   per head h (d / heads columns of each projection):
//   Z_h    = softmax(Q_h K_h^T / sqrt(d / heads)) V_h      [n, d / heads]
//   X1     = layer_norm(X + Wo [Z_1 ... Z_H] + bo)
//   Y      = layer_norm(X1 + W2 relu(W1 X1 + c1) + c2)
//   logits = Wt Y + bt                                      [n, tags]
//   loss   = sum over tokens of -log softmax(logits_t)[tag_t]
//
// sheaf_*       : the per-sentence code a researcher writes, with Sheaf
// per_example_* : eager LibTorch, one sentence at a time, as a careful user
//                 writes it (all heads in one bmm, sparse embedding gradient)
// Hand-batched, padded and masked: bench/baselines/transformer_hand.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <vector>

#include <sheaf/sheaf.h>

#include "../data/tagging.h"

namespace sheaf::models {

struct TransformerOptions {
  int64_t words = 0, tags = 0;  // vocabulary sizes
  int64_t d = 64, heads = 4, ff = 128;
  int64_t max_length = 64;      // positions with an embedding
  // dsl::attention (one launch over every sentence length); false: each head
  // as matmul / softmax / matmul, which runs once per distinct length.
  bool attention_op = true;
};

class TransformerTagger {
 public:
  TransformerTagger(const TransformerOptions& options, uint64_t seed);
  const TransformerOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const;
  void to(const c10::Device& device);  // parameters (made on the CPU) to the graph's device

  // ---- Sheaf, one sentence: logits [n, tags], or the summed loss.
  Expr sheaf_logits(Graph& g, const data::Sentence& s) const;
  Expr sheaf_loss(Graph& g, const data::Sentence& s) const;
  // A batch: sentence i recorded as example i.
  Expr sheaf_batch_loss(Graph& g, std::span<const data::Sentence* const> batch) const;
  std::vector<Expr> sheaf_batch_logits(Graph& g, std::span<const data::Sentence* const> batch) const;

  // ---- Eager LibTorch, one sentence.
  at::Tensor per_example_logits(const data::Sentence& s) const;
  at::Tensor per_example_loss(const data::Sentence& s) const;

  at::Tensor E, P;                   // [words, d], [max_length, d]
  at::Tensor Wq, Wk, Wv, Wo;         // [d, d]
  at::Tensor bq, bk, bv, bo;         // [d]
  at::Tensor g1, b1, g2, b2;         // layer norms' gains and biases [d]
  at::Tensor W1, c1, W2, c2;         // [ff, d], [ff], [d, ff], [d]
  at::Tensor Wt, bt;                 // [tags, d], [tags]

 private:
  void check(const data::Sentence& s) const;  // UserError for an empty or too long sentence
  TransformerOptions options_;
};

}  // namespace sheaf::models
