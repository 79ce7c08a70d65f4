// Per-example coroutines: host code (a parser's stack, a search) that follows
// values the model computes, while all examples run in lock-step batches.
//
//   sheaf::Task<Expr> parse(Graph& g, const Sentence& s) {
//     std::vector<Expr> stack;
//     while (...) {
//       Expr scores = dsl::affine(W, features(stack), b);
//       int64_t action = co_await sheaf::fetch_argmax(scores);   // suspends this example only
//       if (action == kShift) stack.push_back(...); else ...
//     }
//     co_return dsl::sum(losses);
//   }
//
//   for (i...) { auto scope = g.example(i); tasks.push_back(parse(g, data[i])); }
//   g.forward();                       // runs until every task has finished
//   Expr loss = tasks[i].result();
//
// A task runs at once up to its first co_await. Every co_await registers what it
// waits for with the graph; Graph::forward computes a round for all examples,
// fetches every awaited value in ONE device->host copy, and resumes the tasks in
// the order they suspended, each in the example scopes it suspended in (of
// every graph: one that awaits another graph's value and records on into its
// own keeps its example in both). A task may co_await
// another task (recursion works).
//
// Errors: one thrown before a task's first co_await leaves the call that made
// the task. One thrown later (inside forward) ends that task only: the other
// examples complete, forward() then throws it, result() rethrows it, and a task
// that co_awaits the failed one gets it at its co_await. Destroying a Task that
// waits (e.g. the vector of tasks unwinding) withdraws it from the graph.
#pragma once

#include <ATen/core/Tensor.h>

#include <coroutine>
#include <exception>
#include <functional>
#include <optional>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/engine/expr.h>
#include <sheaf/engine/host_value.h>

namespace sheaf {

namespace detail {

// Registers `resume` to run (in `expr`'s example) with expr's value on the host,
// after the forward round that computes it. Returns a token for cancel_await.
struct AwaitToken {
  Expr expr;  // names the graph (and sees it cleared or gone)
  uint32_t index = kNone32, generation = 0;
};
AwaitToken await_value(const Expr& expr, std::function<void(const HostValue&)> resume, std::source_location loc);
// Withdraws a registration that has not been delivered (no-op otherwise, or if
// the graph is gone or cleared).
void cancel_await(const AwaitToken& token);
// A task failed while forward resumed it: the graph reports it at the end of forward.
void report_task_failure(std::exception_ptr error);

struct PromiseBase;
// Links an awaiting task's promise to the promise of the task it waits on.
inline void link(PromiseBase& caller, PromiseBase& callee);
// Records that a task has left its first run (see PromiseOf::unhandled_exception).
template <class P>
void mark_suspended(std::coroutine_handle<P> h) noexcept {
  if constexpr (std::is_base_of_v<PromiseBase, P>) h.promise().suspended = true;
}
// Which value a task's frame waits for (an empty Expr once resumed):
// Task::result() tells a wait that its graph's clear() or destruction dropped
// from one still to come. A copy, not the awaiter's address: an awaiter
// awaited by reference may be gone before the task is asked.
template <class P>
void note_wait(std::coroutine_handle<P> h, const Expr& awaited) noexcept {
  if constexpr (std::is_base_of_v<PromiseBase, P>) h.promise().value_wait = awaited;
}
// Task::result()'s message for a task that has not finished.
std::string unfinished_message(const PromiseBase& p);

// What every awaitable value does: register with the graph, resume in the
// example that suspended, hand over the host value.
struct ValueAwaiter {
  Expr expr;
  std::source_location loc;
  HostValue value;  // valid while the task runs on from its co_await (until it suspends again)
  AwaitToken token;
  bool waiting = false;
  bool moved_from = false;

  ValueAwaiter(Expr e, std::source_location l) : expr(e), loc(l) {}
  // Movable before it is awaited (a helper may return a named one); never
  // copied: two copies awaited would be two waits. The one moved from waits
  // for nothing: awaiting it is a UserError. While it waits, its graph holds
  // its address, and nothing moves it: it lies in the suspended frame.
  ValueAwaiter(ValueAwaiter&& o) noexcept : expr(o.expr), loc(o.loc) { o.moved_from = true; }
  ValueAwaiter(const ValueAwaiter&) = delete;
  ValueAwaiter& operator=(const ValueAwaiter&) = delete;
  ~ValueAwaiter() {
    if (waiting) cancel_await(token);  // the frame is destroyed while it waits
  }
  bool await_ready() const noexcept { return false; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    if (moved_from) throw_user_at(loc, "co_await of a fetch awaiter that was moved from (await the one it was moved to)");
    token = await_value(expr, [this, h](const HostValue& v) {
      waiting = false;
      value = v;
      note_wait(h, Expr());
      h.resume();
    }, loc);
    waiting = true;
    mark_suspended(h);
    note_wait(h, expr);
  }
};

template <class T>
struct Promise;
template <class T>
struct PromiseOf;

}  // namespace detail

template <class T = void>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::Promise<T>;

  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {
    if (h_) h_.promise().owner = this;
  }
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
      if (h_) h_.promise().owner = this;
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }

  bool done() const { return h_ && h_.done(); }
  // Whether the task ended with an exception (result() rethrows it).
  bool failed() const { return done() && h_.promise().error != nullptr; }
  // The co_returned value; rethrows the task's exception if it failed; throws
  // UserError if it has not finished (it is waiting for a value: call Graph::forward).
  decltype(auto) result(std::source_location loc = std::source_location::current()) {
    if (!h_) throw_user_at(loc, "Task::result() of an empty task (moved from)");
    if (!done()) throw_user_at(loc, detail::unfinished_message(h_.promise()));
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    if constexpr (!std::is_void_v<T>) return *h_.promise().value;
  }

  // co_await a task from another task: resumes the caller when it finishes.
  // One task waits on it at a time (it has one continuation). Once it has
  // finished, `co_await t` reads its value (a reference into the task, which
  // holds it), as often as wanted; `co_await std::move(t)` or a temporary
  // task moves it out, once.
  template <bool Move>
  struct Awaiter {
    std::coroutine_handle<promise_type> h;
    std::source_location loc;  // the co_await's line inside a Task; unknown from another coroutine type
    bool await_ready() const noexcept { return h.done(); }
    template <class P>
    void await_suspend(std::coroutine_handle<P> caller) {
      auto& p = h.promise();
      if (p.continuation)
        throw_user_at(loc, "co_await of a task that another task already waits on: a task "
                      "resumes one awaiter; await it from one place and share its result");
      p.continuation = caller;
      if constexpr (std::is_base_of_v<detail::PromiseBase, P>) detail::link(caller.promise(), p);
      detail::mark_suspended(caller);
    }
    decltype(auto) await_resume() {
      auto& p = h.promise();
      if (p.error) std::rethrow_exception(p.error);
      if constexpr (!std::is_void_v<T>) {
        if (p.taken) throw_user_at(loc, "co_await of a finished task whose result was moved "
                                   "out already (co_await std::move(task) or of a temporary task moves it)");
        if constexpr (Move) {
          p.taken = true;
          return T(std::move(*p.value));
        } else {
          return static_cast<T&>(*p.value);
        }
      }
    }
  };
  Awaiter<false> operator co_await() & { return awaiter({}); }
  Awaiter<true> operator co_await() && { return std::move(*this).awaiter({}); }
  // The same, naming the line of the co_await in its errors (a Task's own
  // co_await comes here: PromiseBase::await_transform).
  Awaiter<false> awaiter(std::source_location loc) & { return Awaiter<false>{handle("co_await", loc), loc}; }
  Awaiter<true> awaiter(std::source_location loc) && { return Awaiter<true>{handle("co_await", loc), loc}; }

 private:
  std::coroutine_handle<promise_type> handle(const char* what, std::source_location loc) const {
    if (!h_) throw_user_at(loc, what, " of an empty task (moved from)");
    return h_;
  }
  friend struct detail::PromiseOf<T>;
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) { h_.promise().owner = this; }
  std::coroutine_handle<promise_type> h_;
};

namespace detail {

// At the end of a task, resume whoever co_awaited it (symmetric transfer).
struct FinalAwaiter {
  std::coroutine_handle<> continuation;
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<>) noexcept {
    return continuation ? continuation : std::noop_coroutine();
  }
  void await_resume() noexcept {}
};

// An awaitable with an operator co_await of its own, a member or a free one:
// co_await applies it, and awaits what it returns.
template <class A>
concept HasMemberCoAwait = requires(A&& a) { std::forward<A>(a).operator co_await(); };
template <class A>
concept HasFreeCoAwait = requires(A&& a) { operator co_await(std::forward<A>(a)); };
template <class A>
concept HasCoAwait = HasMemberCoAwait<A> || HasFreeCoAwait<A>;
// An awaiter (await_ready, await_suspend, await_resume of its own) awaited
// as it is: one with an operator co_await too is awaited through that.
template <class A>
concept IsAwaiter = !HasCoAwait<A> && requires(std::remove_reference_t<A>& a) { a.await_ready(); };

// An awaiter handed on by a Task's await_transform by address: GCC 12 copies
// whatever await_transform returns, a reference too, and an awaiter need not
// be copyable (a value awaiter is not). The awaiter itself, a named one or a
// temporary of the co_await's full expression, lives across the suspension.
template <class A>
struct AwaiterRef {
  A* awaiter;
  bool await_ready() { return awaiter->await_ready(); }
  template <class H>
  decltype(auto) await_suspend(H h) {
    return awaiter->await_suspend(h);
  }
  decltype(auto) await_resume() { return awaiter->await_resume(); }
};

// An awaiter an operator co_await returned by value, held where it was made
// (an aggregate initialised from the prvalue: no copy) and awaited as it is:
// the compiler applies no operator co_await to the box, as the standard
// applies none to what the operator returned.
template <class R>
struct AwaiterBox {
  R awaiter;
  bool await_ready() { return awaiter.await_ready(); }
  template <class H>
  decltype(auto) await_suspend(H h) {
    return awaiter.await_suspend(h);
  }
  decltype(auto) await_resume() { return awaiter.await_resume(); }
};

struct PromiseBase {
  std::coroutine_handle<> continuation;
  // The awaiting task's promise, and the task this one waits on: whichever
  // frame is destroyed first unlinks the other (a parent destroyed while its
  // child runs on must not be resumed; a child destroyed first never resumes it).
  PromiseBase* waiter = nullptr;
  PromiseBase* awaiting = nullptr;
  bool suspended = false;  // the first run (inside the call that made the task) is over
  bool taken = false;      // its value was moved out to an awaiter (co_await of an rvalue task)
  Expr value_wait;  // note_wait
  std::exception_ptr error;
  PromiseBase() = default;
  PromiseBase(const PromiseBase&) = delete;
  PromiseBase& operator=(const PromiseBase&) = delete;
  ~PromiseBase() {
    if (awaiting) {
      awaiting->continuation = {};
      awaiting->waiter = nullptr;
    }
    if (waiter) waiter->awaiting = nullptr;
  }
  std::suspend_never initial_suspend() noexcept { return {}; }
  // A co_await of a task hands its line to the awaiter, for its errors (a
  // default argument of await_transform is evaluated at the co_await);
  // every other awaiter passes through by address (AwaiterRef). An
  // awaitable with an operator co_await of its own is given to it here, and
  // what it returns is handed on: by address where it returns a reference
  // (the awaitable, which holds it, lives across the suspension), else in a
  // box made in place. Where no operator co_await is found from here (one
  // declared where only the co_await sees it), the operand is passed on as a
  // copy, and the compiler looks for the operator itself.
  template <class U>
  typename Task<U>::template Awaiter<false> await_transform(
      Task<U>& t, std::source_location loc = std::source_location::current()) {
    return t.awaiter(loc);
  }
  template <class U>
  typename Task<U>::template Awaiter<true> await_transform(
      Task<U>&& t, std::source_location loc = std::source_location::current()) {
    return std::move(t).awaiter(loc);
  }
  // A const task cannot be awaited: awaiting links the waiter into the task
  // and may move its result out.
  // (Each refusal returns an awaiter after its static_assert: only its own message.)
  template <class U>
  std::suspend_never await_transform(const Task<U>&) {
    static_assert(!std::is_same_v<U, U>, "co_await of a const sheaf::Task: await it by reference or std::move it");
    return {};
  }
  template <class U>
  std::suspend_never await_transform(const Task<U>&&) {
    static_assert(!std::is_same_v<U, U>, "co_await of a const sheaf::Task: await it by reference or std::move it");
    return {};
  }
  template <class A>
    requires IsAwaiter<A>
  AwaiterRef<std::remove_reference_t<A>> await_transform(A&& awaiter) noexcept {
    return {&awaiter};
  }
  template <class A>
    requires(!IsAwaiter<A>)
  auto await_transform(A&& awaitable) {
    if constexpr (HasMemberCoAwait<A>) {
      return hand_on<decltype(std::forward<A>(awaitable).operator co_await())>(
          [&]() -> decltype(auto) { return std::forward<A>(awaitable).operator co_await(); });
    } else if constexpr (HasFreeCoAwait<A>) {
      return hand_on<decltype(operator co_await(std::forward<A>(awaitable)))>(
          [&]() -> decltype(auto) { return operator co_await(std::forward<A>(awaitable)); });
    } else {
      return std::remove_cvref_t<A>(std::forward<A>(awaitable));
    }
  }
  // What an operator co_await returned (R, from `get`), as await_transform hands it on.
  template <class R, class Get>
  static auto hand_on(Get get) {
    if constexpr (std::is_reference_v<R>) return AwaiterRef<std::remove_reference_t<R>>{&get()};
    else return AwaiterBox<R>{get()};
  }
  FinalAwaiter final_suspend() noexcept {
    if (waiter) waiter->awaiting = nullptr;  // about to resume it: the link is done
    waiter = nullptr;
    return {continuation};
  }
};

inline void link(PromiseBase& caller, PromiseBase& callee) {
  caller.awaiting = &callee;
  callee.waiter = &caller;
}

// An error during the first run leaves the coroutine's ramp, which frees the
// frame and destroys the Task it returned (GCC and the standard after CWG2451),
// so that Task must let go of the handle. A later error is kept: the task is
// done and failed, whoever awaits it gets the error, and forward reports it.
template <class T>
struct PromiseOf : PromiseBase {
  Task<T>* owner = nullptr;  // the Task that holds this frame (kept by Task's moves)
  Task<T> get_return_object() { return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(self())); }
  void unhandled_exception() {
    if (!suspended) {
      if (owner) owner->h_ = {};
      throw;
    }
    error = std::current_exception();
    if (!continuation) report_task_failure(error);  // an awaiting parent reports it instead
  }
  Promise<T>& self() { return static_cast<Promise<T>&>(*this); }
};

template <class T>
struct Promise : PromiseOf<T> {
  std::optional<T> value;
  void return_value(T v) { value.emplace(std::move(v)); }
};

template <>
struct Promise<void> : PromiseOf<void> {
  void return_void() {}
};

}  // namespace detail

// co_await fetch(e): e's value on the host (a CPU tensor of e's shape).
inline auto fetch(Expr e, std::source_location loc = std::source_location::current()) {
  struct A : detail::ValueAwaiter {
    using ValueAwaiter::ValueAwaiter;
    at::Tensor await_resume() { return value.tensor(); }
  };
  return A{e, loc};
}
// co_await fetch_values(e): e's elements, flattened in row-major order, as host
// floats: what host code reads a few numbers from (a parser's scores) without
// making a tensor per example.
std::vector<float> host_values(const HostValue& v);
inline auto fetch_values(Expr e, std::source_location loc = std::source_location::current()) {
  struct A : detail::ValueAwaiter {
    using ValueAwaiter::ValueAwaiter;
    std::vector<float> await_resume() { return host_values(value); }
  };
  return A{e, loc};
}
// co_await fetch_item(e): a scalar e's value as a double.
double host_item(const HostValue& v, std::source_location loc);
inline auto fetch_item(Expr e, std::source_location loc = std::source_location::current()) {
  struct A : detail::ValueAwaiter {
    using ValueAwaiter::ValueAwaiter;
    double await_resume() { return host_item(value, loc); }
  };
  return A{e, loc};
}
// co_await fetch_argmax(e): the index of the largest element of e (flattened).
int64_t host_argmax(const HostValue& v, std::source_location loc);
inline auto fetch_argmax(Expr e, std::source_location loc = std::source_location::current()) {
  struct A : detail::ValueAwaiter {
    using ValueAwaiter::ValueAwaiter;
    int64_t await_resume() { return host_argmax(value, loc); }
  };
  return A{e, loc};
}

}  // namespace sheaf
