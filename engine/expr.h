// Expr: the symbolic value users write per-example code with. It is a 12-byte
// trivially copyable handle (graph slot, generation, node). Creating one records
// a node; nothing is computed until Graph::forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <source_location>

#include <sheaf/core/ids.h>
#include <sheaf/core/shape.h>

namespace sheaf {

class Graph;
namespace detail {
class Engine;
}

class Expr {
 public:
  using Loc = std::source_location;
  Expr() = default;  // refers to nothing; using it is a UserError

  // The graph this Expr belongs to. Throws UserError (naming the caller's line)
  // if that graph was cleared or destroyed since the Expr was made (the
  // message says which).
  Graph& graph(Loc loc = Loc::current()) const;
  NodeId id() const { return node_; }
  bool defined() const { return slot_ != kNone32; }
  // Per-example shape (no batch axis). Throws if it depends on an unresolved dsl::cond.
  // (A copy: the graph's table of shapes grows as it records.)
  Shape shape(Loc loc = Loc::current()) const;
  // The example id it was recorded for, or kSharedExample / kMixedExample.
  int64_t example(Loc loc = Loc::current()) const;
  // The computed value, [shape...], connected to autograd. Valid after forward.
  at::Tensor value(Loc loc = Loc::current()) const;
  // A scalar's computed value as a double: value().item<double>().
  double item(Loc loc = Loc::current()) const;

  friend bool operator==(const Expr& a, const Expr& b) {
    return a.slot_ == b.slot_ && a.gen_ == b.gen_ && a.node_ == b.node_;
  }

 private:
  friend class detail::Engine;
  Expr(uint32_t slot, uint32_t gen, NodeId node) : slot_(slot), gen_(gen), node_(node) {}
  uint32_t slot_ = kNone32;
  uint32_t gen_ = 0;
  NodeId node_ = 0;
};

}  // namespace sheaf
