// The DSL: functions and operators on Expr. Each one only RECORDS a node (with
// the caller's source line, for errors); Graph::forward computes.
//
// Per-example values have a shape without the batch axis. Wherever an Expr is
// accepted, a torch tensor may be given instead: it is a shared value (a
// parameter), the same for every example. A "shared" value must be the SAME
// tensor for every example to batch: a tensor made per example (W * 1.0, W.t(),
// a narrow of W inside the model) splits batches (Stats::split_shared counts them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <source_location>
#include <span>
#include <type_traits>
#include <vector>

#include <sheaf/engine/expr.h>
#include <sheaf/engine/graph.h>

namespace sheaf {

// An op argument: an Expr, or a tensor used as a shared value.
class Operand {
 public:
  Operand(Expr e) {  // NOLINT: implicit by design
    uint32_t last;
    std::memcpy(&first_, static_cast<const void*>(&e), 8);
    std::memcpy(&last, reinterpret_cast<const char*>(&e) + 8, 4);
    second_ = last;
  }
  Operand(const at::Tensor& t) : first_(reinterpret_cast<uintptr_t>(&t)), second_(kTensor) {}  // NOLINT
  bool is_expr() const { return second_ != kTensor; }
  Expr expr() const {
    Expr e;
    const auto last = static_cast<uint32_t>(second_);
    // (Through void*: Expr is trivially copyable, but its default member
    // initializers make -Wclass-memaccess warn on a typed pointer.)
    std::memcpy(static_cast<void*>(&e), &first_, 8);
    std::memcpy(reinterpret_cast<char*>(&e) + 8, &last, 4);
    return e;
  }
  const at::Tensor& tensor() const { return *reinterpret_cast<const at::Tensor*>(first_); }  // (lives as long as the call)

 private:
  // An Expr's 12 bytes (its first 8, then its last 4), or a tensor's address
  // and kTensor: 16 bytes in two 8-byte words, passed by value in two
  // registers and made or copied 8 bytes at a time. At 24 bytes (an Expr and
  // a pointer) an Operand went through memory, written in 4- and 8-byte
  // parts and read back in 8 or 16 to be passed on: a load that spans two
  // stores waits for them to retire instead of taking their data, which was
  // a tenth of recording a TreeLSTM's nodes. (4-byte words: the same stall
  // for the second.)
  static constexpr uint64_t kTensor = uint64_t{1} << 32;
  static_assert(sizeof(Expr) == 12 && std::is_trivially_copyable_v<Expr>);
  uint64_t first_ = 0;
  uint64_t second_ = 0;
};
static_assert(sizeof(Operand) == 16 && std::is_trivially_copyable_v<Operand>);

// An Expr argument that also remembers the caller's source line. Operators cannot
// take a defaulted std::source_location parameter, but the implicit conversion to
// At evaluates its default argument at the user's call site.
struct At {
  At(Expr e, std::source_location l = std::source_location::current()) : expr(e), loc(l) {}  // NOLINT
  Expr expr;
  std::source_location loc;
};

// ---- Operators (in namespace sheaf, found by argument-dependent lookup).
Expr operator+(At a, Operand b);
Expr operator-(At a, Operand b);
Expr operator*(At a, Operand b);
Expr operator/(At a, Operand b);
Expr operator+(const at::Tensor& a, At b);
Expr operator-(const at::Tensor& a, At b);
Expr operator*(const at::Tensor& a, At b);
Expr operator/(const at::Tensor& a, At b);
Expr operator+(At x, double c);
Expr operator+(double c, At x);
Expr operator-(At x, double c);
Expr operator-(double c, At x);
Expr operator*(At x, double c);
Expr operator*(double c, At x);
Expr operator/(At x, double c);
Expr operator/(double c, At x);
Expr operator-(At x);
// Comparisons give 1.0 / 0.0 (no gradient); use them as dsl::cond / dsl::loop predicates.
Expr operator>(At x, double c);
Expr operator<(At x, double c);
Expr operator>(At a, Operand b);
Expr operator<(At a, Operand b);

namespace dsl {

using Loc = std::source_location;

Expr tanh(At x);
Expr sigmoid(At x);
Expr relu(At x);
Expr exp(At x);
Expr log(At x);
Expr neg(At x);
Expr abs(At x);
Expr sqrt(At x);
Expr softplus(At x);     // log(1 + e^x)
Expr log_sigmoid(At x);  // log(sigmoid(x)), stable for large |x|
Expr gelu(At x);         // GELU, tanh form (LibTorch's approximate="tanh")
Expr pow(At x, double c);  // x^c elementwise (LibTorch's pow with a scalar exponent)
// Elementwise larger / smaller (shapes that broadcast, as for a + b); at
// ties the gradient is split evenly, as LibTorch's.
Expr maximum(Operand a, Operand b, Loc loc = Loc::current());
Expr minimum(Operand a, Operand b, Loc loc = Loc::current());

// W x + b. W: [out, in], shared (a parameter) or per example; x: [in] or [t, in]; b: [out].
Expr affine(Operand W, Operand x, Operand b, Loc loc = Loc::current());
// A x (A: [m, k], x: [k]) or A B (B: [k, p]).
Expr matmul(Operand A, Operand B, Loc loc = Loc::current());

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
// Shape: reshape (one dim may be -1), swap two axes, stack a list along a new axis.
Expr reshape(Expr x, Shape shape, Loc loc = Loc::current());
Expr transpose(Expr x, int axis0 = 0, int axis1 = 1, Loc loc = Loc::current());
Expr stack(std::span<const Expr> xs, int axis = 0, Loc loc = Loc::current());
inline Expr stack(std::initializer_list<Expr> xs, int axis = 0, Loc loc = Loc::current()) {
  return stack(std::span(xs.begin(), xs.size()), axis, loc);
}
inline Expr stack(const std::vector<Expr>& xs, int axis = 0, Loc loc = Loc::current()) {
  return stack(std::span(xs), axis, loc);
}
Expr sum(At x);
Expr mean(At x);
// One axis reduced away (DyNet's names): [3, 4] along axis 1 -> [3].
Expr sum_dim(Expr x, int axis, Loc loc = Loc::current());
Expr mean_dim(Expr x, int axis, Loc loc = Loc::current());
Expr max_dim(Expr x, int axis, Loc loc = Loc::current());
Expr min_dim(Expr x, int axis, Loc loc = Loc::current());
Expr logsumexp_dim(Expr x, int axis, Loc loc = Loc::current());
Expr dot(Operand a, Operand b, Loc loc = Loc::current());  // two vectors -> a scalar
// Scaled dot-product attention with `heads` heads: q [Lq, d], k [Lk, d], v [Lk, dv]
// -> [Lq, dv], each head softmax(scale * q_h k_h^T) v_h on its columns; scale 0
// means 1 / sqrt(d / heads) (give 1 for plain dot products).
// Values of different lengths, Lq = Lk or not, are one launch (docs/ops.md,
// "Lengths"); written as matmul / softmax / matmul it runs once per pair of lengths.
Expr attention(Expr q, Expr k, Expr v, int heads = 1, double scale = 0, Loc loc = Loc::current());
// Normalised over the last axis, times `gain` plus `bias` (shared [d] tensors).
Expr layer_norm(Expr x, Operand gain, Operand bias, double eps = 1e-5, Loc loc = Loc::current());
// An LSTM over a sequence x [L, d] (one row a step), from a zero state:
// every step's hidden state, [L, h]. w_ih [4h, d], w_hh [4h, h] and b [4h]
// must be shared by every example (parameters); gates [i, f, g, o] as
// LibTorch's. `reverse` runs from the last row to the first (a BiLSTM's
// backward half). Sequences of any lengths are ONE launch (ops/lstm.h).
Expr lstm(Expr x, Operand w_ih, Operand w_hh, Operand b, bool reverse = false, Loc loc = Loc::current());
// The same, forward, from the initial hidden state h0 [h] (the cell state
// starts at zero): a decoder started from its encoder's state.
Expr lstm(Expr x, Operand w_ih, Operand w_hh, Operand b, Expr h0, Loc loc = Loc::current());
// Elementwise sum / mean of a list of equal-shaped values (e.g. losses of all examples).
Expr sum(std::span<const Expr> xs, Loc loc = Loc::current());
Expr mean(std::span<const Expr> xs, Loc loc = Loc::current());
inline Expr sum(const std::vector<Expr>& xs, Loc loc = Loc::current()) { return sum(std::span(xs), loc); }
inline Expr mean(const std::vector<Expr>& xs, Loc loc = Loc::current()) { return mean(std::span(xs), loc); }

// ---- Ops defined outside the library (ops/user_op.h: user_op<Op>() gives the
// code). `attrs` are the op's integer attributes (doubles via attr_of); the
// list form is for variadic ops (OpTraits::kVariadic).
Expr call(OpCode op, std::initializer_list<Operand> args, std::span<const int64_t> attrs = {}, Loc loc = Loc::current());
Expr call_list(OpCode op, std::span<const Expr> args, std::span<const int64_t> attrs = {}, Loc loc = Loc::current());

// Over the last axis.
Expr softmax(At x);
Expr log_softmax(At x);
// x[i] of a vector x: a scalar.
Expr pick(Expr x, int64_t i, Loc loc = Loc::current());
// x[i] with the index computed in the graph (a scalar holding a whole number,
// e.g. an argmax): no host round trip. The gradient flows to x only; an index
// out of range is a UserError when the batch runs.
Expr pick(Expr x, Expr i, Loc loc = Loc::current());
// Row i of x [L, S...], [S...]; i < 0 counts from the end (-1: the last row).
// Values of different lengths share one launch (a BiLSTM's final states:
// row(F, -1) and row(B, 0)); slice(x, L - 1, L, 0) runs once per length.
Expr row(Expr x, int64_t i, Loc loc = Loc::current());
// Row i of a shared table with the index computed in the graph (a scalar
// holding a whole number: a decoder's own prediction as its next input), with
// no host round trip. A 2-D table can give a sparse gradient; the gradient
// flows to the table only; an index out of range is a UserError when the batch runs.
Expr lookup(Operand table, Expr i, bool sparse_grad = false, Loc loc = Loc::current());
// The position of the largest element along the last axis, as a float value
// (the first at ties); no gradient. x [n] -> a scalar, [t, n] -> [t].
Expr argmax(At x);
// -log softmax(x)[label]: the cross-entropy loss of one example, a scalar.
Expr pick_neg_log_softmax(Expr x, int64_t label, Loc loc = Loc::current());
// The same over the rows of x [rows, classes], one label per row, summed: a
// sentence's tagging loss. Runs as a lookup of the labels' one-hot rows, a
// log_softmax, a multiply and a sum, batched like any of them.
Expr pick_neg_log_softmax(Expr x, std::span<const int64_t> labels, Loc loc = Loc::current());
inline Expr pick_neg_log_softmax(Expr x, const std::vector<int64_t>& labels, Loc loc = Loc::current()) {
  return pick_neg_log_softmax(x, std::span(labels), loc);
}
// Inverted dropout with keep-probability 1 - p. The mask depends on the graph's
// seed, the example and the node's position in its example, so an example gets
// the same mask alone or batched. Identity when the graph is not in train mode.
Expr dropout(Expr x, double p, Loc loc = Loc::current());

}  // namespace dsl
}  // namespace sheaf
