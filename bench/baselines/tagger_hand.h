// The tagger of examples/tagger/model.h, hand-batched with LibTorch: the batch's
// sentences sorted by length and packed (time-major, no padding), each word
// LSTM direction one call on the packed batch (Kernel below), the MLP and the
// loss over every token in one launch each. In the char tagger, every rare
// token of the batch is spelled by one packed char BiLSTM over all their
// characters, and its rows are placed among the word embeddings with one
// index_select.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>

#include <tagger/model.h>

namespace sheaf::models {

class HandTagger {
 public:
  // How the packed LSTMs run: LibTorch's at::lstm (its cell, step by step on
  // the packed batch); our own loop of ATen ops under autograd, which projects
  // every row's input in one GEMM first (at::lstm on packed input projects step
  // by step); or each direction as ONE autograd node with a hand-written
  // backward and one GEMM per weight gradient (kFused). kSheafCell: kFused
  // with Sheaf's fused cell loop (op::LstmCell::kFused), a custom kernel that
  // LibTorch code does not have: not a hand baseline, a reference for how much
  // of Sheaf's dsl::lstm's lead is that kernel.
  enum class Kernel { kLstmCall, kLoop, kFused, kSheafCell };
  explicit HandTagger(const Tagger& model, Kernel kernel = Kernel::kLstmCall) : m_(model), kernel_(kernel) {}
  at::Tensor loss(std::span<const data::Sentence* const> batch) const;    // summed over tokens
  at::Tensor logits(std::span<const data::Sentence* const> batch) const;  // [tokens, tags], packed order
  // Every token's logits in sentence order (as Tagger::sheaf_batch_logits), for checks.
  at::Tensor logits_in_sentence_order(std::span<const data::Sentence* const> batch) const;

 private:
  struct Packed;
  at::Tensor run(const Packed& p) const;
  const Tagger& m_;
  Kernel kernel_;
};

}  // namespace sheaf::models
