// Which recorded nodes the next round looks at: new nodes, and nodes whose
// reason to wait is gone. A node that cannot run yet waits ("parks") on the one
// node that stops it; when that node becomes ready, its waiters are looked at
// again. So building a round costs what changed since the last one, not
// everything still waiting (a chain of conds no longer rescans the graph per
// round).
#pragma once

#include <cstdint>
#include <vector>

#include <sheaf/core/ids.h>

namespace sheaf {

class ReadyQueue {
 public:
  // The nodes to look at in the next round (taken by the scheduler).
  std::vector<NodeId>& candidates() { return candidates_; }
  void add(NodeId n) { candidates_.push_back(n); }
  // n waits until `on` is ready.
  void park(NodeId n, NodeId on) {
    if (head_.size() <= on) head_.resize(on + 1, kNone32);
    node_.push_back(n);
    next_.push_back(head_[on]);
    head_[on] = static_cast<uint32_t>(node_.size() - 1);
  }
  // `on` is ready: its waiters go to `into` (and wait no longer).
  void wake(NodeId on, std::vector<NodeId>& into) {
    if (on >= head_.size()) return;
    for (uint32_t e = head_[on]; e != kNone32; e = next_[e]) into.push_back(node_[e]);
    head_[on] = kNone32;
  }
  void clear() {
    candidates_.clear();
    head_.clear();
    node_.clear();
    next_.clear();
  }

 private:
  std::vector<NodeId> candidates_;
  std::vector<uint32_t> head_;  // per node waited on: its list of waiters (entries linked through next_)
  std::vector<NodeId> node_;
  std::vector<uint32_t> next_;
};

}  // namespace sheaf
