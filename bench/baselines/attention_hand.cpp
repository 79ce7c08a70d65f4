#include "attention_hand.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/core/GradMode.h>

#include <sheaf/ops/packed_lstm.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "packing.h"

namespace sheaf::models {

namespace {

at::Tensor longs(const std::vector<int64_t>& v, const c10::Device& d) { return at::tensor(v, at::kLong).to(d); }

constexpr float kInf = std::numeric_limits<float>::infinity();

}  // namespace

// The batch sorted longest first (targets are one longer than sources, so one
// order serves both), the encoder run packed, its states padded.
struct HandSeq2Seq::Encoded {
  Packing src;                 // sources, packed
  int64_t longest = 0;
  at::Tensor H;                // [B, N, hidden], zeros past each source's end (sorted order)
  at::Tensor pad;              // [B, 1, N] bool: true past the source's end
  at::Tensor start;            // [B, hidden]: [hf_n; hb_1]
};

bool HandSeq2Seq::fused_lstm() const {
  if (lstm_ != Lstm::kAuto) return lstm_ == Lstm::kFused;
  return c10::GradMode::is_enabled() && m_.E.is_cpu();
}

HandSeq2Seq::Encoded HandSeq2Seq::encode(std::span<const data::DigitPair* const> batch) const {
  const c10::Device device = m_.E.device();
  std::vector<size_t> lengths;
  for (const data::DigitPair* p : batch) lengths.push_back(p->source.size());
  Encoded e{Packing(lengths), 0, {}, {}, {}};
  e.longest = static_cast<int64_t>(e.src.length[0]);
  const auto B = static_cast<int64_t>(batch.size());
  std::vector<int64_t> ids(static_cast<size_t>(e.src.rows())), padded(ids.size());
  e.src.for_each([&](size_t i, size_t t, int64_t row) { ids[static_cast<size_t>(row)] = batch[i]->source[t]; });
  for (size_t k = 0; k < e.src.order.size(); ++k)
    for (size_t t = 0; t < e.src.length[k]; ++t)
      padded[static_cast<size_t>(e.src.row(k, t))] = static_cast<int64_t>(k) * e.longest + static_cast<int64_t>(t);
  const int64_t half = m_.enc_f.hidden(), hidden = 2 * half;
  const at::Tensor X = at::embedding(m_.E, longs(ids, device));
  at::Tensor out;
  if (fused_lstm()) {
    const at::Tensor of = op::packed_lstm(X, m_.enc_f.ih, m_.enc_f.hh, m_.enc_f.b, e.src.batch_sizes, false);
    const at::Tensor ob = op::packed_lstm(X, m_.enc_b.ih, m_.enc_b.hh, m_.enc_b.b, e.src.batch_sizes, true);
    out = at::cat({of, ob}, 1);
    std::vector<int64_t> last(e.src.order.size());  // each source's last row (forward); step 0's rows (backward)
    for (size_t k = 0; k < last.size(); ++k) last[k] = e.src.row(k, e.src.length[k] - 1);
    e.start = at::cat({of.index_select(0, longs(last, device)), ob.narrow(0, 0, B)}, 1);
  } else {
    const at::Tensor h0 = at::zeros({2, B, half}, m_.E.options().requires_grad(false));
    auto [o, hn, cn] = at::lstm(X, longs(e.src.batch_sizes, at::kCPU), {h0, h0}, lstm_params(m_.enc_f, m_.enc_b),
                                /*has_biases=*/true, /*num_layers=*/1, /*dropout=*/0.0,
                                /*train=*/c10::GradMode::is_enabled(), /*bidirectional=*/true);
    out = o;
    e.start = at::cat({hn[0], hn[1]}, 1);
  }
  e.H = at::zeros({B * e.longest, hidden}, out.options()).index_copy(0, longs(padded, device), out).view({B, e.longest, hidden});
  std::vector<int64_t> len_sorted(e.src.length.begin(), e.src.length.end());
  e.pad = (at::arange(e.longest, at::TensorOptions().dtype(at::kLong).device(device)).unsqueeze(0) >=
           longs(len_sorted, device).unsqueeze(1))
              .unsqueeze(1);
  return e;
}

at::Tensor HandSeq2Seq::token_losses(std::span<const data::DigitPair* const> batch, at::Tensor* example_of_row) const {
  const c10::Device device = m_.E.device();
  const Encoded e = encode(batch);
  const auto B = static_cast<int64_t>(batch.size());
  std::vector<size_t> lengths;
  for (const data::DigitPair* p : batch) lengths.push_back(p->target.size());
  const Packing dec(lengths);
  const auto T = static_cast<int64_t>(dec.length[0]);
  const auto rows = static_cast<size_t>(dec.rows());
  std::vector<int64_t> in(rows), gold(rows), padded(rows), example(rows);
  dec.for_each([&](size_t i, size_t t, int64_t row) {
    const auto r = static_cast<size_t>(row);
    in[r] = t == 0 ? data::kDigitBos : batch[i]->target[t - 1];
    gold[r] = batch[i]->target[t];
    example[r] = static_cast<int64_t>(i);
  });
  for (size_t k = 0; k < dec.order.size(); ++k)
    for (size_t t = 0; t < dec.length[k]; ++t)
      padded[static_cast<size_t>(dec.row(k, t))] = static_cast<int64_t>(k) * T + static_cast<int64_t>(t);
  const at::Tensor Y = at::embedding(m_.E, longs(in, device));
  at::Tensor S;
  if (fused_lstm()) {  // targets sort as their sources: step 0's rows are e.start's
    S = op::packed_lstm(Y, m_.dec.ih, m_.dec.hh, m_.dec.b, dec.batch_sizes, false, e.start);
  } else {
    const at::Tensor h0 = e.start.unsqueeze(0), c0 = at::zeros_like(h0);
    S = std::get<0>(at::lstm(Y, longs(dec.batch_sizes, at::kCPU), {h0, c0}, {m_.dec.ih, m_.dec.hh, m_.dec.b, m_.dec.zero},
                             /*has_biases=*/true, /*num_layers=*/1, /*dropout=*/0.0,
                             /*train=*/c10::GradMode::is_enabled(), /*bidirectional=*/false));
  }
  const int64_t hidden = S.size(1);
  const at::Tensor index = longs(padded, device);
  // Attention for every step at once, on the padded layout; then back to the real rows.
  const at::Tensor Sp = at::zeros({B * T, hidden}, S.options()).index_copy(0, index, S).view({B, T, hidden});
  const at::Tensor A = at::softmax(Sp.bmm(e.H.transpose(1, 2)).masked_fill(e.pad, -kInf), 2);
  const at::Tensor C = A.bmm(e.H).view({B * T, hidden}).index_select(0, index);  // [rows, hidden]
  const at::Tensor O = at::tanh(at::addmm(m_.bc, at::cat({S, C}, 1), m_.Wc.t()));
  const at::Tensor logits = at::addmm(m_.bo, O, m_.Wo.t());
  if (example_of_row) *example_of_row = longs(example, device);
  return at::nll_loss(at::log_softmax(logits, 1), longs(gold, device), {}, at::Reduction::None);
}

at::Tensor HandSeq2Seq::loss(std::span<const data::DigitPair* const> batch) const {
  return token_losses(batch, nullptr).sum();
}

at::Tensor HandSeq2Seq::example_losses(std::span<const data::DigitPair* const> batch) const {
  at::Tensor example;
  const at::Tensor terms = token_losses(batch, &example);
  return at::zeros({static_cast<int64_t>(batch.size())}, terms.options()).index_add(0, example, terms);
}

std::vector<std::vector<int64_t>> HandSeq2Seq::greedy(std::span<const data::DigitPair* const> batch) const {
  const Encoded e = encode(batch);
  const auto B = static_cast<int64_t>(batch.size());
  std::vector<int> budget;
  int steps = 0;
  for (size_t i : e.src.order) {
    budget.push_back(Seq2Seq::max_steps_for(batch[i]->source));
    steps = std::max(steps, budget.back());
  }
  std::vector<std::vector<int64_t>> sorted(batch.size());
  std::vector<char> done(batch.size(), 0);
  size_t finished = 0;
  at::Tensor h = e.start, c = at::zeros_like(h);
  at::Tensor y = at::full({B}, data::kDigitBos, at::TensorOptions().dtype(at::kLong).device(m_.E.device()));
  const at::Tensor HT = e.H.transpose(1, 2);
  for (int k = 0; k < steps && finished < batch.size(); ++k) {
    std::tie(h, c) = at::lstm_cell(at::embedding(m_.E, y), {h, c}, m_.dec.ih, m_.dec.hh, m_.dec.b, m_.dec.zero);
    at::Tensor context;  // [B, hidden]
    if (products_ == Products::kBmm) {
      const at::Tensor scores = h.unsqueeze(1).bmm(HT).masked_fill(e.pad, -kInf);
      context = at::softmax(scores, 2).bmm(e.H).squeeze(1);
    } else {
      const at::Tensor scores = (e.H * h.unsqueeze(1)).sum(2).masked_fill(e.pad.squeeze(1), -kInf);
      context = (e.H * at::softmax(scores, 1).unsqueeze(2)).sum(1);
    }
    const at::Tensor logits = at::addmm(m_.bo, at::tanh(at::addmm(m_.bc, at::cat({h, context}, 1), m_.Wc.t())), m_.Wo.t());
    y = logits.argmax(1);
    const at::Tensor host = y.cpu();  // the one sync per step
    const int64_t* p = host.data_ptr<int64_t>();
    for (size_t r = 0; r < batch.size(); ++r) {
      if (done[r]) continue;
      if (p[r] == data::kDigitEos) done[r] = 1;
      else sorted[r].push_back(p[r]);
      if (!done[r] && k + 1 >= budget[r]) done[r] = 1;
      finished += done[r];
    }
  }
  std::vector<std::vector<int64_t>> out(batch.size());
  for (size_t r = 0; r < batch.size(); ++r) out[e.src.order[r]] = std::move(sorted[r]);
  return out;
}

}  // namespace sheaf::models
