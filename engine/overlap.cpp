#include "overlap.h"

#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <utility>

#include "engine.h"
#include "handles.h"
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

Parts balanced_parts(size_t n, size_t parts, const std::function<double(size_t)>& weight) {
  if (parts < 1) throw UserError("sheaf::balanced_parts: parts must be >= 1, got 0");
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) {
    w[i] = weight(i);
    if (!std::isfinite(w[i]))  // (NaN would break the sort's ordering)
      throw UserError(detail::cat("sheaf::balanced_parts: item ", i, "'s weight is ", w[i], ", not a finite number"));
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return w[a] > w[b]; });
  Parts out(parts);
  for (size_t k = 0; k < n; ++k) {
    const size_t lap = k / parts, at = k % parts;
    out[lap % 2 == 0 ? at : parts - 1 - at].push_back(order[k]);  // there and back: 0, 1, 1, 0, ...
  }
  for (auto& p : out) std::sort(p.begin(), p.end());
  return out;
}

Overlap::~Overlap() = default;  // (the workers first: each finishes its part)

namespace {
std::string out_of_range(const char* what, size_t part, size_t parts) {
  return std::string("sheaf::Overlap::") + what + ": part " + std::to_string(part) + " is out of range: this Overlap has " +
         std::to_string(parts) + " parts (0.." + std::to_string(parts - 1) + ")";
}
}  // namespace

Graph& Overlap::graph(size_t part) {
  if (part >= graphs_.size()) throw UserError(out_of_range("graph", part, graphs_.size()));
  return *graphs_[part];
}

const std::vector<Expr>& Overlap::targets(size_t part) const {
  if (part >= targets_.size()) throw UserError(out_of_range("targets", part, targets_.size()));
  return targets_[part];
}

void Overlap::run_part(const Record& record, const ForwardOptions& forward, size_t part, std::source_location loc) {
  Graph& g = *graphs_[part];
  // A thread's first kernel may be one of ours, launched through the CUDA
  // driver (backend/nvrtc.h), which needs the context current on the thread:
  // a LibTorch op first, which makes it so. (Not checked on a GPU yet.)
  const c10::Device device = g.options().device;
  thread_local std::vector<c10::Device> touched;  // (per device: part 0 runs on the caller's thread)
  if (!device.is_cpu() && std::find(touched.begin(), touched.end(), device) == touched.end()) {
    (void)at::zeros({1}, at::TensorOptions().device(device));
    touched.push_back(device);
  }
  g.clear();
  try {
    targets_[part] = record(g, part);
    detail::engine_of(g).expect_results(targets_[part], "sheaf::Overlap's record function", "part", part, loc);
    g.forward(targets_[part], forward, loc);
  } catch (...) {
    targets_[part].clear();  // (targets() holds computed values only)
    throw;
  }
}

void Overlap::run(const Record& record, const ForwardOptions& forward, std::source_location loc) {
  // One run at a time: another from a part's record function or control flow
  // (on any of the parts' threads) or from a second thread would clear graphs
  // in use and post to busy threads.
  if (running_.exchange(true))
    throw UserError("sheaf::Overlap::run called while a run of it is under way (from a part's record function or "
                    "control flow, or from another thread): one run at a time");
  struct Done {
    std::atomic<bool>& running;
    ~Done() { running.store(false); }
  } done{running_};
  // Every part's last targets go first (a part not run this time shows none,
  // not the last batch's), and its Exprs go stale here, on the caller's
  // thread: one still held fails as cleared instead of racing with the
  // worker's clear() (as a Prefetcher's batch does).
  for (size_t p = 0; p < graphs_.size(); ++p) {
    targets_[p].clear();
    if (p > 0) detail::engine_of(*graphs_[p]).retire();
  }
  // Each part's graph is lent to the thread that runs it: forward, prepare
  // and clear from elsewhere (another part's control flow) are a UserError.
  const uint64_t here = detail::this_thread_tag();
  detail::engine_of(*graphs_[0]).lend(here);
  size_t posted = 0;
  std::exception_ptr error;
  try {
    for (; posted < workers_.size(); ++posted) {
      const size_t part = posted + 1;
      detail::engine_of(*graphs_[part]).lend(workers_[posted]->tag());
      workers_[posted]->post([this, &record, &forward, part, loc] { run_part(record, forward, part, loc); });
    }
    run_part(record, forward, 0, loc);
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
  detail::engine_of(*graphs_[0]).lend(0);
  if (error) std::rethrow_exception(error);
}

}  // namespace sheaf
