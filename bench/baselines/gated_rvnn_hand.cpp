#include "gated_rvnn_hand.h"

#include <ATen/ATen.h>

#include <common/linear_rows.h>

#include "tree_levels.h"

namespace sheaf::models {

at::Tensor HandGatedRvNN::root_logits(std::span<const data::Tree* const> trees) const {
  const int64_t h = m_.options().hidden;
  const c10::Device device = m_.E.device();
  auto upload = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const TreeLevels levels(trees);
  std::vector<at::Tensor> H{
      at::embedding(m_.E, upload(levels.leaf_words()), -1, false, m_.options().sparse_embedding_grad)};
  std::vector<std::vector<at::Tensor>> blocks{H[0].split_with_sizes(levels.blocks(0))};
  for (size_t k = 1; k < levels.size(); ++k) {
    const auto n = static_cast<int64_t>(levels.level(k).size());
    const at::Tensor x = TreeLevels::children_of(blocks, k).index_select(0, upload(levels.child_order(k))).view({n, 2 * h});
    const at::Tensor mask = at::gt(linear_rows(x, m_.A, m_.a), 0).to(x.scalar_type());  // [n, 1], no gradient
    const at::Tensor plain = at::tanh(linear_rows(x, m_.W1, m_.b1));
    const at::Tensor residual = at::relu(linear_rows(x, m_.W2, m_.b2)) * 0.5 + x.narrow(1, 0, h) * 0.5;
    H.push_back(mask * plain + (1 - mask) * residual);
    blocks.push_back(H.back().split_with_sizes(levels.blocks(k)));
  }
  return linear_rows(levels.roots(H), m_.V, m_.v);
}

at::Tensor HandGatedRvNN::loss(std::span<const data::Tree* const> trees) const {
  std::vector<int64_t> labels;
  for (const data::Tree* t : trees) labels.push_back(t->label.back());
  const at::Tensor logits = root_logits(trees);
  return at::nll_loss(at::log_softmax(logits, 1), at::tensor(labels, at::kLong).to(logits.device()), {},
                      at::Reduction::Sum);
}

}  // namespace sheaf::models
