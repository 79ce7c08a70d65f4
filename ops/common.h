// Shared pieces of op descriptors. Included only by ops/table.cpp.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/TensorImpl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <concepts>
#include <string_view>
#include <vector>

#include "op.h"
#include "pointwise_math.h"

namespace sheaf::op {

// x, whose axes after the first have size 1, as a tensor of its first axis
// alone (x.size(0) elements, x.stride(0) apart), sharing x's storage and
// its version counter (a write through either is seen through both:
// autograd's saved values, Sheaf's checks that a value read later was not
// changed in place). With autograd
// off, a plain TensorImpl on that storage: a view (Tensor::view) goes
// through the dispatcher and makes a view record for autograd whether or not
// one is wanted (1-1.5 us on LibTorch 1.13; a gated net's gate each round:
// 1.7% of its inference). With autograd on, a view: the gradient flows back
// through it. Also a view for inference tensors and under InferenceMode
// (which would make the new tensor one: no version counter to share).
inline at::Tensor rows_alias(const at::Tensor& x) {
  int64_t n = x.size(0);
  if (c10::GradMode::is_enabled() || c10::InferenceMode::is_enabled() || x.is_inference()) return x.view({n});
  int64_t stride = n > 1 ? x.stride(0) : 1;  // (a single element's stride is any)
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(x.storage()), x.key_set(), x.dtype());
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(at::IntArrayRef(&n, 1), at::IntArrayRef(&stride, 1));
  impl->set_storage_offset(x.storage_offset());
  impl->set_version_counter(x.unsafeGetTensorImpl()->version_counter());
  return t;
}

// Row reductions (OpTraits::row_reduce): x holds every value's rows end to
// end; the sum of each node's rows, [n, row shape...].
inline at::Tensor row_sums(RunCtx& c, const at::Tensor& x) {
  const auto counts = c.segment_counts();
  std::vector<int64_t> sizes{static_cast<int64_t>(counts.size())};
  for (int64_t d = 1; d < x.dim(); ++d) sizes.push_back(x.size(d));
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t k) { return k == counts[0]; })) {
    std::vector<int64_t> split{sizes[0], counts[0]};
    split.insert(split.end(), sizes.begin() + 1, sizes.end());
    return x.reshape(split).sum(1);
  }
  return at::index_add(at::zeros(sizes, x.options()), 0, c.segment_ids(), x);
}

// LibTorch's broadcasting: shapes aligned on the right, each pair of dims equal
// or one of them 1 (a missing dim counts as 1). Per example: the batch axis is
// not part of it (RunCtx::aligned puts the ranks in line below it).
inline Shape infer_elementwise(const InferCtx& c) {
  const Shape& a = c.shape(0);
  const Shape& b = c.shape(1);
  if (a == b || b.rank() == 0) return a;
  if (a.rank() == 0) return b;
  const int rank = std::max(a.rank(), b.rank());
  Shape out;
  for (int d = 0; d < rank; ++d) {
    const int da = d - (rank - a.rank()), db = d - (rank - b.rank());
    const int64_t x = da >= 0 ? a[da] : 1, y = db >= 0 ? b[db] : 1;
    if (x != y && x != 1 && y != 1)
      c.fail("shapes ", a.str(), " and ", b.str(), " do not broadcast (dimension ", d, " of the result: ", x, " against ", y,
             "); elementwise ops need shapes that broadcast as LibTorch's do");
    out.push(x == 1 ? y : x);
  }
  return out;
}

// attrs[first] is a rank, followed by that many dims (leaves carry their shape).
inline Shape shape_from_attrs(const InferCtx& c, size_t first) {
  // The DSL writes these attributes (rank, then the dims, last): anything else
  // is a node recorded around it.
  if (c.attrs().size() < first + 1 || c.attr(first) < 0 || c.attr(first) > kMaxRank ||
      c.attrs().size() != first + 1 + static_cast<size_t>(c.attr(first)))
    c.fail("malformed shape attributes (record through the DSL, sheaf::Graph and sheaf::Function)");
  Shape s;
  for (int64_t i = 0; i < c.attr(first); ++i) {
    int64_t d = c.attr(first + 1 + static_cast<size_t>(i));
    if (d < 0) c.fail("negative dimension ", d, " in shape");
    s.push(d);
  }
  return s;
}

inline Shape infer_same(const InferCtx& c) { return c.shape(0); }

// A fused form's gradient masks (PointwiseInfo::cuda_mask_a/b): a CPU mask
// (bool mask_a(a, b, y, c), mask_b) where there is a CUDA one, none where
// there is not, and none on b for an op of one operand.
template <class P>
concept PointwiseMasks =
    requires(float x) {
      requires P::info.cuda_mask_a.empty() || requires { { P::mask_a(x, x, x, x) } -> std::same_as<bool>; };
      requires P::info.cuda_mask_b.empty() || requires { { P::mask_b(x, x, x, x) } -> std::same_as<bool>; };
    } && (!P::info.cuda_mask_a.empty() || !requires(float x) { P::mask_a(x, x, x, x); }) &&
    (!P::info.cuda_mask_b.empty() || !requires(float x) { P::mask_b(x, x, x, x); }) &&
    (P::info.operands == 2 || P::info.cuda_mask_b.empty());

// An op descriptor with a fused elementwise form (see PointwiseInfo).
template <class Op>
concept PointwiseOp = requires(float x) {
  { Op::Pointwise::info } -> std::convertible_to<PointwiseInfo>;
  { Op::Pointwise::fwd(x, x, x) } -> std::same_as<float>;
  { Op::Pointwise::da(x, x, x, x) } -> std::same_as<float>;
  { Op::Pointwise::db(x, x, x, x) } -> std::same_as<float>;
} && PointwiseMasks<typename Op::Pointwise>;

// The descriptor of an elementwise unary op is its name and one LibTorch function.
template <at::Tensor (*F)(const at::Tensor&)>
struct Unary {
  static constexpr OpTraits traits{.arity = 1, .rowwise = true};
  static Shape infer(const InferCtx& c) { return infer_same(c); }
  static at::Tensor run(RunCtx& c) { return F(c.in(0)); }
};

// x (op) c for a scalar attribute c.
inline at::Scalar scalar_attr(const RunCtx& c) { return at::Scalar(c.attr_f(0)); }

// A batch's computed indices (a scalar per row, or one shared scalar) as int64
// positions in [0, size): checked on the host in one read of a flag, so a bad
// index is a UserError naming the op and examples (the executor wraps the
// exception), never a device fault or a silent clamp.
// `of` and `unit` name the range: "a vector of" 4 "elements".
inline at::Tensor checked_indices(const RunCtx& c, size_t arg, int64_t size, std::string_view of, std::string_view unit) {
  const at::Tensor i = c.in(arg).detach().reshape({-1}).expand({c.n()});
  const at::Tensor bad = (i < 0).logical_or_(i >= static_cast<double>(size)).logical_or_(i != i.trunc());
  if (bad.any().item<bool>()) {
    // (The first bad row, found only once there is one: the executor names its node.)
    const auto row = at::nonzero(bad)[0][0].item<int64_t>();
    throw RowError(c.in(arg).numel() == 1 ? -1 : row,
                   "an index is out of range for " + std::string(of) + " " + std::to_string(size) + " " +
                       std::string(unit) + ", or not a whole number (" + std::to_string(i[row].item<double>()) + ")");
  }
  return i.to(at::kLong);
}

}  // namespace sheaf::op
