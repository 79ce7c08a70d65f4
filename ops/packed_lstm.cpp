#include "packed_lstm.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <vector>

#include <sheaf/core/error.h>

#include "grad_wanted.h"
#include "lstm_cell.h"

namespace sheaf::op {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The steps in the order they run.
std::vector<int64_t> step_order(size_t steps, bool reverse) {
  std::vector<int64_t> ts(steps);
  for (size_t k = 0; k < steps; ++k) ts[k] = static_cast<int64_t>(reverse ? steps - 1 - k : k);
  return ts;
}

// Backward through time, step by step (latest first).
void backward_steps(const at::Tensor& A, const at::Tensor& C, const at::Tensor& dH, const at::Tensor& hh,
                    const std::vector<int64_t>& sizes, const std::vector<int64_t>& offset,
                    const std::vector<int64_t>& ts, at::Tensor& dA) {
  const int64_t h = hh.size(1);
  const at::Tensor Cprev = at::zeros_like(C);
  at::Tensor dh_carry, dc_carry;  // into the previous step's rows, from the step after it
  for (size_t k = ts.size(); k-- > 0;) {
    const auto t = static_cast<size_t>(ts[k]);
    const int64_t active = sizes[t], row = offset[t];
    const at::Tensor a = A.narrow(0, row, active), c = C.narrow(0, row, active);
    at::Tensor dh = dH.narrow(0, row, active).clone();
    at::Tensor dc_in = at::zeros({active, h}, A.options());
    if (dh_carry.defined()) {
      dh.narrow(0, 0, dh_carry.size(0)).add_(dh_carry);
      dc_in.narrow(0, 0, dc_carry.size(0)).copy_(dc_carry);
    }
    const at::Tensor i = a.narrow(1, 0, h), f = a.narrow(1, h, h), g = a.narrow(1, 2 * h, h), o = a.narrow(1, 3 * h, h);
    const at::Tensor tc = at::tanh(c);
    const at::Tensor dc = dc_in.addcmul_(dh * o, 1 - tc * tc);
    at::Tensor da = dA.narrow(0, row, active);
    const int64_t carried = k == 0 ? 0 : std::min(active, sizes[static_cast<size_t>(ts[k - 1])]);
    at::Tensor cprev = Cprev.narrow(0, row, active);
    if (carried > 0) cprev.narrow(0, 0, carried).copy_(C.narrow(0, offset[static_cast<size_t>(ts[k - 1])], carried));
    da.narrow(1, 0, h).copy_(dc * g * i * (1 - i));
    da.narrow(1, h, h).copy_(dc * cprev * f * (1 - f));
    da.narrow(1, 2 * h, h).copy_(dc * i * (1 - g * g));
    da.narrow(1, 3 * h, h).copy_(dh * tc * o * (1 - o));
    if (carried > 0) {
      dh_carry = at::mm(da.narrow(0, 0, carried), hh);
      dc_carry = (dc * f).narrow(0, 0, carried);
    } else {
      dh_carry = dc_carry = at::Tensor();
    }
  }
}

// The same with the cell's math as one loop a step (ops/lstm_cell.h): float
// tensors, contiguous, on the CPU. The carries into the previous step live in
// two pairs of buffers, one written while the other is read.
void fused_backward_steps(const at::Tensor& A, const at::Tensor& C, const at::Tensor& dH, const at::Tensor& hh,
                          const std::vector<int64_t>& sizes, const std::vector<int64_t>& offset,
                          const std::vector<int64_t>& ts, at::Tensor& dA) {
  const int64_t h = hh.size(1);
  const int64_t most = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  at::Tensor dh_next = at::empty({most, h}, A.options()), dh_prev = at::empty_like(dh_next);
  at::Tensor dc_next = at::empty_like(dh_next), dc_prev = at::empty_like(dh_next);
  const float *a = A.data_ptr<float>(), *c = C.data_ptr<float>(), *dh = dH.data_ptr<float>();
  float* da = dA.data_ptr<float>();
  int64_t continued = 0;  // rows of this step that the step run after it continued
  for (size_t k = ts.size(); k-- > 0;) {
    const auto t = static_cast<size_t>(ts[k]);
    const int64_t active = sizes[t], row = offset[t];
    const size_t before = k == 0 ? t : static_cast<size_t>(ts[k - 1]);
    const int64_t carried = k == 0 ? 0 : std::min(active, sizes[before]);
    lstm_cell::backward(a + row * 4 * h, c + row * h, c + offset[before] * h, dh + row * h,
                        dh_next.data_ptr<float>(), dc_next.data_ptr<float>(), da + row * 4 * h,
                        dc_prev.data_ptr<float>(), active, carried, continued, h);
    if (carried > 0) {
      at::Tensor into = dh_prev.narrow(0, 0, carried);
      at::mm_out(into, dA.narrow(0, row, carried), hh);
    }
    std::swap(dh_next, dh_prev);
    std::swap(dc_next, dc_prev);
    continued = carried;
  }
}

struct PackedLstm : torch::autograd::Function<PackedLstm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& ih, const at::Tensor& hh,
                            const at::Tensor& b, const at::Tensor& h0, std::vector<int64_t> sizes, bool reverse,
                            bool fused, bool grad) {
    const int64_t h = hh.size(1);
    std::vector<int64_t> offset(sizes.size());
    for (size_t t = 1; t < sizes.size(); ++t) offset[t] = offset[t - 1] + sizes[t - 1];
    at::Tensor A = at::addmm(b, x, ih.t());  // pre-activations, then activations [i, f, g, o]
    // Hprev: each row's previous hidden state, for W_hh's gradient (none wanted: not kept).
    at::Tensor C = at::empty({x.size(0), h}, x.options()), H = at::empty_like(C);
    const at::Tensor Hprev = grad ? at::zeros_like(C) : at::Tensor();
    int64_t prev = -1;
    for (int64_t t : step_order(sizes.size(), reverse)) {
      const auto tt = static_cast<size_t>(t);
      const int64_t active = sizes[tt], row = offset[tt];
      at::Tensor a = A.narrow(0, row, active), c = C.narrow(0, row, active);
      const int64_t carried = prev < 0 ? 0 : std::min(active, sizes[static_cast<size_t>(prev)]);
      const int64_t prev_row = prev < 0 ? 0 : offset[static_cast<size_t>(prev)];
      if (prev < 0 && h0.numel() > 0) {  // the first step: every sequence starts here, from h0
        if (grad) Hprev.narrow(0, row, active).copy_(h0);
        a.addmm_(h0, hh.t());
      }
      if (carried > 0) {
        const at::Tensor hp = H.narrow(0, prev_row, carried);
        if (grad) Hprev.narrow(0, row, carried).copy_(hp);
        a.narrow(0, 0, carried).addmm_(hp, hh.t());
      }
      if (fused) {
        lstm_cell::forward(A.data_ptr<float>() + row * 4 * h, C.data_ptr<float>() + row * h,
                           H.data_ptr<float>() + row * h, C.data_ptr<float>() + prev_row * h, active, carried, h);
      } else {
        a.narrow(1, 0, 2 * h).sigmoid_();
        a.narrow(1, 2 * h, h).tanh_();
        a.narrow(1, 3 * h, h).sigmoid_();
        at::mul_out(c, a.narrow(1, 0, h), a.narrow(1, 2 * h, h));
        if (carried > 0)
          c.narrow(0, 0, carried).addcmul_(a.narrow(0, 0, carried).narrow(1, h, h), C.narrow(0, prev_row, carried));
        at::Tensor out = H.narrow(0, row, active);
        at::mul_out(out, a.narrow(1, 3 * h, h), at::tanh(c));
      }
      prev = t;
    }
    if (!grad) return H;
    ctx->save_for_backward({x, ih, hh, A, C, Hprev});
    ctx->saved_data["sizes"] = std::move(sizes);
    ctx->saved_data["offset"] = std::move(offset);
    ctx->saved_data["reverse"] = reverse;
    ctx->saved_data["h0"] = h0.numel() > 0;
    ctx->saved_data["fused"] = fused;
    return H;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &ih = saved[1], &hh = saved[2], &A = saved[3], &C = saved[4], &Hprev = saved[5];
    const std::vector<int64_t> sizes = ctx->saved_data["sizes"].toIntVector();
    const std::vector<int64_t> offset = ctx->saved_data["offset"].toIntVector();
    const std::vector<int64_t> ts = step_order(sizes.size(), ctx->saved_data["reverse"].toBool());
    const at::Tensor dH = grads[0].contiguous();
    at::Tensor dA = at::empty_like(A);
    if (ctx->saved_data["fused"].toBool())
      fused_backward_steps(A, C, dH, hh, sizes, offset, ts, dA);
    else
      backward_steps(A, C, dH, hh, sizes, offset, ts, dA);
    // h0 fed step 0's rows (the first step run: forward only) through W_hh.
    const at::Tensor dh0 =
        ctx->saved_data["h0"].toBool() ? at::mm(dA.narrow(0, 0, sizes.empty() ? 0 : sizes[0]), hh) : at::Tensor();
    return {at::mm(dA, ih), at::mm(dA.t(), x), at::mm(dA.t(), Hprev), dA.sum(0), dh0, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor packed_lstm(const at::Tensor& x, const at::Tensor& ih, const at::Tensor& hh, const at::Tensor& b,
                       std::span<const int64_t> sizes, bool reverse, const at::Tensor& h0, LstmCell cell) {
  SHEAF_ASSERT(!h0.defined() || (!reverse && !sizes.empty() && h0.dim() == 2 && h0.size(0) == sizes[0]),
               "packed_lstm: h0 needs one row a sequence and runs forward only");
  // No h0: 0 elements (a custom function's tensor inputs must be defined).
  const at::Tensor start = h0.defined() ? h0 : at::empty({0}, x.options());
  const bool fused = cell == LstmCell::kFused && x.is_cpu() && x.scalar_type() == at::kFloat &&
                     ih.scalar_type() == at::kFloat && hh.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat;
  // Whether autograd will make a node (Function::apply's own test over the
  // tensor arguments): without one, the forward keeps nothing for a backward.
  const bool grad = grad_wanted(x, ih, hh, b, start);
  return PackedLstm::apply(x, ih, hh, b, start, std::vector<int64_t>(sizes.begin(), sizes.end()), reverse, fused,
                           grad);
}

}  // namespace sheaf::op
