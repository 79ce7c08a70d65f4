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

namespace sheaf {

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

  // The n calls of a batch: a.inputs[i] holds argument i ([n, ...], or the shared
  // tensor where a.shared[i]). Returns [n, ...] of the call's shape: the result,
  // or several results flattened side by side. Values stay in autograd; shared
  // weights' gradients join the round's products through a.weight_grads.
  at::Tensor run(const LaunchArgs& a) const;

  size_t steps() const { return steps_.size(); }

 private:
  struct Step {
    NodeId node = kNoNode;  // an op; kNoNode: a fused region
    std::shared_ptr<const FusedProgram> program;
    std::vector<NodeId> inputs;   // the region's inputs
    std::vector<NodeId> members;  // its members, in program order
    std::vector<uint8_t> keep;    // members read outside the region, or results
  };
  const NodeStore* store_ = nullptr;
  const FunctionTable* nested_ = nullptr;
  std::vector<int32_t> arg_of_;  // per body node: the argument it stands for, or -1
  std::vector<NodeId> results_;
  std::vector<Step> steps_;
};

}  // namespace sheaf
