// Functions: a piece of per-example code (a cell) recorded ONCE and called
// many times. A call is one node of the graph, not one node per op of its body:
//
//   auto cell = sheaf::function("tree_lstm_cell", [this](Expr hl, Expr cl, Expr hr, Expr cr) {
//     std::vector<Expr> g = dsl::chunk(dsl::affine(U, dsl::concat({hl, hr}), b), 5);
//     Expr c = dsl::tanh(g[0]) * dsl::sigmoid(g[1]) + dsl::sigmoid(g[2]) * cl + dsl::sigmoid(g[3]) * cr;
//     return std::array{dsl::sigmoid(g[4]) * dsl::tanh(c), c};
//   });
//   auto [h, c] = cell(l.h, l.c, r.h, r.c);   // anywhere an op could be recorded
//
// The body is recorded the first time the function is called with arguments of
// a given signature (shapes, and which are shared) after each clear() of the
// graph, and compiled to batched steps with its elementwise work fused. The
// calls of all examples with the same signature then run as ONE batch: each
// step of the body once, over all of them. Values, gradients and errors are
// those of the same code written inline: only recording and scheduling are
// saved (they cost per call instead of per op).
//
// A body may use any op on its arguments and on tensors it captures (the
// model's parameters), return one Expr or several (std::array, std::pair,
// std::tuple or std::vector of Expr), and call other functions. It may not use
// control flow that waits on computed values (dsl::cond, dsl::loop,
// coroutines): call the function inside the branch instead; nor dropout,
// whose mask is drawn per example: apply it to the arguments or results.
// Make each Function once (a member of the model) and call it many times.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dsl.h"

namespace sheaf {

namespace detail {
struct FunctionDef;
}

class Function {
 public:
  using Body = std::function<std::vector<Expr>(std::span<const Expr> args)>;
  // `body` receives `arity` Exprs standing for the arguments and returns the results.
  Function(std::string name, size_t arity, Body body, std::source_location loc = std::source_location::current());
  // Records a call on the graph of the first Expr argument (tensors are shared
  // values, as anywhere). Returns the results, in the body's order.
  std::vector<Expr> call(std::span<const Operand> args, std::source_location loc = std::source_location::current()) const;
  // The same into `results` (replaced): one vector reused for many calls allocates once.
  void call_into(std::span<const Operand> args, std::vector<Expr>& results,
                 std::source_location loc = std::source_location::current()) const;
  // With the number of results the caller takes (0: any). A call whose
  // arguments' shapes wait on a dsl::cond needs it (its results stand in as
  // placeholders until the call is recorded).
  void call_into(std::span<const Operand> args, std::vector<Expr>& results, size_t expected,
                 std::source_location loc) const;
  // A call of Expr arguments only, with results.size() results, when it is
  // the call its site makes over and over (its body found last, the same
  // argument signature): recorded, its results written to `results`, true.
  // Otherwise false, nothing recorded: call_into does the rest (a first call
  // records the body; mistakes are its UserErrors). TypedFunction's calls.
  bool call_usual(std::span<const Expr> args, std::span<Expr> results, std::source_location loc) const;
  const std::string& name() const;
  size_t arity() const;

 private:
  std::shared_ptr<const detail::FunctionDef> def_;
};

// One argument of a typed call; remembers the caller's line (as dsl's At does).
struct CallArg {
  CallArg(Expr e, std::source_location l = std::source_location::current()) : operand(e), loc(l) {}  // NOLINT
  CallArg(const at::Tensor& t, std::source_location l = std::source_location::current())              // NOLINT
      : operand(t), loc(l) {}
  Operand operand;
  std::source_location loc;
};

namespace detail {

// A body's results as a list and back: Expr, std::array / std::vector of Expr,
// std::pair / std::tuple of Expr.
template <class R>
struct Results {
  static_assert(sizeof(R) == 0,
                "a sheaf::function body returns Expr, std::array<Expr, K>, std::vector<Expr>, "
                "std::pair<Expr, Expr> or std::tuple<Expr...>");
};
template <>
struct Results<Expr> {
  static constexpr size_t kCount = 1;
  static std::vector<Expr> to(const Expr& e) { return {e}; }
  static Expr from(std::span<const Expr> v) { return v[0]; }
};
template <>
struct Results<std::vector<Expr>> {
  static constexpr size_t kCount = 0;  // any
  static std::vector<Expr> to(std::vector<Expr> v) { return v; }
  static std::vector<Expr> from(std::vector<Expr> v) { return v; }
};
template <size_t K>
struct Results<std::array<Expr, K>> {
  static constexpr size_t kCount = K;
  static std::vector<Expr> to(const std::array<Expr, K>& a) { return {a.begin(), a.end()}; }
  static std::array<Expr, K> from(std::span<const Expr> v) {
    std::array<Expr, K> a;
    for (size_t k = 0; k < K; ++k) a[k] = v[k];
    return a;
  }
};
template <class... E>
struct Results<std::tuple<E...>> {
  static_assert((std::is_same_v<E, Expr> && ...), "a tuple of results holds Exprs only");
  static constexpr size_t kCount = sizeof...(E);
  static std::vector<Expr> to(const std::tuple<E...>& t) {
    return std::apply([](const auto&... e) { return std::vector<Expr>{e...}; }, t);
  }
  static std::tuple<E...> from(std::span<const Expr> v) {
    return [&]<size_t... I>(std::index_sequence<I...>) { return std::tuple<E...>{v[I]...}; }(
        std::index_sequence_for<E...>{});
  }
};
template <>
struct Results<std::pair<Expr, Expr>> {
  static constexpr size_t kCount = 2;
  static std::vector<Expr> to(const std::pair<Expr, Expr>& p) { return {p.first, p.second}; }
  static std::pair<Expr, Expr> from(std::span<const Expr> v) { return {v[0], v[1]}; }
};

// The parameter count and result type of a (non-generic) lambda.
template <class F>
struct Signature : Signature<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...) const> {
  using Result = R;
  static constexpr size_t kArity = sizeof...(A);
};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...)> : Signature<R (C::*)(A...) const> {};

}  // namespace detail

// A Function whose body is a lambda of Expr parameters: called like one.
template <class F>
class TypedFunction {
 public:
  using Result = std::remove_cvref_t<typename detail::Signature<F>::Result>;
  static constexpr size_t kArity = detail::Signature<F>::kArity;
  static_assert(kArity >= 1, "a function takes at least one argument (its graph is the argument's)");

  TypedFunction(std::string name, F f, std::source_location loc)
      : fn_(std::move(name), kArity,
            [f = std::move(f)](std::span<const Expr> a) {
              return [&]<size_t... I>(std::index_sequence<I...>) {
                return detail::Results<Result>::to(f(a[I]...));
              }(std::make_index_sequence<kArity>{});
            },
            loc) {}

  template <class... A>
    requires(sizeof...(A) + 1 == kArity && (std::is_constructible_v<Operand, const A&> && ...))
  Result operator()(CallArg first, const A&... rest) const {
    static constexpr size_t kCount = detail::Results<Result>::kCount;
    if constexpr (kCount > 0 && (std::is_same_v<A, Expr> && ...)) {
      // Exprs in, a fixed number of results out: the usual call without the
      // lists a call of any kind goes through.
      if (first.operand.is_expr()) {
        const std::array<Expr, kArity> exprs{first.operand.expr(), rest...};
        std::array<Expr, kCount> out;
        if (fn_.call_usual(exprs, out, first.loc)) return detail::Results<Result>::from(out);
      }
    }
    const std::array<Operand, kArity> args{first.operand, Operand(rest)...};
    // One vector per thread for every call: filled at the end of the call (after
    // any call the body's recording makes), read right away.
    thread_local std::vector<Expr> results;
    fn_.call_into(args, results, detail::Results<Result>::kCount, first.loc);
    return detail::Results<Result>::from(results);
  }
  const Function& untyped() const { return fn_; }

 private:
  Function fn_;
};

// A function by its signature, for a model's members:
//   sheaf::Fn<std::array<Expr, 2>(Expr, Expr)> cell{"cell", [this](Expr x, Expr h) { ... }};
template <class Sig>
class Fn;
template <class R, class... A>
class Fn<R(A...)> : public TypedFunction<std::function<R(A...)>> {
 public:
  Fn(std::string name, std::function<R(A...)> body, std::source_location loc = std::source_location::current())
      : TypedFunction<std::function<R(A...)>>(std::move(name), std::move(body), loc) {}
};

// sheaf::function("name", [&](Expr x, Expr y) { ...; return result; })
template <class F>
TypedFunction<F> function(std::string name, F f, std::source_location loc = std::source_location::current()) {
  return TypedFunction<F>(std::move(name), std::move(f), loc);
}

}  // namespace sheaf
