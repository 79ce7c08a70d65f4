#include "segments.h"

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/scatter_reduce.h>
#include <ATen/ops/segment_reduce.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd_node.h"
#include "cpu_float.h"
#include "grad_wanted.h"
#include "matvec.h"
#include "output_pool.h"

namespace sheaf {

std::vector<int64_t> segment_offsets(std::span<const int64_t> counts) {
  std::vector<int64_t> off(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) off[i + 1] = off[i] + counts[i];
  return off;
}

int64_t segment_grain(int64_t rows, int64_t segments, int64_t width) {
  const int64_t per = std::max<int64_t>(1, rows * width / std::max<int64_t>(1, segments));
  return std::max<int64_t>(1, 16384 / per);
}

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// ---- softmax across each segment

void softmax_forward(const float* x, float* y, const int64_t* off, int64_t s0, int64_t s1, bool log) {
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t b = off[s], e = off[s + 1];
    if (b == e) continue;
    float m = x[b];
    for (int64_t r = b + 1; r < e; ++r) m = std::max(m, x[r]);
    float sum = 0;
    for (int64_t r = b; r < e; ++r) sum += std::exp(x[r] - m);
    if (log) {
      const float lse = m + std::log(sum);
      for (int64_t r = b; r < e; ++r) y[r] = x[r] - lse;
    } else {
      const float inv = 1.0f / sum;
      for (int64_t r = b; r < e; ++r) y[r] = std::exp(x[r] - m) * inv;
    }
  }
}

// softmax: dx = y (g - sum g y); log-softmax: dx = g - exp(y) sum g.
void softmax_backward(const float* y, const float* g, float* dx, const int64_t* off, int64_t s0, int64_t s1, bool log) {
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t b = off[s], e = off[s + 1];
    float dot = 0;
    for (int64_t r = b; r < e; ++r) dot += log ? g[r] : g[r] * y[r];
    for (int64_t r = b; r < e; ++r) dx[r] = log ? g[r] - std::exp(y[r]) * dot : y[r] * (g[r] - dot);
  }
}

struct SegmentSoftmaxNode : torch::autograd::Node {
  at::Tensor y;  // the result, detached (saving it as an output needs the node's own pointer)
  std::vector<int64_t> off;
  bool log = false;
  std::string name() const override { return log ? "sheaf::SegmentLogSoftmaxBackward" : "sheaf::SegmentSoftmaxBackward"; }
  void release_variables() override { y.reset(); }
  variable_list apply(variable_list&& grads) override {
    variable_list out(1);
    if (!grads[0].defined()) return out;
    RECORD_FUNCTION("sheaf::segment_softmax_backward", std::vector<c10::IValue>());
    const at::Tensor& yv = y;
    const at::Tensor g = grads[0].contiguous();
    at::Tensor dx = at::empty_like(yv);
    const auto n = static_cast<int64_t>(off.size()) - 1;
    at::parallel_for(0, n, segment_grain(yv.size(0), n, 1), [&](int64_t s0, int64_t s1) {
      softmax_backward(yv.data_ptr<float>(), g.data_ptr<float>(), dx.data_ptr<float>(), off.data(), s0, s1, log);
    });
    out[0] = dx;
    detail::once_differentiable(*this, grads, out, "sheaf::SegmentSoftmaxBackward");
    return out;
  }
};

}  // namespace

at::Tensor segment_extreme(const at::Tensor& x, const at::Tensor& ids, int64_t n, bool max) {
  const at::Tensor v = x.detach();
  if (v.is_cpu()) return at::segment_reduce(v, max ? "max" : "min", at::bincount(ids, {}, n));
  // Elsewhere a scatter from an identity (+-inf; an empty segment keeps it):
  // on CUDA bincount reads the GPU back (its min and max) and segment_reduce
  // does (its length checks), four waits for the whole queue in every softmax
  // over values of different lengths. (Not on the CPU: LibTorch 1.13 calls
  // scatter_reduce beta and says so on stderr.)
  std::vector<int64_t> rows(static_cast<size_t>(v.dim()), 1);
  rows[0] = v.size(0);
  std::vector<int64_t> sizes = v.sizes().vec();
  sizes[0] = n;
  const double identity = max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  return at::full(sizes, identity, v.options())
      .scatter_reduce_(0, ids.view(rows).expand_as(v), v, max ? "amax" : "amin", /*include_self=*/true);
}

at::Tensor segment_softmax(const at::Tensor& x, std::span<const int64_t> counts, const at::Tensor& ids, bool log) {
  const auto n = static_cast<int64_t>(counts.size());
  if (!cpu_float(x)) {
    // The shift keeps exp() in range and cancels out: no gradient through it.
    const at::Tensor shift = segment_extreme(x, ids, n, /*max=*/true);
    const at::Tensor z = x - shift.index_select(0, ids);
    const at::Tensor e = z.exp();
    const at::Tensor sums = at::index_add(at::zeros({n}, x.options()), 0, ids, e);
    return log ? z - sums.log().index_select(0, ids) : e / sums.index_select(0, ids);
  }
  RECORD_FUNCTION("sheaf::segment_softmax", std::vector<c10::IValue>());
  const at::Tensor xv = x.contiguous();
  std::vector<int64_t> off = segment_offsets(counts);
  at::Tensor y = at::empty_like(xv);
  at::parallel_for(0, n, segment_grain(xv.size(0), n, 1), [&](int64_t s0, int64_t s1) {
    softmax_forward(xv.data_ptr<float>(), y.data_ptr<float>(), off.data(), s0, s1, log);
  });
  if (!grad_wanted(x)) return y;
  auto node = detail::make_node<SegmentSoftmaxNode>();
  node->off = std::move(off);
  node->log = log;
  node->set_next_edges({torch::autograd::impl::gradient_edge(xv)});
  node->y = y.detach();
  torch::autograd::set_history(y, node);
  return y;
}

at::Tensor segment_weighted_sum(const at::Tensor& w, const at::Tensor& B, std::span<const int64_t> counts,
                                const at::Tensor& ids) {
  const auto n = static_cast<int64_t>(counts.size());
  if (!cpu_float(w) || !cpu_float(B))
    return at::index_add(at::zeros({n, B.size(1)}, B.options()), 0, ids, w.unsqueeze(1) * B);
  return weighted_row_sums(RowOperand{w}, RowOperand{B}, counts);
}

}  // namespace sheaf
