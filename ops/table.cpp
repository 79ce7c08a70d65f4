// The op table: built at compile time from kOpList. Every descriptor is checked
// for completeness here, so an op without a batched rule does not compile.
#include <boost/hana/unpack.hpp>

#include <array>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <bit>
#include <concepts>

#include "attention.h"
#include "lstm.h"
#include "call.h"
#include "elementwise.h"
#include "leaf.h"
#include "linear.h"
#include "op.h"  // declares detail::g_builtin_ops extern: its definition below needs that linkage
#include "op_list.h"
#include "reduce.h"
#include "structure.h"

namespace sheaf {

namespace {

template <class Op>
constexpr const PointwiseInfo* pointwise_of() {
  if constexpr (requires { typename Op::Pointwise; }) {
    static_assert(op::PointwiseOp<Op>, "an op's Pointwise form lacks part of its struct (info, fwd, da, db), or has "
                                       "a gradient mask on one of the CPU and CUDA but not the other");
    return &Op::Pointwise::info;
  } else {
    return nullptr;
  }
}

template <class Op>
constexpr OpInfo info_of() {
  static_assert(OpDescriptor<Op>,
                "an entry of sheaf::kOpList lacks part of its descriptor (name, traits, infer or the batched run)");
  static_assert(Op::traits.own_rows == 0 || Op::traits.per_value, "OpTraits::own_rows needs OpTraits::per_value");
  return OpInfo{Op::name, Op::traits, &Op::infer, &Op::run, pointwise_of<Op>()};
}

constexpr auto kTable = boost::hana::unpack(kOpList, [](auto... op) {
  return std::array<OpInfo, sizeof...(op)>{info_of<typename decltype(op)::type>()...};
});

// Users' ops, after the built-in ones: written once each under the lock,
// published by the count, then read without it.
struct UserOps {
  std::mutex write;
  std::array<OpInfo, kMaxUserOps> ops{};
  std::atomic<size_t> count{0};
};
UserOps& user_ops() {
  static UserOps u;
  return u;
}

}  // namespace

namespace detail {
constinit const std::span<const OpInfo> g_builtin_ops{kTable};

const OpInfo& user_op_info(OpCode code) {
  SHEAF_ASSERT(code >= kTable.size(), "op code ", code, " is a built-in op's");
  const UserOps& u = user_ops();
  SHEAF_ASSERT(code - kTable.size() < u.count.load(std::memory_order_acquire), "unknown op code ", code);
  return u.ops[code - kTable.size()];
}
}  // namespace detail

bool fits_shape(const at::Tensor& out, int64_t rows, const Shape& shape, bool packed) {
  const int skip = packed ? 1 : 0;
  bool ok = out.dim() == shape.rank() + 1 - skip && out.size(0) == rows;
  for (int d = skip; ok && d < shape.rank(); ++d) ok = out.size(d + 1 - skip) == shape[d];
  return ok;
}

void check_user_op_output(OpCode op, const Site& site, const at::Tensor& out, int64_t rows, const Shape& shape,
                          bool packed) {
  if (op < detail::g_builtin_ops.size()) return;
  if (!fits_shape(out, rows, shape, packed))
    throw_user(site, "its run() returned sizes ", out.sizes(), " for ", rows, packed ? " packed rows" : " value(s)",
               " of shape ", shape.str(), ", the shape its infer() gave: run() must return [n, shape...] "
               "(ops/user_op.h)");
  // Another dtype would flow on and fail at whichever op reads it next, named
  // as that op's mistake (or not fail at all).
  if (out.scalar_type() != at::kFloat)
    throw_user(site, "its run() returned a tensor of dtype ", out.scalar_type(),
               "; sheaf computes in float32: return a float tensor (.to(at::kFloat)) (ops/user_op.h)");
}

OpCode register_op(const OpInfo& info) {
  UserOps& u = user_ops();
  std::lock_guard lock(u.write);
  const size_t n = u.count.load(std::memory_order_relaxed);
  if (info.name.empty() || info.infer == nullptr || info.run == nullptr)
    throw UserError("sheaf::register_op: an op needs a name, infer and run");
  for (size_t c = 0; c < kTable.size() + n; ++c)
    if (op_info(static_cast<OpCode>(c)).name == info.name)
      throw UserError(detail::cat("sheaf::register_op: there is already an op named '", info.name, "'"));
  if (n == kMaxUserOps) throw UserError(detail::cat("sheaf::register_op: more than ", kMaxUserOps, " user ops"));
  if (info.pointwise != nullptr)
    throw UserError(detail::cat("sheaf::register_op: '", info.name, "': user ops cannot be fused (no Pointwise form)"));
  u.ops[n] = info;
  u.count.store(n + 1, std::memory_order_release);
  return static_cast<OpCode>(kTable.size() + n);
}

std::string_view op_name(OpCode code) { return op_info(code).name; }

bool op_known(OpCode code) { return code < kTable.size() + user_ops().count.load(std::memory_order_acquire); }

int64_t attr_of(double v) { return std::bit_cast<int64_t>(v); }
double attr_to_double(int64_t a) { return std::bit_cast<double>(a); }

double InferCtx::attr_f(size_t k) const { return attr_to_double(attr(k)); }
double RunCtx::attr_f(size_t k) const { return attr_to_double(attr(k)); }
void RunCtx::missing_attr(size_t k) const {
  throw std::out_of_range(detail::cat("run() asks for attribute ", k, " but the call passed ", a_.attrs.size()));
}

void InferCtx::expect_rank(size_t i, int rank, std::string_view what) const {
  if (shape(i).rank() != rank) fail(what, " must have rank ", rank, ", got shape ", shape(i).str());
}
void InferCtx::expect_batched(size_t i, std::string_view what) const {
  if (shared(i)) fail(what, " must be a per-example value, not a shared one");
}
void InferCtx::expect_shared(size_t i, std::string_view what) const {
  if (!shared(i)) fail(what, " must be a shared tensor (a parameter), not a per-example value");
}

at::Tensor RunCtx::batched(size_t i) const {
  const at::Tensor& x = a_.inputs[i];
  if (!shared(i)) return x;
  std::vector<int64_t> sizes{a_.n};
  for (int64_t d : x.sizes()) sizes.push_back(d);
  return x.unsqueeze(0).expand(sizes);
}

int64_t RunCtx::tensor_axis(int64_t axis) const {
  const int rank = out_shape().rank() + (packed() ? 1 : 0);  // the per-example rank
  if (axis < 0) axis += rank;
  return packed() ? axis : axis + 1;
}

at::Tensor RunCtx::aligned(size_t i, int rank) const {
  const at::Tensor& x = a_.inputs[i];
  if (shared(i)) return x;  // right-aligned broadcasting already does the job
  const int have = static_cast<int>(x.dim()) - 1;
  if (have >= rank) return x;
  std::vector<int64_t> sizes{x.size(0)};
  sizes.insert(sizes.end(), static_cast<size_t>(rank - have), 1);
  for (int d = 1; d <= have; ++d) sizes.push_back(x.size(d));
  return x.view(sizes);
}

at::Tensor op::Param::run(RunCtx&) { throw_internal("a parameter node was scheduled for a launch"); }
at::Tensor op::Placeholder::run(RunCtx&) { throw_internal("an unresolved placeholder was scheduled"); }
at::Tensor op::Call::run(RunCtx&) { throw_internal("a function call reached its op's run (the executor runs its body)"); }
at::Tensor op::CallResult::run(RunCtx&) { throw_internal("a call's result was launched apart from its call"); }

}  // namespace sheaf
