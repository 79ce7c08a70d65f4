#include "model.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include <common/model_utils.h>
#include <common/parameter_file.h>

namespace sheaf::models {

Tagger::Tagger(const TaggerOptions& o, uint64_t seed)
    : mlp_("tagger_mlp",
           [this](Expr hf, Expr hb) { return dsl::affine(M2, dsl::tanh(dsl::affine(M1, dsl::concat({hf, hb}), m1)), m2); }),
      options_(o) {
  if (o.words <= 0 || o.tags <= 0 || o.embed <= 0 || o.hidden <= 0 || o.mlp <= 0)
    throw UserError("Tagger: vocabulary and layer sizes must be positive");
  if (o.use_chars && (o.chars <= 0 || o.char_embed <= 0 || o.embed % 2 != 0))
    throw UserError("Tagger: the char tagger needs chars > 0, char_embed > 0 and an even embed (its char BiLSTM "
                    "gives embed / 2 per direction)");
  at::manual_seed(seed);
  E = uniform_param({o.words, o.embed}, 0.1);
  fwd = lstm_weights(o.embed, o.hidden);
  bwd = lstm_weights(o.embed, o.hidden);
  M1 = uniform_param({o.mlp, 2 * o.hidden}, 1.0 / std::sqrt(2.0 * static_cast<double>(o.hidden)));
  m1 = at::zeros({o.mlp}).requires_grad_();
  M2 = uniform_param({o.tags, o.mlp}, 1.0 / std::sqrt(static_cast<double>(o.mlp)));
  m2 = at::zeros({o.tags}).requires_grad_();
  if (o.use_chars) {
    C = uniform_param({o.chars, o.char_embed}, 0.1);
    char_fwd = lstm_weights(o.char_embed, o.embed / 2);
    char_bwd = lstm_weights(o.char_embed, o.embed / 2);
  }
}

std::vector<at::Tensor> Tagger::parameters() const {
  std::vector<at::Tensor> ps{E, fwd.ih, fwd.hh, fwd.b, bwd.ih, bwd.hh, bwd.b, M1, m1, M2, m2};
  if (options_.use_chars)
    for (const at::Tensor& p : {C, char_fwd.ih, char_fwd.hh, char_fwd.b, char_bwd.ih, char_bwd.hh, char_bwd.b})
      ps.push_back(p);
  return ps;
}

void Tagger::to(const c10::Device& device) {
  for (at::Tensor* p : {&E, &M1, &m1, &M2, &m2}) *p = p->detach().to(device).requires_grad_();
  move_to(fwd, device);
  move_to(bwd, device);
  if (options_.use_chars) {
    C = C.detach().to(device).requires_grad_();
    move_to(char_fwd, device);
    move_to(char_bwd, device);
  }
}

void Tagger::save(const std::string& path) const { save_parameters(parameters(), path); }

void Tagger::load(const std::string& path) { load_parameters(parameters(), path, "Tagger"); }

namespace {
// A hash each of the words, characters and tags in id order (FNV-1a, a 0 byte
// after each name): saved after the parameters.
at::Tensor vocab_key(const data::TaggingVocab& v) {
  auto hash = [](const data::Index& index) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < index.size(); ++i) {
      for (const char ch : index.name(static_cast<int64_t>(i))) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
      h *= 1099511628211ull;
    }
    return static_cast<int64_t>(h);
  };
  return at::tensor(std::vector<int64_t>{hash(v.words), hash(v.chars), hash(v.tags)}, at::kLong);
}
}  // namespace

void Tagger::save(const std::string& path, const data::TaggingVocab& vocab) const {
  std::vector<at::Tensor> all = parameters();
  all.push_back(vocab_key(vocab));
  save_parameters(all, path);
}

void Tagger::load(const std::string& path, const data::TaggingVocab& vocab) {
  const std::vector<at::Tensor> saved = read_parameters(path, "Tagger");
  std::vector<at::Tensor> all = parameters();
  if (saved.size() == all.size())
    throw UserError("Tagger::load: '" + path + "' holds the parameters without the key of their vocabulary " +
                    "(saved by Tagger::save(path), or by a tagger before the key): nothing says its ids fit " +
                    "this vocabulary; train and save it again");
  const at::Tensor key = at::zeros({3}, at::kLong);
  all.push_back(key);
  copy_parameters(saved, all, path, "Tagger");
  if (!at::equal(key, vocab_key(vocab)))
    throw UserError("Tagger::load: '" + path + "' was trained with another vocabulary: word and tag ids follow " +
                    "their first appearance in the training file, so load it with the one (and the --format and " +
                    "columns) that saved it");
}

// ---------------------------------------------------------------------------
// Sheaf: written for one sentence.

Expr Tagger::sheaf_word(Graph& g, const data::Sentence& s, size_t t) const {
  if (!options_.use_chars || !s.rare[t]) return g.lookup(E, s.word[t], options_.sparse_embedding_grad);
  if (options_.sequence_op) {  // the spelling's rows: the forward LSTM's last row, the backward one's first
    const Expr chars = g.lookup(C, s.chars[t]);
    return bilstm_ends(sheaf_lstm_rows(char_fwd, chars, false), sheaf_lstm_rows(char_bwd, chars, true));
  }
  std::vector<Expr> chars;
  for (int64_t c : s.chars[t]) chars.push_back(g.lookup(C, c));
  const std::vector<Expr> f = sheaf_lstm(char_fwd, chars, false), b = sheaf_lstm(char_bwd, chars, true);
  return dsl::concat({f.back(), b.front()});
}

std::vector<Expr> Tagger::sheaf_logits(Graph& g, const data::Sentence& s) const {
  std::vector<Expr> xs;
  if (options_.sequence_op) {
    // The sentence as a matrix, one row a token: every op below works row by
    // row, so sentences of all lengths share each launch (docs/ops.md, "Lengths").
    Expr X;
    if (options_.use_chars) {
      for (size_t t = 0; t < s.word.size(); ++t) xs.push_back(sheaf_word(g, s, t));
      X = dsl::stack(xs);
    } else {
      X = g.lookup(E, s.word, options_.sparse_embedding_grad);
    }
    const Expr H = dsl::concat({sheaf_lstm_rows(fwd, X, false), sheaf_lstm_rows(bwd, X, true)}, 1);
    return {dsl::affine(M2, dsl::tanh(dsl::affine(M1, H, m1)), m2)};  // [L, tags]
  }
  for (size_t t = 0; t < s.word.size(); ++t) xs.push_back(sheaf_word(g, s, t));
  const std::vector<Expr> hf = sheaf_lstm(fwd, xs, false), hb = sheaf_lstm(bwd, xs, true);
  std::vector<Expr> logits;
  for (size_t t = 0; t < xs.size(); ++t) logits.push_back(mlp_(hf[t], hb[t]));
  return logits;
}

Expr Tagger::sheaf_loss(Graph& g, const data::Sentence& s) const {
  const std::vector<Expr> logits = sheaf_logits(g, s);
  if (options_.sequence_op) return dsl::pick_neg_log_softmax(logits[0], s.tag);  // summed over the rows
  std::vector<Expr> losses;
  for (size_t t = 0; t < logits.size(); ++t) losses.push_back(dsl::pick_neg_log_softmax(logits[t], s.tag[t]));
  return dsl::sum(losses);
}

Expr Tagger::sheaf_batch_loss(Graph& g, std::span<const data::Sentence* const> batch) const {
  return sum_over_examples(g, batch, [this](Graph& pg, const data::Sentence& x) { return sheaf_loss(pg, x); });
}

std::vector<Expr> Tagger::sheaf_batch_logits(Graph& g, std::span<const data::Sentence* const> batch) const {
  std::vector<Expr> out;
  for (size_t i = 0; i < batch.size(); ++i) {
    auto scope = g.example(static_cast<int64_t>(i));
    for (const Expr& e : sheaf_logits(g, *batch[i])) out.push_back(e);
  }
  return out;
}

at::Tensor Tagger::logit_rows(std::span<const Expr> logits) {
  std::vector<at::Tensor> rows;
  for (const Expr& e : logits) {
    const at::Tensor& v = e.value();
    rows.push_back(v.reshape({-1, v.size(-1)}));  // a token's [tags], or a sentence's [L, tags]
  }
  return at::cat(rows);
}

std::vector<std::vector<int64_t>> Tagger::predict(Graph& g, std::span<const data::Sentence* const> batch,
                                                  const Strategy* strategy) const {
  g.clear();
  const std::vector<Expr> logits = sheaf_batch_logits(g, batch);
  g.forward(logits, {.strategy = strategy});
  const at::Tensor predicted = logit_rows(logits).argmax(1).cpu();
  const int64_t* p = predicted.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (const data::Sentence* s : batch) {
    out.emplace_back(p, p + s->size());
    p += s->size();
  }
  return out;
}

// ---------------------------------------------------------------------------
// Eager, one sentence.

at::Tensor Tagger::per_example_inputs(const data::Sentence& s) const {
  const at::Tensor emb = at::embedding(E, ids_tensor(s.word, E.device()), -1, false, options_.sparse_embedding_grad);
  if (!options_.use_chars) return emb;
  if (std::none_of(s.rare.begin(), s.rare.end(), [](auto r) { return static_cast<bool>(r); })) return emb;
  std::vector<at::Tensor> rows = emb.unbind(0);  // (one backward node, not one per row)
  for (size_t t = 0; t < s.word.size(); ++t) {
    if (!s.rare[t]) continue;
    const at::Tensor chars = at::embedding(C, ids_tensor(s.chars[t], C.device()));
    rows[t] = eager_bilstm(char_fwd, char_bwd, chars).second;
  }
  return at::stack(rows);
}

at::Tensor Tagger::per_example_logits(const data::Sentence& s) const {
  const at::Tensor h = eager_bilstm(fwd, bwd, per_example_inputs(s)).first;
  return at::addmm(m2, at::tanh(at::addmm(m1, h, M1.t())), M2.t());
}

at::Tensor Tagger::per_example_loss(const data::Sentence& s) const {
  return at::nll_loss(at::log_softmax(per_example_logits(s), 1), ids_tensor(s.tag, E.device()), {}, at::Reduction::Sum);
}

}  // namespace sheaf::models
