#include "transformer_hand.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/ops/attention_cpu.h>

namespace sheaf::models {

at::Tensor HandTransformer::attend(const at::Tensor& QKV, std::span<const data::Sentence* const> batch,
                                   std::span<const int64_t> group, std::span<const int64_t> first) const {
  const TransformerOptions& o = m_.options();
  const auto B = static_cast<int64_t>(group.size());
  int64_t N = 0;
  for (int64_t i : group) N = std::max(N, batch[static_cast<size_t>(i)]->size());
  // Each token's row in QKV and its slot in the padded layout.
  std::vector<int64_t> rows, slots;
  std::vector<uint8_t> pad(static_cast<size_t>(B * N), 1);
  for (int64_t j = 0; j < B; ++j) {
    const size_t i = static_cast<size_t>(group[static_cast<size_t>(j)]);
    for (int64_t t = 0; t < batch[i]->size(); ++t) {
      rows.push_back(first[i] + t);
      slots.push_back(j * N + t);
      pad[static_cast<size_t>(j * N + t)] = 0;
    }
  }
  const c10::Device device = QKV.device();
  auto longs = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const at::Tensor slot = longs(slots);
  const at::Tensor mine = group.size() == batch.size() ? QKV : QKV.index_select(0, longs(rows));
  const int64_t d = o.d, H = o.heads, dk = d / H;
  const at::Tensor padded = at::zeros({B * N, 3 * d}, QKV.options())
                                .index_copy(0, slot, mine)
                                .view({B, N, 3, H, dk})
                                .permute({2, 0, 3, 1, 4});  // [3, B, H, N, dk]
  const at::Tensor Q = padded[0].reshape({B * H, N, dk}), K = padded[1].reshape({B * H, N, dk}),
                   V = padded[2].reshape({B * H, N, dk});
  const at::Tensor key_pad = at::from_blob(pad.data(), {B, 1, 1, N}, at::kByte).to(device, at::kBool);
  const at::Tensor S = (Q.bmm(K.transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(dk))))
                           .view({B, H, N, N})
                           .masked_fill(key_pad, -std::numeric_limits<float>::infinity());
  return at::softmax(S, 3)
      .view({B * H, N, N})
      .bmm(V)
      .view({B, H, N, dk})
      .permute({0, 2, 1, 3})
      .reshape({B * N, d})
      .index_select(0, slot);  // [tokens of the group, d]
}

at::Tensor HandTransformer::logits(std::span<const data::Sentence* const> batch) const {
  const TransformerOptions& o = m_.options();
  const auto B = static_cast<int64_t>(batch.size());
  // Tokens in sentence order: their word and position; each sentence's first row.
  std::vector<int64_t> words, positions, first;
  for (const data::Sentence* s : batch) {
    first.push_back(static_cast<int64_t>(words.size()));
    for (int64_t t = 0; t < s->size(); ++t) {
      words.push_back(s->word[static_cast<size_t>(t)]);
      positions.push_back(t);
    }
  }
  const c10::Device device = m_.E.device();
  auto longs = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const at::Tensor X = at::embedding(m_.E, longs(words), -1, false, /*sparse=*/true) +
                       m_.P.index_select(0, longs(positions));  // [T, d]
  const int64_t d = o.d;
  const at::Tensor QKV = at::linear(X, at::cat({m_.Wq, m_.Wk, m_.Wv}), at::cat({m_.bq, m_.bk, m_.bv}));  // [T, 3d]
  if (sheaf_attention_) {
    if (!op::attention_cpu_takes(QKV, QKV, QKV))
      throw UserError("hand:sheaf-attention runs on the CPU in float32 only (Sheaf's CPU attention loop)");
    std::vector<int64_t> lengths;
    for (const data::Sentence* s : batch) lengths.push_back(s->size());
    const at::Tensor Z = op::attention_cpu(QKV.narrow(1, 0, d), QKV.narrow(1, d, d), QKV.narrow(1, 2 * d, d), lengths,
                                           lengths, o.heads, 0);
    return head(X, Z);
  }
  // Sentences by length, cut into buckets of nearly equal count (one: the batch as it is).
  std::vector<int64_t> order(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) order[static_cast<size_t>(i)] = i;
  const int64_t G = std::clamp<int64_t>(buckets_, 1, std::max<int64_t>(B, 1));
  if (G > 1)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return batch[static_cast<size_t>(a)]->size() < batch[static_cast<size_t>(b)]->size();
    });
  std::vector<at::Tensor> parts;
  std::vector<int64_t> back;  // token rows in the order of the parts
  for (int64_t b = 0; b < G; ++b) {
    const auto lo = static_cast<size_t>(B * b / G), hi = static_cast<size_t>(B * (b + 1) / G);
    const std::span<const int64_t> group(order.data() + lo, hi - lo);
    parts.push_back(attend(QKV, batch, group, first));
    for (int64_t i : group)
      for (int64_t t = 0; t < batch[static_cast<size_t>(i)]->size(); ++t) back.push_back(first[static_cast<size_t>(i)] + t);
  }
  at::Tensor Z = parts[0];
  if (G > 1) {
    std::vector<int64_t> to(back.size());  // token row -> its row among the parts
    for (size_t k = 0; k < back.size(); ++k) to[static_cast<size_t>(back[k])] = static_cast<int64_t>(k);
    Z = at::cat(parts).index_select(0, longs(to));
  }
  return head(X, Z);
}

at::Tensor HandTransformer::head(const at::Tensor& X, const at::Tensor& Z) const {
  const int64_t d = m_.options().d;
  const at::Tensor X1 = at::layer_norm(X + at::linear(Z, m_.Wo, m_.bo), {d}, m_.g1, m_.b1);
  const at::Tensor Y = at::layer_norm(X1 + at::linear(at::relu(at::linear(X1, m_.W1, m_.c1)), m_.W2, m_.c2), {d}, m_.g2, m_.b2);
  return at::linear(Y, m_.Wt, m_.bt);
}

at::Tensor HandTransformer::loss(std::span<const data::Sentence* const> batch) const {
  std::vector<int64_t> tags;
  for (const data::Sentence* s : batch) tags.insert(tags.end(), s->tag.begin(), s->tag.end());
  return at::nll_loss(at::log_softmax(logits(batch), 1), at::tensor(tags, at::kLong).to(m_.E.device()), {},
                      at::Reduction::Sum);
}

}  // namespace sheaf::models
