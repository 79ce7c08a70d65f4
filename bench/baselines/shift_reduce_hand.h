// The shift-reduce parser of model.h, hand-batched with LibTorch: the best
// batched version we could write by hand, to compare Sheaf against.
//
// All sentences of a batch take their step t together (sorted by length, longest
// first, so the sentences still parsing at step t are a prefix of the rows; a
// sentence of n words stops after 2n - 1 steps). Per step: one tracking LSTM for
// all active sentences, their transition scores, in predict mode ONE
// device-to-host copy of all the scores (then choose_transition per sentence on
// the host), then one composition for all sentences that REDUCE at this step.
//
// Stacks and buffers live on the host as row references ("refs") into a thin
// stack (Bowman et al. 2016): one h tensor and one c tensor whose rows are the
// batch's words, a zero row (empty buffer, missing stack items, c of a word) and
// the composed items in the order they are made, written in place. A step
// gathers its inputs with one index_select. With autograd, each step's tracking
// cell and composition are ONE custom autograd node each, with a hand-written
// backward that adds the gradients of the rows it read into one gradient buffer
// of the thin stack (index_add_); so no gather zero-fills a gradient of its whole
// source, and no per-op autograd overhead is paid for the cells' elementwise
// math. The weights' gradients are one GEMM per weight for the whole batch.
// shift_reduce_hand.cpp lists what else was tried and measured.
//
// Backward may run more than once (retain_graph); double backward (create_graph)
// is not supported.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <vector>

#include <shift_reduce/model.h>

namespace sheaf::models {

class HandShiftReduce {
 public:
  explicit HandShiftReduce(const ShiftReduce& model) : m_(model) {}

  struct Result {
    at::Tensor loss;    // summed over the batch (sentiment + gold transition losses)
    at::Tensor logits;  // [B, 5], in batch order
    std::vector<std::vector<int>> transitions;  // per sentence, in batch order
  };
  // predict = false: follow the gold transitions (with a loss for each);
  // predict = true: follow the masked argmax of the scores (no transition losses).
  Result run(std::span<const data::Tree* const> batch, bool predict) const;

 private:
  const ShiftReduce& m_;
};

}  // namespace sheaf::models
