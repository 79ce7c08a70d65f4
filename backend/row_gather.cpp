#include "row_gather.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>

#include <sheaf/core/error.h>

#include <sheaf/ops/autograd_node.h>
#include <sheaf/ops/output_pool.h>

#include "row_copies.h"

namespace sheaf {

namespace {

using torch::autograd::variable_list;

int64_t address(const float* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); }

// The copy table of one gather (or of one reader's backward), emptied: one per
// thread, reused, so that a gather allocates nothing once it has grown.
std::vector<RowCopy>& copy_table() {
  thread_local std::vector<RowCopy> table;
  table.clear();
  return table;
}

int64_t row_numel(const at::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

// The source's gradient: every reader adds its rows here, one sum per
// backward pass (two passes at once through one graph each get their own).
struct HubNode : torch::autograd::Node {
  std::shared_ptr<detail::PerPass<at::Tensor>> grads = std::make_shared<detail::PerPass<at::Tensor>>();
  std::vector<int64_t> sizes;
  at::TensorOptions options;

  std::string name() const override { return "sheaf::GatherHub"; }
  // With grads->mutex() held: the current pass's sum, zeros at first.
  float* buffer() { return grads->get([&] { return at::zeros(sizes, options); }).data_ptr<float>(); }
  variable_list apply(variable_list&& /*nothing: readers write into `grads`*/) override {
    variable_list out(1);
    if (std::optional<at::Tensor> g = grads->take()) out[0] = std::move(*g);
    detail::once_differentiable(*this, {}, out, "sheaf::GatherHub");
    return out;
  }
};

using HubPtr = decltype(detail::make_node<HubNode>());

// The hubs of a reader's sources locked (in address order: two readers never
// wait on each other crosswise) and their buffers, per source (null: no hub).
struct HubBuffers {
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<float*> buf;
};
HubBuffers lock_buffers(const std::vector<HubPtr>& hubs) {
  std::vector<HubNode*> order;
  for (const HubPtr& h : hubs)
    if (h) order.push_back(h.get());
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  HubBuffers out;
  out.locks.reserve(order.size());
  for (HubNode* h : order) out.locks.emplace_back(h->grads->mutex());
  out.buf.assign(hubs.size(), nullptr);
  for (size_t k = 0; k < hubs.size(); ++k)
    if (hubs[k]) out.buf[k] = hubs[k]->buffer();
  return out;
}

struct ReaderNode : torch::autograd::Node {
  std::vector<HubPtr> hubs;  // per source; null where the source needs no gradient
  std::vector<RowPick> rows;  // segment-major: segments runs of n
  std::vector<int64_t> width;  // per source: floats per row
  size_t segments = 1;

  std::string name() const override { return "sheaf::GatherRowsBackward"; }
  variable_list apply(variable_list&& grads) override {
    variable_list none(hubs.size());
    if (grads.empty() || !grads[0].defined()) return none;
    RECORD_FUNCTION("sheaf::gather", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)
    const at::Tensor g = grads[0].contiguous();
    const float* gp = g.data_ptr<float>();
    // Only the hubs autograd follows this time (a partial backward skips the
    // others: they will not run, and what they were given would be dropped
    // unread when the pass ends).
    std::vector<HubPtr> wanted(hubs.size());
    for (size_t k = 0; k < hubs.size(); ++k)
      if (hubs[k] && task_should_compute_output(k)) wanted[k] = hubs[k];
    HubBuffers hb = lock_buffers(wanted);
    const size_t n = rows.size() / segments;
    const int64_t out_width = g.numel() / static_cast<int64_t>(std::max<size_t>(n, 1));
    std::vector<RowCopy>& pieces = copy_table();
    int64_t col = 0;
    for (size_t seg = 0; seg < segments; ++seg) {
      const RowPick* picks = rows.data() + seg * n;
      const int64_t d = n ? width[picks[0].source] : 0;
      for (size_t i = 0; i < n; ++i) {
        float* dst = hb.buf[picks[i].source];
        if (dst == nullptr) continue;
        pieces.push_back(RowCopy{address(gp + static_cast<int64_t>(i) * out_width + col),
                                 address(dst + static_cast<int64_t>(picks[i].row) * d), d});
      }
      col += d;
    }
    run_row_copies(pieces, /*add=*/true, g.device());
    return none;
  }
};

// Attaches a reader node to `out` (rows picked from sources with these hubs,
// null where no gradient is needed): its backward adds into the hubs.
void attach_reader(at::Tensor& out, std::vector<HubPtr> hubs, std::span<const RowPick> rows,
                   std::vector<int64_t> width, size_t segments, const std::vector<at::Tensor>& dummies) {
  auto node = detail::make_node<ReaderNode>();
  node->rows.assign(rows.begin(), rows.end());
  node->width = std::move(width);
  node->segments = segments;
  torch::autograd::edge_list edges(hubs.size());
  for (size_t k = 0; k < hubs.size(); ++k)
    if (hubs[k]) edges[k] = torch::autograd::impl::gradient_edge(dummies[k]);
  node->hubs = std::move(hubs);
  node->set_next_edges(std::move(edges));
  torch::autograd::set_history(out, node);
}

}  // namespace

struct RowGathers::Hub {
  HubPtr node;
  at::Tensor dummy;  // 0 elements; the hub's only output: readers' edges point here
  at::Tensor source;  // whose gradient it gathers (held: its address names it)
  std::optional<c10::Stream> stream;  // current when it was made (none on the CPU)
};

RowGathers::RowGathers() = default;
RowGathers::~RowGathers() = default;

bool RowGathers::readable(const at::Tensor& t) {
  if (!t.defined() || !row_copies_on(t.device()) || t.scalar_type() != at::kFloat || t.dim() < 1) return false;
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

std::shared_ptr<RowGathers::Hub> RowGathers::hub_for(uint32_t batch, const at::Tensor& source) {
  std::shared_ptr<Hub>& slot = hubs_[batch];
  // A later round's readers join the hub of an earlier one only where it
  // hands its buffer where theirs would go: the same tensor (a view made
  // anew each round, rows of rows, is another), with the same autograd
  // history (not rewritten in place since), and on the same stream (autograd
  // orders a hub after its readers by stream; readers send it nothing to
  // synchronise on).
  const torch::autograd::Edge edge = torch::autograd::impl::gradient_edge(source);
  const std::optional<c10::Stream> stream =
      source.is_cpu() ? std::nullopt
                      : std::optional(c10::impl::getDeviceGuardImpl(source.device().type())->getStream(source.device()));
  if (slot && slot->source.is_same(source) && slot->node->next_edge(0) == edge && slot->stream == stream) return slot;
  auto hub = std::make_shared<Hub>();
  hub->source = source;
  hub->stream = stream;
  hub->node = detail::make_node<HubNode>();
  hub->node->sizes = source.sizes().vec();
  hub->node->options = source.options().requires_grad(false);
  hub->node->set_next_edges({edge});
  hub->dummy = at::empty({0}, hub->node->options);
  torch::autograd::set_history(hub->dummy, hub->node);
  slot = hub;
  return hub;
}

at::Tensor RowGathers::gather(std::span<const at::Tensor* const> sources, std::span<const uint32_t> batches,
                              std::span<const RowPick> rows) {
  SHEAF_ASSERT(!sources.empty(), "row gather without sources");
  std::vector<int64_t> sizes = sources[0]->sizes().vec();
  sizes[0] = static_cast<int64_t>(rows.size());
  return gather(sources, batches, rows, 1, sizes);
}

at::Tensor RowGathers::gather(std::span<const at::Tensor* const> sources, std::span<const uint32_t> batches,
                              std::span<const RowPick> rows, size_t segments, std::span<const int64_t> out_sizes) {
  SHEAF_ASSERT(!sources.empty() && sources.size() == batches.size() && segments > 0 && rows.size() % segments == 0,
               "row gather without sources");
  RECORD_FUNCTION("sheaf::gather", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)
  const size_t n = rows.size() / segments;
  c10::SmallVector<const float*, 8> base(sources.size());
  c10::SmallVector<int64_t, 8> stride(sources.size()), width(sources.size());
  bool needs_grad = false;
  for (size_t k = 0; k < sources.size(); ++k) {
    const at::Tensor& s = *sources[k];
    SHEAF_ASSERT(readable(s), "row gather source ", k, " is not readable by rows: ", s.sizes(), " ", s.strides());
    base[k] = s.data_ptr<float>();
    width[k] = row_numel(s);
    stride[k] = width[k] == 0 ? 0 : s.stride(0);  // rows of no floats: a null base plus nothing
    needs_grad = needs_grad || s.requires_grad();
  }
  at::Tensor out =
      empty_output(at::IntArrayRef(out_sizes.data(), out_sizes.size()), sources[0]->options().requires_grad(false));
  SHEAF_ASSERT(out.size(0) == static_cast<int64_t>(n), "row gather of ", n, " rows into ", out.sizes());
  float* o = out.data_ptr<float>();
  const int64_t out_width = row_numel(out);
  std::vector<RowCopy>& pieces = copy_table();
  int64_t col = 0;
  for (size_t seg = 0; seg < segments; ++seg) {
    const RowPick* picks = rows.data() + seg * n;
    const int64_t d = n ? width[picks[0].source] : 0;
    for (size_t i = 0; i < n; ++i) {
      const RowPick& r = picks[i];
      SHEAF_ASSERT(width[r.source] == d, "row gather segment ", seg, " mixes rows of ", d, " and ", width[r.source]);
      pieces.push_back(RowCopy{address(base[r.source] + static_cast<int64_t>(r.row) * stride[r.source]),
                               address(o + static_cast<int64_t>(i) * out_width + col), d});
    }
    col += d;
  }
  run_row_copies(pieces, /*add=*/false, out.device());
  SHEAF_ASSERT(col == out_width, "row gather segments cover ", col, " of ", out_width, " columns");
  if (!needs_grad || !at::GradMode::is_enabled()) return out;
  std::vector<HubPtr> hubs(sources.size());
  std::vector<at::Tensor> dummies(sources.size());
  for (size_t k = 0; k < sources.size(); ++k) {
    if (!sources[k]->requires_grad()) continue;
    std::shared_ptr<Hub> hub = hub_for(batches[k], *sources[k]);
    hubs[k] = hub->node;
    dummies[k] = hub->dummy;
  }
  attach_reader(out, std::move(hubs), rows, std::vector<int64_t>(width.begin(), width.end()), segments, dummies);
  return out;
}

struct InPlaceRows::Impl {
  struct Source {
    at::Tensor tensor;
    HubPtr hub;          // null: no gradient
    at::Tensor dummy;    // the hub's edge (with a hub)
    int64_t version = -1;  // when read (check_unchanged)
    // Where its rows were when read: a storage swapped since (set_data, a
    // resize_ that moved it) bumps no version, and the row pointers would
    // then read freed memory.
    const void* data = nullptr;
  };
  // (Inline: in inference a read of rows in place is two allocations, these
  // rows with this and their row pointers; with a vector per field it was
  // ten, a fifth of a gated net's allocations.)
  c10::SmallVector<Source, 4> sources;
  std::vector<torch::autograd::Edge> edges;  // to the hubs of the sources that need a gradient
  std::vector<RowPick> picks;                // with a gradient only (lock_grad_rows, materialize)
  Site reader;
};

// In-place rows and their Impl, made as one.
struct InPlaceRowsBlock final : InPlaceRows {
  InPlaceRows::Impl impl;
};

std::shared_ptr<const InPlaceRows> RowGathers::in_place(std::span<const at::Tensor* const> sources,
                                                        std::span<const uint32_t> batches,
                                                        std::span<const RowPick> rows, const Site& reader) {
  SHEAF_ASSERT(!sources.empty() && sources.size() == batches.size(), "in-place rows without sources");
  auto out = std::make_shared<InPlaceRowsBlock>();
  InPlaceRows::Impl& impl = out->impl;
  out->impl_ = &impl;
  impl.reader = reader;
  const bool grad = at::GradMode::is_enabled();
  c10::SmallVector<const float*, 8> base(sources.size());
  c10::SmallVector<int64_t, 8> stride(sources.size());
  int64_t width = 0;
  impl.sources.reserve(sources.size());
  for (size_t k = 0; k < sources.size(); ++k) {
    const at::Tensor& s = *sources[k];
    SHEAF_ASSERT(readable(s) && s.device().is_cpu(), "in-place source ", k, " is not readable by rows: ", s.sizes(), " ", s.strides());
    base[k] = s.data_ptr<float>();
    const int64_t w = row_numel(s);
    if (k == 0) width = w;
    SHEAF_ASSERT(w == width, "in-place rows of ", width, " and ", w, " floats");
    stride[k] = w == 0 ? 0 : s.stride(0);  // rows of no floats: a null base plus nothing
    InPlaceRows::Impl::Source& src = impl.sources.emplace_back();
    src.tensor = s;
    src.version = version_of(s);
    src.data = base[k];
    if (grad && s.requires_grad()) {
      std::shared_ptr<Hub> hub = hub_for(batches[k], s);
      src.hub = hub->node;
      src.dummy = hub->dummy;
      impl.edges.push_back(torch::autograd::impl::gradient_edge(hub->dummy));
    }
  }
  if (!impl.edges.empty()) impl.picks.assign(rows.begin(), rows.end());
  out->data_.reserve(rows.size());
  for (const RowPick& r : rows) out->data_.push_back(base[r.source] + static_cast<int64_t>(r.row) * stride[r.source]);
  out->width_ = width;
  out->num_edges_ = impl.edges.size();
  return out;
}

int64_t version_of(const at::Tensor& t) { return !t.defined() || t.is_inference() ? -1 : t._version(); }

void check_version(const Site& reader, std::string_view by, const at::Tensor& t, int64_t then) {
  if (then < 0) return;
  if (const int64_t now = t._version(); now != then)
    throw_user(reader, by, " reads again a tensor of shape ", t.sizes(), " that it read at forward(), and that tensor "
               "was changed in place since (its version is ", now, ", it was ", then, "): the result would use the "
               "new values. Write into a copy (value().clone()), or write after backward() and after reading the "
               "values you need (a table: update it after backward(), or clear() the graph)");
}

void InPlaceRows::check_unchanged(std::string_view by) const {
  const Impl& m = *impl_;
  for (const Impl::Source& src : m.sources) {
    const at::Tensor& t = src.tensor;
    if (t.data_ptr() != src.data)
      throw_user(m.reader, by, " reads again a tensor of shape ", t.sizes(), " that it read at forward(), and that "
                 "tensor's storage was replaced since (set_data, or a resize_ that moved it): the rows read then are "
                 "gone. Replace it after backward(), or clear() the graph first");
    check_version(m.reader, by, t, src.version);
  }
}

void InPlaceRows::append_edges(std::vector<torch::autograd::Edge>& edges) const {
  edges.insert(edges.end(), impl_->edges.begin(), impl_->edges.end());
}

RowReads::GradRows InPlaceRows::lock_grad_rows(std::span<const RowReads* const> reads,
                                               const std::function<bool(size_t read, size_t edge)>& wanted) const {
  // Every read's hubs, one lock set for all. A hub whose edge autograd does not
  // follow this time (a partial backward) is left alone: it will not run, and
  // what it was given would be dropped unread when the pass ends.
  std::vector<const InPlaceRows*> mine(reads.size());
  std::vector<HubPtr> hubs;
  for (size_t q = 0; q < reads.size(); ++q) {
    mine[q] = dynamic_cast<const InPlaceRows*>(reads[q]);
    SHEAF_ASSERT(mine[q] != nullptr, "rows read in place that the row gathers did not make");
    size_t edge = 0;
    for (const Impl::Source& src : mine[q]->impl_->sources) {
      const HubPtr& h = src.hub;
      if (!h) {
        hubs.emplace_back();
        continue;
      }
      hubs.push_back(wanted(q, edge++) ? h : HubPtr());
    }
  }
  HubBuffers hb = lock_buffers(hubs);
  GradRows g;
  size_t first = 0;  // this read's sources in hb.buf
  for (const InPlaceRows* r : mine) {
    std::vector<float*>& rows = g.rows.emplace_back();
    rows.reserve(r->impl_->picks.size());
    for (const RowPick& p : r->impl_->picks) {
      float* buf = hb.buf[first + p.source];
      rows.push_back(buf ? buf + static_cast<int64_t>(p.row) * r->width_ : nullptr);
    }
    first += r->impl_->sources.size();
  }
  g.locks = std::move(hb.locks);
  return g;
}

at::Tensor InPlaceRows::materialize(std::span<const int64_t> sizes) const {
  RECORD_FUNCTION("sheaf::gather", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)
  at::Tensor out = empty_output(at::IntArrayRef(sizes.data(), sizes.size()),
                             impl_->sources[0].tensor.options().requires_grad(false));
  SHEAF_ASSERT(out.numel() == static_cast<int64_t>(data_.size()) * width_, "in-place rows of ", data_.size(),
               " x ", width_, " into ", out.sizes());
  float* o = out.data_ptr<float>();
  for (size_t i = 0; i < data_.size() && width_ > 0; ++i)  // rows of no floats may be null pointers
    std::memcpy(o + static_cast<int64_t>(i) * width_, data_[i], static_cast<size_t>(width_) * sizeof(float));
  if (needs_grad() && at::GradMode::is_enabled()) {
    std::vector<HubPtr> hubs;
    std::vector<at::Tensor> dummies;
    for (const Impl::Source& src : impl_->sources) {
      hubs.push_back(src.hub);
      dummies.push_back(src.dummy);
    }
    attach_reader(out, std::move(hubs), impl_->picks, std::vector<int64_t>(impl_->sources.size(), width_), 1, dummies);
  }
  return out;
}

}  // namespace sheaf
