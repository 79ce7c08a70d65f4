#include "function_body.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>

#include <sheaf/ops/op_list.h>
#include <sheaf/ops/packed_gemm.h>
#include <sheaf/scheduler/round.h>

#include "fused.h"

namespace sheaf {

namespace {

// Whether a step gets an index of its own: for an op that reads its payload
// (reads_payload: the body's payload is handed to every call of the batch),
// or a segmented one (its segment ids go in the same index).
bool step_index(const NodeStore& s, NodeId v) {
  return reads_payload(s.op[v]) || op_info(s.op[v]).traits.segmented;
}

}  // namespace

int rows_in_place_arg(const NodeStore& s, NodeId v) {
  const int k = op_info(s.op[v]).traits.rows_in_place;
  const auto args = s.args_of(v);
  if (k < 0 || static_cast<size_t>(k) >= args.size() || s.has(v, NodeStore::kShared)) return -1;
  for (size_t j = 0; j < args.size(); ++j) {
    const NodeId a = s.resolve(args[j]);
    if (static_cast<int>(j) == k ? s.shape_of(a).rank() != 1 : !s.has(a, NodeStore::kShared)) return -1;
  }
  return k;
}

bool rows_in_place_now() { return !at::GradMode::is_enabled() && packed_gemm_available(); }

void FunctionBody::compile(NodeStore& s, ReadyQueue& ready, std::span<const NodeId> args,
                           std::span<const NodeId> results, bool fuse, Fuser& fuser, const FunctionTable* nested) {
  store_ = &s;
  nested_ = nested;
  arg_of_.assign(s.size(), -1);
  for (size_t i = 0; i < args.size(); ++i) arg_of_[args[i]] = static_cast<int32_t>(i);
  results_.assign(results.begin(), results.end());
  steps_.clear();

  // What the results need: the body may have recorded more (it runs no step).
  std::vector<uint8_t> live(s.size(), 0), result(s.size(), 0);
  for (NodeId r : results) live[r] = result[r] = 1;
  for (NodeId v = static_cast<NodeId>(s.size()); v-- > 0;)
    if (live[v])
      for (NodeId a : s.args_of(v)) live[s.resolve(a)] = 1;

  // The body as one round of one example: its order is topological, and the
  // fuser finds its elementwise regions as it would in a graph.
  RoundDag dag;
  std::vector<NodeId> aliases;
  uint64_t visits = 0;
  build_round(s, ready, aliases, dag, visits);
  SHEAF_ASSERT(aliases.empty(), "a function body holds resolved placeholders");
  for (NodeId v = 0; v < s.size(); ++v)
    SHEAF_ASSERT(!live[v] || s.has(v, NodeStore::kComputed) || dag.in_round(v),
                 "node %", v, " of a function body cannot run");
  // Each step runs over the calls, a whole value per call: nothing in a body
  // is packed (scheduler/plan.h), its fused regions included.
  for (NodeId v = 0; v < s.size(); ++v) s.flags[v] = static_cast<uint8_t>(s.flags[v] & ~NodeStore::kRowwise);
  if (fuse) fuser.fuse(s, dag);

  for (uint32_t i = 0; i < dag.size(); ++i) {
    if (dag.region[i] == kNone32) {
      const NodeId v = dag.node[i];
      if (arg_of_[v] >= 0 || !live[v]) continue;
      Step step{v, nullptr, {}, {}, {}};
      step.payload = step_index(s, v);
      if (s.op[v] == code_of<op::Call>)  // a call's results: the call and the nodes recorded after it
        for (int64_t k = 0; k < s.attrs_of(v)[1]; ++k) step.members.push_back(v + static_cast<NodeId>(k));
      steps_.push_back(std::move(step));
      continue;
    }
    const Region& r = fuser.region(dag.region[i]);
    Step step;
    step.program = r.program;
    const auto inputs = fuser.inputs(r);
    const auto members = fuser.members(r);
    const auto escapes = fuser.escapes(r);
    step.inputs.assign(inputs.begin(), inputs.end());
    step.members.assign(members.begin(), members.end());
    bool needed = false;
    for (size_t k = 0; k < members.size(); ++k) {
      step.keep.push_back(escapes[k] || result[members[k]]);
      needed = needed || live[members[k]];
    }
    if (needed) steps_.push_back(std::move(step));
  }
  plan_arguments(s, args.size());
}

// Which arguments fused steps read, which concats put arguments side by side
// (rows one after the other: every dimension before the axis is 1), and which
// arguments are wanted as tensors.
void FunctionBody::plan_arguments(const NodeStore& s, size_t arity) {
  arg_use_.assign(arity, ArgUse{});
  groups_.clear();
  auto arg_index = [&](NodeId v) { return arg_of_[s.resolve(v)]; };
  for (NodeId v = 0; v < s.size(); ++v)  // a shared argument is the tensor itself
    if (arg_of_[v] >= 0 && s.has(v, NodeStore::kShared)) arg_use_[static_cast<size_t>(arg_of_[v])].tensor = true;
  for (Step& step : steps_) {
    if (step.node == kNoNode) {
      for (NodeId v : step.inputs)
        if (const int32_t i = arg_index(v); i >= 0) arg_use_[static_cast<size_t>(i)].fused = true;
      continue;
    }
    const NodeId v = step.node;
    const auto args = s.args_of(v);
    bool group = s.op[v] == code_of<op::Concat> && !s.has(v, NodeStore::kShared);
    if (group) {
      const Shape& shape = s.shape_of(v);
      const int axis = shape.axis(static_cast<int>(s.attrs_of(v)[0]));
      for (int d = 0; d < axis && group; ++d) group = shape[d] == 1;
      for (NodeId a : args) group = group && arg_index(a) >= 0 && !s.has(s.resolve(a), NodeStore::kShared);
    }
    if (group) {
      step.group = static_cast<int32_t>(groups_.size());
      Group g{{}, s.shape_of(v)};
      for (NodeId a : args) g.args.push_back(static_cast<uint32_t>(arg_index(a)));
      groups_.push_back(std::move(g));
      continue;
    }
    const int rows_at = rows_in_place_arg(s, v);
    for (size_t k = 0; k < args.size(); ++k)
      if (const int32_t i = arg_index(args[k]); i >= 0) {
        ArgUse& use = arg_use_[static_cast<size_t>(i)];
        (static_cast<int>(k) == rows_at ? use.rows : use.tensor) = true;
      }
  }
  for (NodeId r : results_)
    if (const int32_t i = arg_of_[r]; i >= 0) arg_use_[static_cast<size_t>(i)].tensor = true;
}

// A fused region: one kernel over the n rows (arguments read in place where
// the executor gave rows).
void FunctionBody::run_fused_step(const Step& step, int64_t n, std::span<const FusedInput> args,
                                  std::span<at::Tensor> regs) const {
  const NodeStore& s = *store_;
  c10::SmallVector<FusedInput, 4> ins;
  for (NodeId v : step.inputs) {
    const int32_t i = arg_of_[s.resolve(v)];
    if (i >= 0 && args[static_cast<size_t>(i)].rows) ins.push_back(args[static_cast<size_t>(i)]);
    else ins.push_back(FusedInput{regs[v], nullptr});
    SHEAF_ASSERT(ins.back().rows || ins.back().tensor.defined(), "fused input %", v, " of a body is missing");
  }
  std::vector<at::Tensor> values = run_fused(step.program, std::span<const FusedInput>(ins.data(), ins.size()), n, step.keep);
  for (size_t k = 0; k < step.members.size(); ++k)
    if (step.keep[k]) regs[step.members[k]] = std::move(values[k]);
}

// One op over the n rows (one row when every argument is shared), as the
// executor would launch a batch of it: the op's batched run, or a nested
// function's body.
void FunctionBody::run_op_step(const Step& step, const LaunchArgs& a, std::span<const FusedInput> args,
                               std::span<at::Tensor> regs) const {
  const NodeStore& s = *store_;
  const NodeId v = step.node;
  const OpInfo& info = op_info(s.op[v]);
  const bool once = s.has(v, NodeStore::kShared);
  const int64_t rows = once ? 1 : a.n;
  const auto node_args = s.args_of(v);
  // On the stack for the usual few arguments: a launch runs a step per body op.
  c10::SmallVector<at::Tensor, 4> ins;
  c10::SmallVector<uint8_t, 4> shared;
  // An argument the executor gave as rows in place (no tensor: ArgUse::rows).
  c10::SmallVector<const RowReads*, 4> in_place;
  size_t rows_at = node_args.size();
  if (const int8_t k = info.traits.rows_in_place; k >= 0 && !once && static_cast<size_t>(k) < node_args.size())
    if (const int32_t i = arg_of_[s.resolve(node_args[static_cast<size_t>(k)])];
        i >= 0 && args[static_cast<size_t>(i)].rows && !args[static_cast<size_t>(i)].tensor.defined()) {
      in_place.assign(node_args.size(), nullptr);
      in_place[static_cast<size_t>(k)] = args[static_cast<size_t>(i)].rows.get();
      rows_at = static_cast<size_t>(k);
    }
  if (info.traits.segmented) {  // one list: every element in in(0), node-major
    std::vector<at::Tensor> xs;
    for (NodeId arg : node_args) xs.push_back(once ? regs[s.resolve(arg)].unsqueeze(0) : regs[s.resolve(arg)]);
    ins.push_back(at::stack(xs, 1).reshape(
        batched_sizes(rows * static_cast<int64_t>(node_args.size()), s.shape_of(s.resolve(node_args[0])))));
    shared.push_back(0);
  } else {
    for (NodeId arg : node_args) {
      const NodeId r = s.resolve(arg);
      if (ins.size() == rows_at) {
        ins.emplace_back();
        shared.push_back(0);
        continue;
      }
      SHEAF_ASSERT(regs[r].defined(), "argument %", r, " of a body step is missing");
      ins.push_back(once ? regs[r].unsqueeze(0) : regs[r]);
      shared.push_back(!once && s.has(r, NodeStore::kShared));
    }
  }
  LaunchArgs la;
  la.n = rows;
  la.arity = node_args.size();
  la.inputs = std::span(ins.data(), ins.size());
  la.shared = std::span(shared.data(), shared.size());
  la.attrs = s.attrs_of(v);
  la.out_shape = &s.shape_of(v);
  la.user_tensors = &s.user_tensors;
  la.options = a.options;
  la.seed = a.seed;
  la.train = a.train;
  la.weight_grads = a.weight_grads;
  la.transposed = a.transposed;
  la.in_place = std::span(in_place.data(), in_place.size());
  at::Tensor index;
  std::vector<int64_t> payload, counts;
  if (step.payload) {
    // [payload per row | segment id per list element]
    const auto k = static_cast<int64_t>(node_args.size());
    const int64_t total = info.traits.segmented ? rows * k : 0;
    payload.assign(static_cast<size_t>(rows), s.payload[v]);
    for (int64_t e = 0; e < total; ++e) payload.push_back(e / k);
    at::Tensor host = at::empty({rows + total}, at::TensorOptions().dtype(at::kLong));
    std::copy(payload.begin(), payload.end(), host.data_ptr<int64_t>());
    index = a.options.device().is_cpu() ? host : host.to(a.options.device());
    la.payload_host = std::span(payload.data(), static_cast<size_t>(rows));
    la.index = &index;
    la.payload_off = 0;
    if (info.traits.segmented) {
      counts.assign(static_cast<size_t>(rows), k);
      la.segments_off = rows;
      la.segments_len = total;
      la.segment_counts = counts;
    }
  }
  if (s.op[v] == code_of<op::Call>) {  // a function the body calls: its results
    SHEAF_ASSERT(nested_ != nullptr, "a function body calls a function but has no table");
    std::vector<at::Tensor> results = nested_->body(la.attrs[0]).run(la);
    SHEAF_ASSERT(results.size() == step.members.size(), "a nested call gave ", results.size(), " results for ",
                 step.members.size());
    for (size_t k = 0; k < results.size(); ++k)
      regs[step.members[k]] = once ? results[k].select(0, 0) : std::move(results[k]);
    return;
  }
  RunCtx ctx(la);
  at::Tensor out = info.run(ctx);
  // (A user op's result read by the body's next step is checked here: a
  // broadcasting step would take a wrong size without a word.)
  // (No example: the body's store has the one that first recorded it, not this
  // batch's; the launch's error names the batch's examples.)
  check_user_op_output(s.op[v], Site{info.name, kSharedExample, s.loc[v]}, out, rows, s.shape_of(v), false);
  regs[v] = once ? out.select(0, 0) : std::move(out);
}

std::vector<at::Tensor> FunctionBody::run(const LaunchArgs& a) const {
  c10::SmallVector<FusedInput, 4> args;
  for (const at::Tensor& t : a.inputs) args.push_back(FusedInput{t, nullptr});
  return run(a, std::span<const FusedInput>(args.data(), args.size()), {});
}

std::vector<at::Tensor> FunctionBody::run(const LaunchArgs& a, std::span<const FusedInput> args,
                                          std::span<const at::Tensor> groups) const {
  const NodeStore& s = *store_;
  const int64_t n = a.n;
  // A value per body node: [n, ...] for per-example nodes, the tensor itself for
  // shared ones (parameters, shared arguments, ops on them only).
  // (Over the body as compiled: its graph refuses more recording until recorded again.)
  c10::SmallVector<at::Tensor, 16> regs(arg_of_.size());
  for (NodeId v = 0; v < arg_of_.size(); ++v) {
    if (const int32_t i = arg_of_[v]; i >= 0) {
      const at::Tensor& x = args[static_cast<size_t>(i)].tensor;
      // A call whose arguments are all shared runs once, its arguments as [1, ...].
      regs[v] = x.defined() && s.has(v, NodeStore::kShared) && !a.shared[static_cast<size_t>(i)] ? x.select(0, 0) : x;
    } else if (s.has(v, NodeStore::kComputed)) {
      regs[v] = s.batch_out[s.value_at[v].batch];  // a parameter: the tensor itself
    }
  }
  for (const Step& step : steps_) {
    if (step.node == kNoNode) {
      run_fused_step(step, n, args, std::span(regs.data(), regs.size()));
    } else if (step.group >= 0 && static_cast<size_t>(step.group) < groups.size() &&
               groups[static_cast<size_t>(step.group)].defined()) {
      regs[step.node] = groups[static_cast<size_t>(step.group)];  // gathered side by side by the executor
    } else {
      run_op_step(step, a, args, std::span(regs.data(), regs.size()));
    }
  }

  std::vector<at::Tensor> outs;
  for (NodeId r : results_) {
    at::Tensor t = regs[r];
    SHEAF_ASSERT(t.defined(), "result %", r, " of a function body was not computed");
    if (s.has(r, NodeStore::kShared)) t = t.unsqueeze(0).expand(batched_sizes(n, s.shape_of(r))).contiguous();
    outs.push_back(std::move(t));
  }
  return outs;
}

}  // namespace sheaf
