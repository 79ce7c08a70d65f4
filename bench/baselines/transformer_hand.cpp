#include "transformer_hand.h"

#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace sheaf::models {

at::Tensor HandTransformer::logits(std::span<const data::Sentence* const> batch) const {
  const TransformerOptions& o = m_.options();
  const auto B = static_cast<int64_t>(batch.size());
  int64_t N = 0;
  for (const data::Sentence* s : batch) N = std::max(N, s->size());
  // Tokens in sentence order: their word, position and slot in the padded layout.
  std::vector<int64_t> words, positions, slots;
  std::vector<uint8_t> pad(static_cast<size_t>(B * N), 1);
  for (int64_t i = 0; i < B; ++i)
    for (int64_t t = 0; t < batch[static_cast<size_t>(i)]->size(); ++t) {
      words.push_back(batch[static_cast<size_t>(i)]->word[static_cast<size_t>(t)]);
      positions.push_back(t);
      slots.push_back(i * N + t);
      pad[static_cast<size_t>(i * N + t)] = 0;
    }
  const c10::Device device = m_.E.device();
  auto longs = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const at::Tensor slot = longs(slots);
  const at::Tensor X = at::embedding(m_.E, longs(words), -1, false, /*sparse=*/true) +
                       m_.P.index_select(0, longs(positions));  // [T, d]
  const int64_t d = o.d, H = o.heads, dk = d / H;
  const at::Tensor QKV = at::linear(X, at::cat({m_.Wq, m_.Wk, m_.Wv}), at::cat({m_.bq, m_.bk, m_.bv}));  // [T, 3d]
  const at::Tensor padded = at::zeros({B * N, 3 * d}, QKV.options())
                                .index_copy(0, slot, QKV)
                                .view({B, N, 3, H, dk})
                                .permute({2, 0, 3, 1, 4});  // [3, B, H, N, dk]
  const at::Tensor Q = padded[0].reshape({B * H, N, dk}), K = padded[1].reshape({B * H, N, dk}),
                   V = padded[2].reshape({B * H, N, dk});
  const at::Tensor key_pad = at::from_blob(pad.data(), {B, 1, 1, N}, at::kByte).to(device, at::kBool);
  const at::Tensor S = (Q.bmm(K.transpose(1, 2)) * (1.0 / std::sqrt(static_cast<double>(dk))))
                           .view({B, H, N, N})
                           .masked_fill(key_pad, -std::numeric_limits<float>::infinity());
  const at::Tensor Z = at::softmax(S, 3)
                           .view({B * H, N, N})
                           .bmm(V)
                           .view({B, H, N, dk})
                           .permute({0, 2, 1, 3})
                           .reshape({B * N, d})
                           .index_select(0, slot);  // [T, d]
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
