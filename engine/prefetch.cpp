#include "prefetch.h"

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "engine.h"
#include "handles.h"

namespace sheaf {

// A job slot for one thread: take() posts (slot, batch), the thread records it
// and reports done (or the error it threw).
struct Prefetcher::Worker {
  std::mutex mu;
  std::condition_variable cv;
  bool posted = false, done = false, stop = false;
  // Only take()'s thread reads or writes this (the worker never does), so
  // take() may test it without the lock.
  bool in_flight = false;
  int slot = 0;
  size_t batch = 0;
  // Autograd's mode on take()'s thread when it posted: the worker records and
  // plans under it (a plan depends on it: scheduler/plan.h, Plan::grad).
  // InferenceMode too (what prepare makes is then an inference tensor, as
  // when take() records itself), and the graph device's current stream, for
  // what prepare puts on the device (none for a CPU graph).
  bool grad = true, inference = false;
  std::optional<c10::Stream> stream;
  std::exception_ptr error;
  uint64_t tag = 0;  // the thread's number (handles.h): the graph it records into is lent to it
  std::thread thread;
};

Prefetcher::Prefetcher(GraphOptions graph, Record record, ForwardOptions forward)
    : record_(std::move(record)),
      forward_(forward),
      device_(graph.device),
      graphs_{std::make_unique<Graph>(graph), std::make_unique<Graph>(graph)},
      worker_(std::make_unique<Worker>()) {
  // The graphs' own, made concrete: an index-less cuda would name whichever
  // device is current at each take(), and hand the worker that one's stream.
  device_ = graphs_[0]->options().device;
  worker_->thread = std::thread([this] {
    Worker& w = *worker_;
    std::unique_lock lock(w.mu);
    w.tag = detail::this_thread_tag();
    w.cv.notify_all();
    for (;;) {
      w.cv.wait(lock, [&] { return w.posted || w.stop; });
      if (!w.posted) return;  // stopped with nothing to do
      w.posted = false;
      const int slot = w.slot;
      const size_t batch = w.batch;
      const bool grad = w.grad, inference = w.inference;
      const std::optional<c10::Stream> stream = w.stream;
      lock.unlock();
      std::exception_ptr error;
      try {
        std::optional<c10::StreamGuard> on_stream;
        if (stream) on_stream.emplace(*stream);
        const c10::InferenceMode inference_mode(inference);  // (sets grad mode too: first)
        const c10::AutoGradMode mode(grad);
        record_into(slot, batch);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      w.error = error;
      w.done = true;
      w.cv.notify_all();
    }
  });
  std::unique_lock lock(worker_->mu);  // its number, before a take() lends it a graph
  worker_->cv.wait(lock, [&] { return worker_->tag != 0; });
}

Prefetcher::~Prefetcher() {  // finishes the batch in flight, then stops the worker
  {
    std::lock_guard lock(worker_->mu);
    worker_->stop = true;
  }
  worker_->cv.notify_all();
  worker_->thread.join();
}

void Prefetcher::record_into(int slot, size_t batch) {
  Graph& g = *graphs_[slot];
  g.clear();
  targets_[slot] = record_(g, batch);
  g.prepare(targets_[slot], forward_);
}

Prefetcher::Batch Prefetcher::take(size_t i, std::optional<size_t> next) {
  Worker& w = *worker_;
  // (It would wait for the batch this very call is recording.)
  if (std::this_thread::get_id() == w.thread.get_id())
    throw UserError("sheaf::Prefetcher::take called from its own record function (which runs on the "
                    "Prefetcher's thread): take batches from the thread that made the Prefetcher");
  const int slot = 1 - current_;
  bool ready = false;
  if (w.in_flight) {
    std::unique_lock lock(w.mu);
    w.cv.wait(lock, [&] { return w.done; });
    w.done = false;
    w.in_flight = false;
    detail::engine_of(*graphs_[slot]).lend(0);  // the worker is done with it
    ready = w.batch == i;
    // The worker's error, if its batch is the one asked for (else it is dropped with the batch).
    if (std::exception_ptr error = std::exchange(w.error, nullptr); error && ready) std::rethrow_exception(error);
  }
  if (!ready) record_into(slot, i);
  current_ = slot;
  if (next) {
    // The last batch's Exprs go stale here, on the caller's thread: one it
    // still holds then fails as cleared, instead of racing with the worker's
    // clear(), which frees the batch off this thread as before.
    detail::engine_of(*graphs_[1 - slot]).retire();
    {
      std::lock_guard lock(w.mu);
      w.slot = 1 - slot;
      w.batch = *next;
      w.grad = c10::GradMode::is_enabled();
      w.inference = c10::InferenceMode::is_enabled();
      w.stream.reset();
      if (!device_.is_cpu()) w.stream = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
      detail::engine_of(*graphs_[1 - slot]).lend(w.tag);  // (after what may throw: lent only if posted)
      w.posted = true;
      w.in_flight = true;
    }
    w.cv.notify_all();
  }
  return Batch{*graphs_[current_], targets_[current_]};
}

}  // namespace sheaf
