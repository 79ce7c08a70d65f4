// A sequence-to-sequence model with dot-product attention (Luong et al. 2015,
// "global attention", dot score, no input feeding), written for ONE example:
//
//   encoder : a BiLSTM over the source's embeddings; H = [hf_t; hb_t] per
//             position, one [n, hidden] matrix per example (n varies)
//   decoder : an LSTM over the previous target token's embedding, starting
//             from [hf_n; hb_1]; at step k, with state s_k:
//               a_k = softmax(H s_k)                 attention over the source
//               o_k = tanh(Wc [s_k; a_k H] + bc)     a_k H: the weighted sum of H's rows
//               logits_k = Wo o_k + bo
//   training: teacher forcing, loss = sum_k -log softmax(logits_k)[y_k]
//   decoding: greedy, one co_await per step for the argmax (sheaf::Task), so
//             each example stops at its own end token
//
// sheaf_*       : the per-example code a researcher writes, with Sheaf
// per_example_* : eager LibTorch, one example at a time, as a careful user
//                 writes it: at::lstm for the encoder and for the teacher-forced
//                 decoder, then the attention of every step as matrix products
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <string>
#include <vector>

#include <sheaf/sheaf.h>

#include "../common/lstm.h"
#include "../data/digits.h"

namespace sheaf::models {

struct Seq2SeqOptions {
  int64_t vocab = data::kDigitVocab;  // source and target tokens share ids
  int64_t embed = 32;
  int64_t hidden = 64;  // decoder state and H's rows; the encoder has hidden / 2 per direction
  // The encoder's BiLSTM, and in training the teacher-forced decoder, as
  // dsl::lstm over the rows (one launch each for the batch), every step's
  // attention as one dsl::attention; false: step by step, a cell a token.
  // Greedy decoding is step by step either way.
  bool sequence_op = false;
};

class Seq2Seq {
 public:
  Seq2Seq(const Seq2SeqOptions& options, uint64_t seed);
  const Seq2SeqOptions& options() const { return options_; }
  std::vector<at::Tensor> parameters() const;
  void to(const c10::Device& device);  // parameters (made on the CPU) to the graph's device
  void save(const std::string& path) const;
  void load(const std::string& path);  // UserError on a file of another shape

  // ---- Sheaf, one example.
  Expr sheaf_loss(Graph& g, const data::DigitPair& p) const;
  // Greedy decoding: the tokens before the end token, at most max_steps of them.
  Task<std::vector<int64_t>> sheaf_greedy(Graph& g, const std::vector<int64_t>& source, int max_steps) const;
  // A batch: example i is batch[i]. The sum of the losses; or each example's
  // greedy output (g is cleared first).
  Expr sheaf_batch_loss(Graph& g, std::span<const data::DigitPair* const> batch) const;
  std::vector<std::vector<int64_t>> sheaf_decode(Graph& g, std::span<const data::DigitPair* const> batch,
                                                 const Strategy* strategy = nullptr) const;

  // ---- Eager LibTorch, one example.
  at::Tensor per_example_loss(const data::DigitPair& p) const;
  std::vector<int64_t> per_example_greedy(const std::vector<int64_t>& source, int max_steps) const;

  // Decoding budget for a source: its length and a few more (the model may
  // fail to stop; greedy search never runs longer than this).
  static int max_steps_for(const std::vector<int64_t>& source) { return static_cast<int>(source.size()) + 4; }

  at::Tensor E;                // [vocab, embed], source and target embeddings
  LstmWeights enc_f, enc_b;    // [.., embed] -> hidden / 2 each
  LstmWeights dec;             // embed -> hidden
  at::Tensor Wc, bc, Wo, bo;   // [hidden, 2 hidden], [hidden], [vocab, hidden], [vocab]

 private:
  struct Encoded {
    Expr H;  // [n, hidden]
    LstmState start;
  };
  Encoded sheaf_encode(Graph& g, const std::vector<int64_t>& source) const;
  Expr sheaf_logits(const Encoded& enc, const Expr& s) const;

  Seq2SeqOptions options_;
};

}  // namespace sheaf::models
