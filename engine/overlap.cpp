#include "overlap.h"

#include <exception>
#include <string>
#include <utility>

#include "engine.h"
#include "turns.h"
#include "worker.h"

namespace sheaf {

Overlap::Overlap(GraphOptions graph, size_t parts) : turns_(std::make_unique<detail::ExecutionTurns>()) {
  if (parts < 1) throw UserError("sheaf::Overlap: parts must be >= 1, got 0");
  for (size_t p = 0; p < parts; ++p) {
    graphs_.push_back(std::make_unique<Graph>(graph));
    detail::engine_of(*graphs_.back()).take_turns(turns_.get());
  }
  targets_.resize(parts);
  // One thread a part past the first for the Overlap's life (not one per
  // run): its scheduling scratch stays warm. The graphs' device made concrete
  // (an index-less cuda would name whichever device is current at each run).
  const c10::Device device = graphs_[0]->options().device;
  for (size_t p = 1; p < parts; ++p) workers_.push_back(std::make_unique<detail::Worker>(device));
}

Overlap::~Overlap() = default;  // (the workers first: each finishes its part)

Graph& Overlap::graph(size_t part) {
  if (part >= graphs_.size())
    throw UserError("sheaf::Overlap::graph: part " + std::to_string(part) + " of " + std::to_string(graphs_.size()));
  return *graphs_[part];
}

const std::vector<Expr>& Overlap::targets(size_t part) const {
  if (part >= targets_.size())
    throw UserError("sheaf::Overlap::targets: part " + std::to_string(part) + " of " +
                    std::to_string(targets_.size()));
  return targets_[part];
}

void Overlap::run_part(const Record& record, const ForwardOptions& forward, size_t part) {
  Graph& g = *graphs_[part];
  targets_[part].clear();
  g.clear();
  targets_[part] = record(g, part);
  g.forward(targets_[part], forward);
}

void Overlap::run(const Record& record, const ForwardOptions& forward) {
  for (const auto& w : workers_)
    if (w->on_this_thread())  // (it would wait for the part this very call runs)
      throw UserError("sheaf::Overlap::run called from its own record function, or from control flow of a "
                      "part (which run on the Overlap's threads): call run from the thread that made it");
  // The other parts first, each lent to its thread while it runs.
  size_t posted = 0;
  std::exception_ptr error;
  try {
    for (; posted < workers_.size(); ++posted) {
      const size_t part = posted + 1;
      // The last run's Exprs of this part go stale here, on the caller's
      // thread: one still held fails as cleared instead of racing with the
      // worker's clear() (as a Prefetcher's batch does).
      detail::engine_of(*graphs_[part]).retire();
      detail::engine_of(*graphs_[part]).lend(workers_[posted]->tag());
      workers_[posted]->post([this, &record, &forward, part] { run_part(record, forward, part); });
    }
    run_part(record, forward, 0);
  } catch (...) {
    error = std::current_exception();
  }
  // Every part posted is waited for, also after an error (they read `record`).
  for (size_t k = 0; k < workers_.size(); ++k) {
    if (k < posted) {
      std::exception_ptr e = workers_[k]->wait();
      if (!error) error = e;
    }
    detail::engine_of(*graphs_[k + 1]).lend(0);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace sheaf
