// Runs a plan with LibTorch on the graph's device. A batch's output is one tensor
// [n, ...]; a node's value is its row. Values stay in the autograd graph.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <deque>
#include <string_view>

#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/weight_grad.h>
#include <sheaf/scheduler/plan.h>
#include <sheaf/tracer/node_store.h>

#include "counters.h"
#include "function_body.h"
#include "fused.h"
#include "lazy.h"
#include "row_gather.h"

namespace sheaf {

struct ExecConfig {
  c10::Device device = c10::kCPU;
  uint64_t seed = 0;    // dropout masks
  bool train = true;    // dropout is the identity when false
  bool profile = false; // wait for the device around gathers and ops (ExecCounters' times)
  bool batch_weight_grads = true;  // one gradient product per shared weight per round (ops/weight_grad.h)
  const FunctionTable* functions = nullptr;  // the bodies of the graph's function calls
  TransposedWeights* transposed = nullptr;   // W^T of shared weights, kept for the graph (ops/weight_grad.h)
  // The graph's last index buffer (CPU): a round reuses it when nothing else
  // holds it (no autograd node saved ids from it: inference) instead of
  // allocating one. Null: a new buffer every round.
  at::Tensor* index_buffer = nullptr;
  // The graph's row gathers, kept from round to round (one gradient hub per
  // source batch for all rounds, backend/row_gather.h). Required.
  RowGathers* row_gathers = nullptr;
};

class Executor {
 public:
  Executor(NodeStore& store, LazyValues& lazy, const ExecConfig& config, ExecCounters& counters)
      : s_(store),
        lazy_(lazy),
        config_(config),
        counters_(counters),
        row_gathers_(required(config.row_gathers)) {}
  // Runs every batch of the plan in order. On failure (a LibTorch error in a
  // launch) throws UserError naming the op, its line and examples; batches
  // before it stay computed. An executor serves every round of its graph:
  // its scratch lists keep their capacity (made afresh each round, they
  // were about a fifth of a gated net's allocations), and what a round held
  // (tensors, rows read in place, the weights' gradient taps) is let go when
  // its run() returns or throws.
  void run(const Plan& plan);

 private:
  void upload_indices(const Plan& plan);
  void launch(const Plan& plan, const PlannedBatch& b);
  void launch_fused(const Plan& plan, const PlannedBatch& b);
  void fused_inputs(const Plan& plan, const PlannedBatch& b);
  std::shared_ptr<const InPlaceRows> in_place(const Plan& plan, const PlannedBatch& b, const BatchArg& arg);
  Site site_of(const Plan& plan, const PlannedBatch& b) const;
  bool rows_for_op(const Plan& plan, const PlannedBatch& b, uint32_t k);
  bool reads_for_op(const Plan& plan, const PlannedBatch& b, uint32_t k);
  bool give_in_place(const Plan& plan, const PlannedBatch& b, uint32_t k);
  LaunchArgs launch_args(const Plan& plan, const PlannedBatch& b);
  at::Tensor input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg);
  at::Tensor rows_input(const Plan& plan, const PlannedBatch& b, const BatchArg& arg);
  at::Tensor read(const Plan& plan, uint32_t r);
  bool pick_rows(const Plan& plan, uint32_t reads_begin, uint32_t reads_end, int64_t perm);
  void clear_picks();
  at::Tensor copy_rows(const Plan& plan, uint32_t reads_begin, uint32_t reads_end, int64_t perm);
  at::Tensor concat_rows(const Plan& plan, const PlannedBatch& b);
  at::Tensor side_by_side(const Plan& plan, const PlannedBatch& b, std::span<const uint32_t> args, const Shape& shape);
  void launch_call(const Plan& plan, const PlannedBatch& b);
  const std::vector<at::Tensor>& split_pieces(const Plan& plan, int32_t split);
  void check_output(NodeId node, const PlannedBatch& b, const at::Tensor& out) const;
  [[noreturn]] void rethrow(const Plan& plan, const PlannedBatch& b, const std::exception& e) const;
  double lap(double* into);  // profiling: ms since the last lap, to the device's idle point (0 otherwise)
  void lap_gathers(std::string_view op);
  void lap_op(std::string_view op);
  void end_round();  // drops what the round held; the lists keep their capacity

  NodeStore& s_;
  LazyValues& lazy_;
  const ExecConfig& config_;
  ExecCounters& counters_;
  at::TensorOptions float_opts_;
  at::Tensor index_;  // plan.indices on the device
  Shape row_shape_;   // a packed batch's out_shape (launch_args)
  WeightGradBatcher weight_grads_;  // one product per shared weight for the round's gradients
  std::vector<std::vector<at::Tensor>> groups_;  // outputs of each read group, made at first use
  RowGathers& row_gathers_;                      // the graph's: CPU gathers, one gradient per source batch
  static RowGathers& required(RowGathers* g) {
    SHEAF_ASSERT(g != nullptr, "an executor without the graph's row gathers");
    return *g;
  }
  std::vector<const at::Tensor*> row_sources_;   // copy_rows' scratch
  std::vector<uint32_t> row_batches_;
  std::vector<RowPick> picks_, permuted_;
  // Batches read as rows of their rows (Read::flatten), one view each per
  // round: a deque, so that row_sources_' pointers stay valid.
  std::deque<std::pair<uint32_t, at::Tensor>> flat_views_;
  const at::Tensor& flat_view(uint32_t batch);
  std::vector<std::vector<at::Tensor>> splits_;  // pieces of each split group, made at first use
  std::vector<at::Tensor> inputs_;
  std::vector<FusedInput> fused_in_;
  std::vector<uint8_t> shared_;
  std::vector<uint32_t> all_args_;      // concat_rows' argument list
  std::vector<at::Tensor> call_groups_;  // launch_call's scratch
  std::vector<uint8_t> grouped_;
  // launch's arguments given as rows in place (OpTraits::rows_in_place,
  // reads_in_place), per argument (null: a tensor); this launch's.
  std::vector<std::shared_ptr<const InPlaceRows>> op_reads_;
  std::vector<const RowReads*> op_reads_view_;
  std::chrono::steady_clock::time_point lap_start_;
};

}  // namespace sheaf
