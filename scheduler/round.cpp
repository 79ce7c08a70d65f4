#include "round.h"

#include <algorithm>

namespace sheaf {

namespace {

constexpr uint8_t kUndecided = 0, kReady = 1, kBlocked = 2;

// Starts a round's marks: stamps from earlier rounds become stale.
uint32_t next_round(const NodeStore& s, RoundDag& dag) {
  dag.mark.resize(s.size());
  dag.local_of.resize(s.size());
  if (dag.stamp.size() < s.size()) dag.stamp.resize(s.size(), 0);
  if (++dag.round == 0) {  // wrapped around: forget every old stamp
    std::fill(dag.stamp.begin(), dag.stamp.end(), 0);
    dag.round = 1;
  }
  return dag.round;
}

// What can run now. Passes in index order mark what is ready; only resolved
// placeholders point forward (to their branch), so a few passes reach the
// fixpoint. The marking order is a topological order: dag.node gets it, and
// each node's in-round arguments and depth as it is marked.
void mark_runnable(const NodeStore& s, std::vector<NodeId>& pending, std::vector<NodeId>& aliases, RoundDag& dag) {
  const uint32_t round = next_round(s, dag);
  dag.node.clear();
  dag.sig.clear();
  dag.depth.clear();
  dag.arg_begin.assign(1, 0);
  dag.args.clear();
  dag.max_depth = 0;
  auto status = [&](NodeId a) -> uint8_t {
    const NodeId r = s.resolve(a);
    if (s.has(r, NodeStore::kComputed)) return kReady;
    return dag.stamp[r] == round ? dag.mark[r] : kUndecided;
  };
  auto& undecided = dag.undecided;
  undecided.clear();
  undecided.swap(pending);
  for (bool progress = true; progress && !undecided.empty();) {
    progress = false;
    size_t keep = 0;
    for (NodeId n : undecided) {
      uint8_t st = kReady;
      if (s.has(n, NodeStore::kPlaceholder)) {
        st = s.alias[n] == kNoNode ? kBlocked : status(n);
      } else if (s.shape[n] == kUnknownShape || s.has(n, NodeStore::kFailed)) {
        st = kBlocked;
      } else {
        for (NodeId a : s.args_of(n)) {
          const uint8_t sa = status(a);
          if (sa == kBlocked) {
            st = kBlocked;
            break;
          }
          if (sa == kUndecided) st = kUndecided;
        }
      }
      if (st == kUndecided) {
        undecided[keep++] = n;
        continue;
      }
      progress = true;
      dag.mark[n] = st;
      dag.stamp[n] = round;
      if (st == kBlocked) {
        pending.push_back(n);
      } else if (s.has(n, NodeStore::kPlaceholder)) {
        aliases.push_back(n);
      } else {
        dag.local_of[n] = static_cast<uint32_t>(dag.node.size());
        dag.node.push_back(n);
        dag.sig.push_back(s.sig[n]);
        uint32_t d = 0;
        for (NodeId a : s.args_of(n)) {
          const NodeId r = s.resolve(a);
          if (s.has(r, NodeStore::kComputed)) continue;
          const uint32_t la = dag.local_of[r];
          dag.args.push_back(la);
          d = std::max(d, dag.depth[la] + 1);
        }
        dag.depth.push_back(d);
        dag.max_depth = std::max(dag.max_depth, d);
        dag.arg_begin.push_back(static_cast<uint32_t>(dag.args.size()));
      }
    }
    undecided.resize(keep);
  }
  // Whatever is still undecided waits on a cycle through placeholders: impossible
  // unless a branch returned its own placeholder; keep it pending (it never runs).
  pending.insert(pending.end(), undecided.begin(), undecided.end());
  std::sort(pending.begin(), pending.end());
}

}  // namespace

// The CSR lists of uses from those of arguments.
void link_uses(RoundDag& dag) {
  const size_t m = dag.size();
  dag.use_begin.assign(m + 1, 0);
  for (uint32_t la : dag.args) ++dag.use_begin[la + 1];
  for (size_t i = 0; i < m; ++i) dag.use_begin[i + 1] += dag.use_begin[i];
  dag.uses.resize(dag.args.size());
  dag.fill.assign(dag.use_begin.begin(), dag.use_begin.end() - 1);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t la : dag.args_of(i)) dag.uses[dag.fill[la]++] = i;
}

// Depths from arguments, then the lists of uses.
void link_dag(RoundDag& dag) {
  const size_t m = dag.size();
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

void build_round(const NodeStore& s, std::vector<NodeId>& pending, std::vector<NodeId>& aliases, RoundDag& dag) {
  mark_runnable(s, pending, aliases, dag);
  dag.region.assign(dag.size(), kNone32);
  link_uses(dag);
}

void build_dag(std::span<const SigId> sigs, std::span<const std::vector<uint32_t>> args, RoundDag& dag) {
  const size_t m = sigs.size();
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
