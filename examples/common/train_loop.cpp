#include "train_loop.h"

#include <ATen/ATen.h>

#include <chrono>
#include <optional>

namespace sheaf::models {

void train_pass(const TrainPass& p, Graph& g, torch::optim::Optimizer& opt) {
  Prefetcher prefetch(p.graph, [&](Graph& pg, size_t b) { return std::vector<Expr>{p.record(pg, b)}; },
                      {.strategy = p.strategy});
  for (size_t b = 0; b < p.batches; ++b) {
    Graph* graph = &g;
    Expr total;
    if (p.prefetch) {
      const Prefetcher::Batch next = prefetch.take(b, b + 1 < p.batches ? std::optional(b + 1) : std::nullopt);
      graph = &next.graph;
      total = next.targets[0];
    } else {
      g.clear();
      total = p.record(g, b);
    }
    graph->forward(total, {.strategy = p.strategy});
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    const at::Tensor loss = total.value() / static_cast<double>(p.size(b));
    if (p.backward) p.backward(loss);
    else loss.backward();
    opt.step();
    if (p.after) p.after(b, total, *graph, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
}

}  // namespace sheaf::models
