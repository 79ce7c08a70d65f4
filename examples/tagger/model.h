// A BiLSTM tagger (DyNet's benchmark `bilstm-tagger`), optionally with rare
// words spelled out by a character BiLSTM (`bilstm-tagger-withchar`), written
// over the SAME parameters three ways so that the benchmark compares like with like:
//
//   sheaf_*       : the per-sentence code a researcher writes, with Sheaf
//   per_example_* : eager LibTorch, one sentence at a time, as a careful user
//                   writes it: one embedding call per sentence (sparse
//                   gradient), LibTorch's fused bidirectional at::lstm over the
//                   sentence (and over each rare word's characters)
//   HandTagger    : (bench/baselines/tagger_hand.h) the batch packed by length
//                   through at::lstm, the strongest batched LibTorch we know
//
// Per token t:  x_t = E[word_t], or for a rare word in the char tagger
//               [fwd char LSTM's last state; bwd char LSTM's last state]
//               (char hidden = embed / 2, as DyNet builds it, so x_t has one size);
//               [hf_t; hb_t] from a forward and a backward LSTM over x_1..x_n;
//               logits_t = M2 tanh(M1 [hf_t; hb_t] + m1) + m2;
//               loss = sum_t -log softmax(logits_t)[tag_t].
// LSTM cells use LibTorch's layout ([i, f, g, o] gate blocks, w_ih, w_hh) with
// one bias (LibTorch's second bias is a constant zero here).
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <string>
#include <vector>

#include <sheaf/sheaf.h>

#include "../common/lstm.h"
#include "../data/tagging.h"

namespace sheaf::models {

struct TaggerOptions {
  int64_t words = 0, chars = 0, tags = 0;  // vocabulary sizes (ids 0..size-1)
  int64_t embed = 128;       // word embedding (and char BiLSTM output) size
  int64_t hidden = 128;      // word LSTM, each direction
  int64_t mlp = 32;
  int64_t char_embed = 64;
  bool use_chars = false;    // rare words spelled out by the char BiLSTM
  bool sparse_embedding_grad = true;
  // The word (and char) BiLSTMs as dsl::lstm over each sentence's rows: one
  // launch a direction for the whole batch, the MLP and the loss over the rows
  // too (the kernels hand-batched code uses; on this CPU no faster than step
  // by step: docs/benchmarks.md). false: step by step, an LSTM cell a token
  // (the autobatched form, DyNet's: a batch per step).
  bool sequence_op = false;
};

class Tagger {
 public:
  Tagger(const TaggerOptions& options, uint64_t seed);
  // The MLP's body refers to this object's parameters: not copyable.
  Tagger(const Tagger&) = delete;
  Tagger& operator=(const Tagger&) = delete;
  const TaggerOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const;
  void to(const c10::Device& device);
  void save(const std::string& path) const;
  void load(const std::string& path);  // UserError on a file of another shape
  // The same, with a key of the vocabulary the ids came from (what tagger
  // --save/--load use): word and tag ids follow their first appearance in the
  // training file, so a file loaded with another vocabulary of the same sizes
  // read every row as another word's without a shape to differ. A
  // UserError then, and for a file saved without its key.
  void save(const std::string& path, const data::TaggingVocab& vocab) const;
  void load(const std::string& path, const data::TaggingVocab& vocab);

  // ---- Sheaf, one sentence: per-token logits, or the summed loss.
  // Step by step one [tags] Expr a token; with sequence_op one [L, tags] Expr.
  std::vector<Expr> sheaf_logits(Graph& g, const data::Sentence& s) const;
  Expr sheaf_loss(Graph& g, const data::Sentence& s) const;
  // A batch: sentence i recorded as example i; the sum of losses, or every
  // token's logits in sentence order.
  Expr sheaf_batch_loss(Graph& g, std::span<const data::Sentence* const> batch) const;
  std::vector<Expr> sheaf_batch_logits(Graph& g, std::span<const data::Sentence* const> batch) const;
  // The values of sheaf_batch_logits' Exprs (computed) as one [tokens, tags] tensor.
  static at::Tensor logit_rows(std::span<const Expr> logits);
  // Each sentence's predicted tags (argmax per token), run batched on g (cleared first).
  std::vector<std::vector<int64_t>> predict(Graph& g, std::span<const data::Sentence* const> batch,
                                            const Strategy* strategy = nullptr) const;

  // ---- Eager LibTorch, one sentence: logits [n, tags], the summed loss.
  at::Tensor per_example_logits(const data::Sentence& s) const;
  at::Tensor per_example_loss(const data::Sentence& s) const;

  at::Tensor E;                      // [words, embed]
  LstmWeights fwd, bwd;              // word LSTMs
  at::Tensor M1, m1, M2, m2;         // [mlp, 2h], [mlp], [tags, mlp], [tags]
  at::Tensor C;                      // [chars, char_embed] (use_chars)
  LstmWeights char_fwd, char_bwd;    // char LSTMs, hidden embed / 2 (use_chars)

 private:
  Expr sheaf_word(Graph& g, const data::Sentence& s, size_t t) const;
  at::Tensor per_example_inputs(const data::Sentence& s) const;  // [n, embed]

  // Per token: both directions' states -> tag scores (concat, MLP), a
  // sheaf::Function (one node per token instead of four; every token's call
  // still runs as one batch: one GEMM per layer for the whole batch).
  Fn<Expr(Expr, Expr)> mlp_;
  TaggerOptions options_;
};

}  // namespace sheaf::models
