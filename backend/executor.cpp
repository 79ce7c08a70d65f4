#include "executor.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/split_with_sizes.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <sstream>

#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

#include "fused.h"
#include "gather.h"
#include "row_copies.h"
#include "row_gather.h"
#include "runtime.h"

namespace sheaf {

namespace {
// RowGathers' key for a batch read as rows of its rows (Read::flatten).
constexpr uint32_t kFlatKey = 0x80000000u;
}  // namespace

// On the CPU, and on CUDA where the row kernels compile, a gathered input is
// one tensor written by row copies (backend/row_gather.h). Appends the rows of
// reads [begin, end), permuted by `perm`, to picks_; false when a source
// cannot be read that way (a shared value in a list, a view whose rows are
// not contiguous).
bool Executor::pick_rows(const Plan& plan, uint32_t reads_begin, uint32_t reads_end, int64_t perm) {
  const size_t first = picks_.size();
  for (uint32_t q = reads_begin; q < reads_end; ++q) {
    const Read& rd = plan.reads[q];
    if (rd.start == kWholeRow) return false;
    // A flattened batch is its own source (its own gradient hub): rows in other units.
    const at::Tensor& src = rd.flatten ? flat_view(rd.batch) : lazy_.get(s_, rd.batch);
    if (!RowGathers::readable(src)) return false;
    const uint32_t key = rd.flatten ? rd.batch | kFlatKey : rd.batch;
    const auto found = std::find(row_batches_.begin(), row_batches_.end(), key);
    const auto k = static_cast<uint32_t>(found - row_batches_.begin());
    if (found == row_batches_.end()) {
      row_batches_.push_back(key);
      row_sources_.push_back(&src);
    }
    for (uint32_t j = 0; j < rd.len; ++j)
      picks_.push_back(RowPick{k, static_cast<uint32_t>(rd.index >= 0 ? plan.indices[rd.index + j] : rd.start + j)});
  }
  if (perm >= 0) {
    const std::span<const RowPick> in_order(picks_.data() + first, picks_.size() - first);
    permuted_.resize(in_order.size());
    for (size_t i = 0; i < in_order.size(); ++i) permuted_[i] = in_order[plan.indices[perm + static_cast<int64_t>(i)]];
    std::copy(permuted_.begin(), permuted_.end(), picks_.begin() + static_cast<std::ptrdiff_t>(first));
  }
  return true;
}

const at::Tensor& Executor::flat_view(uint32_t batch) {
  for (const auto& [b, t] : flat_views_)
    if (b == batch) return t;
  return flat_views_.emplace_back(batch, lazy_.get(s_, batch).flatten(0, 1)).second;
}

void Executor::clear_picks() {
  row_sources_.clear();
  row_batches_.clear();
  picks_.clear();
}

at::Tensor Executor::copy_rows(const Plan& plan, uint32_t reads_begin, uint32_t reads_end, int64_t perm) {
  if (!row_copies_on(config_.device)) return {};
  clear_picks();
  if (!pick_rows(plan, reads_begin, reads_end, perm)) return {};
  ++counters_.gather_launches;
  return row_gathers_.gather(row_sources_, row_batches_, picks_);
}

// A concat whose rows are its arguments' rows side by side (vectors, or any
// shape cut along its first axis of size > 1), on the CPU: one row gather
// writes the output from wherever the arguments live, instead of a gather per
// argument and a cat. Undefined when that does not apply.
at::Tensor Executor::concat_rows(const Plan& plan, const PlannedBatch& b) {
  if (!row_copies_on(config_.device) || b.op != code_of<op::Concat> || b.stacked || b.shared || b.program || b.rows > 0)
    return {};
  const NodeId first = plan.nodes[b.nodes_begin];
  const Shape& shape = s_.shape_of(first);
  const int axis = shape.axis(static_cast<int>(s_.attrs_of(first)[0]));
  for (int d = 0; d < axis; ++d)
    if (shape[d] != 1) return {};
  all_args_.resize(b.arity);
  for (uint32_t k = 0; k < b.arity; ++k) all_args_[k] = k;
  return side_by_side(plan, b, all_args_, shape);
}

// Arguments `args` of batch b written side by side into one [n, shape...]
// tensor by one row gather; undefined when a source cannot be read so.
at::Tensor Executor::side_by_side(const Plan& plan, const PlannedBatch& b, std::span<const uint32_t> args,
                                  const Shape& shape) {
  if (!row_copies_on(config_.device)) return {};
  clear_picks();
  for (uint32_t k : args) {
    const BatchArg& arg = plan.args[b.args_begin + k];
    if (arg.kind == BatchArg::kShared || arg.unpack != kNone32 || !pick_rows(plan, arg.reads_begin, arg.reads_end, arg.perm))
      return {};
  }
  c10::SmallVector<int64_t, kMaxRank + 1> sizes{static_cast<int64_t>(b.n)};  // (no allocation per launch)
  sizes.append(shape.dims().begin(), shape.dims().end());
  at::Tensor out = row_gathers_.gather(row_sources_, row_batches_, picks_, args.size(),
                                       std::span<const int64_t>(sizes.data(), sizes.size()));
  ++counters_.gather_launches;
  counters_.gathered_inputs += args.size();
  counters_.gathered_bytes += static_cast<uint64_t>(out.numel()) * out.element_size();
  return out;
}

at::Tensor Executor::read(const Plan& plan, uint32_t r) {
  const Read& rd = plan.reads[r];
  if (rd.flatten) {  // rows of rows (a packed batch's input; a shared value's rows in a list)
    if (rd.start == kWholeRow) return lazy_.get(s_, rd.batch);
    const at::Tensor& rows = flat_view(rd.batch);
    if (rd.index >= 0) {
      ++counters_.gather_launches;
      return rows.index_select(0, index_.narrow(0, rd.index, rd.len));
    }
    if (rd.start == 0 && rd.len == rows.size(0)) return rows;
    return rows.narrow(0, rd.start, rd.len);
  }
  const at::Tensor& src = lazy_.get(s_, rd.batch);
  if (rd.start == kWholeRow) return src.unsqueeze(0);  // a shared value inside a shared computation
  if (rd.split >= 0) return split_pieces(plan, rd.split)[rd.slot];
  if (rd.group >= 0) {
    // One of several partial reads of this batch: on the CPU a row copy whose
    // gradient joins the batch's one gradient (its hub: backend/row_gather.h).
    if (at::Tensor x = copy_rows(plan, r, r + 1, -1); x.defined()) return x;
    auto& outs = groups_[static_cast<size_t>(rd.group)];
    if (outs.empty()) {
      std::vector<RowRead> reads;
      for (uint32_t q : plan.groups[static_cast<size_t>(rd.group)]) {
        const Read& x = plan.reads[q];
        reads.push_back(x.index >= 0 ? RowRead{0, x.len, index_.narrow(0, x.index, x.len)} : RowRead{x.start, x.len, {}});
      }
      outs = gather_rows(src, reads);
      ++counters_.gather_launches;
    }
    return outs[rd.slot];
  }
  if (rd.index >= 0) {
    ++counters_.gather_launches;
    return src.index_select(0, index_.narrow(0, rd.index, rd.len));
  }
  if (rd.start == 0 && rd.len == src.size(0)) return src;
  return src.narrow(0, rd.start, rd.len);
}

at::Tensor Executor::input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg) {
  at::Tensor x = rows_input(plan, b, arg);
  if (arg.unpack == kNone32) return x;
  // Rows of packed values, for a batch that takes whole values.
  return x.reshape(batched_sizes(-1, s_.shapes[arg.unpack]));
}

at::Tensor Executor::rows_input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg) {
  switch (arg.kind) {
    case BatchArg::kShared: {
      const at::Tensor& t = lazy_.get(s_, plan.reads[arg.reads_begin].batch);
      shared_.push_back(!b.shared);
      return b.shared ? t.unsqueeze(0) : t;
    }
    case BatchArg::kView:
      shared_.push_back(0);
      ++counters_.zero_copy_inputs;
      return read(plan, arg.reads_begin);
    case BatchArg::kGather: {
      shared_.push_back(0);
      if (at::Tensor x = copy_rows(plan, arg.reads_begin, arg.reads_end, arg.perm); x.defined()) {
        ++counters_.gathered_inputs;
        counters_.gathered_bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
        return x;
      }
      std::vector<at::Tensor> pieces;
      pieces.reserve(arg.reads_end - arg.reads_begin);
      for (uint32_t q = arg.reads_begin; q < arg.reads_end; ++q) pieces.push_back(read(plan, q));
      at::Tensor x = pieces.size() == 1 ? pieces[0] : at::cat(pieces);
      if (pieces.size() > 1) ++counters_.gather_launches;
      if (arg.perm >= 0) {
        x = x.index_select(0, index_.narrow(0, arg.perm, x.size(0)));
        ++counters_.gather_launches;
      }
      ++counters_.gathered_inputs;
      counters_.gathered_bytes += static_cast<uint64_t>(x.numel()) * x.element_size();
      return x;
    }
  }
  throw_internal("bad input kind");
}

const std::vector<at::Tensor>& Executor::split_pieces(const Plan& plan, int32_t split) {
  auto& pieces = splits_[static_cast<size_t>(split)];
  if (pieces.empty()) {
    const SplitGroup& g = plan.splits[static_cast<size_t>(split)];
    const std::span<const int64_t> sizes = plan.sizes_of(g);
    // A batch, or one gathered input that several slices cut (gathered once).
    const PlannedBatch* by = g.gathered >= 0 ? &plan.batches[static_cast<size_t>(g.gathered)] : nullptr;
    const at::Tensor source = by ? rows_input(plan, *by, plan.args[by->args_begin]) : lazy_.get(s_, g.batch);
    pieces = source.split_with_sizes(at::IntArrayRef(sizes.data(), sizes.size()), g.axis);
  }
  return pieces;
}

// Profiling, per op: one launch and its gathers' time so far; then its own time.
void Executor::lap_gathers(std::string_view op) {
  const double ms = lap(&counters_.gather_ms);
  if (!config_.profile) return;
  ExecCounters::OpTime& t = counters_.by_op[std::string(op)];
  ++t.launches;
  t.gather_ms += ms;
}

void Executor::lap_op(std::string_view op) {
  const double ms = lap(&counters_.op_ms);
  if (config_.profile) counters_.by_op[std::string(op)].op_ms += ms;
}

double Executor::lap(double* into) {
  if (!config_.profile) return 0;
  synchronize(config_.device);
  const auto now = std::chrono::steady_clock::now();
  const double ms = std::chrono::duration<double, std::milli>(now - lap_start_).count();
  if (into) *into += ms;
  lap_start_ = now;
  return ms;
}

// Every index of the round (gathers, payloads, segment ids) in one host buffer
// and, off the CPU, one upload that does not wait for the device.
void Executor::upload_indices(const Plan& plan) {
  const auto n = static_cast<int64_t>(plan.indices.size());
  const bool cuda = config_.device.is_cuda();
  auto copy_into = [&](const at::Tensor& t) {
    if (n) std::memcpy(t.data_ptr<int64_t>(), plan.indices.data(), static_cast<size_t>(n) * sizeof(int64_t));
  };
  if (config_.device.is_cpu() && config_.index_buffer != nullptr) {
    // The last round's buffer serves again when nothing else holds it (a
    // lookup's or an index_select's backward keeps a view of it: training),
    // which saves an allocation a round. Reads go by offsets: it may be longer.
    at::Tensor& buffer = *config_.index_buffer;
    if (!buffer.defined() || buffer.numel() < n || buffer.use_count() != 1 || buffer.storage().use_count() != 1)
      buffer = at::empty({n}, at::TensorOptions().dtype(at::kLong));
    copy_into(buffer);
    index_ = buffer;
    return;
  }
  at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(cuda));
  copy_into(host);
  index_ = config_.device.is_cpu() ? host : host.to(config_.device, /*non_blocking=*/true);
}

void Executor::run(const Plan& plan) {
  struct EndRound {
    Executor& e;
    ~EndRound() { e.end_round(); }
  } end{*this};
  upload_indices(plan);  // (flat_views_ and the picks are empty: end_round)
  groups_.assign(plan.groups.size(), {});
  splits_.assign(plan.splits.size(), {});
  float_opts_ = at::TensorOptions().dtype(at::kFloat).device(config_.device);
  lap(nullptr);
  for (NodeId n : plan.placed) s_.flags[n] |= NodeStore::kComputed;  // rows of their tables: nothing to launch
  counters_.nodes += plan.placed.size();
  for (const PlannedBatch& b : plan.batches) {
    try {
      launch(plan, b);
    } catch (const UserError&) {
      throw;
    } catch (const InternalError&) {
      throw;
    } catch (const std::exception& e) {
      rethrow(plan, b, e);
    }
    for (uint32_t i = 0; i < b.n * b.outputs; ++i) s_.flags[plan.nodes[b.nodes_begin + i]] |= NodeStore::kComputed;
    ++counters_.batches;
    counters_.nodes += b.n * b.outputs;
  }
}

void Executor::end_round() {
  index_ = at::Tensor();  // (the graph's index buffer serves the next round only when nothing else holds it)
  weight_grads_.clear();
  groups_.clear();
  splits_.clear();
  flat_views_.clear();
  clear_picks();
  inputs_.clear();
  fused_in_.clear();
  shared_.clear();
  call_groups_.clear();
  op_reads_.clear();
  op_reads_view_.clear();
}

LaunchArgs Executor::launch_args(const Plan& plan, const PlannedBatch& b) {
  const NodeId first = plan.nodes[b.nodes_begin];
  LaunchArgs a;
  a.n = b.rows > 0 ? b.rows : b.n;
  a.arity = s_.args_of(first).size();
  a.stacked = b.stacked;
  a.inputs = inputs_;
  a.shared = shared_;
  a.attrs = s_.attrs_of(first);
  a.out_shape = &s_.shape_of(first);
  if (b.rows > 0) {  // packed: the op sees rows, each of the shape less its first axis
    a.packed = true;
    row_shape_ = a.out_shape->row();
    a.out_shape = &row_shape_;
  }
  if (b.payload >= 0) a.payload_host = std::span(plan.indices.data() + b.payload, b.n);
  a.index = &index_;
  a.payload_off = b.payload;
  a.user_tensors = &s_.user_tensors;
  a.options = float_opts_;
  a.seed = config_.seed;
  a.train = config_.train;
  a.weight_grads = config_.batch_weight_grads ? &weight_grads_ : nullptr;
  a.transposed = config_.transposed;
  if (b.segments >= 0) {
    a.segments_off = b.segments;
    a.segments_len = b.total;
    a.segment_counts = std::span(plan.indices.data() + b.counts, b.n);
  }
  if (b.own_counts >= 0) a.own_counts = std::span(plan.indices.data() + b.own_counts, b.n);
  return a;
}

void Executor::launch(const Plan& plan, const PlannedBatch& b) {
  inputs_.clear();
  shared_.clear();
  if (b.op == code_of<op::Call> && !b.program) return launch_call(plan, b);
  at::Tensor out = concat_rows(plan, b);  // a concat that is one gather needs no inputs
  op_reads_.clear();
  if (b.program) fused_inputs(plan, b);
  else if (!out.defined() && b.split < 0)  // (a split's pieces need no inputs)
    for (uint32_t k = 0; k < b.arity; ++k) {
      if (rows_for_op(plan, b, k) || reads_for_op(plan, b, k)) {
        inputs_.emplace_back();
        shared_.push_back(0);
        continue;
      }
      inputs_.push_back(input(plan, b, plan.args[b.args_begin + k]));
    }
  lap_gathers(b.program ? "fused" : op_info(b.op).name);
  if (b.program) return launch_fused(plan, b);
  if (out.defined()) {
    // the concat, gathered
  } else if (b.split >= 0) {
    out = split_pieces(plan, b.split)[b.piece];
  } else {
    LaunchArgs args = launch_args(plan, b);
    if (!op_reads_.empty()) {
      op_reads_view_.assign(b.arity, nullptr);
      for (size_t k = 0; k < op_reads_.size(); ++k) op_reads_view_[k] = op_reads_[k].get();
      args.in_place = op_reads_view_;
    }
    RunCtx ctx(args);
    out = op_info(b.op).run(ctx);
    op_reads_.clear();
  }
  lap_op(op_info(b.op).name);
  check_output(plan.nodes[b.nodes_begin], b, out);
  if (b.shared) out = out.select(0, 0);
  SHEAF_ASSERT(s_.batch_out.size() == b.out, "batch output slot mismatch");
  s_.push_batch(std::move(out), b.rows > 0 ? b.rows : b.n);
}

// A batch of function calls runs the body's steps once for all of them. On
// the CPU its arguments come without copies where the body allows: read in
// place by the body's fused steps, or gathered straight into the value of a
// body's concat of them (one row copy, as a concat batch is); the others as
// any op's inputs.
void Executor::launch_call(const Plan& plan, const PlannedBatch& b) {
  SHEAF_ASSERT(config_.functions != nullptr, "a function call without the graph's function table");
  const FunctionBody& body = config_.functions->body(s_.attrs_of(plan.nodes[b.nodes_begin])[0]);
  const std::span<const FunctionBody::ArgUse> uses = body.arg_uses();
  SHEAF_ASSERT(uses.size() == b.arity, "a call of ", b.arity, " arguments to a body of ", uses.size());
  call_groups_.clear();
  grouped_.assign(b.arity, 0);  // 1: in a group, 2: in a group gathered here
  for (const FunctionBody::Group& g : body.groups()) {
    at::Tensor t = b.shared ? at::Tensor() : side_by_side(plan, b, g.args, g.shape);
    for (uint32_t k : g.args) grouped_[k] = t.defined() && grouped_[k] != 1 ? 2 : 1;
    call_groups_.push_back(std::move(t));
  }
  fused_in_.clear();
  for (uint32_t k = 0; k < b.arity; ++k) {
    const BatchArg& arg = plan.args[b.args_begin + k];
    const FunctionBody::ArgUse& use = uses[k];
    std::shared_ptr<const InPlaceRows> rows;
    // Op steps take rows in place only where no gradient is wanted (ArgUse::rows).
    const bool tensor = use.tensor || (use.rows && !rows_in_place_now());
    const bool by_rows = use.fused || use.rows;
    if (!b.shared && by_rows && !tensor && grouped_[k] != 1) rows = in_place(plan, b, arg);
    at::Tensor t;
    if (tensor || grouped_[k] == 1 || (by_rows && !rows)) {
      t = input(plan, b, arg);
    } else {
      shared_.push_back(arg.kind == BatchArg::kShared && !b.shared);
    }
    inputs_.push_back(t);
    fused_in_.push_back(FusedInput{std::move(t), std::move(rows)});
  }
  lap_gathers("call");
  const LaunchArgs args = launch_args(plan, b);
  std::vector<at::Tensor> results = body.run(args, fused_in_, call_groups_);
  lap_op("call");
  SHEAF_ASSERT(results.size() == b.outputs && s_.batch_out.size() == b.out, "a call batch of ", b.outputs,
               " outputs got ", results.size(), " results");
  for (uint32_t k = 0; k < b.outputs; ++k) {
    check_output(plan.nodes[b.nodes_begin + k * b.n], b, results[k]);
    s_.push_batch(b.shared ? results[k].select(0, 0) : std::move(results[k]), b.n);
  }
  ++counters_.call_batches;
}

// A gathered argument that the op reads where its rows lie (OpTraits::
// rows_in_place: the packed product reads x's rows from the batches that hold
// them): no gathered copy. Where rows_in_place_arg and rows_in_place_now say
// so (a batch's nodes share a signature: its first speaks for all), and the
// batch is neither stacked, packed nor segmented. Sets op_reads_[k].
bool Executor::rows_for_op(const Plan& plan, const PlannedBatch& b, uint32_t k) {
  if (b.stacked || b.rows > 0 || b.segments >= 0 || !rows_in_place_now() ||
      rows_in_place_arg(s_, plan.nodes[b.nodes_begin]) != static_cast<int>(k))
    return false;
  return give_in_place(plan, b, k);
}

// A gathered argument of a packed or row-reduced batch that the op reads where
// its rows lie, gradients included (OpTraits::reads_in_place: attention's
// products over encoder rows): no gathered copy forward, no copy of its
// gradient backward. Sets op_reads_[k].
bool Executor::reads_for_op(const Plan& plan, const PlannedBatch& b, uint32_t k) {
  if (b.stacked || (b.rows == 0 && b.segments < 0) || !op_info(b.op).traits.reads_in_place_arg(k)) return false;
  // A shared operand (a weight applied to each row) goes to the op's product
  // kernels, which take tensors: the op would copy the rows anyway.
  for (uint32_t j = 0; j < b.arity; ++j)
    if (plan.args[b.args_begin + j].kind == BatchArg::kShared) return false;
  return give_in_place(plan, b, k);
}

// Argument k of batch b as rows in place for the op (op_reads_[k]), where
// in_place() can read it so.
bool Executor::give_in_place(const Plan& plan, const PlannedBatch& b, uint32_t k) {
  std::shared_ptr<const InPlaceRows> rows = in_place(plan, b, plan.args[b.args_begin + k]);
  if (!rows) return false;
  if (op_reads_.size() <= k) op_reads_.resize(k + 1);
  op_reads_[k] = std::move(rows);
  return true;
}

// On the CPU a fused kernel, a call's body or an op (rows_for_op,
// reads_for_op) reads gathered rows where they lie (and adds their gradients
// into the sources' hubs): the gather's copy, its tensor and its autograd
// node are not made. Null where that does not apply.
std::shared_ptr<const InPlaceRows> Executor::in_place(const Plan& plan, const PlannedBatch& b, const BatchArg& arg) {
  if (!config_.device.is_cpu() || arg.unpack != kNone32) return nullptr;
  const Read& first = plan.reads[arg.reads_begin];
  const bool gathered = arg.kind == BatchArg::kGather ||
                        (arg.kind == BatchArg::kView && first.split < 0 && (first.group >= 0 || first.index >= 0));
  if (!gathered) return nullptr;
  clear_picks();
  if (!pick_rows(plan, arg.reads_begin, arg.reads_end, arg.perm)) return nullptr;
  ++counters_.in_place_inputs;
  return row_gathers_.in_place(row_sources_, row_batches_, picks_, site_of(plan, b));
}

void Executor::fused_inputs(const Plan& plan, const PlannedBatch& b) {
  fused_in_.clear();
  for (uint32_t k = 0; k < b.arity; ++k) {
    const BatchArg& arg = plan.args[b.args_begin + k];
    if (std::shared_ptr<const InPlaceRows> rows = in_place(plan, b, arg))
      fused_in_.push_back(FusedInput{{}, std::move(rows)});
    else
      fused_in_.push_back(FusedInput{input(plan, b, arg), nullptr});
  }
}

// One kernel for n regions: member k's values are batch out + k.
void Executor::launch_fused(const Plan& plan, const PlannedBatch& b) {
  const std::span<const uint8_t> keep(plan.keep.data() + b.keep_begin, b.outputs);
  const int64_t rows = b.rows > 0 ? b.rows : b.n;  // packed: the program runs over rows
  std::vector<at::Tensor> values = run_fused(b.program, fused_in_, rows, keep);
  for (uint8_t k : keep)
    if (!k) {  // some members stay in the kernel: keep what recomputes them
      lazy_.add(b.out, b.program, fused_in_, rows, site_of(plan, b));
      break;
    }
  lap_op("fused");
  SHEAF_ASSERT(values.size() == b.outputs && s_.batch_out.size() == b.out, "fused batch output mismatch");
  for (at::Tensor& v : values) s_.push_batch(std::move(v), rows);  // (a member kept inside: undefined)
  ++counters_.fused_batches;
  counters_.fused_ops += b.outputs;
}

// A built-in descriptor that returns the wrong shape is our bug; a user op's, the user's.
void Executor::check_output(NodeId node, const PlannedBatch& b, const at::Tensor& out) const {
  const Shape& shape = s_.shape_of(node);
  const bool packed = b.rows > 0;  // [rows, shape less its first axis]
  const int64_t rows = packed ? b.rows : b.n;
  // (A user op's sizes and dtype: check_user_op_output says what is wrong, or returns.)
  if (b.op >= detail::g_builtin_ops.size())
    return check_user_op_output(b.op, Site{op_info(b.op).name, s_.example[node], s_.loc[node]}, out, rows, shape,
                                packed);
  if (fits_shape(out, rows, shape, packed)) return;
  throw_internal("op ", op_info(b.op).name, " returned ", out.sizes(), " for ", b.n, " x ", shape.str(),
                 packed ? " packed" : "");
}

void Executor::rethrow(const Plan& plan, const PlannedBatch& b, const std::exception& e) const {
  // One row's fault (RowError): that row's node is named.
  if (const auto* row = dynamic_cast<const RowError*>(&e); row != nullptr && b.rows == 0 && row->row() >= 0 &&
                                                           row->row() < static_cast<int64_t>(b.n)) {
    const NodeId n = plan.nodes[b.nodes_begin + static_cast<uint32_t>(row->row())];
    throw_user(Site{op_info(s_.op[n]).name, s_.example[n], s_.loc[n]}, "in the batched launch of ", b.n,
               " node(s), this node's row: ", e.what());
  }
  std::set<int64_t> examples;
  for (uint32_t i = 0; i < b.n && examples.size() < 8; ++i) examples.insert(s_.example[plan.nodes[b.nodes_begin + i]]);
  std::ostringstream os;
  os << "the batched launch of " << b.n << " node(s) failed (examples";
  for (int64_t ex : examples) os << " " << ex;
  os << (b.n > examples.size() ? " ..." : "") << "): ";
  std::string what = e.what();
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) what = ce->what_without_backtrace();
  os << what;
  throw_user(site_of(plan, b), os.str());
}

// A batch's errors name its first node: its op (a fused batch's op is its
// last member's), example and line.
Site Executor::site_of(const Plan& plan, const PlannedBatch& b) const {
  const NodeId first = plan.nodes[b.nodes_begin];
  return Site{op_info(s_.op[first]).name, s_.example[first], s_.loc[first]};
}

}  // namespace sheaf
