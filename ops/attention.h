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
// be Lq, a decoder's queries over an encoder's states). On the CPU (float32)
// run() reads each packed value's rows where they lie, one loop forward and
// one backward (ops/attention_cpu.h). Elsewhere (a GPU; other types) it pads
// each to the longest in the batch (on the CPU: in its group of like
// lengths), masks the padded keys, runs the heads as two batched GEMMs (a
// pair a group) and keeps the real rows: exact (padded queries are dropped,
// padded keys get weight 0).
#pragma once

#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/softmax.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "attention_cpu.h"
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
    // On the CPU (float32): one loop over the rows where they lie (ops/attention_cpu.h).
    if (attention_cpu_takes(c.in(0), c.in(1), c.in(2))) {
      SHEAF_ASSERT(!c.own_counts().empty(), "attention: a packed batch without its keys' counts");
      return attention_cpu(c.in(0), c.in(1), c.in(2), counts, c.own_counts(), heads, scale);
    }
    // Packed rows: pad each value's queries to the longest query count and
    // its keys and values to the longest key count, each through one index
    // (padding reads an appended zero row), and keep the real rows after. On
    // the CPU, values of very different lengths are padded in groups of like
    // lengths (buckets()), each group its own pair of GEMMs.
    SHEAF_ASSERT(!c.own_counts().empty(), "attention: a packed batch without its keys' counts");
    const auto device = c.in(0).device();
    const std::span<const int64_t> qc = counts, kc = c.own_counts();
    const int64_t d = c.in(0).size(1), dv = c.in(2).size(1);
    const Groups g = device.is_cpu() ? buckets(qc, kc, heads, d + dv) : Groups::one(qc.size());
    const Padding qp(qc, g, c.in(0).size(0), device), kp(kc, g, c.in(1).size(0), device);
    // The groups' rows as pieces of one split each (one backward that
    // concatenates, where a narrow a group would each zero-fill the whole).
    auto pieces = [&](int arg, const Padding& p) {
      const at::Tensor x = map_rows(c.in(arg), p.to_padded);
      return g.cuts.size() == 2 ? std::vector<at::Tensor>{x} : x.split_with_sizes(p.sizes);
    };
    const std::vector<at::Tensor> q = pieces(0, qp), k = pieces(1, kp), v = pieces(2, kp);
    const at::Tensor padded_keys = kp.to_padded.index().eq(kp.rows);  // the zero row: one launch for every group
    std::vector<at::Tensor> outs;
    for (size_t b = 0; b + 1 < g.cuts.size(); ++b) {
      const int64_t nb = static_cast<int64_t>(g.cuts[b + 1] - g.cuts[b]), lq = qp.longest[b], lk = kp.longest[b];
      auto shaped = [&](const at::Tensor& x, int64_t len) { return x.view({nb, len, x.size(1)}); };
      const at::Tensor mask = padded_keys.narrow(0, kp.begin[b], nb * lk).view({nb, 1, 1, lk});
      outs.push_back(attend(shaped(q[b], lq), shaped(k[b], lk), shaped(v[b], lk), heads, scale, mask)
                         .reshape({nb * lq, -1}));
    }
    return map_rows(outs.size() == 1 ? outs[0] : at::cat(outs), qp.to_rows);
  }

  // Values in padding order (`order`: value indices) cut into groups of
  // consecutive ones: group b is order[cuts[b] .. cuts[b + 1]).
  struct Groups {
    std::vector<int64_t> order;
    std::vector<size_t> cuts;
    static Groups one(size_t n) {
      Groups g{std::vector<int64_t>(n), {0, n}};
      for (size_t i = 0; i < n; ++i) g.order[i] = static_cast<int64_t>(i);
      return g;
    }
  };

  // Values sorted by key count (then query count), cut where padding each
  // group to its own longest costs less than one more pair of GEMMs: the
  // cheapest partition of the sorted values (dynamic programming).
  // Cost in microseconds, estimated on this project's CPU (one thread): a
  // padded score costs the softmax, mask and scale per head plus a
  // multiply-add per column of Q and V; a group costs ~10 LibTorch calls.
  // (Transformer layer, d = 64, lengths 5-40: padding all 64 sentences to the
  // longest was 2.2-2.7 ms of attention a batch, about this model's 2.5.)
  static Groups buckets(std::span<const int64_t> qc, std::span<const int64_t> kc, int64_t heads, int64_t columns) {
    constexpr double kPerScoreHead = 3e-3, kPerMac = 1e-4, kPerGroup = 30.0;
    const size_t n = qc.size();
    Groups g = Groups::one(n);
    std::stable_sort(g.order.begin(), g.order.end(), [&](int64_t a, int64_t b) {
      return kc[static_cast<size_t>(a)] != kc[static_cast<size_t>(b)] ? kc[static_cast<size_t>(a)] < kc[static_cast<size_t>(b)]
                                                                        : qc[static_cast<size_t>(a)] < qc[static_cast<size_t>(b)];
    });
    const double per_score = static_cast<double>(heads) * kPerScoreHead + static_cast<double>(columns) * kPerMac;
    auto kc_at = [&](size_t i) { return kc[static_cast<size_t>(g.order[i])]; };
    // Groups end only where the key count changes (values of one key count
    // pad alike): D distinct counts make the search D x n, not n^2.
    std::vector<size_t> at{0};
    for (size_t j = 1; j < n; ++j)
      if (kc_at(j) != kc_at(j - 1)) at.push_back(j);
    at.push_back(n);
    std::vector<double> best(at.size(), 0.0);
    std::vector<size_t> from(at.size(), 0);
    for (size_t e = 1; e < at.size(); ++e) {
      best[e] = -1;
      int64_t lq = 0;
      const int64_t lk = kc_at(at[e] - 1);  // the group's longest keys: its last value's
      for (size_t b = e; b-- > 0;) {        // group order[at[b] .. at[e])
        for (size_t i = at[b]; i < at[b + 1]; ++i) lq = std::max(lq, qc[static_cast<size_t>(g.order[i])]);
        const double cost =
            best[b] + static_cast<double>(at[e] - at[b]) * static_cast<double>(lq * lk) * per_score + kPerGroup;
        if (best[e] < 0 || cost < best[e]) {
          best[e] = cost;
          from[e] = b;
        }
      }
    }
    g.cuts.clear();
    for (size_t e = at.size() - 1; e > 0; e = from[e]) g.cuts.push_back(at[e]);
    g.cuts.push_back(0);
    std::reverse(g.cuts.begin(), g.cuts.end());
    if (g.cuts.size() == 2) return Groups::one(n);  // one group: the values' own order
    return g;
  }

 private:
  // Values of `counts` rows each, end to end in `rows` rows, as [n_b, longest_b, ...]
  // per group, the groups one after another, and back (op::map_rows: each
  // way's gradient is the other way).
  struct Padding {
    int64_t rows = 0;
    std::vector<int64_t> longest, begin, sizes;  // per group: its padded length, first padded row, padded rows
    RowMap to_padded, to_rows;  // padded slot <- row (rows: the zero row); row <- padded slot
    Padding(std::span<const int64_t> counts, const Groups& g, int64_t total, const c10::Device& device) : rows(total) {
      std::vector<int64_t> first(counts.size());  // each value's first row
      for (size_t i = 0, row = 0; i < counts.size(); ++i) {
        first[i] = static_cast<int64_t>(row);
        row += static_cast<size_t>(counts[i]);
      }
      std::vector<int64_t> p;
      p.reserve(counts.size() * static_cast<size_t>(*std::max_element(counts.begin(), counts.end())));
      for (size_t b = 0; b + 1 < g.cuts.size(); ++b) {
        int64_t l = 0;
        for (size_t i = g.cuts[b]; i < g.cuts[b + 1]; ++i) l = std::max(l, counts[static_cast<size_t>(g.order[i])]);
        longest.push_back(l);
        begin.push_back(static_cast<int64_t>(p.size()));
        sizes.push_back(l * static_cast<int64_t>(g.cuts[b + 1] - g.cuts[b]));
        for (size_t i = g.cuts[b]; i < g.cuts[b + 1]; ++i) {
          const auto v = static_cast<size_t>(g.order[i]);
          for (int64_t j = 0; j < l; ++j) p.push_back(j < counts[v] ? first[v] + j : total);
        }
      }
      to_padded = RowMap(p, total, device);
      to_rows = to_padded.inverse();
    }
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
