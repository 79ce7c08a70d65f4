// The small ids every layer passes around, and their sentinels.
#pragma once

#include <cstdint>
#include <limits>

namespace sheaf {

using NodeId = uint32_t;   // a node of one graph's trace
using OpCode = uint16_t;   // an op's position in the op table (ops/op_list.h)
using ShapeId = uint32_t;  // an interned per-example shape (tracer/node_store.h)
using SigId = uint32_t;    // an interned signature: equal ids may share a launch

inline constexpr uint32_t kNone32 = std::numeric_limits<uint32_t>::max();
inline constexpr NodeId kNoNode = kNone32;
inline constexpr ShapeId kUnknownShape = kNone32;  // downstream of an unresolved dsl::cond
inline constexpr SigId kNoSig = kNone32;           // a shared node: computed once, never batched
inline constexpr uint32_t kWholeRow = kNone32;     // a value that is a whole tensor, not a batch row

// Example tags of nodes that belong to no single example. User example ids are >= 0.
inline constexpr int64_t kSharedExample = -1;  // a parameter, or an op on parameters only
inline constexpr int64_t kMixedExample = -2;   // combines values of several examples

}  // namespace sheaf
