// Concatenation and slicing along an axis of the per-example value (the batch
// axis is never touched: per-example axis a is batched axis a + 1).
#pragma once

#include <ATen/ops/cat.h>
#include <ATen/ops/movedim.h>

#include <vector>

#include <ATen/ops/stack.h>

#include "common.h"

namespace sheaf::op {

// attr: axis (normalised to >= 0 when recorded, unless the shape was not known
// then: downstream of a dsl::cond; normalise_axis() gives the axis either way).
inline int normalise_axis(const Shape& s, int64_t axis) { return s.axis(static_cast<int>(axis)); }

struct Concat {
  static constexpr std::string_view name = "concat";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic, .stackable = true, .rowwise = true, .axis_attr = 0};
  static Shape infer(const InferCtx& c) {
    if (c.arity() == 0) c.fail("needs at least one argument");
    Shape out = c.shape(0);
    const int axis = out.axis(static_cast<int>(c.attr(0)));
    if (axis < 0) c.fail("axis ", c.attr(0), " is out of range for shape ", out.str());
    for (size_t i = 1; i < c.arity(); ++i) {
      const Shape& s = c.shape(i);
      bool ok = s.rank() == out.rank();
      for (int d = 0; ok && d < s.rank(); ++d) ok = d == axis || s[d] == out[d];
      if (!ok) c.fail("argument ", i, " has shape ", s.str(), ", incompatible with ", c.shape(0).str(), " on axis ", axis);
      out[axis] += s[axis];
    }
    return out;
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t axis = normalise_axis(c.out_shape(), c.attr(0));
    if (c.stacked()) {
      // in(0) = [n * k, S...]: as [n, k, S...], move k next to the axis and merge them.
      const at::Tensor& x = c.in(0);
      std::vector<int64_t> sizes{c.n(), static_cast<int64_t>(c.arity())};
      for (int64_t d = 1; d < x.dim(); ++d) sizes.push_back(x.size(d));
      at::Tensor y = x.reshape(sizes);
      if (axis > 0) y = y.movedim(1, axis + 1);
      std::vector<int64_t> out{c.n()};
      for (int64_t d : c.out_shape().dims()) out.push_back(d);
      return y.reshape(out);
    }
    std::vector<at::Tensor> xs;
    xs.reserve(c.arity());
    for (size_t i = 0; i < c.arity(); ++i) xs.push_back(c.batched(i));
    return at::cat(xs, c.packed() ? c.tensor_axis(c.attr(0)) : axis + 1);
  }
};

// attrs: axis, begin, end.
struct Slice {
  static constexpr std::string_view name = "slice";
  static constexpr OpTraits traits{.arity = 1, .rowwise = true, .axis_attr = 0};
  static Shape infer(const InferCtx& c) {
    Shape s = c.shape(0);
    const int axis = s.axis(static_cast<int>(c.attr(0)));
    if (axis < 0) c.fail("axis ", c.attr(0), " is out of range for shape ", s.str());
    const int64_t b = c.attr(1), e = c.attr(2);
    if (b < 0 || e > s[axis] || b >= e)
      c.fail("range [", b, ", ", e, ") is empty or outside [0, ", s[axis], ") on axis ", axis);
    s[axis] = e - b;
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    return c.in(0).narrow(c.tensor_axis(c.attr(0)), c.attr(1), c.attr(2) - c.attr(1));
  }
};

// attrs: rank, then the new per-example dims; one of them may be -1 (inferred
// from the element count, as LibTorch's reshape).
struct Reshape {
  static constexpr std::string_view name = "reshape";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    const Shape& in = c.shape(0);
    if (c.attr(0) > kMaxRank) c.fail("per-example values have rank at most ", kMaxRank, ", asked for ", c.attr(0));
    Shape out;
    int free = -1;
    int64_t known = 1;
    for (int64_t i = 0; i < c.attr(0); ++i) {
      const int64_t d = c.attr(1 + static_cast<size_t>(i));
      if (d == -1 && free < 0) {
        free = out.rank();
        out.push(1);
        continue;
      }
      if (d < 0) c.fail("dimension ", d, " is invalid (one dimension may be -1: inferred)");
      known *= d;
      out.push(d);
    }
    if (free >= 0) {
      if (known == 0 || in.numel() % known != 0)
        c.fail("cannot infer the -1 dimension: ", in.numel(), " elements are not a multiple of ", known);
      out[free] = in.numel() / known;
    }
    if (out.numel() != in.numel())
      c.fail("cannot reshape ", in.str(), " (", in.numel(), " elements) into ", out.str(), " (", out.numel(), ")");
    return out;
  }
  static at::Tensor run(RunCtx& c) {
    return c.in(0).reshape(batched_sizes(c.in(0).size(0), c.out_shape()));  // n, or 1 for a shared value
  }
};

// attrs: the two axes to swap (normalised when the shape was known at recording).
struct Transpose {
  static constexpr std::string_view name = "transpose";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) {
    Shape s = c.shape(0);
    const int a = s.axis(static_cast<int>(c.attr(0))), b = s.axis(static_cast<int>(c.attr(1)));
    if (a < 0 || b < 0) c.fail("axes ", c.attr(0), " and ", c.attr(1), " are not both in range for shape ", s.str());
    std::swap(s[a], s[b]);
    return s;
  }
  static at::Tensor run(RunCtx& c) {
    const int rank = static_cast<int>(c.in(0).dim()) - 1;
    auto axis = [&](int64_t a) { return (a < 0 ? a + rank : a) + 1; };
    // Contiguous: later reads take rows of this batch as flat blocks.
    return c.in(0).transpose(axis(c.attr(0)), axis(c.attr(1))).contiguous();
  }
};

// A list of equal-shaped values -> one value with a new axis of the list's
// length at `axis` (attr 0, in 0 .. rank, normalised at recording).
struct Stack {
  static constexpr std::string_view name = "stack";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic, .stackable = true};
  static Shape infer(const InferCtx& c) {
    if (c.arity() == 0) c.fail("needs at least one argument");
    const Shape& s = c.shape(0);
    for (size_t i = 1; i < c.arity(); ++i)
      if (!(c.shape(i) == s)) c.fail("argument ", i, " has shape ", c.shape(i).str(), " but argument 0 has ", s.str());
    if (s.rank() >= kMaxRank) c.fail("per-example values have rank at most ", kMaxRank, "; stacking ", s.str(), " would exceed it");
    const int64_t axis = c.attr(0);
    if (axis < 0 || axis > s.rank()) c.fail("axis ", axis, " is out of range 0..", s.rank(), " for values of shape ", s.str());
    Shape out;
    for (int d = 0; d <= s.rank(); ++d) {
      if (d == axis) out.push(static_cast<int64_t>(c.arity()));
      if (d < s.rank()) out.push(s[d]);
    }
    return out;
  }
  static at::Tensor run(RunCtx& c) {
    const int64_t axis = c.attr(0);
    if (c.stacked()) {
      // in(0) = [n * k, S...]: as [n, k, S...], then move k to its axis.
      std::vector<int64_t> sizes{c.n(), static_cast<int64_t>(c.arity())};
      for (int64_t d = 1; d < c.in(0).dim(); ++d) sizes.push_back(c.in(0).size(d));
      at::Tensor y = c.in(0).reshape(sizes);
      return axis == 0 ? y : y.movedim(1, axis + 1).contiguous();
    }
    std::vector<at::Tensor> xs;
    xs.reserve(c.arity());
    for (size_t i = 0; i < c.arity(); ++i) xs.push_back(c.batched(i));
    return at::stack(xs, axis + 1);
  }
};

}  // namespace sheaf::op
