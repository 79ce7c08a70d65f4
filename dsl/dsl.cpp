#include "dsl.h"

#include "op.h"

namespace sheaf {

namespace detail {

namespace {
// The graph of the first Expr operand. A tensor-only call has no graph to go to.
Graph& graph_of(OpCode op, std::span<const Operand> args, Loc loc) {
  for (const Operand& a : args) {
    if (!a.is_expr()) continue;
    if (Graph* g = Graph::find(a.expr())) return *g;
    throw_user(Site{op_info(op).name, -1, loc},
               a.expr().defined() ? "an argument is an Expr whose graph was cleared or destroyed since it was made"
                                  : "an argument is an empty Expr (default-constructed, never assigned)");
  }
  throw_user(Site{op_info(op).name, -1, loc},
             "every argument is a tensor, so there is no graph to record on; make one of them an Expr with "
             "g.param(tensor)");
}
}  // namespace

Expr apply(OpCode op, std::initializer_list<Operand> args, std::span<const int64_t> attrs, int64_t payload, Loc loc) {
  Graph& g = graph_of(op, std::span(args.begin(), args.size()), loc);
  std::array<NodeId, 8> ids{};
  SHEAF_ASSERT(args.size() <= ids.size(), "too many operands");
  size_t k = 0;
  for (const Operand& a : args)
    ids[k++] = a.is_expr() ? g.node_of(a.expr(), op_info(op).name, loc) : g.param(a.tensor(), loc).id();
  return g.record(op, std::span(ids.data(), k), attrs, payload, loc);
}

Expr apply_list(OpCode op, std::span<const Expr> args, std::span<const int64_t> attrs, Loc loc) {
  if (args.empty()) throw_user(Site{op_info(op).name, -1, loc}, "needs a non-empty list of Exprs");
  Operand first(args[0]);
  Graph& g = graph_of(op, std::span(&first, 1), loc);
  thread_local std::vector<NodeId> ids;
  ids.clear();
  for (const Expr& e : args) ids.push_back(g.node_of(e, op_info(op).name, loc));
  return g.record(op, ids, attrs, 0, loc);
}

}  // namespace detail

namespace dsl {

namespace {
// A negative axis counts from the end of x's per-example shape.
int normalise_axis(const Expr& x, int axis, std::string_view op, Loc loc) {
  const Shape& s = x.shape();
  int a = s.axis(axis);
  if (a < 0) throw_user(Site{op, x.example(), loc}, "axis ", axis, " is out of range for shape ", s.str());
  return a;
}
}  // namespace

Expr concat(std::span<const Expr> xs, int axis, Loc loc) {
  if (xs.empty()) throw_user(Site{"concat", -1, loc}, "needs a non-empty list of Exprs");
  int64_t a = normalise_axis(xs[0], axis, "concat", loc);
  return detail::apply_list(code_of<op::Concat>, xs, std::span(&a, 1), loc);
}

Expr slice(Expr x, int64_t begin, int64_t end, int axis, Loc loc) {
  std::array<int64_t, 3> attrs{normalise_axis(x, axis, "slice", loc), begin, end};
  return detail::apply(code_of<op::Slice>, {x}, attrs, 0, loc);
}

std::vector<Expr> split(Expr x, std::span<const int64_t> sizes, int axis, Loc loc) {
  int a = normalise_axis(x, axis, "split", loc);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (total != x.shape()[a])
    throw_user(Site{"split", x.example(), loc}, "sizes add up to ", total, " but axis ", a, " of ",
               x.shape().str(), " has ", x.shape()[a]);
  std::vector<Expr> out;
  int64_t at = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, at, at + s, a, loc));
    at += s;
  }
  return out;
}

std::vector<Expr> chunk(Expr x, int n, int axis, Loc loc) {
  int a = normalise_axis(x, axis, "chunk", loc);
  int64_t d = x.shape()[a];
  if (n <= 0 || d % n != 0)
    throw_user(Site{"chunk", x.example(), loc}, "cannot cut axis ", a, " of size ", d, " into ", n, " equal chunks");
  std::vector<int64_t> sizes(static_cast<size_t>(n), d / n);
  return split(x, sizes, a, loc);
}

Expr sum(std::span<const Expr> xs, Loc loc) { return detail::apply_list(code_of<op::SumList>, xs, {}, loc); }
Expr mean(std::span<const Expr> xs, Loc loc) { return detail::apply_list(code_of<op::MeanList>, xs, {}, loc); }

}  // namespace dsl
}  // namespace sheaf
