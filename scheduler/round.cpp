#include "round.h"

#include <algorithm>
#include <functional>
#include <utility>

#include <sheaf/core/error.h>
#include <sheaf/ops/op_list.h>

namespace sheaf {

namespace {

// Starts a round's marks: stamps from earlier rounds become stale.
uint32_t next_round(const NodeStore& s, RoundDag& dag) {
  dag.local_of.resize(s.size());
  if (dag.stamp.size() < s.size()) dag.stamp.resize(s.size(), 0);
  if (++dag.round == 0) {  // wrapped around: forget every old stamp
    std::fill(dag.stamp.begin(), dag.stamp.end(), 0);
    dag.round = 1;
  }
  return dag.round;
}

// Marks what the awaited nodes need: themselves and, through arguments and
// resolved placeholders, every node they depend on that is not computed yet.
// A node is marked once (needed stays needed), so rounds walk only what is new.
// Deferred nodes found needed go to `work`.
void need_from(const NodeStore& s, ReadyQueue& q, std::span<const NodeId> awaited, std::vector<NodeId>& stack,
               NodeList& work) {
  stack.assign(awaited.begin(), awaited.end());
  while (!stack.empty()) {
    const NodeId n = stack.back();
    stack.pop_back();
    if (s.has(n, NodeStore::kComputed) || !q.need(n, work)) continue;
    if (s.has(n, NodeStore::kPlaceholder)) {
      // Unresolved: its branch is not recorded yet; mark_runnable walks on from
      // the node it resolves to.
      if (s.alias[n] != kNoNode) stack.push_back(s.alias[n]);
      continue;
    }
    // (A computed argument, a parameter, needs nothing: not pushed to be popped and skipped.)
    for (NodeId a : s.args_of(n))
      if (!s.has(a, NodeStore::kComputed)) stack.push_back(a);
  }
}

// What can run now, looking only at the queue's candidates (new nodes and nodes
// woken since the last round), in index order: arguments come first, so one
// pass decides them. A node that cannot run parks on the node that stops it; a
// node found ready wakes its waiters into this same pass (they come after it,
// so the order stays topological: dag.node gets it, with each node's in-round
// arguments and depth). An unresolved placeholder, a node whose shape waits on
// a cond, and a failed node are dropped: resolving, inferring the shape, and
// nothing, respectively, bring them back. With `awaited`, a node that could
// run but that no awaited node needs is deferred instead (if recorded from
// awaited->defer_from on).
void mark_runnable(const NodeStore& s, ReadyQueue& q, std::vector<NodeId>& aliases, RoundDag& dag, uint64_t& visits,
                   const Awaited* awaited) {
  const uint32_t round = next_round(s, dag);
  dag.recorded = false;
  // Kept in a local until the end: as a member, every store to the round's
  // columns might change it, and it was reloaded and stored each node.
  uint32_t max_depth = 0;
  auto& work = dag.undecided;
  work.clear();
  if (awaited) {
    need_from(s, q, awaited->nodes, dag.stack, q.candidates());
  } else {
    q.release_deferred();
  }
  work.swap(q.candidates());
  sort_unique(work, s.size(), dag.bits);
  // The round's entries are written by count, not pushed (a capacity check per
  // array per node was a tenth of the round's instructions): sized for the
  // work list, grown if woken nodes outnumber it, cut to the count at the end.
  uint32_t m = 0;
  size_t listed = 0;  // arguments written
  auto make_room = [&](size_t entries) {
    dag.node.resize(entries);
    dag.sig.resize(entries);
    dag.depth.resize(entries);
    dag.arg_begin.resize(entries + 1);
  };
  make_room(work.size());
  dag.arg_begin[0] = 0;
  auto ready = [&](NodeId r) { return s.has(r, NodeStore::kComputed) || dag.stamp[r] == round; };
  for (size_t i = 0; i < work.size(); ++i) {
    const NodeId n = work[i];
    if (s.has(n, NodeStore::kComputed) || dag.stamp[n] == round) continue;  // done, or seen this round
    NodeId blocker = kNoNode;
    if (s.has(n, NodeStore::kPlaceholder)) {
      if (s.alias[n] == kNoNode) continue;  // Trace::resolve brings it back
      const NodeId r = s.resolve(n);
      if (!ready(r)) {
        q.park(n, r);
        // Needed before it resolved: what it became is needed now.
        if (awaited && q.needed(n)) {
          const NodeId target[] = {r};
          need_from(s, q, target, dag.stack, work);
        }
        continue;
      }
      dag.stamp[n] = round;
      aliases.push_back(n);
      q.wake(n, work);
      continue;
    }
    if (s.shape[n] == kUnknownShape || s.has(n, NodeStore::kFailed))
      continue;  // its shape's inference brings it back; a failed node never runs
    // One pass over the arguments decides readiness and lists the in-round
    // ones (after `listed`: kept only if none blocks).
    const std::span<const NodeId> node_args = s.args_of(n);
    if (listed + node_args.size() > dag.args.size())
      dag.args.resize(std::max(2 * dag.args.size(), listed + node_args.size()));
    size_t w = listed;
    uint32_t d = 0;
    for (NodeId a : node_args) {
      const NodeId r = s.resolve(a);
      if (s.has(r, NodeStore::kComputed)) continue;
      if (dag.stamp[r] != round) {
        blocker = r;
        break;
      }
      const uint32_t la = dag.local_of[r];
      dag.args[w++] = la;
      d = std::max(d, dag.depth[la] + 1);
    }
    if (blocker != kNoNode) {
      q.park(n, blocker);
      continue;
    }
    // A call's further result gets here only as a failed run's node put back
    // (engine.cpp): its call, placed, stamps it, before or (parked on the
    // call) instead of this visit. It never gets a batch of its own.
    SHEAF_ASSERT(s.op[n] != code_of<op::CallResult>, "a call's result ", n, " reached a round without its call");
    if (awaited && n >= awaited->defer_from && !q.needed(n)) {
      if (!q.deferred(n)) q.defer(n);
      continue;  // nodes that read it park on it
    }
    if (m == dag.node.size()) make_room(2 * size_t{m} + 16);
    dag.stamp[n] = round;
    dag.local_of[n] = m;
    dag.node[m] = n;
    dag.sig[m] = s.sig[n];
    dag.depth[m] = d;
    max_depth = std::max(max_depth, d);
    listed = w;
    dag.arg_begin[++m] = static_cast<uint32_t>(listed);
    q.wake(n, work);
    if (s.op[n] == code_of<op::Call>) {
      // Its further results (nodes n + 1 .. n + K - 1, not candidates when
      // recorded: Trace::call_result) are computed by its batch: each is the
      // call's entry for whatever reads it (the planner places their rows).
      // Found by their op, next to the call's: the count in the call's
      // attributes was a cache miss a call, a seventh of this loop's time.
      const NodeId end = static_cast<NodeId>(s.size());
      for (NodeId r = n + 1; r < end && s.op[r] == code_of<op::CallResult>; ++r) {
        SHEAF_ASSERT(s.args_of(r)[0] == n, "call result ", r, " does not follow its call ", n);
        dag.stamp[r] = round;
        dag.local_of[r] = dag.local_of[n];
        q.wake(r, work);
      }
    }
  }
  // Cut to what was written. (Not on an exception: a throw here is an
  // internal error that also loses the queue's work list, so the round is
  // not usable either way; a try block cost 0.7% of scheduling.)
  dag.node.resize(m);
  dag.sig.resize(m);
  dag.depth.resize(m);
  dag.arg_begin.resize(m + 1);
  dag.args.resize(listed);
  dag.max_depth = max_depth;
  visits += work.size();  // every entry of the work list, woken ones too, was looked at once
}

// The round recording listed (ReadyQueue::plain): every candidate, in
// recording order, with the in-round arguments and depths found as each was
// recorded (the columns are swapped in, not copied; the queue's list of
// candidates is empty: ReadyQueue::plain). The round's marks, which fusion
// reads, are the queue's local ids too (a call's further results have their
// call's: ReadyQueue::add_result), swapped in as they are: RoundDag::in_round
// and local read them by node id, where marking each node (and reading each
// call's result count from its attributes, a cache miss a call) cost a
// fifth of the round.
void take_recorded(const NodeStore& s, ReadyQueue& q, RoundDag& dag, uint64_t& visits) {
  RecordedRound& r = q.recorded();
  const uint32_t m = std::exchange(r.size, 0);
  r.node.resize(m);
  r.arg_begin.resize(m + 1);
  r.args.resize(r.arg_begin[m]);
  r.depth.resize(m);
  dag.node.swap(r.node);
  dag.arg_begin.swap(r.arg_begin);
  dag.args.swap(r.args);
  dag.depth.swap(r.depth);
  q.take_local(dag.recorded_local, dag.first, dag.listed);
  dag.recorded = true;
  dag.sig.resize(m);
  uint32_t max_depth = 0, sigs_end = 0;
  for (uint32_t i = 0; i < m; ++i) {
    max_depth = std::max(max_depth, dag.depth[i]);
    dag.sig[i] = s.sig[dag.node[i]];
    sigs_end = std::max(sigs_end, dag.sig[i] + 1);  // (num_sigs: kNoSig + 1 is 0)
  }
  dag.max_depth = max_depth;
  dag.sigs_end = sigs_end;
  dag.sigs_known = true;
  visits += m;
}

}  // namespace

// A bit per node and a scan of the words, where that costs less than a comparison sort.
void sort_unique(NodeList& v, size_t size, std::vector<uint64_t>& bits) {
  const size_t words = (size + 63) / 64;
  // Strictly ascending (a round of nodes recorded in order): nothing to do.
  if (std::adjacent_find(v.begin(), v.end(), std::greater_equal<>()) == v.end()) return;
  const bool sorted = std::is_sorted(v.begin(), v.end());
  if (sorted || v.size() < 64 || v.size() * 8 < words) {  // few: a comparison sort costs less than the scan
    if (!sorted) std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return;
  }
  bits.assign(words, 0);
  for (NodeId n : v) bits[n >> 6] |= uint64_t{1} << (n & 63);
  v.clear();
  for (size_t w = 0; w < words; ++w)
    for (uint64_t b = bits[w]; b != 0; b &= b - 1)
      v.push_back(static_cast<NodeId>(w * 64 + static_cast<size_t>(__builtin_ctzll(b))));
}

// The CSR lists of uses from those of arguments. Entry la's count goes to
// use_begin[la + 2], so that after the sums use_begin[la + 1] is where its
// uses begin: the scatter advances it to where they end, which is where
// la + 1's begin. No copy of the starts to fill from (a pass per round).
void link_uses(RoundDag& dag) {
  const size_t m = dag.size();
  dag.use_begin.assign(m + 2, 0);
  for (uint32_t la : dag.args) ++dag.use_begin[la + 2];
  for (size_t i = 1; i < m; ++i) dag.use_begin[i + 1] += dag.use_begin[i];
  dag.uses.resize(dag.args.size());
  uint32_t* const next = dag.use_begin.data() + 1;
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t la : dag.args_of(i)) dag.uses[next[la]++] = i;
  dag.use_begin.resize(m + 1);
}

// Depths from arguments, then the lists of uses.
void link_dag(RoundDag& dag) {
  const size_t m = dag.size();
  dag.sigs_known = false;
  dag.depth.assign(m, 0);
  dag.max_depth = 0;
  for (uint32_t i = 0; i < m; ++i) {
    uint32_t d = 0;
    for (uint32_t a : dag.args_of(i)) d = std::max(d, dag.depth[a] + 1);
    dag.depth[i] = d;
    dag.max_depth = std::max(dag.max_depth, d);
  }
  link_uses(dag);
}

void build_round(const NodeStore& s, ReadyQueue& queue, std::vector<NodeId>& aliases, RoundDag& dag,
                 uint64_t& visits, const Awaited* awaited) {
  dag.sigs_known = false;  // (take_recorded finds them)
  if (awaited == nullptr && queue.plain()) take_recorded(s, queue, dag, visits);
  else mark_runnable(s, queue, aliases, dag, visits, awaited);
  // (Rounds that follow one built for awaited values are most often built
  // for awaited values too: what is recorded meanwhile is not listed.)
  queue.restart(s.size(), awaited == nullptr);
  dag.region.assign(dag.size(), kNone32);
  link_uses(dag);
}

void build_dag(std::span<const SigId> sigs, std::span<const std::vector<uint32_t>> args, RoundDag& dag) {
  const size_t m = sigs.size();
  dag.recorded = false;  // (no marks: a DAG by hand has no graph nodes to mark)
  dag.node.resize(m);
  dag.region.assign(m, kNone32);
  dag.sig.assign(sigs.begin(), sigs.end());
  dag.arg_begin.assign(1, 0);
  dag.args.clear();
  for (uint32_t i = 0; i < m; ++i) {
    dag.node[i] = i;
    dag.args.insert(dag.args.end(), args[i].begin(), args[i].end());
    dag.arg_begin.push_back(static_cast<uint32_t>(dag.args.size()));
  }
  link_dag(dag);
}

}  // namespace sheaf
