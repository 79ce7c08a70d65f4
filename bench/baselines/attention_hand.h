// The attention model of examples/attention/model.h, hand-batched with
// LibTorch, padded and masked (Matchbox's MaskedBatch by hand), with what a
// careful user adds: the batch sorted by length and packed so that neither
// LSTM computes on padding (one at::lstm call for the bidirectional encoder,
// one for the teacher-forced decoder), the encoder states scattered once into a
// padded [B, N, hidden] tensor, every step's attention in two bmm's with the
// source padding masked to -inf, and the output layer and loss over the real
// target tokens only (packed rows, no padding).
//
// Greedy decoding runs the decoder one step at a time for the whole batch (one
// lstm_cell, two bmm's, one argmax and ONE device->host copy per step) until
// every example has written its end token or used its budget; finished rows
// keep computing (selecting the live rows every step costs more than it saves).
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <vector>

#include <attention/model.h>

namespace sheaf::models {

class HandSeq2Seq {
 public:
  // How greedy decoding's step multiplies each example's H with its state and
  // attention weights: bmm (one addmm per example inside LibTorch on the CPU),
  // or broadcast multiply and sum (two passes over H, no per-example call).
  enum class Products { kBmm, kMulSum };
  // The encoder's and the teacher-forced decoder's LSTMs: at::lstm, or
  // op::packed_lstm (one autograd node a direction, its backward by hand: the
  // faster to train on the CPU, as the hand tagger's); kAuto: packed_lstm
  // where a gradient is wanted on the CPU, at::lstm elsewhere.
  enum class Lstm { kAuto, kLstmCall, kFused };
  explicit HandSeq2Seq(const Seq2Seq& model, Products products = Products::kBmm, Lstm lstm = Lstm::kAuto)
      : m_(model), products_(products), lstm_(lstm) {}
  at::Tensor loss(std::span<const data::DigitPair* const> batch) const;             // summed over tokens
  at::Tensor example_losses(std::span<const data::DigitPair* const> batch) const;   // [B], batch order
  // Greedy outputs in batch order, each within Seq2Seq::max_steps_for its source.
  std::vector<std::vector<int64_t>> greedy(std::span<const data::DigitPair* const> batch) const;

 private:
  struct Encoded;
  Encoded encode(std::span<const data::DigitPair* const> batch) const;
  at::Tensor token_losses(std::span<const data::DigitPair* const> batch, at::Tensor* example_of_row) const;
  bool fused_lstm() const;
  const Seq2Seq& m_;
  Products products_;
  Lstm lstm_;
};

}  // namespace sheaf::models
