// A SPINN-style shift-reduce encoder (Bowman et al. 2016) over sentiment trees.
//
// A buffer holds the words (h = E[word], c = 0); a stack holds partial trees.
// At every step a tracking LSTM reads [buffer top; stack top; stack second]
// and a linear layer scores the two transitions. SHIFT moves the buffer top to
// the stack; REDUCE pops two items and composes them with a TreeLSTM cell that
// also sees the tracking state. After 2n - 1 steps the stack holds one item: the
// sentence, classified into 5 sentiment labels.
//
// Training follows the gold transitions of the tree (structure-driven).
// Inference follows the model's own predictions (value-driven): each step's
// transition is the argmax of the scores, masked to the valid actions (REDUCE
// needs two stack items, SHIFT a non-empty buffer).
//
// The same per-sentence code runs with Sheaf (a coroutine that co_awaits the
// scores when it must decide) and eagerly per example (for the benchmark).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include <sheaf/sheaf.h>

#include "../data/trees.h"

namespace sheaf::models {

enum Transition : int { kShift = 0, kReduce = 1 };

// The gold transitions of a tree: SHIFT per leaf, REDUCE per internal node, in
// post-order (the node order of data::Tree).
std::vector<int> gold_transitions(const data::Tree& tree);

// The valid transition with the higher score; `scores` are [shift, reduce].
int choose_transition(float shift_score, float reduce_score, size_t stack_size, size_t buffer_left);

struct ShiftReduceOptions {
  int64_t vocab = 0;
  int64_t hidden = 128;
  int64_t tracking = 32;
  bool sparse_embedding_grad = true;
};

struct ParseResult {
  Expr loss;                     // sentiment loss (+ transition losses when following gold)
  Expr logits;                   // sentence sentiment logits [5]
  std::vector<int> transitions;  // what was done
};

class ShiftReduce {
 public:
  static constexpr int64_t kClasses = 5;
  ShiftReduce(const ShiftReduceOptions& options, uint64_t seed);
  // The cells' bodies refer to this object's parameters: not copyable.
  ShiftReduce(const ShiftReduce&) = delete;
  ShiftReduce& operator=(const ShiftReduce&) = delete;
  const ShiftReduceOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const { return {E, T, t, A, a, U, u, V, v}; }
  void to(const c10::Device& device);

  // Sheaf, per sentence. predict = false: follow the gold transitions and add a
  // loss for predicting each of them; predict = true: follow the argmax.
  Task<ParseResult> parse(Graph& g, const data::Tree& tree, bool predict) const;

  // Eager LibTorch, one sentence (predict: one .item() per step, as per-example code must).
  struct EagerResult {
    at::Tensor loss, logits;
    std::vector<int> transitions;
  };
  EagerResult parse_eager(const data::Tree& tree, bool predict) const;

  at::Tensor E;     // [vocab, h]
  at::Tensor T, t;  // tracking LSTM: [4k, 3h + k], [4k]
  at::Tensor A, a;  // transition scores: [2, k], [2]
  at::Tensor U, u;  // composition: [5h, 2h + k], [5h]
  at::Tensor V, v;  // sentiment: [5, h], [5]

 private:
  // The two cells as sheaf::Functions (one node per call, dsl/function.h):
  // tracking (buffer top, stack top, stack second, h, c) -> (h, c), and
  // composition (left h, left c, right h, right c, tracking h) -> (h, c).
  Fn<std::array<Expr, 2>(Expr, Expr, Expr, Expr, Expr)> track_;
  Fn<std::array<Expr, 2>(Expr, Expr, Expr, Expr, Expr)> compose_;
  ShiftReduceOptions options_;
};

}  // namespace sheaf::models
