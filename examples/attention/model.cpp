#include "model.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <tuple>

#include <common/model_utils.h>
#include <common/parameter_file.h>

namespace sheaf::models {

namespace {

// The decoder reads the start token, then the target but its last token.
std::vector<int64_t> decoder_inputs(const std::vector<int64_t>& target) {
  std::vector<int64_t> in{data::kDigitBos};
  in.insert(in.end(), target.begin(), target.end() - 1);
  return in;
}

}  // namespace

Seq2Seq::Seq2Seq(const Seq2SeqOptions& o, uint64_t seed) : options_(o) {
  if (o.vocab <= data::kDigitEos || o.embed <= 0 || o.hidden <= 0 || o.hidden % 2 != 0)
    throw UserError("Seq2Seq: need vocab >= 12 (digits and the start and end tokens), embed > 0 and an even "
                    "hidden > 0 (the encoder has hidden / 2 per direction)");
  at::manual_seed(seed);
  E = uniform_param({o.vocab, o.embed}, 0.5);
  enc_f = lstm_weights(o.embed, o.hidden / 2);
  enc_b = lstm_weights(o.embed, o.hidden / 2);
  dec = lstm_weights(o.embed, o.hidden);
  Wc = uniform_param({o.hidden, 2 * o.hidden}, 1.0 / std::sqrt(2.0 * static_cast<double>(o.hidden)));
  bc = at::zeros({o.hidden}).requires_grad_();
  Wo = uniform_param({o.vocab, o.hidden}, 1.0 / std::sqrt(static_cast<double>(o.hidden)));
  bo = at::zeros({o.vocab}).requires_grad_();
}

std::vector<at::Tensor> Seq2Seq::parameters() const {
  return {E, enc_f.ih, enc_f.hh, enc_f.b, enc_b.ih, enc_b.hh, enc_b.b, dec.ih, dec.hh, dec.b, Wc, bc, Wo, bo};
}

void Seq2Seq::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &Wc, &bc, &Wo, &bo}) *p = p->detach().to(device).requires_grad_();
  for (LstmWeights* w : {&enc_f, &enc_b, &dec}) move_to(*w, device);
}

void Seq2Seq::save(const std::string& path) const { save_parameters(parameters(), path); }

void Seq2Seq::load(const std::string& path) { load_parameters(parameters(), path, "Seq2Seq"); }

// ---------------------------------------------------------------------------
// Sheaf: written for one example.

Seq2Seq::Encoded Seq2Seq::sheaf_encode(Graph& g, const std::vector<int64_t>& source) const {
  if (source.empty()) throw UserError("Seq2Seq: an empty source");
  if (options_.sequence_op) {
    const Expr X = g.lookup(E, source);  // [n, embed]
    const Expr F = sheaf_lstm_rows(enc_f, X, false), B = sheaf_lstm_rows(enc_b, X, true);
    return {dsl::concat({F, B}, 1), {bilstm_ends(F, B), {}}};
  }
  std::vector<Expr> xs;
  xs.reserve(source.size());
  for (int64_t id : source) xs.push_back(g.lookup(E, id));
  const std::vector<Expr> hf = sheaf_lstm(enc_f, xs, false), hb = sheaf_lstm(enc_b, xs, true);
  const Expr H = dsl::concat({dsl::stack(hf), dsl::stack(hb)});  // [n, hidden]
  return {H, {dsl::concat({hf.back(), hb.front()}), {}}};
}

Expr Seq2Seq::sheaf_logits(const Encoded& enc, const Expr& s) const {
  // Sources of different lengths n batch together: the scores are one element
  // per row of H, the softmax works across each example's, and the context
  // weighs H's rows (docs/ops.md, "Lengths").
  const Expr attention = dsl::softmax(dsl::matmul(enc.H, s));  // [n]
  const Expr context = dsl::matmul(attention, enc.H);          // [hidden]
  const Expr o = dsl::tanh(dsl::affine(Wc, dsl::concat({s, context}), bc));
  return dsl::affine(Wo, o, bo);
}

Expr Seq2Seq::sheaf_loss(Graph& g, const data::DigitPair& p) const {
  const Encoded enc = sheaf_encode(g, p.source);
  std::vector<Expr> losses;
  if (options_.sequence_op) {
    // Teacher forcing: the decoder's inputs are known, so the decoder is one
    // dsl::lstm and every step's attention one dsl::attention over H (scale
    // 1: this model's scores are plain dot products).
    const Expr S = dsl::lstm(g.lookup(E, decoder_inputs(p.target)), dec.ih, dec.hh, dec.b,
                             enc.start.h);                  // [T, hidden], from the encoder's state
    const Expr C = dsl::attention(S, enc.H, enc.H, 1, 1.0);  // [T, hidden]
    const Expr O = dsl::tanh(dsl::affine(Wc, dsl::concat({S, C}, 1), bc));
    return dsl::pick_neg_log_softmax(dsl::affine(Wo, O, bo), p.target);
  }
  LstmState state = enc.start;
  int64_t previous = data::kDigitBos;
  for (int64_t y : p.target) {
    state = sheaf_lstm_step(dec, g.lookup(E, previous), state);
    losses.push_back(dsl::pick_neg_log_softmax(sheaf_logits(enc, state.h), y));
    previous = y;
  }
  return dsl::sum(losses);
}

Task<std::vector<int64_t>> Seq2Seq::sheaf_greedy(Graph& g, const std::vector<int64_t>& source, int max_steps) const {
  const Encoded enc = sheaf_encode(g, source);
  LstmState state = enc.start;
  std::vector<int64_t> out;
  int64_t previous = data::kDigitBos;
  for (int k = 0; k < max_steps; ++k) {
    state = sheaf_lstm_step(dec, g.lookup(E, previous), state);
    previous = co_await fetch_argmax(sheaf_logits(enc, state.h));  // this example waits; the others go on
    if (previous == data::kDigitEos) break;
    out.push_back(previous);
  }
  co_return out;
}

Expr Seq2Seq::sheaf_batch_loss(Graph& g, std::span<const data::DigitPair* const> batch) const {
  return sum_over_examples(g, batch, [this](Graph& pg, const data::DigitPair& x) { return sheaf_loss(pg, x); });
}

std::vector<std::vector<int64_t>> Seq2Seq::sheaf_decode(Graph& g, std::span<const data::DigitPair* const> batch,
                                                        const Strategy* strategy) const {
  g.clear();
  std::vector<Task<std::vector<int64_t>>> tasks;
  tasks.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto scope = g.example(static_cast<int>(i));
    tasks.push_back(sheaf_greedy(g, batch[i]->source, max_steps_for(batch[i]->source)));
  }
  g.forward({}, {.strategy = strategy});
  std::vector<std::vector<int64_t>> out;
  out.reserve(tasks.size());
  for (auto& t : tasks) out.push_back(t.result());
  return out;
}

// ---------------------------------------------------------------------------
// Eager, one example.

at::Tensor Seq2Seq::per_example_loss(const data::DigitPair& p) const {
  const auto [H, start] = eager_bilstm(enc_f, enc_b, at::embedding(E, ids_tensor(p.source, E.device())));  // [n, hidden], [hidden]
  // Teacher forcing: the whole decoder recurrence in one at::lstm, then every
  // step's attention at once.
  const at::Tensor X = at::embedding(E, ids_tensor(decoder_inputs(p.target), E.device()));  // [T, embed]
  const at::Tensor h0 = start.view({1, 1, -1}), c0 = at::zeros_like(h0);
  const at::Tensor S = std::get<0>(at::lstm(X.unsqueeze(1), {h0, c0}, {dec.ih, dec.hh, dec.b, dec.zero},
                                            /*has_biases=*/true, /*num_layers=*/1, /*dropout=*/0.0,
                                            /*train=*/c10::GradMode::is_enabled(), /*bidirectional=*/false,
                                            /*batch_first=*/false))
                           .squeeze(1);                                 // [T, hidden]
  const at::Tensor A = at::softmax(S.mm(H.t()), 1);                    // [T, n]
  const at::Tensor O = at::tanh(at::addmm(bc, at::cat({S, A.mm(H)}, 1), Wc.t()));
  const at::Tensor logits = at::addmm(bo, O, Wo.t());                  // [T, vocab]
  return at::nll_loss(at::log_softmax(logits, 1), ids_tensor(p.target, E.device()), {}, at::Reduction::Sum);
}

std::vector<int64_t> Seq2Seq::per_example_greedy(const std::vector<int64_t>& source, int max_steps) const {
  const auto [H, start] = eager_bilstm(enc_f, enc_b, at::embedding(E, ids_tensor(source, E.device())));
  const at::Tensor HT = H.t();
  at::Tensor h = start.unsqueeze(0), c = at::zeros_like(h);
  std::vector<int64_t> out;
  int64_t previous = data::kDigitBos;
  for (int k = 0; k < max_steps; ++k) {
    std::tie(h, c) = at::lstm_cell(E[previous].unsqueeze(0), {h, c}, dec.ih, dec.hh, dec.b, dec.zero);
    const at::Tensor s = h.squeeze(0);
    const at::Tensor context = HT.mv(at::softmax(H.mv(s), 0));
    const at::Tensor logits = at::addmv(bo, Wo, at::tanh(at::addmv(bc, Wc, at::cat({s, context}))));
    previous = logits.argmax().item<int64_t>();
    if (previous == data::kDigitEos) break;
    out.push_back(previous);
  }
  return out;
}

}  // namespace sheaf::models
