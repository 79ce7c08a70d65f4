// Control flow on computed values, batched across examples.
//
//   Expr y = dsl::cond(x > 0.0, [=] { return f(x); }, [=] { return g(x); });
//   Expr z = dsl::loop(x, [](Expr s) { return s > 0.0; }, [](Expr s) { return s - 1.0; });
//
// Nothing runs when these are called. During Graph::forward, once the predicates
// of a round are computed they are fetched to the host together (one copy for
// all examples); each example's branch (or loop body) is then recorded, and the
// examples that took the same branch run it together in the next round. A loop
// example that has finished costs nothing more.
//
// Branches and loop bodies run LATER, inside forward(): capture Exprs (and other
// locals) by value, not by reference: [=] or [&, x], never a bare [&] over
// locals that are gone by then.
//
// A branch or body that throws stops its own example only: the other examples
// complete, then forward() throws (docs/reliability.md).
//
// For host code that must follow a computed value (a parser's stack), see
// dsl/task.h: co_await the value inside a per-example coroutine.
#pragma once

#include <concepts>
#include <functional>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include <sheaf/engine/host_value.h>

#include "dsl.h"

namespace sheaf::dsl {

namespace cond_impl {

// A cond between its call and its branch (what the templates below need from
// the engine, which this header does not include).
struct CondSlot {
  sheaf::detail::Engine* engine = nullptr;
  Site site;
  Expr result;  // the placeholder handed to the user
};
// Checks the predicate (and a declared shape) and records the placeholder.
CondSlot cond_begin(const Expr& pred, bool callable, const Shape* declared, std::source_location loc);
// Runs `callback` once the predicate is computed.
void cond_wait(const CondSlot& c, const Expr& pred, sheaf::detail::ValueCallback&& callback);
// The branch a computed predicate picks, recorded in the cond's example:
// `branch(object, taken)`; then checked and bound to the placeholder.
void cond_resolve(const CondSlot& c, const HostValue& pred, Expr (*branch)(void* object, bool taken), void* object);

template <class F>
bool callable(const F& f) {
  if constexpr (std::is_constructible_v<bool, const F&>) return static_cast<bool>(f);  // an empty std::function
  else return true;
}

template <class Then, class Else>
Expr cond(Expr pred, Then&& then_fn, Else&& else_fn, const Shape* declared, std::source_location loc) {
  const CondSlot c = cond_begin(pred, cond_impl::callable(then_fn) && cond_impl::callable(else_fn), declared, loc);
  // One callable holds both branches: kept in the waiter itself (no allocation
  // while the three fit in ValueCallback's buffer).
  cond_wait(c, pred, [c, t = std::forward<Then>(then_fn), e = std::forward<Else>(else_fn)](const HostValue& v) mutable {
    auto pick = [&](bool taken) -> Expr { return taken ? Expr(t()) : Expr(e()); };
    cond_resolve(c, v, [](void* o, bool taken) { return (*static_cast<decltype(pick)*>(o))(taken); }, &pick);
  });
  return c.result;
}

}  // namespace cond_impl

// A branch: a callable taking nothing and returning an Expr (a lambda, a
// std::function).
template <class F>
concept Branch = std::invocable<std::decay_t<F>&> && std::convertible_to<std::invoke_result_t<std::decay_t<F>&>, Expr>;

// pred: a per-example scalar; nonzero selects then_fn. The result is the value
// of the branch the example took, with that branch's shape: examples (and the
// two branches) may differ in shape. Until forward() decides, the result's
// shape is unknown: Expr::shape() is a UserError then, and ops recorded on it
// check their shapes (and report mistakes at their own lines) when it is known.
// The branches are kept (moved or copied) until the predicate is computed.
template <Branch Then, Branch Else>
Expr cond(Expr pred, Then&& then_fn, Else&& else_fn, std::source_location loc = std::source_location::current()) {
  return cond_impl::cond(pred, std::forward<Then>(then_fn), std::forward<Else>(else_fn), nullptr, loc);
}
// The same with the result's shape declared: both branches must return
// `shape` (else a UserError names the branch, the example and the cond's
// line; where the branch's own shape waits on another cond, the check comes
// when that shape is known and names the cond's line and the example). The
// result's shape is then known at once, so what is recorded on it
// records now instead of waiting for the branch: a sheaf::Function call on it
// is recorded directly, not as a pending call resolved later, and
// Expr::shape() works. Worth it where a cond's result feeds more work, e.g. a
// recursive net choosing each node's cell: that host work is done per node,
// in the rounds where the device waits for it.
template <Branch Then, Branch Else>
Expr cond(Expr pred, Then&& then_fn, Else&& else_fn, const Shape& shape,
          std::source_location loc = std::source_location::current()) {
  return cond_impl::cond(pred, std::forward<Then>(then_fn), std::forward<Else>(else_fn), &shape, loc);
}

// while (cond_fn(state) != 0) state = body_fn(state); returns the final state.
// The body must keep the state's shapes (checked per iteration). More than
// max_iterations iterations is a UserError naming the example and the loop's
// line (instead of a hang).
Expr loop(Expr init, std::function<Expr(Expr)> cond_fn, std::function<Expr(Expr)> body_fn,
          int max_iterations = 10000, std::source_location loc = std::source_location::current());
std::vector<Expr> loop(std::vector<Expr> init, std::function<Expr(const std::vector<Expr>&)> cond_fn,
                       std::function<std::vector<Expr>(const std::vector<Expr>&)> body_fn, int max_iterations = 10000,
                       std::source_location loc = std::source_location::current());

}  // namespace sheaf::dsl
