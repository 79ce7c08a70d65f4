// A vector for buffers of plain data that are sized ahead and written by
// count (NodeStore's columns and lists; the scheduler's per-node arrays and
// scratch): growing it leaves the new elements default-initialized, that is
// unwritten, where std::vector would zero them first. A graph made per batch
// grows its columns every batch (those zero-fills were a tenth of a gated
// net's recording), and a round's arrays grow again after each cut. Whoever
// uses one writes every element it reads.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace sheaf {

template <class T, class A = std::allocator<T>>
class DefaultInitAllocator : public A {
  using Traits = std::allocator_traits<A>;

 public:
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U, typename Traits::template rebind_alloc<U>>;
  };
  using A::A;
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    Traits::construct(static_cast<A&>(*this), p, std::forward<Args>(args)...);
  }
};

template <class T>
using Column = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace sheaf
