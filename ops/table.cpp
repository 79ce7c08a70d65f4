// The op table: built at compile time from kOpList. Every descriptor is checked
// for completeness here, so an op without a batched rule does not compile.
#include <boost/hana/unpack.hpp>

#include <array>
#include <bit>
#include <concepts>

#include "elementwise.h"
#include "leaf.h"
#include "linear.h"
#include "op_list.h"
#include "reduce.h"
#include "structure.h"

namespace sheaf {

template <class Op>
concept OpDescriptor = requires(const InferCtx& ic, RunCtx& rc) {
  { Op::name } -> std::convertible_to<std::string_view>;
  { Op::traits } -> std::convertible_to<OpTraits>;
  { Op::infer(ic) } -> std::same_as<Shape>;  // shape inference (user errors at trace time)
  { Op::run(rc) } -> std::same_as<at::Tensor>;  // the batched LibTorch call
};

namespace {

template <class Op>
constexpr const PointwiseInfo* pointwise_of() {
  if constexpr (op::PointwiseOp<Op>) return &Op::Pointwise::info;
  else return nullptr;
}

template <class Op>
constexpr OpInfo info_of() {
  static_assert(OpDescriptor<Op>,
                "an entry of sheaf::kOpList lacks part of its descriptor (name, traits, infer or the batched run)");
  return OpInfo{Op::name, Op::traits, &Op::infer, &Op::run, pointwise_of<Op>()};
}

constexpr auto kTable = boost::hana::unpack(kOpList, [](auto... op) {
  return std::array<OpInfo, sizeof...(op)>{info_of<typename decltype(op)::type>()...};
});

}  // namespace

const OpInfo& op_info(OpCode code) {
  SHEAF_ASSERT(code < kTable.size(), "unknown op code ", code);
  return kTable[code];
}

std::string_view op_name(OpCode code) { return op_info(code).name; }

int64_t attr_of(double v) { return std::bit_cast<int64_t>(v); }
double attr_to_double(int64_t a) { return std::bit_cast<double>(a); }

double InferCtx::attr_f(size_t k) const { return attr_to_double(attrs_[k]); }
double RunCtx::attr_f(size_t k) const { return attr_to_double(a_.attrs[k]); }

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

}  // namespace sheaf
