// Ops defined in the user's own project. A descriptor is the same struct the
// built-in ops use (ops/op.h): a name, traits, shape inference and ONE batched
// LibTorch call; user_op<Op>() registers it on first use and returns its code,
// and dsl::call records it:
//
//   struct Swish {
//     static constexpr std::string_view name = "swish";
//     static constexpr sheaf::OpTraits traits{.arity = 1};
//     static sheaf::Shape infer(const sheaf::InferCtx& c) { return c.shape(0); }
//     static at::Tensor run(sheaf::RunCtx& c) { return c.in(0) * at::sigmoid(c.in(0)); }
//   };
//   sheaf::Expr y = sheaf::dsl::call(sheaf::user_op<Swish>(), {x});
//
// The batched-vs-alone checker (dsl/check.h) covers user ops like any other.
// They are never fused with their neighbours (fusion needs a kernel compiled
// into the library), so each is one launch and one autograd node per batch.
#pragma once

#include "op.h"

namespace sheaf {

template <class Op>
OpCode user_op() {
  static_assert(OpDescriptor<Op>,
                "a user op needs name, traits, static Shape infer(const InferCtx&) and static at::Tensor run(RunCtx&)");
  static_assert(Op::traits.own_rows == 0 || Op::traits.per_value, "OpTraits::own_rows needs OpTraits::per_value");
  static const OpCode code = register_op(OpInfo{Op::name, Op::traits, &Op::infer, &Op::run, nullptr});
  return code;
}

}  // namespace sheaf
