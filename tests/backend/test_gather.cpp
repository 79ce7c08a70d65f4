// The gather node on its own: several partial reads of one tensor as one
// autograd node. Its values and its gradient must equal those of plain
// narrow/index_select reads.
#include <sheaf/backend/gather.h>

#include "../support.h"

using namespace sheaf;

TEST_CASE("gather_rows: values and gradient equal separate narrow / index_select reads", "[backend][gather]") {
  at::manual_seed(3);
  const at::Tensor src0 = at::randn({7, 3, 2});
  const at::Tensor idx = at::tensor(std::vector<int64_t>{6, 0, 6, 2}, at::kLong);  // repeats accumulate
  const std::vector<RowRead> reads{{1, 3, {}}, {0, 4, idx}, {5, 2, {}}};
  std::vector<at::Tensor> weights;
  for (const RowRead& r : reads) weights.push_back(at::randn({r.len, 3, 2}));

  at::Tensor a = src0.clone().requires_grad_();
  std::vector<at::Tensor> outs = gather_rows(a, reads);
  REQUIRE(outs.size() == reads.size());
  at::Tensor loss_a = at::zeros({});
  for (size_t k = 0; k < outs.size(); ++k) loss_a = loss_a + (outs[k] * weights[k]).sum();
  loss_a.backward();

  at::Tensor b = src0.clone().requires_grad_();
  at::Tensor loss_b = at::zeros({});
  for (size_t k = 0; k < reads.size(); ++k) {
    const RowRead& r = reads[k];
    const at::Tensor ref = r.index.defined() ? b.index_select(0, r.index) : b.narrow(0, r.start, r.len);
    CHECK(at::equal(outs[k].detach(), ref.detach()));
    loss_b = loss_b + (ref * weights[k]).sum();
  }
  loss_b.backward();
  CHECK(at::allclose(a.grad(), b.grad(), 1e-6, 1e-6));
}

TEST_CASE("gather_rows: a read whose gradient is not needed contributes nothing", "[backend][gather]") {
  const at::Tensor src = at::randn({5, 2}).requires_grad_();
  std::vector<at::Tensor> outs = gather_rows(src, std::vector<RowRead>{{0, 2, {}}, {3, 2, {}}});
  outs[1].sum().backward();  // only the second read is used
  CHECK(at::equal(src.grad().narrow(0, 0, 3), at::zeros({3, 2})));
  CHECK(at::equal(src.grad().narrow(0, 3, 2), at::ones({2, 2})));
}

TEST_CASE("gather_rows without autograd: plain views and index_selects", "[backend][gather]") {
  const at::Tensor src = at::arange(10, at::kFloat).view({5, 2});
  std::vector<at::Tensor> outs =
      gather_rows(src, std::vector<RowRead>{{1, 2, {}}, {0, 2, at::tensor(std::vector<int64_t>{4, 0}, at::kLong)}});
  CHECK(outs[0].data_ptr() == src[1].data_ptr());  // a view, no copy
  CHECK(at::equal(outs[1], at::stack({src[4], src[0]})));
}
