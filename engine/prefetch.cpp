#include "prefetch.h"

#include <utility>

namespace sheaf {

Prefetcher::Prefetcher(GraphOptions graph, Record record, ForwardOptions forward)
    : record_(std::move(record)),
      forward_(forward),
      graphs_{std::make_unique<Graph>(graph), std::make_unique<Graph>(graph)} {}

Prefetcher::~Prefetcher() {
  if (worker_.valid()) worker_.wait();
}

void Prefetcher::record_into(int slot, size_t batch) {
  Graph& g = *graphs_[slot];
  g.clear();
  targets_[slot] = record_(g, batch);
  g.prepare(targets_[slot], forward_);
}

Prefetcher::Batch Prefetcher::take(size_t i, std::optional<size_t> next) {
  const int slot = 1 - current_;
  bool ready = false;
  if (worker_.valid()) {
    ready = worker_batch_ == i;
    worker_.get();  // rethrows the worker's error
  }
  if (!ready) record_into(slot, i);
  current_ = slot;
  if (next) {
    worker_batch_ = *next;
    worker_ = std::async(std::launch::async, [this, other = 1 - slot, b = *next] { record_into(other, b); });
  }
  return Batch{*graphs_[current_], targets_[current_]};
}

}  // namespace sheaf
