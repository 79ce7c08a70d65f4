#include "autograd_node.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <sheaf/core/error.h>

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

namespace {
struct SecondOrder : torch::autograd::Node {
  const char* node = "";
  std::string name() const override { return "sheaf::SecondOrderError"; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&&) override {
    throw UserError(cat("sheaf: a second derivative (a backward through gradients made with create_graph) reached ",
                        node, ", whose backward is not differentiable (docs/reliability.md, \"Autograd through "
                        "Sheaf's own nodes\"): take second derivatives through eager LibTorch code"));
  }
};
}  // namespace

void once_differentiable(const torch::autograd::Node& self, const torch::autograd::variable_list& given,
                         torch::autograd::variable_list& grads, const char* node) {
  if (!c10::GradMode::is_enabled()) return;  // a plain backward: nothing records these gradients
  auto error = make_node<SecondOrder>();
  error->node = node;
  torch::autograd::edge_list edges = torch::autograd::collect_next_edges(given);
  for (const torch::autograd::Edge& e : self.next_edges()) edges.push_back(e);
  error->set_next_edges(std::move(edges));
  for (at::Tensor& g : grads)
    if (g.defined()) {
      g = g.tensor_data();  // (the same data, no history: only the error node.s)
      torch::autograd::set_history(g, error);
    }
}

void on_backward_end(std::function<void()> forget) {
  if (current_backward() == nullptr) return;  // not inside a pass: nothing will be left keyed by it
  auto guard = std::make_shared<AtEnd>(std::move(forget));
  AtEnd* const g = guard.get();
  torch::autograd::Engine::get_default_engine().queue_callback([guard = std::move(guard)] {});
  g->armed = true;
}

}  // namespace sheaf::detail
