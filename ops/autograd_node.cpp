#include "autograd_node.h"

#include <torch/csrc/autograd/engine.h>

namespace sheaf::detail {

std::atomic<int64_t> g_live_pass_entries{0};

namespace {
// Runs its function when the last copy of the callback holding it goes: the
// callback itself does nothing, as it runs only after a pass that finished.
// Armed only once queued: if queueing throws, the caller (which may hold the
// lock `forget` takes) unwinds without it.
struct AtEnd {
  std::function<void()> f;
  bool armed = false;
  explicit AtEnd(std::function<void()> g) : f(std::move(g)) {}
  AtEnd(const AtEnd&) = delete;
  AtEnd& operator=(const AtEnd&) = delete;
  ~AtEnd() {
    if (!armed) return;
    try {
      f();
    } catch (...) {  // (a destructor, maybe LibTorch's unwinding: nothing to tell)
    }
  }
};
}  // namespace

void on_backward_end(std::function<void()> forget) {
  if (current_backward() == nullptr) return;  // not inside a pass: nothing will be left keyed by it
  auto guard = std::make_shared<AtEnd>(std::move(forget));
  AtEnd* const g = guard.get();
  torch::autograd::Engine::get_default_engine().queue_callback([guard = std::move(guard)] {});
  g->armed = true;
}

}  // namespace sheaf::detail
