// Expr: the symbolic value users write per-example code with. It is a 12-byte
// trivially copyable handle (graph slot, generation, node). Creating one records
// a node; nothing is computed until Graph::forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <source_location>

#include "../tracer/shape.h"

namespace sheaf {

class Graph;
using NodeId = uint32_t;

class Expr {
 public:
  Expr() = default;  // refers to nothing; using it is a UserError

  // The graph this Expr belongs to. Throws UserError if that graph was cleared
  // or destroyed since the Expr was made.
  Graph& graph() const;
  NodeId id() const { return node_; }
  bool defined() const { return slot_ != kNoSlot; }
  // Per-example shape (no batch axis). Throws if it depends on an unresolved dsl::cond.
  const Shape& shape() const;
  int example() const;
  // The computed value, [shape...], connected to autograd. Valid after forward.
  at::Tensor value() const;
  // Convenience for scalars: value().item<double>().
  double item() const;

  friend bool operator==(const Expr& a, const Expr& b) {
    return a.slot_ == b.slot_ && a.gen_ == b.gen_ && a.node_ == b.node_;
  }

 private:
  friend class Graph;
  static constexpr uint32_t kNoSlot = 0xFFFFFFFFu;
  Expr(uint32_t slot, uint32_t gen, NodeId node) : slot_(slot), gen_(gen), node_(node) {}
  uint32_t slot_ = kNoSlot;
  uint32_t gen_ = 0;
  NodeId node_ = 0;
};

// An Expr argument that also remembers the caller's source line. Operators cannot
// take a defaulted std::source_location parameter, but the implicit conversion to
// At evaluates its default argument at the user's call site.
struct At {
  At(Expr e, std::source_location l = std::source_location::current()) : expr(e), loc(l) {}
  Expr expr;
  std::source_location loc;
};

}  // namespace sheaf
