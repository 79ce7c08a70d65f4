#include "tagger_hand.h"

#include "packing.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <sheaf/ops/packed_lstm.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace sheaf::models {

namespace {

at::Tensor longs(const std::vector<int64_t>& v, const c10::Device& d) { return at::tensor(v, at::kLong).to(d); }

// A BiLSTM over packed rows [rows, in] with at::lstm: (outputs [rows, 2h],
// final states [2, sequences, h]).
std::pair<at::Tensor, at::Tensor> lstm_call(const LstmWeights& f, const LstmWeights& b, const at::Tensor& data,
                                            const Packing& p) {
  const at::Tensor h0 = at::zeros({2, p.batch_sizes.empty() ? 0 : p.batch_sizes[0], f.hidden()},
                                  data.options().requires_grad(false));
  auto [out, hn, cn] = at::lstm(data, at::tensor(p.batch_sizes, at::kLong), {h0, h0}, lstm_params(f, b),
                                /*has_biases=*/true, /*num_layers=*/1, /*dropout=*/0.0,
                                /*train=*/c10::GradMode::is_enabled(), /*bidirectional=*/true);
  return {out, hn};
}

// One direction as a loop over time steps on packed rows: the input projection
// of every row in one GEMM, then per step one GEMM on the active rows (a prefix,
// sequences being sorted longest first) and the cell's elementwise ops. Returns
// the outputs in packed order [rows, h] and the final states [sequences, h].
std::pair<at::Tensor, at::Tensor> loop_direction(const LstmWeights& w, const at::Tensor& data, const Packing& p,
                                                 bool reverse) {
  const at::Tensor projected = at::addmm(w.b, data, w.ih.t());
  const size_t steps = p.batch_sizes.size();
  std::vector<at::Tensor> outputs(steps), finals;  // finals: rows that end at a step (forward: in order of ending)
  at::Tensor h, c;
  for (size_t k = 0; k < steps; ++k) {
    const size_t t = reverse ? steps - 1 - k : k;
    const int64_t active = p.batch_sizes[t];
    at::Tensor gates = projected.narrow(0, p.offset[t], active);
    if (k > 0) {
      const int64_t carried = h.size(0);
      if (carried > active) {  // forward: the shortest sequences ended at the previous step
        finals.push_back(h.narrow(0, active, carried - active));
        h = h.narrow(0, 0, active), c = c.narrow(0, 0, active);
      } else if (carried < active) {  // backward: sequences that end at t start here, from zero
        const at::Tensor zeros = at::zeros({active - carried, h.size(1)}, h.options().requires_grad(false));
        h = at::cat({h, zeros}), c = at::cat({c, zeros});
      }
      gates = at::addmm(gates, h, w.hh.t());
    }
    const std::vector<at::Tensor> g = gates.chunk(4, 1);  // i, f, g, o
    const at::Tensor input = at::sigmoid(g[0]) * at::tanh(g[2]);
    c = k == 0 ? input : at::sigmoid(g[1]) * c + input;
    h = outputs[t] = at::sigmoid(g[3]) * at::tanh(c);
  }
  finals.push_back(h);
  // Forward: finals hold sequences longest-last in reverse ending order; rebuild sorted order.
  at::Tensor last = reverse ? h : at::cat(std::vector<at::Tensor>(finals.rbegin(), finals.rend()));
  return {at::cat(outputs), last};
}

// The same contract as lstm_call, one direction at a time.
std::pair<at::Tensor, at::Tensor> loop_call(const LstmWeights& f, const LstmWeights& b, const at::Tensor& data,
                                            const Packing& p) {
  auto [of, hf] = loop_direction(f, data, p, false);
  auto [ob, hb] = loop_direction(b, data, p, true);
  return {at::cat({of, ob}, 1), at::stack({hf, hb})};
}

// The same contract as lstm_call with op::packed_lstm (one autograd node a
// direction, its backward by hand: ops/packed_lstm.h); final states picked from
// the outputs (forward: each sequence's last row; backward: step 0's rows).
std::pair<at::Tensor, at::Tensor> fused_call(const LstmWeights& f, const LstmWeights& b, const at::Tensor& data,
                                             const Packing& p, op::LstmCell cell) {
  const at::Tensor of = op::packed_lstm(data, f.ih, f.hh, f.b, p.batch_sizes, false, {}, cell);
  const at::Tensor ob = op::packed_lstm(data, b.ih, b.hh, b.b, p.batch_sizes, true, {}, cell);
  std::vector<int64_t> last(p.order.size());
  for (size_t k = 0; k < last.size(); ++k) last[k] = p.row(k, p.length[k] - 1);
  const at::Tensor hf = of.index_select(0, at::tensor(last, at::kLong).to(data.device()));
  const at::Tensor hb = ob.narrow(0, 0, static_cast<int64_t>(p.order.size()));
  return {at::cat({of, ob}, 1), at::stack({hf, hb})};
}

std::pair<at::Tensor, at::Tensor> packed_bilstm(HandTagger::Kernel kernel, const LstmWeights& f, const LstmWeights& b,
                                                const at::Tensor& data, const Packing& p) {
  switch (kernel) {
    case HandTagger::Kernel::kLstmCall: return lstm_call(f, b, data, p);
    case HandTagger::Kernel::kLoop: return loop_call(f, b, data, p);
    case HandTagger::Kernel::kFused: break;
    case HandTagger::Kernel::kSheafCell: return fused_call(f, b, data, p, op::LstmCell::kFused);
  }
  return fused_call(f, b, data, p, op::LstmCell::kAten);
}

}  // namespace

struct HandTagger::Packed {
  Packing words;
  std::vector<int64_t> ids, tags;   // packed order
  std::vector<int64_t> sentence_order;  // packed row of each token, sentences in batch order
  // Char tagger: the rare tokens' characters, packed, and where the rows go.
  Packing chars;
  std::vector<int64_t> char_ids, frequent_ids;
  std::vector<int64_t> place;  // packed token row -> row of [frequent embeddings; rare spellings]

  Packed(std::span<const data::Sentence* const> batch, bool use_chars) : words(lengths(batch)) {
    const auto n = static_cast<size_t>(words.rows());
    ids.resize(n);
    tags.resize(n);
    sentence_order.resize(n);
    std::vector<int64_t> first(batch.size() + 1, 0);  // sentence-order index of each sentence's first token
    for (size_t i = 0; i < batch.size(); ++i) first[i + 1] = first[i] + batch[i]->size();
    std::vector<std::pair<size_t, size_t>> token(n);  // packed row -> (sentence, position)
    words.for_each([&](size_t i, size_t t, int64_t row) {
      const auto r = static_cast<size_t>(row);
      token[r] = {i, t};
      ids[r] = batch[i]->word[t];
      tags[r] = batch[i]->tag[t];
      sentence_order[static_cast<size_t>(first[i]) + t] = row;
    });
    if (!use_chars) return;
    std::vector<const std::vector<int64_t>*> spellings;  // rare tokens, packed row order
    std::vector<int64_t> rare_row;
    place.resize(n);
    for (size_t row = 0; row < n; ++row) {
      const auto [i, t] = token[row];
      const data::Sentence& s = *batch[i];
      if (s.rare[t]) {
        rare_row.push_back(static_cast<int64_t>(row));
        spellings.push_back(&s.chars[t]);
      } else {
        place[row] = static_cast<int64_t>(frequent_ids.size());
        frequent_ids.push_back(s.word[t]);
      }
    }
    std::vector<size_t> char_lengths;
    for (const auto* sp : spellings) char_lengths.push_back(sp->size());
    chars = Packing(char_lengths);
    // at::lstm returns final states in packed (sorted) order.
    for (size_t k = 0; k < chars.order.size(); ++k)
      place[static_cast<size_t>(rare_row[chars.order[k]])] = static_cast<int64_t>(frequent_ids.size() + k);
    char_ids.resize(static_cast<size_t>(chars.rows()));
    chars.for_each([&](size_t w, size_t j, int64_t row) { char_ids[static_cast<size_t>(row)] = (*spellings[w])[j]; });
  }

  static std::vector<size_t> lengths(std::span<const data::Sentence* const> batch) {
    std::vector<size_t> out;
    for (const data::Sentence* s : batch) out.push_back(s->word.size());
    return out;
  }
};

at::Tensor HandTagger::run(const Packed& p) const {
  const Tagger& m = m_;
  const c10::Device d = m.E.device();
  const bool sparse = m.options().sparse_embedding_grad;
  at::Tensor x;
  if (!m.options().use_chars || p.chars.rows() == 0) {
    x = at::embedding(m.E, longs(p.ids, d), -1, false, sparse);
  } else {
    const at::Tensor chars = at::embedding(m.C, longs(p.char_ids, d));
    const at::Tensor hn = packed_bilstm(kernel_, m.char_fwd, m.char_bwd, chars, p.chars).second;  // [2, rare, embed / 2]
    const at::Tensor spelled = at::cat({hn[0], hn[1]}, 1);
    const at::Tensor frequent = at::embedding(m.E, longs(p.frequent_ids, d), -1, false, sparse);
    x = at::cat({frequent, spelled}).index_select(0, longs(p.place, d));
  }
  const at::Tensor h = packed_bilstm(kernel_, m.fwd, m.bwd, x, p.words).first;
  return at::addmm(m.m2, at::tanh(at::addmm(m.m1, h, m.M1.t())), m.M2.t());
}

at::Tensor HandTagger::logits(std::span<const data::Sentence* const> batch) const {
  return run(Packed(batch, m_.options().use_chars));
}

at::Tensor HandTagger::loss(std::span<const data::Sentence* const> batch) const {
  const Packed p(batch, m_.options().use_chars);
  return at::nll_loss(at::log_softmax(run(p), 1), longs(p.tags, m_.E.device()), {}, at::Reduction::Sum);
}

at::Tensor HandTagger::logits_in_sentence_order(std::span<const data::Sentence* const> batch) const {
  const Packed p(batch, m_.options().use_chars);
  return run(p).index_select(0, longs(p.sentence_order, m_.E.device()));
}

}  // namespace sheaf::models
