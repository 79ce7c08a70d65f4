// A sheaf::Function's body, compiled to run batched: each of the body's ops
// (or fused regions of them) is one step, and a batch of n calls runs every
// step ONCE over [n, ...] values. Recording the body per call and scheduling its
// nodes per call is what a function saves (dsl/function.h); the launches are
// the ones the body's ops would have made in a batch of n.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <sheaf/ops/op.h>
#include <sheaf/scheduler/fusion.h>
#include <sheaf/tracer/node_store.h>
#include <sheaf/tracer/ready.h>

#include "fused.h"

namespace sheaf {

// The argument node v takes as rows in place (OpTraits::rows_in_place): its
// op names one, v is per example, that argument is one row a value and every
// other argument is shared; else -1. Whether rows are given also depends on
// the moment (rows_in_place_now).
int rows_in_place_arg(const NodeStore& s, NodeId v);
// Rows go in place only without autograd (the ops' rows paths record no
// backward) and where the packed product runs (else the op copies them).
bool rows_in_place_now();

class FunctionBody;

// The bodies a graph's call nodes name by index (op::Call's first attribute);
// the engine keeps them (engine/functions.h).
class FunctionTable {
 public:
  virtual ~FunctionTable() = default;
  virtual const FunctionBody& body(int64_t index) const = 0;
};

class FunctionBody {
 public:
  // `store` holds the body recorded for one call, and must outlive this and stay
  // unchanged while it runs; `ready` is that recording's queue (compiling takes
  // its nodes). args: the nodes that stand for the arguments, in order (inputs;
  // parameters for shared arguments). results: the body's results. `nested`:
  // the table of the functions the body itself calls.
  void compile(NodeStore& store, ReadyQueue& ready, std::span<const NodeId> args, std::span<const NodeId> results,
               bool fuse, Fuser& fuser, const FunctionTable* nested);

  // How the body reads its arguments, for the executor to hand them over
  // without copies where it can: an argument read only by fused steps may come
  // as rows read in place (FusedInput::rows, on the CPU); arguments that one of
  // the body's concats puts side by side may come as that concat's value,
  // gathered in one row copy (a "group"). Everything else comes as a tensor.
  struct ArgUse {
    bool fused = false;   // read by a fused step (as rows in place, when it is read by nothing else)
    bool tensor = false;  // shared, read by an op step outside a group, or returned
    // Read by op steps that take it as rows in place (OpTraits::rows_in_place):
    // without a gradient wanted, the executor may give rows instead of a tensor.
    bool rows = false;
  };
  std::span<const ArgUse> arg_uses() const { return arg_use_; }
  // Per group: the arguments, in the concat's order, and its per-example shape.
  struct Group {
    std::vector<uint32_t> args;
    Shape shape;
  };
  std::span<const Group> groups() const { return groups_; }

  // The n calls of a batch: args[i] holds argument i ([n, ...] or rows read in
  // place; the shared tensor where a.shared[i]; undefined where arg_uses()
  // says it is not needed and its group came); groups[k] group k's value, or
  // undefined (then its arguments come as tensors). Returns each result as
  // [n, its shape...]. Values stay in autograd; shared weights' gradients join
  // the round's products through a.weight_grads.
  std::vector<at::Tensor> run(const LaunchArgs& a, std::span<const FusedInput> args,
                              std::span<const at::Tensor> groups) const;
  // The same with every argument a tensor (a.inputs) and no groups.
  std::vector<at::Tensor> run(const LaunchArgs& a) const;

  size_t steps() const { return steps_.size(); }

 private:
  struct Step {
    NodeId node = kNoNode;  // an op (a call: `members` are its results); kNoNode: a fused region
    std::shared_ptr<const FusedProgram> program;
    std::vector<NodeId> inputs;   // the region's inputs
    std::vector<NodeId> members;  // its members, in program order
    std::vector<uint8_t> keep;    // members read outside the region, or results
    int32_t group = -1;           // a concat of arguments: its group
    bool payload = false;         // an op that reads its payload: handed one per row
  };
  void plan_arguments(const NodeStore& s, size_t arity);
  // `regs`: a value per body node (run()'s, on its stack for a small body).
  void run_fused_step(const Step& step, int64_t n, std::span<const FusedInput> args, std::span<at::Tensor> regs) const;
  void run_op_step(const Step& step, const LaunchArgs& a, std::span<const FusedInput> args,
                   std::span<at::Tensor> regs) const;

  const NodeStore* store_ = nullptr;
  const FunctionTable* nested_ = nullptr;
  std::vector<int32_t> arg_of_;  // per body node: the argument it stands for, or -1
  std::vector<NodeId> results_;
  std::vector<Step> steps_;
  std::vector<ArgUse> arg_use_;
  std::vector<Group> groups_;
};

}  // namespace sheaf
