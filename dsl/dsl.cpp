#include "dsl.h"

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <mutex>
#include <string>

#include <ATen/ops/eye.h>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

namespace sheaf {

namespace {

using detail::Engine;
using Loc = std::source_location;

// Why engine_for found no engine: the first Expr operand is unusable, or
// there is none (a tensor-only call has no graph to go to).
[[noreturn, gnu::noinline]] void no_engine(OpCode op, std::span<const Operand> args, Loc loc) {
  for (const Operand& a : args)
    if (a.is_expr())
      throw_user(Site{op_info(op).name, kSharedExample, loc}, Engine::unusable(a.expr(), "an argument"));
  throw_user(Site{op_info(op).name, kSharedExample, loc},
             "every argument is a tensor, so there is no graph to record on; make one of them an Expr with "
             "g.param(tensor)");
}

// The engine of the first Expr operand. In line (apply's loops unroll per op).
[[gnu::always_inline]] inline Engine& engine_for(OpCode op, std::span<const Operand> args, Loc loc) {
  for (const Operand& a : args)
    if (a.is_expr()) {
      if (Engine* e = Engine::find(a.expr())) [[likely]]
        return *e;
      break;
    }
  no_engine(op, args, loc);
}

// An operand's node: its Expr's, or a tensor's shared node.
inline NodeId operand_node(Engine& g, const Operand& a, OpCode op, Loc loc) {
  if (a.is_expr()) return g.node_of(a.expr(), op_info(op).name, loc);
  g.expect_open(op, loc);  // a frozen body gets no shared node before it refuses the op
  return g.trace().param(a.tensor(), loc);
}

// apply() past the eight operands it keeps on the stack (out of line: the usual call stays as it was).
[[gnu::noinline]] Expr apply_many(Engine& g, OpCode op, std::initializer_list<Operand> args,
                                  std::span<const int64_t> attrs, int64_t payload, Loc loc) {
  std::vector<NodeId> ids;
  for (const Operand& a : args) ids.push_back(operand_node(g, a, op, loc));
  return g.record(op, ids, attrs, payload, loc);
}

// Records `op` on the graph of the first Expr operand; tensors become shared nodes.
// In line into each op's function, where the number of operands is known: the
// loops over them unroll (an out-of-line loop tested each operand's count).
[[gnu::always_inline]] inline Expr apply(OpCode op, std::initializer_list<Operand> args,
                                         std::span<const int64_t> attrs, int64_t payload, Loc loc) {
  Engine& g = engine_for(op, std::span(args.begin(), args.size()), loc);
  if (args.size() > 8) [[unlikely]]  // a user op of many arguments (dsl::call)
    return apply_many(g, op, args, attrs, payload, loc);
  std::array<NodeId, 8> ids{};
  size_t k = 0;
  for (const Operand& a : args) ids[k++] = operand_node(g, a, op, loc);
  return g.record(op, std::span(ids.data(), k), attrs, payload, loc);
}

Expr apply_list(OpCode op, std::span<const Expr> args, std::span<const int64_t> attrs, Loc loc) {
  if (args.empty()) throw_user(Site{op_info(op).name, kSharedExample, loc}, "needs a non-empty list of Exprs");
  const Operand first(args[0]);
  Engine& g = engine_for(op, std::span(&first, 1), loc);
  thread_local std::vector<NodeId> ids;
  ids.clear();
  for (const Expr& e : args) ids.push_back(g.node_of(e, op_info(op).name, loc));
  return g.record(op, ids, attrs, 0, loc);
}

Expr unary(OpCode op, const At& x) { return apply(op, {x.expr}, {}, 0, x.loc); }

Expr with_scalar(OpCode op, const At& x, double c) {
  const int64_t a = attr_of(c);
  return apply(op, {x.expr}, std::span(&a, 1), 0, x.loc);
}

Expr binary(OpCode op, Operand a, Operand b, Loc loc) { return apply(op, {a, b}, {}, 0, loc); }

}  // namespace

Expr operator+(At a, Operand b) { return binary(code_of<op::Add>, a.expr, b, a.loc); }
Expr operator-(At a, Operand b) { return binary(code_of<op::Sub>, a.expr, b, a.loc); }
Expr operator*(At a, Operand b) { return binary(code_of<op::Mul>, a.expr, b, a.loc); }
Expr operator/(At a, Operand b) { return binary(code_of<op::Div>, a.expr, b, a.loc); }
Expr operator+(const at::Tensor& a, At b) { return binary(code_of<op::Add>, a, b.expr, b.loc); }
Expr operator-(const at::Tensor& a, At b) { return binary(code_of<op::Sub>, a, b.expr, b.loc); }
Expr operator*(const at::Tensor& a, At b) { return binary(code_of<op::Mul>, a, b.expr, b.loc); }
Expr operator/(const at::Tensor& a, At b) { return binary(code_of<op::Div>, a, b.expr, b.loc); }
Expr operator+(At x, double c) { return with_scalar(code_of<op::AddScalar>, x, c); }
Expr operator+(double c, At x) { return with_scalar(code_of<op::AddScalar>, x, c); }
Expr operator-(At x, double c) { return with_scalar(code_of<op::AddScalar>, x, -c); }
Expr operator-(double c, At x) { return with_scalar(code_of<op::AddScalar>, At(unary(code_of<op::Neg>, x), x.loc), c); }
Expr operator*(At x, double c) { return with_scalar(code_of<op::MulScalar>, x, c); }
Expr operator*(double c, At x) { return with_scalar(code_of<op::MulScalar>, x, c); }
Expr operator/(At x, double c) { return with_scalar(code_of<op::MulScalar>, x, 1.0 / c); }
Expr operator/(double c, At x) { return with_scalar(code_of<op::RDivScalar>, x, c); }
Expr operator-(At x) { return unary(code_of<op::Neg>, x); }
Expr operator>(At x, double c) { return with_scalar(code_of<op::GreaterScalar>, x, c); }
Expr operator<(At x, double c) { return with_scalar(code_of<op::LessScalar>, x, c); }
Expr operator>(At a, Operand b) { return binary(code_of<op::Greater>, a.expr, b, a.loc); }
Expr operator<(At a, Operand b) { return binary(code_of<op::Greater>, b, a.expr, a.loc); }

namespace dsl {

Expr tanh(At x) { return unary(code_of<op::Tanh>, x); }
Expr sigmoid(At x) { return unary(code_of<op::Sigmoid>, x); }
Expr relu(At x) { return unary(code_of<op::Relu>, x); }
Expr exp(At x) { return unary(code_of<op::Exp>, x); }
Expr log(At x) { return unary(code_of<op::Log>, x); }
Expr neg(At x) { return unary(code_of<op::Neg>, x); }
Expr abs(At x) { return unary(code_of<op::Abs>, x); }
Expr sqrt(At x) { return unary(code_of<op::Sqrt>, x); }
Expr softplus(At x) { return unary(code_of<op::Softplus>, x); }
Expr log_sigmoid(At x) { return unary(code_of<op::LogSigmoid>, x); }
Expr gelu(At x) { return unary(code_of<op::Gelu>, x); }
Expr pow(At x, double c) { return with_scalar(code_of<op::PowScalar>, x, c); }
Expr maximum(Operand a, Operand b, Loc loc) { return binary(code_of<op::Maximum>, a, b, loc); }
Expr minimum(Operand a, Operand b, Loc loc) { return binary(code_of<op::Minimum>, a, b, loc); }
Expr sum(At x) { return unary(code_of<op::Sum>, x); }
Expr mean(At x) { return unary(code_of<op::Mean>, x); }
Expr softmax(At x) { return unary(code_of<op::Softmax>, x); }
Expr log_softmax(At x) { return unary(code_of<op::LogSoftmax>, x); }

Expr affine(Operand W, Operand x, Operand b, Loc loc) { return apply(code_of<op::Affine>, {W, x, b}, {}, 0, loc); }
Expr matmul(Operand A, Operand B, Loc loc) { return apply(code_of<op::Matmul>, {A, B}, {}, 0, loc); }
Expr pick(Expr x, int64_t i, Loc loc) { return apply(code_of<op::Pick>, {x}, {}, i, loc); }
Expr pick(Expr x, Expr i, Loc loc) { return apply(code_of<op::PickAt>, {x, i}, {}, 0, loc); }
Expr row(Expr x, int64_t i, Loc loc) { return apply(code_of<op::Row>, {x}, std::span(&i, 1), 0, loc); }
Expr lookup(Operand table, Expr i, bool sparse_grad, Loc loc) {
  const int64_t sparse = sparse_grad ? 1 : 0;
  return apply(code_of<op::LookupAt>, {std::move(table), std::move(i)}, std::span(&sparse, 1), 0, loc);
}
Expr argmax(At x) { return unary(code_of<op::ArgMax>, x); }
Expr pick_neg_log_softmax(Expr x, int64_t label, Loc loc) {
  return apply(code_of<op::PickNegLogSoftmax>, {x}, {}, label, loc);
}

namespace {

// One identity matrix per size and device for the program's life: a table's
// identity is its tensor, so every row-wise loss of one size shares it (and batches).
const at::Tensor& identity(int64_t n, const c10::Device& device) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, std::string>, at::Tensor> cache;
  std::lock_guard lock(mu);
  at::Tensor& t = cache[{n, device.str()}];
  if (!t.defined()) t = at::eye(n, at::TensorOptions().dtype(at::kFloat).device(device));
  return t;
}

}  // namespace

Expr pick_neg_log_softmax(Expr x, std::span<const int64_t> labels, Loc loc) {
  const Shape& s = x.shape(loc);
  const Site site{"pick_neg_log_softmax", x.example(loc), loc};
  if (s.rank() != 2) throw_user(site, "with a list of labels, x must be [rows, classes], got ", s.str());
  if (static_cast<int64_t>(labels.size()) != s[0])
    throw_user(site, labels.size(), " labels for ", s[0], " rows of x ", s.str());
  if (labels.empty()) throw_user(site, "x ", s.str(), " has no rows to pick labels from");
  for (size_t k = 0; k < labels.size(); ++k)
    if (labels[k] < 0 || labels[k] >= s[1])
      throw_user(site, "label ", labels[k], " (row ", k, ") is out of range for ", s[1], " classes");
  Graph& g = x.graph(loc);
  const Expr one_hot = g.lookup(identity(s[1], g.options().device), labels, /*sparse_grad=*/false, loc);
  return -At(sum(At(At(log_softmax(At(x, loc)), loc) * one_hot, loc)), loc);
}
Expr dropout(Expr x, double p, Loc loc) {
  const int64_t a = attr_of(p);
  return apply(code_of<op::Dropout>, {x}, std::span(&a, 1), 0, loc);
}

namespace {

// A negative axis counts from the end of x's per-example shape. When that shape
// waits on a dsl::cond, the axis is kept as given: the op's shape inference
// normalises it once the shape is known.
int normalise_axis(const Expr& x, int axis, std::string_view op, Loc loc) {
  Engine& g = Engine::of(x, loc);
  const NodeId n = g.node_of(x, op, loc);
  if (g.store().shape[n] == kUnknownShape) return axis;
  const Shape& s = g.store().shape_of(n);
  const int a = s.axis(axis);
  if (a < 0) throw_user(Site{op, g.store().example[n], loc}, "axis ", axis, " is out of range for shape ", s.str());
  return a;
}

// x's shape, or a UserError naming `op` when it waits on a dsl::cond.
const Shape& known_shape(const Expr& x, std::string_view op, Loc loc) {
  Engine& g = Engine::of(x, loc);
  const NodeId n = g.node_of(x, op, loc);
  if (g.store().shape[n] == kUnknownShape)
    throw_user(Site{op, g.store().example[n], loc},
               "needs the size of its input, which depends on a dsl::cond not yet resolved; use dsl::split with "
               "explicit sizes, or record this after forward()");
  return g.store().shape_of(n);
}

}  // namespace

Expr concat(std::span<const Expr> xs, int axis, Loc loc) {
  if (xs.empty()) throw_user(Site{"concat", kSharedExample, loc}, "needs a non-empty list of Exprs");
  const int64_t a = normalise_axis(xs[0], axis, "concat", loc);
  return apply_list(code_of<op::Concat>, xs, std::span(&a, 1), loc);
}

Expr slice(Expr x, int64_t begin, int64_t end, int axis, Loc loc) {
  const std::array<int64_t, 3> attrs{normalise_axis(x, axis, "slice", loc), begin, end};
  return apply(code_of<op::Slice>, {x}, attrs, 0, loc);
}

namespace {

// The slices of x along `axis` (normalised, or as given while x's shape waits
// on a dsl::cond): the engine and x's node are found once for all pieces.
std::vector<Expr> slices(Expr x, std::span<const int64_t> sizes, int axis, std::string_view op, Loc loc) {
  Engine& g = Engine::of(x, loc);
  const NodeId n = g.node_of(x, op, loc);
  std::vector<Expr> out;
  out.reserve(sizes.size());
  int64_t at = 0;
  for (int64_t k : sizes) {
    const std::array<int64_t, 3> attrs{axis, at, at + k};
    out.push_back(g.record(code_of<op::Slice>, std::span(&n, 1), attrs, 0, loc));
    at += k;
  }
  return out;
}

}  // namespace

std::vector<Expr> split(Expr x, std::span<const int64_t> sizes, int axis, Loc loc) {
  Engine& g = Engine::of(x, loc);
  const NodeId n = g.node_of(x, "split", loc);
  int64_t total = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    // (Here, not in the slices' inference: that error would name op 'slice'.)
    if (sizes[k] <= 0)
      throw_user(Site{"split", x.example(loc), loc}, "piece ", k, " has size ", sizes[k], "; every piece needs a positive size");
    total += sizes[k];
  }
  // The sizes must cover the axis: checked now, or, while x's shape waits on a
  // dsl::cond, when it is known (the slices' own inference checks only that
  // each piece lies within it).
  auto check = [x, &g, n, axis, total, loc] {
    const int a = normalise_axis(x, axis, "split", loc);  // (the shape is known here)
    const Shape& s = g.store().shape_of(n);
    if (total != s[a])
      throw_user(Site{"split", g.store().example[n], loc}, "sizes add up to ", total, " but axis ", a, " of ",
                 s.str(), " has ", s[a]);
    return a;
  };
  if (g.store().shape[n] != kUnknownShape) return slices(x, sizes, check(), "split", loc);
  g.trace().when_shapes_known(std::span(&n, 1), [check] { check(); });
  return slices(x, sizes, axis, "split", loc);
}

std::vector<Expr> chunk(Expr x, int n, int axis, Loc loc) {
  const Shape& s = known_shape(x, "chunk", loc);
  const int a = s.axis(axis);
  if (a < 0) throw_user(Site{"chunk", x.example(loc), loc}, "axis ", axis, " is out of range for shape ", s.str());
  const int64_t d = s[a];
  if (n <= 0 || d == 0 || d % n != 0)
    throw_user(Site{"chunk", x.example(loc), loc}, "cannot cut axis ", a, " of size ", d, " into ", n,
               " equal chunks, none of them empty");
  // Recorded once per cell: its sizes live on the stack (the result is the one allocation).
  std::array<int64_t, 16> small;
  std::vector<int64_t> large;
  std::span<int64_t> sizes = n <= 16 ? std::span(small.data(), static_cast<size_t>(n))
                                     : std::span((large = std::vector<int64_t>(static_cast<size_t>(n))));
  std::ranges::fill(sizes, d / n);
  return slices(x, sizes, a, "chunk", loc);
}

Expr reshape(Expr x, Shape shape, Loc loc) {
  std::array<int64_t, 1 + kMaxRank> attrs{shape.rank()};
  for (int d = 0; d < shape.rank(); ++d) attrs[static_cast<size_t>(d) + 1] = shape[d];
  return apply(code_of<op::Reshape>, {x}, std::span(attrs.data(), static_cast<size_t>(shape.rank()) + 1), 0, loc);
}

Expr transpose(Expr x, int axis0, int axis1, Loc loc) {
  const std::array<int64_t, 2> attrs{normalise_axis(x, axis0, "transpose", loc), normalise_axis(x, axis1, "transpose", loc)};
  return apply(code_of<op::Transpose>, {x}, attrs, 0, loc);
}

Expr stack(std::span<const Expr> xs, int axis, Loc loc) {
  if (xs.empty()) throw_user(Site{"stack", kSharedExample, loc}, "needs a non-empty list of Exprs");
  // The new axis counts from the end of the result (rank + 1 axes): -1 is last.
  int64_t a = axis;
  if (a < 0) a += known_shape(xs[0], "stack", loc).rank() + 1;
  return apply_list(code_of<op::Stack>, xs, std::span(&a, 1), loc);
}

namespace {
Expr reduce_dim(OpCode op, Expr x, int axis, Loc loc) {
  const int64_t a = normalise_axis(x, axis, op_info(op).name, loc);
  return apply(op, {x}, std::span(&a, 1), 0, loc);
}
}  // namespace

Expr sum_dim(Expr x, int axis, Loc loc) { return reduce_dim(code_of<op::SumDim>, x, axis, loc); }
Expr mean_dim(Expr x, int axis, Loc loc) { return reduce_dim(code_of<op::MeanDim>, x, axis, loc); }
Expr max_dim(Expr x, int axis, Loc loc) { return reduce_dim(code_of<op::MaxDim>, x, axis, loc); }
Expr min_dim(Expr x, int axis, Loc loc) { return reduce_dim(code_of<op::MinDim>, x, axis, loc); }
Expr logsumexp_dim(Expr x, int axis, Loc loc) { return reduce_dim(code_of<op::LogSumExpDim>, x, axis, loc); }
Expr dot(Operand a, Operand b, Loc loc) { return binary(code_of<op::Dot>, a, b, loc); }

Expr attention(Expr q, Expr k, Expr v, int heads, double scale, Loc loc) {
  const std::array<int64_t, 2> attrs{heads, attr_of(scale)};
  return apply(code_of<op::Attention>, {q, k, v}, attrs, 0, loc);
}

Expr lstm(Expr x, Operand w_ih, Operand w_hh, Operand b, bool reverse, Loc loc) {
  const int64_t r = reverse ? 1 : 0;
  return apply(code_of<op::Lstm>, {x, std::move(w_ih), std::move(w_hh), std::move(b)}, std::span(&r, 1), 0, loc);
}

Expr lstm(Expr x, Operand w_ih, Operand w_hh, Operand b, Expr h0, Loc loc) {
  return apply(code_of<op::LstmFrom>, {x, std::move(w_ih), std::move(w_hh), std::move(b), h0}, {}, 0, loc);
}

Expr layer_norm(Expr x, Operand gain, Operand bias, double eps, Loc loc) {
  const int64_t e = attr_of(eps);
  return apply(code_of<op::LayerNorm>, {x, gain, bias}, std::span(&e, 1), 0, loc);
}

Expr sum(std::span<const Expr> xs, Loc loc) { return apply_list(code_of<op::SumList>, xs, {}, loc); }

namespace {
// A code that names no op: the user's mistake (a code made by hand, or another program's).
void expect_op(OpCode op, Loc loc) {
  if (!op_known(op))
    throw_user(Site{"call", kSharedExample, loc}, "op code ", op,
               " names no op: take codes from sheaf::user_op<Op>() or sheaf::register_op");
}
}  // namespace

Expr call(OpCode op, std::initializer_list<Operand> args, std::span<const int64_t> attrs, Loc loc) {
  expect_op(op, loc);
  const OpInfo& info = op_info(op);
  if (info.traits.arity == OpTraits::kVariadic)
    throw_user(Site{info.name, kSharedExample, loc}, "takes a list of Exprs: use dsl::call_list");
  if (args.size() != static_cast<size_t>(info.traits.arity))
    throw_user(Site{info.name, kSharedExample, loc}, "takes ", info.traits.arity, " arguments, got ", args.size());
  return apply(op, args, attrs, 0, loc);
}

Expr call_list(OpCode op, std::span<const Expr> args, std::span<const int64_t> attrs, Loc loc) {
  expect_op(op, loc);
  const OpInfo& info = op_info(op);
  if (info.traits.arity != OpTraits::kVariadic)
    throw_user(Site{info.name, kSharedExample, loc}, "takes ", info.traits.arity, " arguments, not a list: use dsl::call");
  return apply_list(op, args, attrs, loc);
}
Expr mean(std::span<const Expr> xs, Loc loc) { return apply_list(code_of<op::MeanList>, xs, {}, loc); }

}  // namespace dsl
}  // namespace sheaf
