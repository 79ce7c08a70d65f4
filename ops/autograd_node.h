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
#include <memory>
#include <type_traits>
#include <utility>

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

// How many per-pass entries (a hub's sum, a weight's pending rows) all graphs
// hold now: what a test reads to see that a pass left none behind.
extern std::atomic<int64_t> g_live_pass_entries;

}  // namespace sheaf::detail
