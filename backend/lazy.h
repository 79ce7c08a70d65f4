// Values that fused batches computed only inside their kernel (backend/fused.h:
// members read by nothing outside their region when the batch ran). A later
// read (a node recorded after forward, Expr::value(), the checker) runs the
// batch's program again from the inputs it kept, under the reader's grad mode,
// and fills the missing values in.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/scheduler/fusion.h>
#include <sheaf/tracer/node_store.h>

#include "fused.h"

namespace sheaf {

class LazyValues {
 public:
  // Batch outputs [first, first + count) of a fused batch, some left undefined;
  // `site` names the batch (get's error).
  void add(uint32_t first, std::shared_ptr<const FusedProgram> program, std::vector<FusedInput> inputs, int64_t n,
           const Site& site);
  // store.batch_out[slot], computed now if a fused batch left it out: from the
  // inputs as forward read them (a UserError if one was changed in place since).
  const at::Tensor& get(NodeStore& store, uint32_t slot);
  void clear();
  // Fused batches run again by get() since the last clear().
  uint64_t remade() const { return remade_; }

 private:
  struct Record {
    uint32_t first;
    std::shared_ptr<const FusedProgram> program;
    std::vector<FusedInput> inputs;
    int64_t n;
    std::vector<int64_t> versions;  // per tensor input (version_of), when added
    Site site;
  };
  std::vector<Record> records_;
  std::vector<int32_t> record_of_slot_;
  uint64_t remade_ = 0;
};

}  // namespace sheaf
