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
  TreeLevels::Blocks blocks = levels.no_blocks();
  levels.split(H[0], 0, blocks);
  for (size_t k = 1; k < levels.size(); ++k) {
    const auto n = static_cast<int64_t>(levels.level(k).size());
    const at::Tensor x = TreeLevels::children_of(blocks, k).index_select(0, upload(levels.child_order(k))).view({n, 2 * h});
    const at::Tensor gate = at::gt(linear_rows(x, m_.A, m_.a), 0);  // [n, 1], no gradient
    auto plain = [&](const at::Tensor& rows) { return at::tanh(linear_rows(rows, m_.W1, m_.b1)); };
    auto residual = [&](const at::Tensor& rows) {
      return at::relu(linear_rows(rows, m_.W2, m_.b2)) * 0.5 + rows.narrow(1, 0, h) * 0.5;
    };
    if (branches_ == Branches::kMask) {
      const at::Tensor mask = gate.to(x.scalar_type());
      H.push_back(mask * plain(x) + (1 - mask) * residual(x));
    } else {
      const at::Tensor taken = gate.view({n}).cpu();  // (a wait on a GPU)
      const at::Tensor first = at::nonzero(taken).view({-1}), second = at::nonzero(at::logical_not(taken)).view({-1});
      std::vector<at::Tensor> parts;
      if (first.numel() > 0) parts.push_back(plain(x.index_select(0, first.to(device))));
      if (second.numel() > 0) parts.push_back(residual(x.index_select(0, second.to(device))));
      // Row r of the level is row back[r] of [plain rows; residual rows].
      const at::Tensor order = at::cat({first, second});
      const at::Tensor back = at::empty_like(order).index_put_({order}, at::arange(n, order.options()));
      H.push_back(parts.size() == 1 ? parts[0] : at::cat(parts).index_select(0, back.to(device)));
    }
    levels.split(H.back(), k, blocks);
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
