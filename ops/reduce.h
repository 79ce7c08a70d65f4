// Reductions, softmax and losses.
#pragma once

#include <ATen/ops/gather.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>

#include <numeric>
#include <vector>

#include "common.h"

namespace sheaf::op {

// All elements of one value -> a scalar, with F = at::sum or at::mean over the
// per-example axes 1 .. rank.
template <at::Tensor (*F)(const at::Tensor&, at::IntArrayRef)>
struct ReduceAll {
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx&) { return Shape{}; }
  static at::Tensor run(RunCtx& c) {
    const int rank = static_cast<int>(c.in(0).dim()) - 1;
    if (rank == 0) return c.in(0);  // reducing over an empty axis list would reduce everything
    std::vector<int64_t> axes(static_cast<size_t>(rank));
    std::iota(axes.begin(), axes.end(), 1);
    return F(c.in(0), axes);
  }
};

inline at::Tensor sum_axes(const at::Tensor& x, at::IntArrayRef axes) { return at::sum(x, axes); }
inline at::Tensor mean_axes(const at::Tensor& x, at::IntArrayRef axes) { return at::mean(x, axes); }

struct Sum : ReduceAll<sum_axes> { static constexpr std::string_view name = "sum"; };
struct Mean : ReduceAll<mean_axes> { static constexpr std::string_view name = "mean"; };

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
  std::vector<int64_t> sizes{n};
  for (int64_t d : c.out_shape().dims()) sizes.push_back(d);
  return at::index_add(at::zeros(sizes, x.options()), 0, c.segment_ids(), x);
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
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return infer_vector_like(c); }
  static at::Tensor run(RunCtx& c) { return at::softmax(c.in(0), -1); }
};

struct LogSoftmax {
  static constexpr std::string_view name = "log_softmax";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return infer_vector_like(c); }
  static at::Tensor run(RunCtx& c) { return at::log_softmax(c.in(0), -1); }
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
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    check_index(c, "index");
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) { return at::gather(c.in(0), 1, c.payload().unsqueeze(1)).squeeze(1); }
};

// payload: the gold label.
struct PickNegLogSoftmax {
  static constexpr std::string_view name = "pick_neg_log_softmax";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    check_index(c, "label");
    return Shape{};
  }
  static at::Tensor run(RunCtx& c) {
    return at::nll_loss(at::log_softmax(c.in(0), 1), c.payload(), {}, at::Reduction::None);
  }
};

}  // namespace sheaf::op
