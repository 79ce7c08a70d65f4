// Scaled dot-product attention of one example's queries over its keys and
// values, with `heads` heads (the Transformer's; Vaswani et al. 2017):
//
//   Q [Lq, d], K [Lk, d], V [Lk, dv] -> [Lq, dv]; per head h (d / heads
//   columns of Q and K, dv / heads of V): softmax(Q_h K_h^T / sqrt(d / heads)) V_h
//
// Why one op: written as matmul / softmax / matmul, each [L, L] product runs
// once per distinct sentence length (its rows are not independent). Here
// self-attention (Lq = Lk) over sentences of different lengths is ONE packed
// batch (OpTraits::per_value): the rows of every example's Q, K and V end to
// end, with segment counts; run() pads them to the longest in the batch,
// masks the padded keys, runs the heads as two batched GEMMs and keeps the
// real rows: exact (padded queries are dropped, padded keys get weight 0).
#pragma once

#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common.h"

namespace sheaf::op {

// attrs: heads.
struct Attention {
  static constexpr std::string_view name = "attention";
  static constexpr OpTraits traits{.arity = 3, .rowwise = true, .per_value = true};
  static Shape infer(const InferCtx& c) {
    const Shape &q = c.shape(0), &k = c.shape(1), &v = c.shape(2);
    const int64_t heads = c.attr(0);
    if (q.rank() != 2 || k.rank() != 2 || v.rank() != 2)
      c.fail("needs matrices (queries, keys, values: one row each), got ", q.str(), ", ", k.str(), " and ", v.str());
    if (k[1] != q[1]) c.fail("queries ", q.str(), " and keys ", k.str(), " need the same width");
    if (v[0] != k[0]) c.fail("keys ", k.str(), " and values ", v.str(), " need the same number of rows");
    if (heads < 1 || q[1] % heads != 0 || v[1] % heads != 0)
      c.fail(heads, " heads must divide the query width ", q[1], " and the value width ", v[1]);
    return Shape{q[0], v[1]};
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t heads = c.attr(0);
    const auto counts = c.segment_counts();
    if (counts.empty()) {  // values of one shape: [n, L, d]
      const at::Tensor q = c.batched(0), k = c.batched(1), v = c.batched(2);
      return attend(q, k, v, heads, {});
    }
    // Packed rows: pad each value's rows to the longest, through one index
    // (padding reads an appended zero row), and keep the real rows after.
    const auto n = static_cast<int64_t>(counts.size());
    const int64_t longest = *std::max_element(counts.begin(), counts.end());
    const int64_t rows = c.in(0).size(0);
    std::vector<int64_t> pad, keep;
    pad.reserve(static_cast<size_t>(n * longest));
    int64_t row = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t len = counts[static_cast<size_t>(s)];
      for (int64_t j = 0; j < longest; ++j) {
        pad.push_back(j < len ? row + j : rows);
        if (j < len) keep.push_back(s * longest + j);
      }
      row += len;
    }
    const auto device = c.in(0).device();
    const at::Tensor pad_ids = at::tensor(pad, at::kLong).to(device), keep_ids = at::tensor(keep, at::kLong).to(device);
    const at::Tensor mask = pad_ids.eq(rows).view({n, 1, 1, longest});  // padded keys: the zero row
    auto padded = [&](const at::Tensor& x) {
      const at::Tensor zero = at::zeros({1, x.size(1)}, x.options());
      return at::cat({x, zero}).index_select(0, pad_ids).view({n, longest, x.size(1)});
    };
    const at::Tensor out = attend(padded(c.in(0)), padded(c.in(1)), padded(c.in(2)), heads, mask);
    return out.reshape({n * longest, -1}).index_select(0, keep_ids);
  }

 private:
  // q [n, Lq, d], k [n, Lk, d], v [n, Lk, dv] -> [n, Lq, dv]; mask [n, 1, 1, Lk]
  // (true: a padded key) or undefined.
  static at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads,
                           const at::Tensor& mask) {
    const int64_t n = q.size(0), lq = q.size(1), lk = k.size(1), dk = q.size(2) / heads, dv = v.size(2) / heads;
    auto split = [&](const at::Tensor& x, int64_t len, int64_t width) {  // [n, len, heads * w] -> [n * heads, len, w]
      return x.reshape({n, len, heads, width}).transpose(1, 2).reshape({n * heads, len, width});
    };
    at::Tensor scores = at::bmm(split(q, lq, dk), split(k, lk, dk).transpose(1, 2)) * (1.0 / std::sqrt(double(dk)));
    if (mask.defined()) scores = scores.view({n, heads, lq, lk}).masked_fill(mask, -INFINITY).view({n * heads, lq, lk});
    const at::Tensor out = at::bmm(at::softmax(scores, -1), split(v, lk, dv));  // [n * heads, Lq, dv]
    return out.view({n, heads, lq, dv}).transpose(1, 2).reshape({n, lq, heads * dv});
  }
};

}  // namespace sheaf::op
