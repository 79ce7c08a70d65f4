// A call of a sheaf::Function (dsl/function.h): the function's body, recorded
// once per argument signature, runs for every call of a batch as ONE step list
// over the batch (backend/function_body.h). The graph sees one node per call
// instead of one per op of the body, so recording and scheduling cost per call,
// not per op.
#pragma once

#include "common.h"

namespace sheaf::op {

// args: the function's arguments; attrs: the body's index in the graph's
// function table, the number of results K, then the shape of the first
// result (rank, dims...). Its value is the first result; results 1..K-1 are
// the CallResult nodes recorded right after it (node ids call + k). A batch of
// calls has one output per result: the scheduler places the results' rows
// with the call's (scheduler/round.h, plan.h).
struct Call {
  static constexpr std::string_view name = "call";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic};
  static Shape infer(const InferCtx& c) { return shape_from_attrs(c, 2); }
  static at::Tensor run(RunCtx&);  // never: the executor runs the body (backend/function_body.h)
};

// Result k (>= 1) of a call: args: the call; attrs: k, then the result's shape.
// Computed by the call's batch, never scheduled on its own.
struct CallResult {
  static constexpr std::string_view name = "call_result";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return shape_from_attrs(c, 1); }
  static at::Tensor run(RunCtx&);
};

}  // namespace sheaf::op
