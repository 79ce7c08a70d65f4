#include "autograd_node.h"

#include <torch/csrc/autograd/engine.h>

namespace sheaf::detail {

namespace {
// Runs its function when the last copy of the callback holding it goes: the
// callback itself does nothing, as it runs only after a pass that finished.
struct AtEnd {
  std::function<void()> f;
  explicit AtEnd(std::function<void()> g) : f(std::move(g)) {}
  AtEnd(const AtEnd&) = delete;
  AtEnd& operator=(const AtEnd&) = delete;
  ~AtEnd() { f(); }
};
}  // namespace

void on_backward_end(std::function<void()> forget) {
  auto guard = std::make_shared<AtEnd>(std::move(forget));
  torch::autograd::Engine::get_default_engine().queue_callback([guard = std::move(guard)] {});
}

}  // namespace sheaf::detail
