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
#include <span>
#include <vector>

#include <sheaf/core/column.h>
#include <sheaf/core/error.h>
#include <sheaf/core/ids.h>
#include <sheaf/tracer/node_store.h>

namespace sheaf {

// The queue's lists of node ids (its candidates, a round's work list). A
// Column, not a std::vector<uint32_t>: its push_back, made for every node
// recorded (Trace::record), is its own instantiation, inlined or not on its
// own account. Sharing std::vector<uint32_t>'s with the tracer's other
// vectors, it was left out of line from record() when an unrelated function
// of the same file changed (16 instructions a node).
using NodeList = Column<NodeId>;

// The next round as recording found it (ReadyQueue::plain): the candidates,
// in recording order, each with its arguments recorded since the last round
// (as candidate indices: the round's local ids) and its depth. Columns sized
// as capacity and written by count (a push_back each, out of line, cost
// recording more than the round saved); the scheduler cuts them to `size`
// and swaps them with its round's (scheduler/round.cpp).
struct RecordedRound {
  uint32_t size = 0;           // candidates listed
  Column<NodeId> node;         // (size valid)
  Column<uint32_t> arg_begin;  // CSR (size + 1 valid): candidate i's are [arg_begin[i], arg_begin[i + 1])
  Column<uint32_t> args;       // (arg_begin[size] valid)
  Column<uint32_t> depth;      // longest path from the round's inputs, 0-based (size valid)
};

class ReadyQueue {
 public:
  // The nodes to look at in the next round (taken by the scheduler).
  // (Order aside: a round sorts them.)
  NodeList& candidates() {
    if (plain_ || recorded_.size > 0) unlist();
    return candidates_;
  }
  // A candidate other than a node just recorded (a resolved placeholder, a
  // node put back): the round is built the general way.
  void add(NodeId n) {
    if (plain_) unlist();
    candidates_.push_back(n);
  }

  // ---- The round as recorded. Most rounds (a training batch's one round)
  // are every node recorded since the last round, each with its arguments
  // computed or recorded before it in that same span. Recording, which has
  // each node's arguments at hand, then lists the candidates with their
  // in-round arguments and depths as it goes, and the round is those lists
  // (round.cpp's take_recorded), not a second look at every node and
  // argument (about 150 instructions a node, against about 85 for the lists
  // and their take). It holds
  // ("plain") while every candidate came from add_recorded (shape known; no
  // argument a placeholder or a node left over from an earlier round), no
  // node waits and none is deferred: plain(). Anything else makes the round
  // be built the general way. Recorded candidates are listed in
  // recorded().node either way, by count (a push_back, out of line, cost
  // recording under control flow 3%), until the list of candidates is asked
  // for (unlist).
  // (Only running a plan computes nodes, after its round: a node recorded
  // since the last round is not computed before the next.)
  template <size_t N>
  [[gnu::always_inline]] void add_recorded(const NodeStore& s, NodeId n, std::span<const NodeId, N> args) {
    RecordedRound& r = recorded_;
    const uint32_t m = r.size;
    if (!plain_) {
      if (m >= r.node.size()) grow_recorded(0, 0);
      r.node[m] = n;
      r.size = m + 1;
      return;
    }
    const uint32_t at = n - start_;
    uint32_t listed = r.arg_begin[m];
    // (m <= at, and the candidates' columns have more room than local_: one
    // check covers both.)
    if (at >= local_.size() || listed + args.size() > r.args.size()) grow_recorded(at, args.size());
    // Nodes appended without a candidate have no local id: placeholders (and
    // parameters, computed). A call's result has its call's (add_result).
    while (filled_ < at) local_[filled_++] = kNone32;
    uint32_t d = 0;
    for (NodeId a : args) {
      if (s.has(a, NodeStore::kComputed)) continue;
      // (Unsigned: a node from before start_ is far past filled_.)
      const uint32_t i = a - start_;
      const uint32_t la = i < filled_ ? local_[i] : kNone32;
      if (la == kNone32) {
        add(n);
        return;
      }
      r.args[listed++] = la;
      d = std::max(d, r.depth[la] + 1);
    }
    local_[at] = m;
    filled_ = at + 1;
    r.node[m] = n;
    r.depth[m] = d;
    r.arg_begin[m + 1] = listed;
    r.size = m + 1;
  }
  // A call's further result (recorded right after it, not a candidate): what
  // reads it reads the call's batch.
  void add_result(NodeId result, NodeId call) {
    if (!plain_) return;
    const uint32_t at = result - start_;
    if (call < start_ || filled_ != at) return unlist();
    if (at >= local_.size()) grow_recorded(at, 0);
    local_[at] = local_[call - start_];
    filled_ = at + 1;
  }
  // Takes back the last candidate, just recorded (a parameter: computed, no launch).
  void drop_last() {
    SHEAF_ASSERT(recorded_.size > 0 || !candidates_.empty(), "no candidate to take back");
    if (recorded_.size == 0) return candidates_.pop_back();  // (add_recorded's add)
    --recorded_.size;  // (no arguments: the args list is unchanged)
    if (plain_) local_[--filled_] = kNone32;
  }
  // The local ids recording gave (by node id from `first`, `listed` of
  // them; kNone32: no candidate), swapped into `into` for the round taken
  // as recorded (scheduler/round.cpp), which reads them as its marks; the
  // queue keeps `into`'s buffer for the next round's (restart follows).
  void take_local(Column<uint32_t>& into, NodeId& first, uint32_t& listed) {
    local_.swap(into);
    first = start_;
    listed = filled_;
    filled_ = 0;
  }
  // Whether the candidates are the next round as recorded() lists it.
  bool plain() const { return plain_ && waiting_ == 0 && live_deferred_ == 0; }
  RecordedRound& recorded() { return recorded_; }
  // A round took the candidates: what is recorded from here on (node ids
  // from `size` on) makes the next. Without `list`, it is not listed as a
  // round (while control flow waits, rounds are built the general way: the
  // lists would cost recording without use).
  void restart(size_t size, bool list = true) {
    if (recorded_.size > 0) unlist();  // (a round takes them all: none)
    start_ = static_cast<NodeId>(size);
    plain_ = list && candidates_.empty();
    filled_ = 0;
    // (The columns may be a round's, swapped in: add_recorded's one capacity
    // check covers node, depth and arg_begin while they keep these sizes,
    // more than local_'s.)
    RecordedRound& r = recorded_;
    r.node.resize(r.depth.size());
    r.arg_begin.resize(r.depth.size() + 1);
    r.arg_begin[0] = 0;
    local_.resize(std::min(local_.size(), r.depth.empty() ? 0 : r.depth.size() - 1));
  }
  // Builds the next round the general way (tests compare the two).
  void forget_recorded() {
    if (plain_) unlist();
  }

  // n waits until `on` is ready. (In line: its two callers, both in the
  // general round's loop, called it out of line once another function of
  // the queue was added, 1.5% of a gated net's scheduling instructions.)
  [[gnu::always_inline]] void park(NodeId n, NodeId on) {
    cover(head_, on, kNone32);
    node_.push_back(n);
    next_.push_back(head_[on]);
    head_[on] = static_cast<uint32_t>(node_.size() - 1);
    ++waiting_;
  }
  // `on` is ready: its waiters go to `into` (and wait no longer).
  void wake(NodeId on, NodeList& into) {
    if (on >= head_.size()) return;
    for (uint32_t e = head_[on]; e != kNone32; e = next_[e]) {
      into.push_back(node_[e]);
      --waiting_;
    }
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
    if (plain_) unlist();
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
    waiting_ = 0;
    recorded_.size = 0;
    restart(0);
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
  // Parked nodes not woken yet. (One parked on a node that never runs, a
  // failed one, keeps rounds built the general way until clear(): a cost
  // in time only.)
  size_t waiting_ = 0;
  // The recorded round: whether it holds, the first node id it covers, and
  // per node id from there its candidate index (kNone32: none).
  bool plain_ = true;
  NodeId start_ = 0;
  Column<uint32_t> local_;  // (sized as capacity: filled_ valid)
  uint32_t filled_ = 0;
  RecordedRound recorded_{0, {}, Column<uint32_t>(1, 0), {}, {}};
  // Room for node id `at` and one more candidate with `args` arguments (out
  // of line: a round's columns grow a few times, then hold). Not plain: for
  // one more candidate only.
  // local_ grows last: add_recorded's one check trusts the others to be
  // longer, and a throw (out of memory) midway must leave them so.
  [[gnu::noinline]] void grow_recorded(uint32_t at, size_t args) {
    RecordedRound& r = recorded_;
    if (!plain_) return room(r.node, size_t{r.size} + 1);
    room(r.args, r.arg_begin[r.size] + args);
    const size_t local = std::max(local_.size(), room_size(local_, size_t{at} + 1));
    if (local + 1 > r.depth.size()) {  // (node and arg_begin keep their sizes: restart)
      room(r.depth, local + 1);
      r.node.resize(r.depth.size());
      r.arg_begin.resize(r.depth.size() + 1);
    }
    local_.resize(local);
  }
  // Makes c at least `need` long: to its capacity, or twice its length (no
  // allocation once both sets of the round's columns, swapped in turn, have grown).
  template <class T>
  static size_t room_size(const Column<T>& c, size_t need) {
    return need <= c.size() ? c.size() : need <= c.capacity() ? c.capacity() : std::max(2 * c.size(), need + 64);
  }
  template <class T>
  static void room(Column<T>& c, size_t need) {
    c.resize(room_size(c, need));
  }
  // The recorded candidates go to the list of candidates, and the round
  // will be built the general way.
  [[gnu::noinline]] void unlist() {
    candidates_.insert(candidates_.end(), recorded_.node.begin(), recorded_.node.begin() + recorded_.size);
    recorded_.size = 0;
    plain_ = false;
  }
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
