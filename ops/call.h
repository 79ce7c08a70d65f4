// A call of a sheaf::Function (dsl/function.h): the function's body, recorded
// once per argument signature, runs for every call of a batch as ONE step list
// over the batch (backend/function_body.h). The graph sees one node per call
// instead of one per op of the body, so recording and scheduling cost per call,
// not per op.
#pragma once

#include "common.h"

namespace sheaf::op {

// Attributes (k, rank, dims...): an index, then a shape.
inline Shape indexed_shape(const InferCtx& c) {
  if (c.attrs().size() < 2 || c.attr(1) < 0 || c.attr(1) > kMaxRank ||
      c.attrs().size() != 2 + static_cast<size_t>(c.attr(1)))
    c.fail("malformed attributes (record calls through sheaf::Function)");
  Shape out;
  for (int64_t i = 0; i < c.attr(1); ++i) out.push(c.attr(2 + static_cast<size_t>(i)));
  return out;
}

// args: the function's arguments; attrs: the body's index in the graph's
// function table, then the shape of its (first) result. Its value is the first
// result; a function with more results has a CallResult node for each of the
// others, and a batch of calls has one output per result (scheduler/fusion.h).
struct Call {
  static constexpr std::string_view name = "call";
  static constexpr OpTraits traits{.arity = OpTraits::kVariadic};
  static Shape infer(const InferCtx& c) { return indexed_shape(c); }
  static at::Tensor run(RunCtx&);  // never: the executor runs the body (backend/function_body.h)
};

// Result k (>= 1) of a call: args: the call; attrs: k, then the result's shape.
// Computed by the call's batch, never launched alone.
struct CallResult {
  static constexpr std::string_view name = "call_result";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return indexed_shape(c); }
  static at::Tensor run(RunCtx&);
};

}  // namespace sheaf::op
