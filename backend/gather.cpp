#include "gather.h"

#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sheaf/ops/grad_wanted.h>

namespace sheaf {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GatherRows : torch::autograd::Function<GatherRows> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& src, std::span<const RowRead> reads) {
    std::vector<int64_t> starts, lens;
    c10::List<at::Tensor> indices;
    variable_list out;
    out.reserve(reads.size());
    for (const RowRead& r : reads) {
      lens.push_back(r.len);
      if (r.index.defined()) {
        starts.push_back(-1 - static_cast<int64_t>(indices.size()));
        indices.push_back(r.index);
        out.push_back(src.index_select(0, r.index));
      } else {
        starts.push_back(r.start);
        out.push_back(src.narrow(0, r.start, r.len).clone());  // an output must not be a view of the input
      }
    }
    ctx->saved_data["starts"] = std::move(starts);
    ctx->saved_data["lens"] = std::move(lens);
    ctx->saved_data["indices"] = std::move(indices);
    ctx->saved_data["sizes"] = src.sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto starts = ctx->saved_data["starts"].toIntVector();
    const auto lens = ctx->saved_data["lens"].toIntVector();
    const auto indices = ctx->saved_data["indices"].toTensorList();
    at::Tensor grad;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!grads[k].defined()) continue;
      if (!grad.defined()) grad = at::zeros(ctx->saved_data["sizes"].toIntVector(), grads[k].options());
      if (starts[k] < 0)
        grad.index_add_(0, indices.get(static_cast<size_t>(-1 - starts[k])), grads[k]);
      else
        grad.narrow(0, starts[k], lens[k]).add_(grads[k]);
    }
    return {grad, at::Tensor()};  // nothing for the (non-tensor) reads argument
  }
};

}  // namespace

std::vector<at::Tensor> gather_rows(const at::Tensor& src, std::span<const RowRead> reads) {
  if (grad_wanted(src)) return GatherRows::apply(src, reads);
  // No gradient to accumulate (inference, constants): plain views and index_selects.
  std::vector<at::Tensor> out;
  out.reserve(reads.size());
  for (const RowRead& r : reads)
    out.push_back(r.index.defined() ? src.index_select(0, r.index) : src.narrow(0, r.start, r.len));
  return out;
}

}  // namespace sheaf
