// Scaled dot-product attention of one example's queries over its keys and
// values, with `heads` heads (the Transformer's; Vaswani et al. 2017):
//
//   Q [Lq, d], K [Lk, d], V [Lk, dv] -> [Lq, dv]; per head h (d / heads
//   columns of Q and K, dv / heads of V): softmax(scale * Q_h K_h^T) V_h,
//   scale 1 / sqrt(d / heads) unless given
//
// Why one op: written as matmul / softmax / matmul, each [Lq, Lk] product runs
// once per distinct pair of lengths (its rows are not independent). Here
// attention over values of different lengths is ONE packed batch
// (OpTraits::per_value): the rows of every example's Q end to end with their
// counts, and those of K and V with theirs (OpTraits::own_rows: Lk need not
// be Lq, a decoder's queries over an encoder's states); run() pads each to
// the longest in the batch, masks the padded keys, runs the heads as two
// batched GEMMs and keeps the real rows: exact (padded queries are dropped,
// padded keys get weight 0).
#pragma once

#include <ATen/ops/bmm.h>
#include <ATen/ops/softmax.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "common.h"
#include "map_rows.h"

namespace sheaf::op {

// attrs: heads, scale (as attr_of(double); 0: 1 / sqrt(d / heads)).
struct Attention {
  static constexpr std::string_view name = "attention";
  static constexpr OpTraits traits{.arity = 3, .rowwise = true, .per_value = true, .own_rows = 0b110};
  static Shape infer(const InferCtx& c) {
    const Shape &q = c.shape(0), &k = c.shape(1), &v = c.shape(2);
    const int64_t heads = c.attr(0);
    if (q.rank() != 2 || k.rank() != 2 || v.rank() != 2)
      c.fail("needs matrices (queries, keys, values: one row each), got ", q.str(), ", ", k.str(), " and ", v.str());
    if (k[1] != q[1]) c.fail("queries ", q.str(), " and keys ", k.str(), " need the same width");
    if (v[0] != k[0]) c.fail("keys ", k.str(), " and values ", v.str(), " need the same number of rows");
    if (k[0] == 0 || q[0] == 0) c.fail("needs at least one query and one key, got ", q.str(), " and ", k.str());
    if (heads < 1 || q[1] % heads != 0 || v[1] % heads != 0)
      c.fail(heads, " heads must divide the query width ", q[1], " and the value width ", v[1]);
    if (!std::isfinite(c.attr_f(1))) c.fail("the scale must be finite, got ", c.attr_f(1));
    return Shape{q[0], v[1]};
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t heads = c.attr(0);
    const double scale = c.attr_f(1);
    const auto counts = c.segment_counts();
    if (counts.empty()) {  // values of one shape: [n, L, d]
      const at::Tensor q = c.batched(0), k = c.batched(1), v = c.batched(2);
      return attend(q, k, v, heads, scale, {});
    }
    // Packed rows: pad each value's queries to the longest query count and
    // its keys and values to the longest key count, each through one index
    // (padding reads an appended zero row), and keep the real rows after.
    SHEAF_ASSERT(!c.own_counts().empty(), "attention: a packed batch without its keys' counts");
    const auto device = c.in(0).device();
    const Padding qp(counts, c.in(0).size(0), device), kp(c.own_counts(), c.in(1).size(0), device);
    const auto n = static_cast<int64_t>(counts.size());
    const at::Tensor mask = kp.to_padded.index().eq(kp.rows).view({n, 1, 1, kp.longest});  // padded keys: the zero row
    const at::Tensor out = attend(qp.padded(c.in(0)), kp.padded(c.in(1)), kp.padded(c.in(2)), heads, scale, mask);
    return qp.unpadded(out.reshape({n * qp.longest, -1}));
  }

 private:
  // Values of `counts` rows each, end to end in `rows` rows, as [n, longest, ...]
  // and back (op::map_rows: each way's gradient is the other way).
  struct Padding {
    int64_t rows = 0, longest = 0;
    RowMap to_padded, to_rows;  // padded slot <- row (rows: the zero row); row <- padded slot
    Padding(std::span<const int64_t> counts, int64_t total, const c10::Device& device) : rows(total) {
      longest = *std::max_element(counts.begin(), counts.end());
      std::vector<int64_t> p;
      p.reserve(counts.size() * static_cast<size_t>(longest));
      int64_t row = 0;
      for (const int64_t len : counts) {
        for (int64_t j = 0; j < longest; ++j) p.push_back(j < len ? row + j : total);
        row += len;
      }
      to_padded = RowMap(p, total, device);
      to_rows = to_padded.inverse();
    }
    at::Tensor padded(const at::Tensor& x) const { return map_rows(x, to_padded).view({-1, longest, x.size(1)}); }
    at::Tensor unpadded(const at::Tensor& y) const { return map_rows(y, to_rows); }
  };

  // q [n, Lq, d], k [n, Lk, d], v [n, Lk, dv] -> [n, Lq, dv]; mask [n, 1, 1, Lk]
  // (true: a padded key) or undefined.
  static at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t heads, double scale,
                           const at::Tensor& mask) {
    const int64_t n = q.size(0), lq = q.size(1), lk = k.size(1), dk = q.size(2) / heads, dv = v.size(2) / heads;
    auto split = [&](const at::Tensor& x, int64_t len, int64_t width) {  // [n, len, heads * w] -> [n * heads, len, w]
      return x.reshape({n, len, heads, width}).transpose(1, 2).reshape({n * heads, len, width});
    };
    if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(dk));
    // The scale rides on the smaller of the queries and the scores (none when it is 1).
    at::Tensor qs = split(q, lq, dk);
    const bool on_queries = scale != 1 && dk <= lk;
    if (on_queries) qs = qs * scale;
    at::Tensor scores = at::bmm(qs, split(k, lk, dk).transpose(1, 2));
    if (scale != 1 && !on_queries) scores = scores * scale;
    if (mask.defined()) scores = scores.view({n, heads, lq, lk}).masked_fill(mask, -INFINITY).view({n * heads, lq, lk});
    const at::Tensor out = at::bmm(at::softmax(scores, -1), split(v, lk, dv));  // [n * heads, Lq, dv]
    return out.view({n, heads, lq, dv}).transpose(1, 2).reshape({n, lq, heads * dv});
  }
};

}  // namespace sheaf::op
