// Concatenation and slicing along an axis of the per-example value (the batch
// axis is never touched: per-example axis a is batched axis a + 1).
#pragma once

#include <ATen/ops/cat.h>
#include <ATen/ops/movedim.h>

#include <vector>

#include "common.h"

namespace sheaf::op {

// attr: axis (normalised to >= 0 when recorded, unless the shape was not known
// then: downstream of a dsl::cond; normalise_axis() gives the axis either way).
inline int normalise_axis(const Shape& s, int64_t axis) { return s.axis(static_cast<int>(axis)); }

struct Concat {
  static constexpr std::string_view name = "concat";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic, .stackable = true};
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
    return at::cat(xs, axis + 1);
  }
};

// attrs: axis, begin, end.
struct Slice {
  static constexpr std::string_view name = "slice";
  static constexpr OpTraits traits{.arity = 1};
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
    return c.in(0).narrow(normalise_axis(c.out_shape(), c.attr(0)) + 1, c.attr(1), c.attr(2) - c.attr(1));
  }
};

}  // namespace sheaf::op
