// A move-only callable wrapper that keeps callables of up to N bytes in place.
//
// std::function (libstdc++) stores in place only trivially copyable callables
// of at most 16 bytes: a dsl::cond's callback, which holds the user's two
// branch lambdas and the cond's site, cost a heap allocation and a free per
// cond, and so did each branch (perf, gated inference: ~2% of the forward in
// malloc and free for them). A callable too large, or whose move may throw,
// goes to the heap as before.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace sheaf {

template <class Sig, std::size_t N>
class InlineFunction;

template <class R, class... Args, std::size_t N>
class InlineFunction<R(Args...), N> {
 public:
  InlineFunction() noexcept = default;
  InlineFunction(std::nullptr_t) noexcept {}

  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, InlineFunction> && std::is_constructible_v<std::decay_t<F>, F> &&
             std::is_invocable_r_v<R, std::decay_t<F>&, Args...>)
  InlineFunction(F&& f) {  // NOLINT(google-explicit-constructor): as std::function
    using D = std::decay_t<F>;
    if constexpr (kInPlace<D>) {
      ::new (static_cast<void*>(buf_)) D(std::forward<F>(f));
      ops_ = &kInPlaceOps<D>;
    } else {
      ::new (static_cast<void*>(buf_)) D*(new D(std::forward<F>(f)));
      ops_ = &kHeapOps<D>;
    }
  }

  InlineFunction(InlineFunction&& o) noexcept { take(o); }
  // Takes o's callable before destroying its own (o may live inside it), as
  // std::function does. Into an empty one (a waiter's slot), straight: one
  // move of the callable, not two through a temporary (an indirect call each).
  InlineFunction& operator=(InlineFunction&& o) noexcept {
    if (ops_ == nullptr) {
      take(o);  // (o cannot live inside an empty wrapper; o == this is empty too)
    } else if (this != &o) {
      InlineFunction taken(std::move(o));
      reset();
      take(taken);
    }
    return *this;
  }
  InlineFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  InlineFunction(const InlineFunction&) = delete;
  InlineFunction& operator=(const InlineFunction&) = delete;
  ~InlineFunction() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  R operator()(Args... args) {
    // (Calling an empty one is a bug in Sheaf, not a user's: the engine
    // checks before it calls.)
    return ops_->call(buf_, std::forward<Args>(args)...);
  }

 private:
  struct Ops {
    R (*call)(void*, Args&&...);
    void (*move)(void* to, void* from) noexcept;  // move-constructs at `to`, destroys `from`
    void (*destroy)(void*) noexcept;
  };

  // std::invoke, its result dropped where R is void (is_invocable_r allows a
  // callable that returns something to stand for one that returns nothing).
  template <class D>
  static R invoke(D& f, Args&&... a) {
    if constexpr (std::is_void_v<R>) std::invoke(f, std::forward<Args>(a)...);
    else return std::invoke(f, std::forward<Args>(a)...);
  }

  template <class D>
  static constexpr bool kInPlace = sizeof(D) <= N && alignof(D) <= alignof(std::max_align_t) &&
                                   std::is_nothrow_move_constructible_v<D>;

  template <class D>
  static constexpr Ops kInPlaceOps{
      [](void* p, Args&&... a) -> R { return invoke(*std::launder(static_cast<D*>(p)), std::forward<Args>(a)...); },
      [](void* to, void* from) noexcept {
        D* f = std::launder(static_cast<D*>(from));
        ::new (to) D(std::move(*f));
        f->~D();
      },
      [](void* p) noexcept { std::launder(static_cast<D*>(p))->~D(); }};

  template <class D>
  static constexpr Ops kHeapOps{
      [](void* p, Args&&... a) -> R { return invoke(**static_cast<D**>(p), std::forward<Args>(a)...); },
      [](void* to, void* from) noexcept { ::new (to) D*(*static_cast<D**>(from)); },
      [](void* p) noexcept { delete *static_cast<D**>(p); }};

  // Moves o's callable into this empty wrapper; o is left empty.
  void take(InlineFunction& o) noexcept {
    ops_ = std::exchange(o.ops_, nullptr);
    if (ops_ != nullptr) ops_->move(buf_, o.buf_);
  }

  // Empty first: a destructor that reaches this wrapper again finds nothing to destroy.
  void reset() noexcept {
    if (const Ops* ops = std::exchange(ops_, nullptr)) ops->destroy(buf_);
  }

  alignas(std::max_align_t) unsigned char buf_[N < sizeof(void*) ? sizeof(void*) : N];
  const Ops* ops_ = nullptr;
};

}  // namespace sheaf
