// Per-example coroutines: host code (a parser's stack, a search) that follows
// values the model computes, while all examples run in lock-step batches.
//
//   sheaf::Task<Expr> parse(Graph& g, const Sentence& s) {
//     std::vector<Expr> stack;
//     while (...) {
//       Expr scores = dsl::affine(W, features(stack), b);
//       int64_t action = co_await sheaf::argmax(scores);   // suspends this example only
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
// the order they suspended, each in its own example scope. A task may co_await
// another task (recursion works).
#pragma once

#include <ATen/core/Tensor.h>

#include <coroutine>
#include <exception>
#include <optional>
#include <type_traits>
#include <utility>

#include "../tracer/graph.h"

namespace sheaf {

namespace detail {

struct PromiseBase;
// Records that a task has left its first run (see Promise::unhandled_exception).
template <class P>
void mark_suspended(std::coroutine_handle<P> h) noexcept {
  if constexpr (std::is_base_of_v<PromiseBase, P>) h.promise().suspended = true;
}

// What every awaitable value does: register with the graph, resume in the
// example that suspended, hand over the host value.
struct ValueAwaiter {
  Expr expr;
  at::Tensor value;
  bool await_ready() const noexcept { return false; }
  template <class P>
  void await_suspend(std::coroutine_handle<P> h) {
    Graph& g = Graph::of(expr);
    const int example = g.current_example();
    g.when_computed(g.node_of(expr, "co_await", std::source_location::current()),
                    [this, h, &g, example](const at::Tensor& v) {
                      value = v;
                      auto scope = g.example(example);
                      h.resume();
                    });
    mark_suspended(h);
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
  // The co_returned value; throws UserError if the task has not finished (it is
  // waiting for a value: call Graph::forward).
  decltype(auto) result() {
    if (!done()) throw UserError("sheaf::Task::result(): the task has not finished; call Graph::forward() first");
    if constexpr (!std::is_void_v<T>) return *h_.promise().value;
  }

  // co_await a task from another task: resumes the caller when it finishes.
  struct Awaiter {
    std::coroutine_handle<promise_type> h;
    bool await_ready() const noexcept { return h.done(); }
    template <class P>
    void await_suspend(std::coroutine_handle<P> caller) noexcept {
      h.promise().continuation = caller;
      detail::mark_suspended(caller);
    }
    decltype(auto) await_resume() {
      if constexpr (!std::is_void_v<T>) return std::move(*h.promise().value);
    }
  };
  Awaiter operator co_await() noexcept { return Awaiter{h_}; }

 private:
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

struct PromiseBase {
  std::coroutine_handle<> continuation;
  bool suspended = false;  // the first run (inside the call that made the task) is over
  std::suspend_never initial_suspend() noexcept { return {}; }
  FinalAwaiter final_suspend() noexcept { return {continuation}; }
};

// An error inside a task (a UserError while recording) surfaces where the task
// was running: from the call that made it during its first run, else from the
// Graph::forward that resumed it. In the first case the exception leaves the
// coroutine's ramp, which frees the frame and destroys the Task it returned
// (GCC and the standard after CWG2451), so that Task must let go of the handle.
template <class T>
struct PromiseOf : PromiseBase {
  Task<T>* owner = nullptr;  // the Task that holds this frame (kept by Task's moves)
  Task<T> get_return_object() { return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(self())); }
  void unhandled_exception() {
    if (!suspended && owner) owner->h_ = {};
    throw;
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
inline auto fetch(Expr e) {
  struct A : detail::ValueAwaiter {
    at::Tensor await_resume() { return value; }
  };
  return A{{e, {}}};
}
// co_await item(e): a scalar e's value as a double.
inline auto item(Expr e) {
  struct A : detail::ValueAwaiter {
    double await_resume() { return value.item<double>(); }
  };
  return A{{e, {}}};
}
// co_await argmax(e): the index of the largest element of a vector e.
int64_t host_argmax(const at::Tensor& v);
inline auto argmax(Expr e) {
  struct A : detail::ValueAwaiter {
    int64_t await_resume() { return host_argmax(value); }
  };
  return A{{e, {}}};
}

}  // namespace sheaf
