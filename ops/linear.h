// Matrix products. A shared matrix (the usual parameter) becomes one GEMM over the
// batch; per-example matrices become one batched GEMM, or with a per-example
// vector one batched_matvec (ops/matvec.h).
#pragma once

#include <ATen/ops/addmv.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mv.h>
#include <c10/core/GradMode.h>

#include <array>

#include "common.h"
#include "cpu_float.h"
#include "matvec.h"
#include "segments.h"
#include "weight_grad.h"

namespace sheaf::op {

// A shared weight applied to the batch's rows: one product (GEMV for one row, a
// few rows padded: ops/weight_grad.h), and with autograd the weight's gradient
// joins the round's single product for that weight.
// b: shared [m], per row [n, m] (bias_rows; x is [n, k]) or undefined.
inline at::Tensor shared_linear(RunCtx& c, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                bool bias_rows = false) {
  WeightGradBatcher* batcher = c.weight_grads();
  // W^T where the product reads it: several rows, and not plain autograd on W
  // (which needs W itself in the product for W's gradient).
  const bool grad = c10::GradMode::is_enabled();
  const bool plain_w_grad = !batcher && w.requires_grad() && grad;
  const bool reuse = c.transposed() && x.dim() == 2 && !plain_w_grad;
  // Packed first (ops/packed_gemm.h), one row included: the panels the other
  // batches read are warm, W itself is not. Else W^T for several rows. The
  // packed product records no autograd of its own: it serves where nothing
  // needs a gradient, or where the batcher's node gives x, W and b theirs (a
  // frozen W with autograd on goes through at::linear, which gives x and b theirs).
  const bool packable = (!grad || (batcher && w.requires_grad())) && packed_product_takes(x, b);
  std::shared_ptr<const PackedWeight> packed =
      reuse && packable ? c.transposed()->packed(w, grad && x.requires_grad(), x.size(0)) : nullptr;
  // (One output column is a GEMV on W's row, linear_rows: no W^T.)
  const at::Tensor* wt = reuse && !packed && x.size(0) > 1 && w.size(0) > 1 ? c.transposed()->get(w) : nullptr;
  if (batcher) return batcher->linear(x, w, b, wt, bias_rows, std::move(packed));
  return packed ? linear_packed(x, *packed, b) : linear_rows(x, w, b, wt);
}

// The same product over x's rows where they lie (no gradient is wanted):
// the packed product reads them in place; where it does not serve (no
// AVX2, a weight it does not take, a first product of 1-3 rows), the rows
// are copied into one tensor as a gather would have.
inline at::Tensor shared_linear_rows(RunCtx& c, const RowReads& x, const at::Tensor& w, const at::Tensor& b) {
  const auto m = static_cast<int64_t>(x.rows());
  const bool packable = c.transposed() && w.dim() == 2 && w.size(1) == x.width() &&
                        (!b.defined() || cpu_float(b));
  std::shared_ptr<const PackedWeight> packed = packable ? c.transposed()->packed(w, false, m) : nullptr;
  if (packed) return packed_mm_rows(x.data(), packed->forward, b, c.options());
  return shared_linear(c, x.materialize(std::array<int64_t, 2>{m, x.width()}), w, b);
}

// W x + b. W: [m, k] (shared or per example); x: [k] or [t, k]; b: [m].
struct Affine {
  static constexpr std::string_view name = "affine";
  static constexpr OpTraits traits{.arity = 3, .rowwise = true, .weights = 1, .rows_in_place = 1};
  static Shape infer(const InferCtx& c) {
    const Shape& w = c.shape(0);
    const Shape& x = c.shape(1);
    const Shape& b = c.shape(2);
    if (w.rank() != 2) c.fail("W must be a matrix [out, in], got ", w.str());
    if (x.rank() < 1 || x[x.rank() - 1] != w[1])
      c.fail("x has shape ", x.str(), " but W ", w.str(), " expects a last dimension of ", w[1]);
    if (!c.shared(0) && x.rank() > 2) c.fail("a per-example W needs x of rank 1 or 2, got ", x.str());
    if (b.rank() != 1 || b[0] != w[0]) c.fail("b has shape ", b.str(), " but W ", w.str(), " needs [", w[0], "]");
    Shape out = x;
    out[x.rank() - 1] = w[0];
    return out;
  }
  static at::Tensor run(RunCtx& c) {
    int rank = c.out_shape().rank();
    at::Tensor y;
    if (const RowReads* x = c.in_place(traits.rows_in_place)) return shared_linear_rows(c, *x, c.in(0), c.in(2));
    if (c.shared(0)) {
      if (c.shared(2)) return shared_linear(c, c.batched(1), c.in(0), c.in(2));
      const at::Tensor x = c.batched(1);
      // A bias per example (an LSTM's input projection as the recurrent
      // product's bias): added by the product itself, not by one more launch.
      if (x.dim() == 2) return shared_linear(c, x, c.in(0), c.batched(2), /*bias_rows=*/true);
      y = shared_linear(c, x, c.in(0), at::Tensor());
    } else {
      at::Tensor x = c.batched(1);
      y = x.dim() == 2 ? batched_matvec(c.in(0), x) : at::bmm(x, c.in(0).transpose(1, 2));
    }
    return y + c.aligned(2, rank);
  }
};

// A x, A B or x B. A: [m, k]; B: [k, p]; x: [k] (a vector).
//
// Over values of different lengths: A x packs by A's rows (one element each,
// an attention's scores), and x B with per-example x and B reduces their rows
// (an attention's context: its weights times the rows they weigh).
struct Matmul {
  static constexpr std::string_view name = "matmul";
  // Packed A x and row-reduced x B read gathered rows in place (ops/row_reads.h):
  // an attention step's encoder rows are not copied for each step.
  static constexpr OpTraits traits{
      .arity = 2, .rowwise = true, .weights = 2, .row_args = 1, .row_reduce = true, .reads_in_place = 0b11};
  static Shape infer(const InferCtx& c) {
    const Shape& a = c.shape(0);
    const Shape& b = c.shape(1);
    if (a.rank() == 1) {
      if (b.rank() != 2 || b[0] != a[0])
        c.fail("shapes ", a.str(), " and ", b.str(), " do not multiply (a vector times a matrix ",
               b.rank() == 1 ? "of its length; for two vectors, dsl::dot)" : "of its length)");
      return Shape{b[1]};
    }
    if (a.rank() != 2) c.fail("the left operand must be a matrix or a vector, got ", a.str());
    if (b.rank() < 1 || b.rank() > 2 || b[0] != a[1])
      c.fail("shapes ", a.str(), " and ", b.str(), " do not multiply");
    return b.rank() == 1 ? Shape{a[0]} : Shape{a[0], b[1]};
  }
  static at::Tensor run(RunCtx& c) {
    // Rows read in place (OpTraits::reads_in_place) come only to the first two
    // forms: the executor gives none to a batch with a shared argument.
    if (!c.segment_counts().empty()) {  // x B, rows
      if (c.in_place(0) || c.in_place(1))
        return weighted_row_sums(RowOperand{c.in(0), c.in_place(0)}, RowOperand{c.in(1), c.in_place(1)},
                                 c.segment_counts());
      return segment_weighted_sum(c.in(0), c.in(1), c.segment_counts(), c.segment_ids());
    }
    // A's rows [R, k] times the example's x on each row ([R, k]): a dot product
    // per row, one loop and one autograd node.
    if (c.packed() && !c.shared(1)) return dot_rows(RowOperand{c.in(0), c.in_place(0)}, RowOperand{c.in(1), c.in_place(1)});
    const at::Tensor& a = c.in(0);
    const at::Tensor& b = c.in(1);
    if (c.packed()) return at::matmul(a, b);  // A's rows [R, k] times a shared B
    if (a.dim() - (c.shared(0) ? 0 : 1) == 1) {  // x B
      if (c.shared(0) || c.shared(1)) return at::matmul(a, b);
      return at::bmm(a.unsqueeze(1), b).squeeze(1);
    }
    const bool vec = c.out_shape().rank() == 1;
    if (c.shared(0)) return vec ? shared_linear(c, b, a, at::Tensor()) : at::matmul(a, b);
    if (c.shared(1)) return at::matmul(a, b);
    return vec ? batched_matvec(a, b) : at::bmm(a, b);
  }
};

}  // namespace sheaf::op
