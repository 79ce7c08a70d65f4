// The DSL: functions and operators on Expr. Each one only RECORDS a node (with
// the caller's source line, for errors); Graph::forward computes.
//
// Per-example values have a shape without the batch axis. Wherever an Expr is
// accepted, a torch tensor may be given instead: it is a shared value (a
// parameter), the same for every example.
#pragma once

#include <ATen/core/Tensor.h>

#include <bit>
#include <initializer_list>
#include <source_location>
#include <span>
#include <vector>

#include "../tracer/graph.h"
#include "op_list.h"

namespace sheaf {

// An op argument: an Expr, or a tensor used as a shared value.
class Operand {
 public:
  Operand(Expr e) : expr_(e) {}                        // NOLINT: implicit by design
  Operand(const at::Tensor& t) : tensor_(&t) {}        // NOLINT
  bool is_expr() const { return tensor_ == nullptr; }
  const Expr& expr() const { return expr_; }
  const at::Tensor& tensor() const { return *tensor_; }

 private:
  Expr expr_;
  const at::Tensor* tensor_ = nullptr;  // lives as long as the call
};

namespace detail {
using Loc = std::source_location;
// Records `op` on the graph of the first Expr operand; tensors become shared nodes.
Expr apply(OpCode op, std::initializer_list<Operand> args, std::span<const int64_t> attrs, int64_t payload, Loc loc);
Expr apply_list(OpCode op, std::span<const Expr> args, std::span<const int64_t> attrs, Loc loc);
inline Expr unary(OpCode op, const At& x) { return apply(op, {x.expr}, {}, 0, x.loc); }
inline Expr with_scalar(OpCode op, const At& x, double c) {
  int64_t a = std::bit_cast<int64_t>(c);
  return apply(op, {x.expr}, std::span(&a, 1), 0, x.loc);
}
}  // namespace detail

// ---- Operators (in namespace sheaf, found by argument-dependent lookup).
inline Expr operator+(At a, Operand b) { return detail::apply(code_of<op::Add>, {a.expr, b}, {}, 0, a.loc); }
inline Expr operator-(At a, Operand b) { return detail::apply(code_of<op::Sub>, {a.expr, b}, {}, 0, a.loc); }
inline Expr operator*(At a, Operand b) { return detail::apply(code_of<op::Mul>, {a.expr, b}, {}, 0, a.loc); }
inline Expr operator/(At a, Operand b) { return detail::apply(code_of<op::Div>, {a.expr, b}, {}, 0, a.loc); }
inline Expr operator+(const at::Tensor& a, At b) { return detail::apply(code_of<op::Add>, {a, b.expr}, {}, 0, b.loc); }
inline Expr operator-(const at::Tensor& a, At b) { return detail::apply(code_of<op::Sub>, {a, b.expr}, {}, 0, b.loc); }
inline Expr operator*(const at::Tensor& a, At b) { return detail::apply(code_of<op::Mul>, {a, b.expr}, {}, 0, b.loc); }
inline Expr operator/(const at::Tensor& a, At b) { return detail::apply(code_of<op::Div>, {a, b.expr}, {}, 0, b.loc); }
inline Expr operator+(At x, double c) { return detail::with_scalar(code_of<op::AddScalar>, x, c); }
inline Expr operator+(double c, At x) { return detail::with_scalar(code_of<op::AddScalar>, x, c); }
inline Expr operator-(At x, double c) { return detail::with_scalar(code_of<op::AddScalar>, x, -c); }
inline Expr operator-(double c, At x) {
  return detail::with_scalar(code_of<op::AddScalar>, At(detail::unary(code_of<op::Neg>, x), x.loc), c);
}
inline Expr operator*(At x, double c) { return detail::with_scalar(code_of<op::MulScalar>, x, c); }
inline Expr operator*(double c, At x) { return detail::with_scalar(code_of<op::MulScalar>, x, c); }
inline Expr operator/(At x, double c) { return detail::with_scalar(code_of<op::MulScalar>, x, 1.0 / c); }
inline Expr operator/(double c, At x) { return detail::with_scalar(code_of<op::RDivScalar>, x, c); }
inline Expr operator-(At x) { return detail::unary(code_of<op::Neg>, x); }
// Comparisons give 1.0 / 0.0 (no gradient); use them as dsl::cond / dsl::loop predicates.
inline Expr operator>(At x, double c) { return detail::with_scalar(code_of<op::GreaterScalar>, x, c); }
inline Expr operator<(At x, double c) { return detail::with_scalar(code_of<op::LessScalar>, x, c); }
inline Expr operator>(At a, Operand b) { return detail::apply(code_of<op::Greater>, {a.expr, b}, {}, 0, a.loc); }
inline Expr operator<(At a, Operand b) { return detail::apply(code_of<op::Greater>, {b, a.expr}, {}, 0, a.loc); }

namespace dsl {

using detail::Loc;

inline Expr tanh(At x) { return detail::unary(code_of<op::Tanh>, x); }
inline Expr sigmoid(At x) { return detail::unary(code_of<op::Sigmoid>, x); }
inline Expr relu(At x) { return detail::unary(code_of<op::Relu>, x); }
inline Expr exp(At x) { return detail::unary(code_of<op::Exp>, x); }
inline Expr log(At x) { return detail::unary(code_of<op::Log>, x); }
inline Expr neg(At x) { return detail::unary(code_of<op::Neg>, x); }

// W x + b. W: [out, in], shared (a parameter) or per example; x: [in] or [t, in]; b: [out].
inline Expr affine(Operand W, Operand x, Operand b, Loc loc = Loc::current()) {
  return detail::apply(code_of<op::Affine>, {W, x, b}, {}, 0, loc);
}
// A x (A: [m, k], x: [k]) or A B (B: [k, p]).
inline Expr matmul(Operand A, Operand B, Loc loc = Loc::current()) {
  return detail::apply(code_of<op::Matmul>, {A, B}, {}, 0, loc);
}

// Concatenation along `axis` of the per-example value (default: the last).
Expr concat(std::span<const Expr> xs, int axis = -1, Loc loc = Loc::current());
inline Expr concat(std::initializer_list<Expr> xs, int axis = -1, Loc loc = Loc::current()) {
  return concat(std::span(xs.begin(), xs.size()), axis, loc);
}
// Elements [begin, end) along `axis`.
Expr slice(Expr x, int64_t begin, int64_t end, int axis = -1, Loc loc = Loc::current());
// `n` equal slices along `axis` (the size must divide).
std::vector<Expr> chunk(Expr x, int n, int axis = -1, Loc loc = Loc::current());
// Slices of the given sizes along `axis` (they must add up to the size).
std::vector<Expr> split(Expr x, std::span<const int64_t> sizes, int axis = -1, Loc loc = Loc::current());

// Sum / mean of all elements of x: a scalar.
inline Expr sum(At x) { return detail::unary(code_of<op::Sum>, x); }
inline Expr mean(At x) { return detail::unary(code_of<op::Mean>, x); }
// Elementwise sum / mean of a list of equal-shaped values (e.g. losses of all examples).
Expr sum(std::span<const Expr> xs, Loc loc = Loc::current());
Expr mean(std::span<const Expr> xs, Loc loc = Loc::current());
inline Expr sum(const std::vector<Expr>& xs, Loc loc = Loc::current()) { return sum(std::span(xs), loc); }
inline Expr mean(const std::vector<Expr>& xs, Loc loc = Loc::current()) { return mean(std::span(xs), loc); }

// Over the last axis.
inline Expr softmax(At x) { return detail::unary(code_of<op::Softmax>, x); }
inline Expr log_softmax(At x) { return detail::unary(code_of<op::LogSoftmax>, x); }
// x[i] of a vector x: a scalar.
inline Expr pick(Expr x, int64_t i, Loc loc = Loc::current()) {
  return detail::apply(code_of<op::Pick>, {x}, {}, i, loc);
}
// -log softmax(x)[label]: the cross-entropy loss of one example, a scalar.
inline Expr pick_neg_log_softmax(Expr x, int64_t label, Loc loc = Loc::current()) {
  return detail::apply(code_of<op::PickNegLogSoftmax>, {x}, {}, label, loc);
}
// Inverted dropout with keep-probability 1 - p. The mask depends on the graph's
// seed, the example and the node's position in its example, so an example gets
// the same mask alone or batched. Identity when the graph is not in train mode.
inline Expr dropout(Expr x, double p, Loc loc = Loc::current()) {
  int64_t a = std::bit_cast<int64_t>(p);
  return detail::apply(code_of<op::Dropout>, {x}, std::span(&a, 1), 0, loc);
}

}  // namespace dsl
}  // namespace sheaf
