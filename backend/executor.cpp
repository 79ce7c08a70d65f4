#include "executor.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/split_with_sizes.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <set>
#include <sstream>

#include "../dsl/op.h"
#include "gather.h"
#include "runtime.h"

namespace sheaf {

at::Tensor Executor::read(const Plan& plan, uint32_t r) {
  const Read& rd = plan.reads[r];
  const at::Tensor& src = s_.batch_out[rd.batch];
  if (rd.start == kWholeRow) return src.unsqueeze(0);  // a shared value inside a shared computation
  if (rd.group >= 0) {
    auto& outs = groups_[static_cast<size_t>(rd.group)];
    if (outs.empty()) {
      std::vector<RowRead> reads;
      for (uint32_t q : plan.groups[static_cast<size_t>(rd.group)]) {
        const Read& x = plan.reads[q];
        reads.push_back(x.index >= 0 ? RowRead{0, x.len, index_.narrow(0, x.index, x.len)} : RowRead{x.start, x.len, {}});
      }
      outs = gather_rows(src, reads);
      ++stats_.gather_launches;
    }
    return outs[rd.slot];
  }
  if (rd.index >= 0) {
    ++stats_.gather_launches;
    return src.index_select(0, index_.narrow(0, rd.index, rd.len));
  }
  if (rd.start == 0 && rd.len == src.size(0)) return src;
  return src.narrow(0, rd.start, rd.len);
}

at::Tensor Executor::input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg) {
  switch (arg.kind) {
    case BatchArg::kShared: {
      const at::Tensor& t = s_.batch_out[plan.reads[arg.reads_begin].batch];
      shared_.push_back(!b.shared);
      return b.shared ? t.unsqueeze(0) : t;
    }
    case BatchArg::kView:
      shared_.push_back(0);
      ++stats_.zero_copy_inputs;
      return read(plan, arg.reads_begin);
    case BatchArg::kGather: {
      shared_.push_back(0);
      std::vector<at::Tensor> pieces;
      pieces.reserve(arg.reads_end - arg.reads_begin);
      for (uint32_t q = arg.reads_begin; q < arg.reads_end; ++q) pieces.push_back(read(plan, q));
      at::Tensor x = pieces.size() == 1 ? pieces[0] : at::cat(pieces);
      if (pieces.size() > 1) ++stats_.gather_launches;
      if (arg.perm >= 0) {
        x = x.index_select(0, index_.narrow(0, arg.perm, x.size(0)));
        ++stats_.gather_launches;
      }
      ++stats_.gathered_inputs;
      stats_.gathered_bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
      return x;
    }
  }
  throw_internal("bad input kind");
}

at::Tensor Executor::split_piece(const Plan& plan, const PlannedBatch& b) {
  auto& pieces = splits_[static_cast<size_t>(b.split)];
  if (pieces.empty()) {
    const SplitGroup& g = plan.splits[static_cast<size_t>(b.split)];
    pieces = s_.batch_out[g.batch].split_with_sizes(g.sizes, g.axis);
  }
  return pieces[b.piece];
}

size_t Executor::run(const Plan& plan) {
  // Every index of the round (gathers, payloads, segment ids) in one host buffer
  // and, off the CPU, one upload.
  {
    auto n = static_cast<int64_t>(plan.indices.size());
    bool cuda = options_.device.is_cuda();
    at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(cuda));
    if (n) std::memcpy(host.data_ptr<int64_t>(), plan.indices.data(), static_cast<size_t>(n) * sizeof(int64_t));
    index_ = options_.device.is_cpu() ? host : host.to(options_.device, /*non_blocking=*/true);
  }
  groups_.assign(plan.groups.size(), {});
  splits_.assign(plan.splits.size(), {});
  const at::TensorOptions float_opts = at::TensorOptions().dtype(at::kFloat).device(options_.device);

  // Profiling: host time to the device's idle point, so queued kernels count.
  using Clock = std::chrono::steady_clock;
  auto lap = [&, t = Clock::now()](double* into) mutable {
    if (!options_.profile) return;
    synchronize(options_.device);
    auto now = Clock::now();
    if (into) *into += std::chrono::duration<double, std::milli>(now - t).count();
    t = now;
  };
  lap(nullptr);

  size_t done = 0;
  for (const PlannedBatch& b : plan.batches) {
    const OpInfo& info = op_info(b.op);
    const NodeId first = plan.nodes[b.nodes_begin];
    try {
      inputs_.clear();
      shared_.clear();
      for (uint32_t k = 0; k < b.arity; ++k) inputs_.push_back(input(plan, b, plan.args[b.args_begin + k]));
      lap(&stats_.gather_ms);

      RunCtx ctx;
      ctx.n_ = b.n;
      ctx.arity_ = s_.args_of(first).size();
      ctx.stacked_ = b.stacked;
      ctx.inputs_ = inputs_;
      ctx.shared_ = shared_;
      ctx.attrs_ = s_.attrs_of(first);
      ctx.out_shape_ = &s_.shape_of(first);
      ctx.payload_host_ = std::span(plan.indices.data() + b.payload, b.n);
      ctx.index_ = &index_;
      ctx.payload_off_ = b.payload;
      if (b.segments >= 0) {
        ctx.segments_off_ = b.segments;
        ctx.segments_len_ = b.total;
        ctx.segment_counts_ = std::span(plan.indices.data() + b.counts, b.n);
      }
      ctx.user_tensors_ = &s_.user_tensors;
      ctx.options_ = float_opts;
      ctx.seed_ = options_.seed;
      ctx.train_ = options_.train;

      at::Tensor out = b.split >= 0 ? split_piece(plan, b) : info.run(ctx);
      lap(&stats_.op_ms);

      // A descriptor that returns the wrong shape is our bug, not the user's.
      const Shape& shape = *ctx.out_shape_;
      bool ok = out.dim() == shape.rank() + 1 && out.size(0) == b.n;
      for (int d = 0; ok && d < shape.rank(); ++d) ok = out.size(d + 1) == shape[d];
      SHEAF_ASSERT(ok, "op ", info.name, " returned ", out.sizes(), " for ", b.n, " x ", shape.str());
      if (b.shared) out = out.select(0, 0);
      SHEAF_ASSERT(s_.batch_out.size() == b.out, "batch output slot mismatch");
      s_.batch_out.push_back(std::move(out));
    } catch (const UserError&) {
      throw;
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      rethrow(plan, b, e);
    }
    for (uint32_t i = 0; i < b.n; ++i) s_.flags[plan.nodes[b.nodes_begin + i]] |= NodeStore::kComputed;
    ++stats_.batches;
    stats_.nodes += b.n;
    ++done;
  }
  return done;
}

void Executor::rethrow(const Plan& plan, const PlannedBatch& b, const std::exception& e) const {
  const NodeId first = plan.nodes[b.nodes_begin];
  std::set<int> examples;
  for (uint32_t i = 0; i < b.n && examples.size() < 8; ++i) examples.insert(s_.example[plan.nodes[b.nodes_begin + i]]);
  std::ostringstream os;
  os << "the batched launch of " << b.n << " node(s) failed (examples";
  for (int ex : examples) os << " " << ex;
  os << (b.n > examples.size() ? " ..." : "") << "): ";
  std::string what = e.what();
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) what = ce->what_without_backtrace();
  os << what;
  throw_user(Site{op_info(b.op).name, s_.example[first], s_.loc[first]}, os.str());
}

}  // namespace sheaf
