#include "weight_grad.h"

#include <ATen/ops/addmm.h>
#include <ATen/ops/addmv.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mv.h>
#include <ATen/ops/sum.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include "autograd_node.h"
#include "cpu_float.h"
#include "grad_wanted.h"
#include "matvec.h"

namespace sheaf {

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// What the linears of one weight leave for its gradient in one backward
// pass: (dY, X) per batch. Kept per pass (detail::PerPass): two passes at
// once through one graph each take their own, and a pass's rows go when it
// is over (one that threw before the weight's node ran leaves them).
struct Pending {
  at::Tensor dy, x;
};
using Rows = detail::PerPass<std::vector<Pending>>;

// Runs after every linear of its weight has had its backward: dW and db at once.
struct WeightGradNode : torch::autograd::Node {
  std::shared_ptr<Rows> rows;
  bool has_bias = false;
  std::string name() const override { return "sheaf::WeightGradBackward"; }
  variable_list apply(variable_list&&) override {
    variable_list out(has_bias ? 2 : 1);
    const bool want_w = task_should_compute_output(0), want_b = has_bias && task_should_compute_output(1);
    std::optional<std::vector<Pending>> taken = rows->take();
    if (!taken || taken->empty() || (!want_w && !want_b)) return out;
    std::vector<Pending>& mine = *taken;
    RECORD_FUNCTION("sheaf::weight_grad", std::vector<c10::IValue>());
    std::vector<at::Tensor> dys, xs;
    for (Pending& p : mine) {
      dys.push_back(std::move(p.dy));
      xs.push_back(std::move(p.x));
    }
    const at::Tensor dy = dys.size() == 1 ? dys[0] : at::cat(dys);
    if (want_w) out[0] = at::mm(dy.t(), xs.size() == 1 ? xs[0] : at::cat(xs));
    if (want_b) out[1] = at::sum(dy, 0);
    detail::once_differentiable(*this, {}, out, "sheaf::WeightGradBackward");
    return out;
  }
};

// One batch's x W^T + b: dX now, (dY, X) for the weight's node; with a bias
// per row (bias_rows), its gradient dY too.
struct LinearNode : torch::autograd::Node {
  std::shared_ptr<Rows> rows;
  SavedVariable x, w;
  std::shared_ptr<const PackedWeight> packed;  // W laid out for dX = dY W, or null
  std::vector<int64_t> x_sizes, b_sizes;
  bool bias_rows = false;
  std::string name() const override { return "sheaf::LinearBackward"; }
  void release_variables() override {
    x.reset_data();
    w.reset_data();
    packed.reset();
  }
  variable_list apply(variable_list&& grads) override {
    variable_list out(3);
    if (!grads[0].defined()) return out;
    const at::Tensor weight = w.unpack();
    // Rows counted from x's sizes, not inferred (-1): a weight with no
    // columns or no rows leaves nothing to infer them from.
    const int64_t m = c10::multiply_integers(x_sizes.begin(), x_sizes.end() - 1);
    const at::Tensor dy = grads[0].reshape({m, weight.size(0)});
    if (task_should_compute_output(0))
      out[0] = (packed && packed->backward.defined() ? packed_mm(dy, packed->backward)
                                                                         : at::mm(dy, weight))
                   .view(x_sizes);
    if (bias_rows && task_should_compute_output(2)) out[2] = grads[0].reshape(b_sizes);
    // Only where this backward runs the weight's node: rows left behind by a
    // partial backward would be counted again by the next one.
    if (task_should_compute_output(1)) {
      at::Tensor rows_x = x.unpack().reshape({m, weight.size(1)});
      std::lock_guard<std::mutex> lock(rows->mutex());
      rows->get([] { return std::vector<Pending>(); }).push_back({dy, std::move(rows_x)});
    }
    detail::once_differentiable(*this, grads, out, "sheaf::LinearBackward");
    return out;  // the weight's and a shared bias's gradients come from WeightGradNode
  }
};

}  // namespace

struct WeightGradBatcher::Tap {
  std::shared_ptr<Rows> rows = std::make_shared<Rows>();
  decltype(detail::make_node<WeightGradNode>()) node;
};

WeightGradBatcher::WeightGradBatcher() = default;
WeightGradBatcher::~WeightGradBatcher() = default;

bool TransposedWeights::Seen::matches(const at::Tensor& w) const {
  return data == w.data_ptr() && version == w._version() && rows == w.size(0) && cols == w.size(1) &&
         row_stride == w.stride(0) && col_stride == w.stride(1);
}

void TransposedWeights::Seen::take(const at::Tensor& w) {
  data = w.data_ptr();
  version = w._version();
  rows = w.size(0);
  cols = w.size(1);
  row_stride = w.stride(0);
  col_stride = w.stride(1);
}

const at::Tensor* TransposedWeights::get(const at::Tensor& w) {
  // Inference tensors have no version counter to tell an update by.
  if (w.dim() != 2 || !w.is_cpu() || w.is_inference()) return nullptr;
  // Where W^T reads faster (bench table in weight_grad.h): an inner size that is
  // not a multiple of 128, or a small weight; and not past the sizes measured
  // (an output layer over a vocabulary would be copied for little).
  const int64_t entries = w.size(0) * w.size(1);
  if ((w.size(1) % 128 == 0 && entries > 65536) || entries > (int64_t{1} << 20)) return nullptr;
  for (Entry& e : entries_) {
    if (!e.w.is_same(w)) continue;
    if (!e.seen.matches(w)) {  // start again
      e.seen.take(w);
      e.wt = at::Tensor();
      return nullptr;
    }
    if (!e.wt.defined()) e.wt = w.detach().t().contiguous();
    return &e.wt;
  }
  Entry& e = entries_.emplace_back();
  e.w = w;
  e.seen.take(w);
  return nullptr;
}

void TransposedWeights::clear() {
  entries_.clear();
  // Kept: layouts with their copy, and decisions not to lay a weight out
  // (made from its sizes and strides, which the next use matches, whatever its bytes).
  std::erase_if(packed_, [&](const PackedEntry& e) {
    return e.used != generation_ || (e.suits && !e.bytes.defined());
  });
  for (PackedEntry& e : packed_) e.check = e.bytes.defined();
  ++generation_;
}

void TransposedWeights::check_kept(PackedEntry& e, const at::Tensor& w) {
  e.check = false;
  const size_t size = static_cast<size_t>(e.bytes.numel()) * sizeof(float);
  if (e.seen.matches(w) && w.is_cpu() && w.is_contiguous() && w.scalar_type() == at::kFloat &&
      std::memcmp(w.data_ptr(), e.bytes.data_ptr(), size) == 0)
    return;
  // Changed where the version counter did not see: packed() takes it as new
  // (decided and laid out again, its copy dropped).
  e.seen = Seen{};
}

std::shared_ptr<const PackedWeight> TransposedWeights::packed(const at::Tensor& w, bool backward, int64_t rows) {
  if (!packing_ || !packed_gemm_available() || w.dim() != 2 || w.is_inference()) return nullptr;
  PackedEntry* e = nullptr;
  for (PackedEntry& f : packed_)
    if (f.w.is_same(w)) e = &f;
  if (e) {
    e->used = generation_;
    if (e->check) check_kept(*e, w);
  }
  // A product OpenBLAS's own threads run faster: its layout, if any, stays
  // for the weight's smaller products (kept as used).
  if (!packed_gemm_serves(rows, w.size(1), w.size(0))) return nullptr;
  // Seen before and unchanged: decided without making a tensor (a weight is
  // applied at every level of every tree; the view W^T cost more than this).
  const bool same = e && e->seen.matches(w);
  if (same && !e->suits) return nullptr;
  if (same && e->packed && (!backward || e->packed->backward.defined() || !e->backward_suits)) return e->packed;
  const at::Tensor wt = w.detach().t();
  if (!e) {
    e = &packed_.emplace_back();
    e->w = w;
    e->used = generation_;
  }
  if (!same) {  // new, changed in place, re-seated or reshaped
    e->seen.take(w);
    e->suits = packed_gemm_suits(wt);
    e->backward_suits = packed_gemm_suits(w.detach());
    e->packed = nullptr;
    e->bytes = at::Tensor();
  }
  if (!e->suits || (!e->packed && rows < 4)) return nullptr;
  backward = backward && e->backward_suits;
  // A fresh object for a new layout: a backward still holding the old one keeps it.
  if (!e->packed || (backward && !e->packed->backward.defined())) {
    auto p = std::make_shared<PackedWeight>();
    p->forward = e->packed ? e->packed->forward : pack_matrix(wt);
    if (backward) p->backward = pack_matrix(w.detach());
    // Inference (autograd off): W likely stays as it is for the next graph;
    // keep a copy to tell (clear()). Not in training, where a layout without
    // a backward form (a first layer's input wants no gradient) is made again
    // after every step. Not past 4Mi entries (16 MiB a copy), beyond what was measured.
    const bool inference = !backward && !c10::GradMode::is_enabled();
    if (inference && !e->bytes.defined() && w.is_contiguous() && w.numel() <= (int64_t{1} << 22))
      e->bytes = w.detach().clone();
    else if (!inference)
      e->bytes = at::Tensor();
    e->packed = std::move(p);
  }
  return e->packed;
}

at::Tensor linear_packed(const at::Tensor& x, const PackedWeight& w, const at::Tensor& b) {
  return packed_mm(x, w.forward, b);
}

namespace {

// x [m, k] W^T + b from wt = W^T [k, n].
at::Tensor product_t(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& b) {
  return b.defined() ? at::addmm(b, x, wt) : at::mm(x, wt);
}

}  // namespace

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor* wt) {
  // A bias per row of x (a [1, m] bias broadcasts as before).
  const bool bias_rows = b.defined() && b.dim() == 2 && x.dim() == 2 && b.size(0) == x.size(0) && b.size(0) > 1;
  const int64_t m = x.dim() == 2 ? x.size(0) : 0;
  // One output column (a gate's score) is a GEMV: OpenBLAS's GEMM runs a single
  // column through its kernel's full width ([100, 256] x [256, 1] on a Zen 1
  // core, 1 thread: addmm 17.5 us, addmv 7.4; at 400 rows 58 and 16). Without
  // autograd, one loop (ops/matvec.h), for one row too; with it (a frozen W
  // whose x or bias wants a gradient), addmv.
  const bool one_column = m > 0 && w.size(0) == 1 && x.is_cpu();
  // What the loops of ops/matvec.h take: float rows on the CPU, no gradient.
  auto takes = [](const at::Tensor& t) { return !t.defined() || cpu_float(t); };
  auto loop_takes = [&] { return m > 0 && takes(x) && takes(w) && takes(b) && !grad_wanted(x, w, b); };
  if (one_column && loop_takes()) return rows_dot(x, w, b);
  // A few output columns (a classifier's classes): one loop, as above, on
  // one thread (past ~1M inputs OpenBLAS's threads may pay).
  if (m > 0 && w.dim() == 2 && w.size(0) >= 1 && w.size(0) <= kNarrowRows && m * x.size(1) <= (int64_t{1} << 20) &&
      (!b.defined() || (b.dim() == 1 && b.numel() == w.size(0))) && loop_takes())
    return narrow_product(x, w, b);
  if (m == 1) {
    at::Tensor y = b.defined() ? at::addmv(b.dim() == 2 ? b[0] : b, w, x[0]) : at::mv(w, x[0]);
    return y.unsqueeze(0);
  }
  if (one_column) {
    const at::Tensor v = w[0];
    const at::Tensor y =
        b.defined() ? at::addmv(bias_rows ? b.reshape({m}) : b.reshape({1}).expand({m}), x, v) : at::mv(x, v);
    return y.unsqueeze(1);
  }
  // Padding costs a copy and a launch (~1-2 us): it pays for large weights,
  // and for mid-sized ones only where it adds a single row (OpenBLAS on Zen 5,
  // 1 thread: [640, 288] at 11 rows 89 us, padded 61; [128, 416] at 11 rows
  // 26 us, padded 19, at 29 rows 36 us, padded 37; [2, 64] 2 us, padded 3).
  // A CPU BLAS trait: on CUDA the pad would be one more kernel launch.
  const int64_t size = w.size(0) * w.size(1);
  const bool pad = x.is_cpu() && (m % 4 == 3 ? size >= 16384 : size >= 131072);
  if (m > 0 && m < 64 && m % 4 != 0 && pad) {
    at::Tensor padded = at::constant_pad_nd(x, {0, 0, 0, 4 - m % 4});
    const at::Tensor pb = bias_rows ? at::constant_pad_nd(b, {0, 0, 0, 4 - m % 4}) : b;
    return (wt ? product_t(padded, *wt, pb) : at::linear(padded, w, pb)).narrow(0, 0, m);
  }
  return m > 0 && wt ? product_t(x, *wt, b) : at::linear(x, w, b);
}

at::Tensor WeightGradBatcher::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                     const at::Tensor* wt, bool bias_rows, std::shared_ptr<const PackedWeight> packed) {
  if (!c10::GradMode::is_enabled()) return packed ? linear_packed(x, *packed, b) : linear_rows(x, w, b, wt);
  // A frozen weight leaves nothing to batch: plain autograd for x and the bias
  // (the packed product records none).
  if (!w.requires_grad()) return linear_rows(x, w, b, wt);
  at::Tensor y;
  {
    c10::AutoGradMode no_grad(false);
    y = packed ? linear_packed(x, *packed, b) : linear_rows(x, w, b, wt);
  }
  // The weight's node, made at its first use in this round; a bias per row is
  // not its business (each batch's node hands that gradient on).
  const at::Tensor none;
  const at::Tensor& shared_b = bias_rows ? none : b;
  const std::pair<const void*, const void*> key{w.unsafeGetTensorImpl(),
                                                shared_b.defined() ? shared_b.unsafeGetTensorImpl() : nullptr};
  std::shared_ptr<Tap> tap;
  for (auto& [k, t] : taps_)
    if (k == key) tap = t;
  if (!tap) {
    tap = std::make_shared<Tap>();
    tap->node = detail::make_node<WeightGradNode>();
    tap->node->rows = tap->rows;
    tap->node->has_bias = shared_b.defined();
    torch::autograd::edge_list edges{torch::autograd::impl::gradient_edge(w)};
    tap->node->add_input_metadata(w);
    if (shared_b.defined()) {
      edges.push_back(torch::autograd::impl::gradient_edge(shared_b));
      tap->node->add_input_metadata(shared_b);
    }
    tap->node->set_next_edges(std::move(edges));
    taps_.emplace_back(key, tap);
  }
  auto node = detail::make_node<LinearNode>();
  node->rows = tap->rows;
  node->x = SavedVariable(x, /*is_output=*/false);
  node->w = SavedVariable(w, /*is_output=*/false);
  node->packed = std::move(packed);
  node->x_sizes = x.sizes().vec();
  node->bias_rows = bias_rows;
  if (bias_rows) node->b_sizes = b.sizes().vec();
  node->set_next_edges({torch::autograd::impl::gradient_edge(x), torch::autograd::Edge(tap->node, 0),
                        bias_rows          ? torch::autograd::impl::gradient_edge(b)
                        : b.defined()      ? torch::autograd::Edge(tap->node, 1)
                                           : torch::autograd::Edge()});
  torch::autograd::set_history(y, node);
  return y;
}

}  // namespace sheaf
