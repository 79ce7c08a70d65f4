// Runs a plan with LibTorch on the graph's device. A batch's output is one tensor
// [n, ...]; a node's value is its row. Values stay in the autograd graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "../scheduler/plan.h"
#include "../tracer/graph.h"

namespace sheaf {

class Executor {
 public:
  Executor(NodeStore& store, const GraphOptions& options, Stats& stats)
      : s_(store), options_(options), stats_(stats) {}
  // Runs every batch of the plan in order. On failure (a LibTorch error in a
  // launch) throws UserError naming the op and examples; batches before it stay
  // computed. Returns the number of batches that ran.
  size_t run(const Plan& plan);

 private:
  at::Tensor input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg);
  at::Tensor read(const Plan& plan, uint32_t r);
  at::Tensor split_piece(const Plan& plan, const PlannedBatch& b);
  [[noreturn]] void rethrow(const Plan& plan, const PlannedBatch& b, const std::exception& e) const;

  NodeStore& s_;
  const GraphOptions& options_;
  Stats& stats_;
  at::Tensor index_;  // plan.indices on the device
  std::vector<std::vector<at::Tensor>> groups_;  // outputs of each read group, made at first use
  std::vector<std::vector<at::Tensor>> splits_;  // pieces of each split group, made at first use
  std::vector<at::Tensor> inputs_;
  std::vector<uint8_t> shared_;
};

}  // namespace sheaf
