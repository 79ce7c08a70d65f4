// Creating an autograd node of our own, on either side of a LibTorch change:
// nodes are held by std::shared_ptr up to torch 2.12 and by c10::intrusive_ptr
// since (torch/csrc/autograd/node.h). set_history and Edge accept what
// make_node returns in both.
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/function.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

namespace sheaf::detail {

inline constexpr bool kIntrusiveNodes = std::is_base_of_v<c10::intrusive_ptr_target, torch::autograd::Node>;

template <class T, class... A>
auto make_node(A&&... args) {
  if constexpr (kIntrusiveNodes) return c10::make_intrusive<T>(std::forward<A>(args)...);
  else return std::make_shared<T>(std::forward<A>(args)...);
}

// The backward pass now running (its graph task), as a key. Sums that several
// nodes add into and one node hands on (a source's hub, a weight's pending
// rows) are kept per pass: two passes at once through one graph (two
// threads' autograd::grad) must not take each other's.
inline const void* current_backward() { return torch::autograd::get_current_graph_task_exec_info(); }

// Calls `forget` once the current backward pass is over, whether it finished
// or threw: when LibTorch destroys the pass's graph task, which holds it as a
// final callback. What a pass left keyed by current_backward() is dropped
// then, before that address can be another pass's key: a pass that threw
// midway would otherwise leave its sums to a later pass at the same address.
// Call only from inside a backward pass (an autograd node's apply).
void on_backward_end(std::function<void()> forget);

// Our nodes' gradients carry no history of their own (raw kernels, copies
// into a hub, pre-packed weights): a second derivative through them
// (`create_graph`) would leave terms out without a word. So, as LibTorch's
// once-differentiable functions do, under create_graph the gradients a node
// returns are handed on through a node that refuses to be differentiated:
// a UserError naming `node` if, and only if, a second backward reaches it.
// Call at the end of every apply() of ours (`self`), on what it returns: the
// error node follows the gradients `self` was given and `self`'s own inputs,
// so that a second backward toward anything they depend on reaches it.
void once_differentiable(const torch::autograd::Node& self, const torch::autograd::variable_list& given,
                         torch::autograd::variable_list& grads, const char* node);

// How many per-pass entries (a hub's sum, a weight's pending rows) all graphs
// hold now: what a test reads to see that a pass left none behind.
extern std::atomic<int64_t> g_live_pass_entries;

// A value per backward pass (a hub's sum, a weight's pending rows): made by
// the pass's first contributor, taken by the node that hands it on, and
// dropped when the pass ends if that node never ran (the pass threw before
// it). One place for the keying, the drop and the count, for every such sum.
// Held by std::shared_ptr (make_shared): the drop holds it weakly, so an owner
// gone before its pass ends takes its entries with it.
template <class T>
class PerPass : public std::enable_shared_from_this<PerPass<T>> {
 public:
  PerPass() = default;
  PerPass(const PerPass&) = delete;
  PerPass& operator=(const PerPass&) = delete;
  ~PerPass() { g_live_pass_entries -= static_cast<int64_t>(entries_.size()); }

  // Guards the entries: get() wants it held (a caller may hold several, in an
  // order of its own); take() and the drop take it themselves.
  std::mutex& mutex() { return mutex_; }

  // With mutex() held, inside a pass: the current pass's value, made by
  // `make()` if it has none, its drop at the pass's end armed first (if
  // arming throws, nothing was added; if `make` throws, the drop finds nothing).
  template <class Make>
  T& get(Make&& make) {
    const void* pass = current_backward();
    auto it = find(pass);
    if (it == entries_.end()) {
      if (this->weak_from_this().expired())  // (the drop could not find it: a pass's sums would outlive it)
        throw std::logic_error("sheaf: a detail::PerPass not made by std::make_shared");
      on_backward_end([self = this->weak_from_this(), pass] {
        if (const std::shared_ptr<PerPass> p = self.lock()) p->forget(pass);
      });
      it = entries_.emplace(entries_.end(), pass, std::forward<Make>(make)());
      ++g_live_pass_entries;
    }
    return it->second;
  }
  // The current pass's value, taken out; none if no contributor made one.
  std::optional<T> take() {
    const void* pass = current_backward();
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = find(pass);
    if (it == entries_.end()) return std::nullopt;
    std::optional<T> out(std::move(it->second));
    entries_.erase(it);
    --g_live_pass_entries;
    return out;
  }
  // Drops what `pass` left (its end: on_backward_end).
  void forget(const void* pass) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = find(pass); it != entries_.end()) {
      entries_.erase(it);
      --g_live_pass_entries;
    }
  }

 private:
  // One entry per pass running through the owner: one but for concurrent passes.
  auto find(const void* pass) {
    return std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == pass; });
  }
  std::mutex mutex_;
  std::vector<std::pair<const void*, T>> entries_;
};

}  // namespace sheaf::detail
