// Turns at running kernels, for graphs run on several threads at once
// (sheaf::Overlap): one round's kernels at a time, each thread's host work
// (recording, control flow, scheduling) meanwhile.
#pragma once

#include <atomic>
#include <thread>

namespace sheaf::detail {

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins while busy() for at most `spins` pauses; whether it stopped being busy.
template <class Busy>
bool spin_while(Busy busy, int spins) {
  for (int i = 0; i < spins; ++i) {
    if (!busy()) return true;
    cpu_pause();
  }
  return !busy();
}

// A lock that waits by spinning, then by yielding its core: a round's
// kernels take tens of microseconds, less than a thread put to sleep takes
// to wake on a virtual machine (with a std::mutex, two parts of the gated
// net's batch ran slower than one graph: docs/benchmarks.md, stop 73).
class ExecutionTurns {
 public:
  void lock() {
    while (busy_.exchange(true, std::memory_order_acquire))
      if (!spin_while([&] { return busy_.load(std::memory_order_relaxed); }, kSpins))
        while (busy_.load(std::memory_order_relaxed)) std::this_thread::yield();
    holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void unlock() {
    holder_.store(std::thread::id(), std::memory_order_relaxed);
    busy_.store(false, std::memory_order_release);
  }
  // Whether this thread holds the turn (what launches kernels outside a
  // round, a value made at a fetch, checks: engine.cpp).
  bool held_here() const { return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }

 private:
  static constexpr int kSpins = 1 << 14;  // 0.05-1 ms of pauses (10-140 cycles each, by CPU)
  std::atomic<bool> busy_{false};
  std::atomic<std::thread::id> holder_{};
};

}  // namespace sheaf::detail
