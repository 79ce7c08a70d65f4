#include "worker.h"

#include <ATen/ThreadLocalState.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include <sheaf/core/error.h>

#include "handles.h"
#include "turns.h"

namespace sheaf::detail {

struct Worker::State {
  std::mutex mu;
  std::condition_variable cv;
  bool posted = false, stop = false;
  std::atomic<bool> done{true};  // (read without the lock by wait()'s spin)
  std::function<void()> job;
  // The poster's thread-local LibTorch state (autograd and inference modes,
  // autocast, dispatch settings, saved-tensor hooks, profiler callbacks),
  // which the job runs under; for a device graph, its current stream too.
  std::optional<at::ThreadLocalState> state;
  std::optional<c10::Stream> stream;
  std::exception_ptr error;
};

Worker::Worker(c10::Device device) : device_(device), state_(std::make_unique<State>()) {
  thread_ = std::thread([this] { loop(); });
  std::unique_lock lock(state_->mu);  // its number, before anyone lends it a graph
  state_->cv.wait(lock, [&] { return tag_ != 0; });
}

Worker::~Worker() {
  {
    std::lock_guard lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  thread_.join();
}

void Worker::loop() {
  State& s = *state_;
  std::unique_lock lock(s.mu);
  tag_ = this_thread_tag();
  s.cv.notify_all();
  for (;;) {
    s.cv.wait(lock, [&] { return s.posted || s.stop; });
    if (!s.posted) return;  // stopped with nothing to do
    s.posted = false;
    std::function<void()> job = std::move(s.job);
    const std::optional<c10::Stream> stream = s.stream;
    const std::optional<at::ThreadLocalState> state = std::move(s.state);
    lock.unlock();
    std::exception_ptr error;
    try {
      // (Grad and inference modes included: at::ThreadLocalState carries
      // the autograd state and the dispatch keys InferenceMode sets.)
      const at::ThreadLocalStateGuard thread_state(*state);
      std::optional<c10::StreamGuard> on_stream;
      if (stream) on_stream.emplace(*stream);
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // its captures go here, not in the next post()
    lock.lock();
    s.error = error;
    s.done.store(true, std::memory_order_release);
    s.cv.notify_all();
  }
}

void Worker::post(std::function<void()> job) {
  State& s = *state_;
  std::optional<c10::Stream> stream;  // (what may throw, before anything is posted)
  if (!device_.is_cpu()) stream = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
  at::ThreadLocalState state;
  {
    std::lock_guard lock(s.mu);
    SHEAF_ASSERT(s.done.load(std::memory_order_relaxed) && !s.posted, "a job posted to a busy worker thread");
    s.job = std::move(job);
    s.state = std::move(state);
    s.stream = stream;
    s.done.store(false, std::memory_order_relaxed);
    s.posted = true;
  }
  s.cv.notify_all();
}

std::exception_ptr Worker::wait() {
  State& s = *state_;
  (void)spin_while([&] { return !s.done.load(std::memory_order_acquire); }, 1 << 12);
  std::unique_lock lock(s.mu);
  s.cv.wait(lock, [&] { return s.done.load(std::memory_order_relaxed); });
  return std::exchange(s.error, nullptr);
}

}  // namespace sheaf::detail
