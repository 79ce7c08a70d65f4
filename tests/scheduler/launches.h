// The scheduler's launch counts, read from the last round's plan.
#pragma once

#include <cstdint>
#include <string_view>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/op.h>

namespace sheaf::test {

// Batches of `op` in the last round (fused batches not counted).
inline uint64_t launches_of(Graph& g, std::string_view op) {
  uint64_t n = 0;
  for (const PlannedBatch& b : sheaf::detail::engine_of(g).last_plan()->batches)
    if (!b.program && op_name(b.op) == op) ++n;
  return n;
}

}  // namespace sheaf::test
