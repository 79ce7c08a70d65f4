// THE list of ops. An op is one descriptor struct (in ops/*.h: name, traits,
// shape inference, batched LibTorch call) plus one entry here. ops/table.cpp
// builds the runtime table from this list and refuses to compile if any
// descriptor is missing a part, so no op can silently run one example at a time.
//
// Library-internal: Boost.Hana stays out of users' translation units.
#pragma once

#include <boost/hana/equal.hpp>
#include <boost/hana/optional.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/index_if.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include <sheaf/core/ids.h>

namespace sheaf {

namespace op {
// Leaves.
struct Input;        // a per-example tensor given by the user
struct Constant;     // a per-example constant (zeros, a scalar)
struct Param;        // a shared tensor (a parameter); never batched
struct Lookup;       // row `id` of a shared embedding table
struct LookupList;   // the rows of a list of ids, as one per-example matrix
struct LookupAt;     // row i of a shared table, i computed
// Elementwise.
struct Add;
struct Sub;
struct Mul;
struct Div;
struct AddScalar;
struct MulScalar;
struct RDivScalar;   // c / x
struct Maximum;      // elementwise larger of x and y
struct Minimum;
struct Greater;      // 1.0 where x > y, else 0.0 (no gradient)
struct GreaterScalar;
struct LessScalar;
struct Neg;
struct Tanh;
struct Sigmoid;
struct Relu;
struct Exp;
struct Log;
struct Abs;
struct Sqrt;
struct Softplus;     // log(1 + e^x)
struct Gelu;         // GELU, tanh form
struct PowScalar;    // x^c
struct LogSigmoid;   // log(sigmoid(x))
struct Dropout;
// Linear algebra.
struct Affine;       // W x + b
struct Matmul;       // A x or A B
struct Attention;    // scaled dot-product attention, with heads
struct Lstm;         // an LSTM over a sequence, all steps
struct LstmFrom;     // the same from a given initial state
// Structure.
struct Concat;
struct Slice;
struct Reshape;
struct Transpose;
struct Stack;    // a list of equal-shaped values -> one value with a new axis
// Reductions and losses.
struct Sum;          // all elements of one value
struct Mean;
struct SumList;      // elementwise sum of a list of values (lists may differ in length)
struct MeanList;
struct Softmax;
struct LogSoftmax;
struct Pick;         // x[id]
struct Row;          // row i of x (from the end when negative)
struct PickAt;       // x[i], i computed
struct ArgMax;       // position of the largest element along the last axis
struct PickNegLogSoftmax;  // -log softmax(x)[label]
struct SumDim;       // one axis reduced
struct MeanDim;
struct MaxDim;
struct MinDim;
struct LogSumExpDim;
struct Dot;
struct LayerNorm;
// Control flow: the result of a dsl::cond or dsl::loop before its branch is known.
struct Placeholder;
// A call of a sheaf::Function: its body runs batched as one step list.
struct Call;
struct CallResult;   // a call's result after the first
}  // namespace op

inline constexpr auto kOpList = boost::hana::tuple_t<
    op::Input, op::Constant, op::Param, op::Lookup, op::LookupList, op::LookupAt,
    op::Add, op::Sub, op::Mul, op::Div, op::AddScalar, op::MulScalar, op::RDivScalar,
    op::PowScalar, op::Maximum, op::Minimum, op::Greater, op::GreaterScalar, op::LessScalar,
    op::Neg, op::Tanh, op::Sigmoid, op::Relu, op::Exp, op::Log, op::Abs, op::Sqrt, op::Softplus, op::LogSigmoid,
    op::Gelu,
    op::Dropout,
    op::Affine, op::Matmul, op::Attention, op::Lstm, op::LstmFrom,
    op::Concat, op::Slice, op::Reshape, op::Transpose, op::Stack,
    op::Sum, op::Mean, op::SumList, op::MeanList, op::Softmax, op::LogSoftmax, op::Pick, op::PickAt, op::Row, op::ArgMax,
    op::PickNegLogSoftmax, op::SumDim, op::MeanDim, op::MaxDim, op::MinDim, op::LogSumExpDim, op::Dot, op::LayerNorm,
    op::Placeholder, op::Call, op::CallResult>;

inline constexpr size_t kNumOps = decltype(boost::hana::length(kOpList))::value;

// The code of an op is its position in kOpList.
template <class Op>
inline constexpr OpCode code_of = [] {
  using Found = decltype(boost::hana::index_if(kOpList, boost::hana::equal.to(boost::hana::type_c<Op>)));
  static_assert(decltype(boost::hana::is_just(std::declval<Found>()))::value, "op is not in sheaf::kOpList");
  return static_cast<OpCode>(std::remove_cvref_t<decltype(std::declval<Found>().value())>::value);
}();

}  // namespace sheaf
