// A computed value on the host, handed to whatever awaited it (a dsl::cond, a
// dsl::loop step, a coroutine). Valid only during that call: it points into
// the round's values (on the CPU, the batch output itself: nothing is copied)
// or into the round's one device->host copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include <sheaf/core/error.h>
#include <sheaf/core/inline_function.h>
#include <sheaf/core/shape.h>

namespace sheaf {

struct HostValue {
  const float* data = nullptr;
  // By value: the graph's shape table may grow while callbacks record nodes.
  Shape shape;
  Site recorded;  // the op, example and line that recorded the value (for errors about it)

  int64_t numel() const { return shape.numel(); }
  // A CPU tensor of the value that the caller owns (one copy).
  at::Tensor tensor() const;
};

namespace detail {

// Something waiting for the computed value of a node (a dsl::cond, a dsl::loop
// step, a suspended coroutine). Called with the value on the CPU, after the
// round that computed it; it may record more nodes. In place up to 128 bytes
// (core/inline_function.h): a cond's own state takes 56 of them, so branches
// capturing up to ~72 bytes together (the gated net's take 56) cost no
// allocation; larger ones cost one, for the whole callback.
using ValueCallback = InlineFunction<void(const HostValue& value), 128>;

}  // namespace detail

}  // namespace sheaf
