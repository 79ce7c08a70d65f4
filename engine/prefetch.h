// Overlaps the host's tracing and scheduling with the device's work, batch by
// batch: while the caller runs batch i (forward, backward, optimizer step), a
// worker thread records batch i+1 into a second Graph and schedules it
// (Graph::prepare). On a GPU the host otherwise traces and schedules while the
// device waits; on a CPU the worker uses a core that a one-thread run leaves idle.
//
//   sheaf::Prefetcher batches({.device = device}, [&](sheaf::Graph& g, size_t b) {
//     return std::vector<sheaf::Expr>{model.loss(g, data[b])};   // runs on the worker
//   });
//   for (size_t b = 0; b < n; ++b) {
//     sheaf::Prefetcher::Batch batch = batches.take(b, b + 1 < n ? std::optional(b + 1) : std::nullopt);
//     batch.graph.forward(batch.targets);
//     batch.targets[0].value().backward();
//     optimizer.step();
//   }
//
// The record function runs on the worker: it may read what the caller does not
// change meanwhile (the parameters' identities, the data), and must not touch
// the caller's graph.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <thread>
#include <vector>

#include "graph.h"

namespace sheaf {

namespace detail {
class Worker;
}

class Prefetcher {
 public:
  using Record = std::function<std::vector<Expr>(Graph&, size_t batch)>;
  struct Batch {
    Graph& graph;
    // A copy: the worker records into the other graph's list while the caller
    // runs this one, so a list kept past the next take() holds Exprs that fail
    // as cleared, not a view of what the worker rewrites.
    std::vector<Expr> targets;
  };

  // `loc`: where it is made (errors about what `record` returns name it).
  Prefetcher(GraphOptions graph, Record record, ForwardOptions forward = {},
             std::source_location loc = std::source_location::current());
  ~Prefetcher();  // waits for the worker
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Batch i, recorded and prepared: by the worker if the last take() asked for
  // i, else here. Then starts batch `next` on the worker, under this thread's
  // autograd mode, InferenceMode and (for a device graph) current stream. An error recording
  // batch i, here or on the worker, is thrown here (a batch the worker
  // recorded that this call does not take is dropped, error and all). The
  // batch's graph and targets stay valid until the next take(). A take()
  // with `next` makes them stale and lends the graph to the worker, which
  // records that batch into it, until the take() after: meanwhile its
  // forward, prepare and clear are a UserError (and its Exprs are stale:
  // the next take() retires the graph first). Its other calls (recording,
  // example(), set_strategy, set_train, stats()) are not checked: do not.
  // All takes come from one thread, the first take()'s: another's is a
  // UserError (two threads' takes handed each other's batches, values and all).
  Batch take(size_t i, std::optional<size_t> next = std::nullopt);

 private:
  void record_into(int slot, size_t batch);

  Record record_;
  ForwardOptions forward_;
  std::source_location made_at_;
  c10::Device device_;  // the graphs' (its current stream goes to the worker)
  std::array<std::unique_ptr<Graph>, 2> graphs_;
  std::array<std::vector<Expr>, 2> targets_;
  int current_ = 0;
  bool in_flight_ = false;  // a batch posted to the worker, not taken yet
  size_t posted_ = 0;       // that batch
  std::atomic<std::thread::id> taker_{};  // the thread of the first take()
  // One worker thread for the Prefetcher's life (not one per batch): its
  // scheduling scratch stays warm, so a batch allocates nothing there either.
  std::unique_ptr<detail::Worker> worker_;  // last: started once the rest exists
};

}  // namespace sheaf
