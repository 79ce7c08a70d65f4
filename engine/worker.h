// A thread of the library's own (a Prefetcher's, an Overlap's) that runs one
// posted job at a time, each under the LibTorch thread-local state (autograd
// mode, InferenceMode, autocast, ...) and device stream of the thread that
// posted it: what the job records, plans and runs is what that thread would
// have (a plan depends on the autograd mode: scheduler/plan.h, Plan::grad).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

namespace sheaf::detail {

class Worker {
 public:
  explicit Worker(c10::Device device);  // the graphs' device (its current stream goes with each job)
  ~Worker();                            // finishes the job in flight, then stops
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Starts `job` on the thread (none may be in flight: an internal error).
  void post(std::function<void()> job);
  // Waits for the job posted last; returns what it threw (null if nothing).
  // A short job is waited for by spinning first: a thread put to sleep on a
  // virtual machine takes tens of microseconds to wake.
  std::exception_ptr wait();
  uint64_t tag() const { return tag_; }  // the thread's number (handles.h)
  bool on_this_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct State;
  void loop();
  c10::Device device_;
  std::unique_ptr<State> state_;
  uint64_t tag_ = 0;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace sheaf::detail
