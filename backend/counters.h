// What the executor counts while it runs a plan (part of sheaf::Stats).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace sheaf {

struct ExecCounters {
  uint64_t nodes = 0;             // nodes executed
  uint64_t batches = 0;           // batches run (one launch each, but a call batch runs its body's steps)
  uint64_t zero_copy_inputs = 0;  // batched inputs passed as a view of an earlier batch
  uint64_t gathered_inputs = 0;   // batched inputs that needed a gather
  uint64_t gather_launches = 0;   // index_select / cat launches those gathers took
  uint64_t gathered_bytes = 0;    // bytes those gathers wrote
  // Inputs read row by row where they lie (CPU): no gather. Fused kernels'
  // inputs, products' x without autograd (OpTraits::rows_in_place), and
  // packed products' rows with their gradients (OpTraits::reads_in_place).
  // An op that takes such rows as a tensor after all copies them itself,
  // uncounted here (bench/launches.h counts that copy as a gather): a product
  // the packed kernel does not take.
  uint64_t in_place_inputs = 0;
  uint64_t fused_batches = 0;     // batches that ran a fused elementwise program (one launch each)
  uint64_t fused_ops = 0;         // the ops those programs computed (without fusion: one launch each)
  uint64_t call_batches = 0;      // batches of sheaf::Function calls (each runs its body's steps once: several launches)
  double gather_ms = 0;  // with GraphOptions::profile: inputs' gathers, device time included
  double op_ms = 0;      // with GraphOptions::profile: the batched ops, device time included
  // With GraphOptions::profile: per op ("fused" for fused batches), launches and
  // milliseconds of gathers and of the op itself.
  struct OpTime {
    uint64_t launches = 0;
    double gather_ms = 0, op_ms = 0;
  };
  std::map<std::string, OpTime> by_op;
};

}  // namespace sheaf
