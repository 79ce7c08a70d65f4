// Reductions, softmax and losses.
#pragma once

#include <ATen/ops/argmax.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "map_rows.h"
#include "segments.h"

namespace sheaf::op {

// Each node's number of rows as [n, 1, ...] floats of rank `rank` + 1, counted
// on the device from the segment ids (no upload).
inline at::Tensor row_counts(RunCtx& c, int64_t rank) {
  const at::Tensor& seg = c.segment_ids();
  at::Tensor counts = at::index_add(at::zeros({c.n()}, c.options()), 0, seg, at::ones_like(seg, c.options()));
  std::vector<int64_t> sizes(static_cast<size_t>(rank) + 1, 1);
  sizes[0] = c.n();
  return counts.view(sizes);
}

// All elements of one value -> a scalar, with F = at::sum or at::mean over the
// per-example axes 1 .. rank. Values of rank >= 2 batch by rows whatever their
// length (OpTraits::row_reduce).
template <at::Tensor (*F)(const at::Tensor&, at::IntArrayRef), bool kMean>
struct ReduceAll {
  static constexpr OpTraits traits{.arity = 1, .row_reduce = true};
  static Shape infer(const InferCtx&) { return Shape{}; }
  static at::Tensor run(RunCtx& c) {
    if (!c.segment_counts().empty()) {  // rows of values of different lengths
      at::Tensor sums = row_sums(c, c.in(0));
      const int64_t per_row = sums.numel() / std::max<int64_t>(c.n(), 1);
      if (sums.dim() > 1) sums = sums.reshape({c.n(), -1}).sum(1);
      return kMean ? sums / (row_counts(c, 0) * static_cast<double>(per_row)) : sums;
    }
    const int rank = static_cast<int>(c.in(0).dim()) - 1;
    if (rank == 0) return c.in(0);  // reducing over an empty axis list would reduce everything
    // One element each (a gate's [1] score): the values themselves, not a
    // launch: the batch axis's elements, whatever the strides of the axes of
    // size 1 that go (rows_alias: without autograd, not a view's dispatch).
    if (c.in(0).numel() == c.n()) return rows_alias(c.in(0));
    std::vector<int64_t> axes(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 1);
    return F(c.in(0), axes);
  }
};

inline at::Tensor sum_axes(const at::Tensor& x, at::IntArrayRef axes) { return at::sum(x, axes); }
inline at::Tensor mean_axes(const at::Tensor& x, at::IntArrayRef axes) { return at::mean(x, axes); }

struct Sum : ReduceAll<sum_axes, false> { static constexpr std::string_view name = "sum"; };
struct Mean : ReduceAll<mean_axes, true> { static constexpr std::string_view name = "mean"; };

// How a reduction along axis 0 combines the rows of values of different
// lengths (OpTraits::row_reduce): not at all (by shape), or as below.
enum class Rows { kNone, kSum, kMean, kMax, kMin, kLogSumExp };

// The largest (or smallest) of each value's rows, [n, row shape...]: the
// gradient goes to the tied extremes in equal shares, as amax's does (the
// extremes and the ties are found without gradient; the result is the
// ties' mean, which is the extreme).
inline at::Tensor row_extremes(RunCtx& c, const at::Tensor& x, bool max) {
  const at::Tensor ids = c.segment_ids();
  const auto n = static_cast<int64_t>(c.segment_counts().size());
  const at::Tensor best = segment_extreme(x, ids, n, max).index_select(0, ids);
  const at::Tensor is_tied = x.detach().eq(best);
  const at::Tensor tied = is_tied.to(x.scalar_type());
  const at::Tensor share = tied / row_sums(c, tied).index_select(0, ids);
  // The other rows are masked out, not weighed by 0: an infinite row (a
  // padded -inf under a max) times 0 is NaN.
  return row_sums(c, x.masked_fill(is_tied.logical_not(), 0.0) * share);
}

// log of the sum of exp over each value's rows, shifted by the row maxima
// (without gradient: the shift cancels out). An infinite maximum shifts by 0,
// as LibTorch's logsumexp does: inf - inf would make the sum NaN where the
// answer is +inf (a +inf row) or -inf (every row -inf).
inline at::Tensor row_logsumexp(RunCtx& c, const at::Tensor& x) {
  const at::Tensor ids = c.segment_ids();
  at::Tensor shift = segment_extreme(x, ids, static_cast<int64_t>(c.segment_counts().size()), /*max=*/true);
  shift = shift.masked_fill(shift.isinf(), 0.0);
  return row_sums(c, (x - shift.index_select(0, ids)).exp()).log() + shift;
}

// One axis of a value reduced (DyNet's sum_dim, max_dim, ...): attr 0 is the
// axis (normalised at recording when the shape was known). Along axis 0,
// values of different lengths batch by rows (OpTraits::row_reduce).
template <at::Tensor (*F)(const at::Tensor&, int64_t), Rows kRows>
struct ReduceDim {
  static constexpr OpTraits traits{.arity = 1, .axis_attr = 0, .row_reduce = kRows != Rows::kNone};
  static Shape infer(const InferCtx& c) {
    const Shape& s = c.shape(0);
    const int axis = s.axis(static_cast<int>(c.attr(0)));
    if (axis < 0) c.fail("axis ", c.attr(0), " is out of range for shape ", s.str());
    Shape out;
    for (int d = 0; d < s.rank(); ++d)
      if (d != axis) out.push(s[d]);
    return out;
  }
  static at::Tensor run(RunCtx& c) {
    if (!c.segment_counts().empty()) {  // along the rows of values of different lengths
      const at::Tensor& x = c.in(0);
      if constexpr (kRows == Rows::kMax || kRows == Rows::kMin) return row_extremes(c, x, kRows == Rows::kMax);
      if constexpr (kRows == Rows::kLogSumExp) return row_logsumexp(c, x);
      at::Tensor sums = row_sums(c, x);
      return kRows == Rows::kMean ? sums / row_counts(c, sums.dim() - 1) : sums;
    }
    const int64_t a = c.attr(0);
    return F(c.in(0), (a < 0 ? a + c.in(0).dim() - 1 : a) + 1);
  }
};

inline at::Tensor sum_dim(const at::Tensor& x, int64_t d) { return x.sum(d); }
inline at::Tensor mean_dim(const at::Tensor& x, int64_t d) { return x.mean(d); }
// amax/amin: the gradient is shared evenly between tied maxima (max(dim) would
// give it all to one of them).
inline at::Tensor max_dim(const at::Tensor& x, int64_t d) { return x.amax(d); }
inline at::Tensor min_dim(const at::Tensor& x, int64_t d) { return x.amin(d); }
inline at::Tensor logsumexp_dim(const at::Tensor& x, int64_t d) { return x.logsumexp(d); }

struct SumDim : ReduceDim<sum_dim, Rows::kSum> { static constexpr std::string_view name = "sum_dim"; };
struct MeanDim : ReduceDim<mean_dim, Rows::kMean> { static constexpr std::string_view name = "mean_dim"; };
struct MaxDim : ReduceDim<max_dim, Rows::kMax> { static constexpr std::string_view name = "max_dim"; };
struct MinDim : ReduceDim<min_dim, Rows::kMin> { static constexpr std::string_view name = "min_dim"; };
struct LogSumExpDim : ReduceDim<logsumexp_dim, Rows::kLogSumExp> {
  static constexpr std::string_view name = "logsumexp_dim";
};

// Two vectors of one length -> their dot product (a scalar).
struct Dot {
  static constexpr std::string_view name = "dot";
  static constexpr OpTraits traits{.arity = 2};
  static Shape infer(const InferCtx& c) {
    if (c.shape(0).rank() != 1 || !(c.shape(0) == c.shape(1)))
      c.fail("needs two vectors of one length, got ", c.shape(0).str(), " and ", c.shape(1).str());
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) { return (c.batched(0) * c.batched(1)).sum(1); }
};

// Normalised over the last axis, then scaled and shifted by shared [d] tensors
// (LibTorch's layer_norm); attr 0: epsilon (a double, attr_of).
struct LayerNorm {
  static constexpr std::string_view name = "layer_norm";
  static constexpr OpTraits traits{.arity = 3, .rowwise = true};
  static Shape infer(const InferCtx& c) {
    const Shape& s = c.shape(0);
    if (s.rank() < 1) c.fail("needs a value of rank >= 1, got a scalar");
    for (size_t i : {size_t{1}, size_t{2}}) {
      c.expect_shared(i, i == 1 ? "the gain" : "the bias");
      if (!(c.shape(i) == Shape{s[s.rank() - 1]}))
        c.fail(i == 1 ? "the gain" : "the bias", " has shape ", c.shape(i).str(), "; the last axis of ", s.str(),
               " needs [", s[s.rank() - 1], "]");
    }
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t d = c.in(0).size(-1);
    return at::layer_norm(c.in(0), {d}, c.in(1), c.in(2), c.attr_f(0));
  }
};

// Lists of equal-shaped values, reduced elementwise. Lists of different lengths
// share one launch: every element arrives in in(0) = [total, S...], in node order.
inline Shape infer_list(const InferCtx& c) {
  if (c.arity() == 0) c.fail("needs a non-empty list");
  for (size_t i = 1; i < c.arity(); ++i)
    if (c.shared(i) != c.shared(0))
      c.fail("list element ", i, " is ", c.shared(i) ? "shared" : "per-example", " but element 0 is not; ",
             "lists must be all per-example values or all shared ones");
  for (size_t i = 1; i < c.arity(); ++i)
    if (!(c.shape(i) == c.shape(0)))
      c.fail("list element ", i, " has shape ", c.shape(i).str(), " but element 0 has ", c.shape(0).str());
  return c.shape(0);
}

inline at::Tensor segment_sum(RunCtx& c) {
  const at::Tensor& x = c.in(0);
  auto counts = c.segment_counts();
  const int64_t n = c.n();
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t k) { return k == counts[0]; })) {
    std::vector<int64_t> sizes{n, counts[0]};
    for (int64_t d : c.out_shape().dims()) sizes.push_back(d);
    return x.view(sizes).sum(1);
  }
  return at::index_add(at::zeros(batched_sizes(n, c.out_shape()), x.options()), 0, c.segment_ids(), x);
}

struct SumList {
  static constexpr std::string_view name = "sum_list";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic, .segmented = true};
  static Shape infer(const InferCtx& c) { return infer_list(c); }
  static at::Tensor run(RunCtx& c) { return segment_sum(c); }
};

struct MeanList {
  static constexpr std::string_view name = "mean_list";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic, .segmented = true};
  static Shape infer(const InferCtx& c) { return infer_list(c); }
  static at::Tensor run(RunCtx& c) {
    // Counts are computed on the device from the segment ids: no host upload per batch.
    const at::Tensor& seg = c.segment_ids();
    at::Tensor counts = at::index_add(at::zeros({c.n()}, c.options()), 0, seg, at::ones_like(seg, c.options()));
    std::vector<int64_t> sizes(static_cast<size_t>(c.out_shape().rank()) + 1, 1);
    sizes[0] = c.n();
    return segment_sum(c) / counts.view(sizes);
  }
};

inline Shape infer_vector_like(const InferCtx& c) {
  if (c.shape(0).rank() < 1) c.fail("needs a value of rank >= 1, got a scalar");
  return c.shape(0);
}

struct Softmax {
  static constexpr std::string_view name = "softmax";
  static constexpr OpTraits traits{.arity = 1, .rowwise = true, .across_rows = true};
  static Shape infer(const InferCtx& c) { return infer_vector_like(c); }
  static at::Tensor run(RunCtx& c) {
    if (c.segment_counts().empty()) return at::softmax(c.in(0), -1);
    return segment_softmax(c.in(0), c.segment_counts(), c.segment_ids(), /*log=*/false);  // across packed vectors
  }
};

struct LogSoftmax {
  static constexpr std::string_view name = "log_softmax";
  static constexpr OpTraits traits{.arity = 1, .rowwise = true, .across_rows = true};
  static Shape infer(const InferCtx& c) { return infer_vector_like(c); }
  static at::Tensor run(RunCtx& c) {
    if (c.segment_counts().empty()) return at::log_softmax(c.in(0), -1);
    return segment_softmax(c.in(0), c.segment_counts(), c.segment_ids(), /*log=*/true);  // across packed vectors
  }
};

inline void check_index(const InferCtx& c, const char* what) {
  const Shape& s = c.shape(0);
  if (s.rank() != 1) c.fail("needs a vector, got shape ", s.str());
  if (c.payload() < 0 || c.payload() >= s[0])
    c.fail(what, " ", c.payload(), " is out of range for a vector of ", s[0], " elements");
}

// payload: the index.
struct Pick {
  static constexpr std::string_view name = "pick";
  static constexpr OpTraits traits{.arity = 1, .payload_index = true};
  static Shape infer(const InferCtx& c) {
    check_index(c, "index");
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) { return at::gather(c.in(0), 1, c.payload().unsqueeze(1)).squeeze(1); }
};

// Row i of x [L, S...] (i < 0 counts from the end: -1 is the last), [S...]:
// a BiLSTM's last forward state. attr 0: i, kept as given, so that values of
// different lengths share a signature and their rows one launch
// (OpTraits::row_reduce): one row move each way (op::map_rows); its gradient
// writes each source row once (zeros where no row was read) instead of a
// slice's zero-fill of the whole source and an add.
struct Row {
  static constexpr std::string_view name = "row";
  static constexpr OpTraits traits{.arity = 1, .row_reduce = true};
  static Shape infer(const InferCtx& c) {
    const Shape& s = c.shape(0);
    if (s.rank() < 1) c.fail("needs a value of rank >= 1, got a scalar");
    const int64_t i = c.attr(0);
    if (i < -s[0] || i >= s[0]) c.fail("row ", i, " is out of range for a value of ", s[0], " rows (shape ", s.str(), ")");
    return s.row();
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t i = c.attr(0);
    const auto counts = c.segment_counts();
    if (counts.empty()) {  // [n, L, S...]
      const at::Tensor& x = c.in(0);
      return x.select(1, i < 0 ? i + x.size(1) : i);
    }
    const at::Tensor& x = c.in(0);
    std::vector<int64_t> take(counts.size());
    int64_t start = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      take[k] = start + (i < 0 ? counts[k] + i : i);
      start += counts[k];
    }
    return map_rows(x, RowMap(take, x.size(0), x.device()));
  }
};

// x[i] of a vector x at an index computed in the graph (a scalar holding a
// whole number, e.g. an argmax). The gradient flows to x only. An index out of
// range or not whole is checked when the batch runs (one host read of a flag):
// a UserError naming the op and examples, never a device fault.
struct PickAt {
  static constexpr std::string_view name = "pick";
  static constexpr OpTraits traits{.arity = 2};
  static Shape infer(const InferCtx& c) {
    if (c.shape(0).rank() != 1) c.fail("needs a vector, got shape ", c.shape(0).str());
    if (c.shape(1).rank() != 0) c.fail("the index must be a scalar, got shape ", c.shape(1).str());
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) {
    const at::Tensor x = c.batched(0);
    return at::gather(x, 1, checked_indices(c, 1, x.size(1), "a vector of", "elements").unsqueeze(1)).squeeze(1);
  }
};

// The position of the largest element along the last axis, as a float (the
// first one at ties, as LibTorch's argmax); no gradient.
struct ArgMax {
  static constexpr std::string_view name = "argmax";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    const Shape& s = infer_vector_like(c);
    Shape out;
    for (int d = 0; d + 1 < s.rank(); ++d) out.push(s[d]);
    return out;
  }
  static at::Tensor run(RunCtx& c) { return at::argmax(c.in(0).detach(), -1).to(c.options()); }
};

// payload: the gold label.
struct PickNegLogSoftmax {
  static constexpr std::string_view name = "pick_neg_log_softmax";
  static constexpr OpTraits traits{.arity = 1, .payload_index = true};
  static Shape infer(const InferCtx& c) {
    check_index(c, "label");
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) {
    return at::nll_loss(at::log_softmax(c.in(0), 1), c.payload(), {}, at::Reduction::None);
  }
};

}  // namespace sheaf::op
