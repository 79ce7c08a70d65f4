// Which recorded nodes the next round looks at: new nodes, and nodes whose
// reason to wait is gone. A node that cannot run yet waits ("parks") on the one
// node that stops it; when that node becomes ready, its waiters are looked at
// again. So building a round costs what changed since the last one, not
// everything still waiting (a chain of conds no longer rescans the graph per
// round).
//
// While control flow waits for values, a round may run only what those values
// need (Scheduler::schedule's `awaited`): a node nothing awaited needs (a
// step's loss) is deferred, and joins a later round, batched with its kind
// from the other steps, once something needs it or nothing is awaited any more.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <sheaf/core/column.h>
#include <sheaf/core/ids.h>

namespace sheaf {

// The queue's lists of node ids (its candidates, a round's work list). A
// Column, not a std::vector<uint32_t>: its push_back, made for every node
// recorded (Trace::record), is its own instantiation, inlined or not on its
// own account. Sharing std::vector<uint32_t>'s with the tracer's other
// vectors, it was left out of line from record() when an unrelated function
// of the same file changed (16 instructions a node).
using NodeList = Column<NodeId>;

class ReadyQueue {
 public:
  // The nodes to look at in the next round (taken by the scheduler).
  NodeList& candidates() { return candidates_; }
  void add(NodeId n) { candidates_.push_back(n); }
  // n waits until `on` is ready.
  void park(NodeId n, NodeId on) {
    cover(head_, on, kNone32);
    node_.push_back(n);
    next_.push_back(head_[on]);
    head_[on] = static_cast<uint32_t>(node_.size() - 1);
  }
  // `on` is ready: its waiters go to `into` (and wait no longer).
  void wake(NodeId on, NodeList& into) {
    if (on >= head_.size()) return;
    for (uint32_t e = head_[on]; e != kNone32; e = next_[e]) into.push_back(node_[e]);
    head_[on] = kNone32;
  }

  // ---- Deferral. A node is "needed" once an awaited node depends on it (for
  // good: what it feeds is awaited), and "deferred" while it could run but waits.
  bool needed(NodeId n) const { return n < mark_.size() && (mark_[n] & kNeeded) != 0; }
  bool deferred(NodeId n) const { return n < mark_.size() && (mark_[n] & kDeferred) != 0; }
  bool any_deferred() const { return live_deferred_ > 0; }
  // Deferrals since clear() (Stats::deferred; a node parked again after a
  // round that ran everything may be deferred again).
  uint64_t deferred_count() const { return deferred_count_; }
  void defer(NodeId n) {
    grow(n);
    mark_[n] |= kDeferred;
    deferred_.push_back(n);
    ++deferred_count_;
    ++live_deferred_;
  }
  // Marks n needed; a deferred n goes back to be looked at (into `work`: the
  // candidates, or a round's work list). Returns whether n was newly needed
  // (its arguments then need looking at).
  bool need(NodeId n, NodeList& work) {
    grow(n);
    if (mark_[n] & kNeeded) return false;
    if (mark_[n] & kDeferred) {
      work.push_back(n);
      --live_deferred_;
    }
    mark_[n] = kNeeded;
    return true;
  }
  // Every deferred node goes back to the candidates.
  void release_deferred() {
    for (NodeId n : deferred_)
      if (mark_[n] & kDeferred) {
        mark_[n] &= static_cast<uint8_t>(~kDeferred);
        candidates_.push_back(n);
      }
    deferred_.clear();
    live_deferred_ = 0;
  }

  void clear() {
    candidates_.clear();
    head_.clear();
    node_.clear();
    next_.clear();
    mark_.clear();
    deferred_.clear();
    deferred_count_ = 0;
    live_deferred_ = 0;
  }

 private:
  NodeList candidates_;
  std::vector<uint32_t> head_;  // per node waited on: its list of waiters (entries linked through next_)
  std::vector<NodeId> node_;
  std::vector<uint32_t> next_;
  static constexpr uint8_t kNeeded = 1, kDeferred = 2;
  std::vector<uint8_t> mark_;       // per node: kNeeded, kDeferred
  std::vector<NodeId> deferred_;    // deferred nodes (entries released by need() go stale)
  uint64_t deferred_count_ = 0;
  size_t live_deferred_ = 0;        // entries of deferred_ still deferred
  void grow(NodeId n) { cover(mark_, n, uint8_t{0}); }
  // Makes v[n] valid (new entries `fill`), growing v at least twofold: nodes
  // come in recording order, so growing to n + 1 (an out-of-line fill) would
  // run on nearly every call.
  template <class T>
  static void cover(std::vector<T>& v, NodeId n, T fill) {
    if (v.size() <= n) v.resize(std::max<size_t>(n + 1, 2 * v.size()), fill);
  }
};

}  // namespace sheaf
