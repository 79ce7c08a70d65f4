// Weight gradients of a layer used many times in one batch (every level of a
// tree, every step of a parse), deferred to ONE product: each use writes its
// input rows into X and, in its backward, its output gradient rows into G;
// this node, whose output (`token`) every use takes as an input, runs after
// all of their backwards and gives the weight G^T X and the bias sum(G). Per
// use, at::linear's backward would be a GEMM only that use's rows deep plus a
// full-size add into the weight's gradient.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace sheaf::models {

struct DeferredWeightGrads : torch::autograd::Function<DeferredWeightGrads> {
  // The token: a zero scalar. X [rows, in], G [rows, out], filled as the uses run.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& w, const at::Tensor& /*b*/,
                            const at::Tensor& X, const at::Tensor& G) {
    ctx->saved_data["X"] = X;
    ctx->saved_data["G"] = G;
    return at::zeros({}, w.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list) {
    const at::Tensor X = ctx->saved_data["X"].toTensor(), G = ctx->saved_data["G"].toTensor();
    return {at::mm(G.t(), X), G.sum(0), at::Tensor(), at::Tensor()};
  }
};

}  // namespace sheaf::models
