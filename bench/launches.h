// Kernel launches of any system (per-example, hand-batched, Sheaf), counted the
// same way: every ATen op that does device work, called at the top level of the
// program or directly by an autograd node (an op inside another op is part of
// it). View and metadata ops (view, narrow, select, transpose, expand, empty,
// ...) launch nothing and are not counted; Sheaf's fused kernels announce
// themselves as one op each ("sheaf::fused"). Counted in a pass of its own:
// the callback costs time, so timed passes run without it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace sheaf::bench {

class LaunchCounter {
 public:
  enum Phase { kForward = 0, kBackward = 1, kOptimizer = 2, kPhases = 3 };
  struct OpTime {
    uint64_t launches = 0;
    double ms = 0;
  };

  // Installs the callback; with `timed`, also times each counted op by name.
  explicit LaunchCounter(bool timed = false);
  ~LaunchCounter();  // removes it
  LaunchCounter(const LaunchCounter&) = delete;
  LaunchCounter& operator=(const LaunchCounter&) = delete;

  // What the next ops belong to (the step maker sets it around each phase).
  static void set_phase(Phase p);
  std::array<uint64_t, kPhases> counts() const;
  std::map<std::string, OpTime> by_op() const;  // with `timed`: every phase
};

}  // namespace sheaf::bench
