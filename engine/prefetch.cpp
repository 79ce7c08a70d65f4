#include "prefetch.h"

#include <exception>
#include <utility>

#include "engine.h"
#include "worker.h"

namespace sheaf {

Prefetcher::Prefetcher(GraphOptions graph, Record record, ForwardOptions forward, std::source_location loc)
    : record_(std::move(record)),
      forward_(forward),
      made_at_(loc),
      device_(graph.device),
      graphs_{std::make_unique<Graph>(graph), std::make_unique<Graph>(graph)} {
  // The graphs' own, made concrete: an index-less cuda would name whichever
  // device is current at each take(), and hand the worker that one's stream.
  device_ = graphs_[0]->options().device;
  worker_ = std::make_unique<detail::Worker>(device_);
}

Prefetcher::~Prefetcher() = default;  // (the worker first: it finishes the batch in flight)

void Prefetcher::record_into(int slot, size_t batch) {
  Graph& g = *graphs_[slot];
  g.clear();
  targets_[slot] = record_(g, batch);
  detail::engine_of(g).expect_results(targets_[slot], "sheaf::Prefetcher's record function", "batch", batch, made_at_);
  g.prepare(targets_[slot], forward_, made_at_);
}

Prefetcher::Batch Prefetcher::take(size_t i, std::optional<size_t> next) {
  // (It would wait for the batch this very call is recording.)
  if (worker_->on_this_thread())
    throw UserError("sheaf::Prefetcher::take called from its own record function (which runs on the "
                    "Prefetcher's thread): take batches from the thread that made the Prefetcher");
  std::thread::id first{};
  if (!taker_.compare_exchange_strong(first, std::this_thread::get_id()) && first != std::this_thread::get_id())
    throw UserError("sheaf::Prefetcher::take called from a second thread: a Prefetcher's batches are taken from "
                    "one thread (the first take()'s), each used until the next take(); use a Prefetcher per thread");
  const int slot = 1 - current_;
  bool ready = false;
  if (in_flight_) {
    std::exception_ptr error = worker_->wait();
    in_flight_ = false;
    detail::engine_of(*graphs_[slot]).lend(0);  // the worker is done with it
    ready = posted_ == i;
    // The worker's error, if its batch is the one asked for (else it is dropped with the batch).
    if (error && ready) std::rethrow_exception(error);
  }
  if (!ready) record_into(slot, i);
  current_ = slot;
  if (next) {
    // The last batch's Exprs go stale here, on the caller's thread: one it
    // still holds then fails as cleared, instead of racing with the worker's
    // clear(), which frees the batch off this thread as before.
    const int to = 1 - slot;
    detail::engine_of(*graphs_[to]).retire();
    const size_t batch = *next;
    worker_->post([this, to, batch] { record_into(to, batch); });
    detail::engine_of(*graphs_[to]).lend(worker_->tag());  // (after what may throw: lent only if posted)
    posted_ = batch;
    in_flight_ = true;
  }
  return Batch{*graphs_[current_], targets_[current_]};
}

}  // namespace sheaf
