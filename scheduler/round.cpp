#include "round.h"

#include <algorithm>

#include "../dsl/op.h"

namespace sheaf {

uint32_t signature(NodeStore& s, NodeId n) {
  const OpTraits& traits = op_info(s.op[n]).traits;
  std::vector<int64_t>& key = s.key_scratch;
  key.clear();
  auto args = s.args_of(n);
  auto attrs = s.attrs_of(n);
  key.push_back(s.op[n]);
  key.push_back(s.shape[n]);
  key.push_back(traits.segmented ? -1 : static_cast<int64_t>(args.size()));
  key.insert(key.end(), attrs.begin(), attrs.end());
  for (size_t i = 0; i < args.size(); ++i) {
    // A shared input batches only with the same shared input (the same weight);
    // a per-example input with any input of the same shape. The elements of a
    // segmented list all have one shape (checked when recorded): count it once.
    NodeId r = s.resolve(args[i]);
    if (s.has(r, NodeStore::kShared))
      key.push_back((int64_t{1} << 40) | r);
    else if (!traits.segmented || i == 0)
      key.push_back(s.shape[args[i]]);
  }
  return s.sigs.intern(key);
}

namespace {
constexpr uint8_t kUndecided = 0, kReady = 1, kBlocked = 2;
}

void build_round(const NodeStore& s, std::vector<NodeId>& pending, std::vector<NodeId>& aliases, RoundDag& dag) {
  auto& mark = dag.mark;
  auto& local_of = dag.local_of;
  mark.resize(s.size());
  local_of.resize(s.size());
  if (dag.stamp.size() < s.size()) dag.stamp.resize(s.size(), 0);
  if (++dag.round == 0) {  // wrapped around: forget every old stamp
    std::fill(dag.stamp.begin(), dag.stamp.end(), 0);
    dag.round = 1;
  }
  const uint32_t round = dag.round;
  dag.node.clear();
  dag.args.clear();
  dag.max_depth = 0;
  auto status = [&](NodeId a) -> uint8_t {
    NodeId r = s.resolve(a);
    if (s.has(r, NodeStore::kComputed)) return kReady;
    return dag.stamp[r] == round ? mark[r] : kUndecided;
  };
  // Passes in index order mark what can run; only resolved placeholders point
  // forward (to their branch), so a few passes reach the fixpoint. The marking
  // order is a topological order.
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
      } else if (s.shape[n] == kUnknownShape) {
        st = kBlocked;
      } else {
        for (NodeId a : s.args_of(n)) {
          uint8_t sa = status(a);
          if (sa == kBlocked) { st = kBlocked; break; }
          if (sa == kUndecided) st = kUndecided;
        }
      }
      if (st == kUndecided) {
        undecided[keep++] = n;
        continue;
      }
      progress = true;
      mark[n] = st;
      dag.stamp[n] = round;
      if (st == kBlocked) {
        pending.push_back(n);
      } else if (s.has(n, NodeStore::kPlaceholder)) {
        aliases.push_back(n);
      } else {
        local_of[n] = static_cast<uint32_t>(dag.node.size());
        dag.node.push_back(n);
      }
    }
    undecided.resize(keep);
  }
  // Whatever is still undecided waits on a cycle through placeholders: impossible
  // unless a branch returned its own placeholder; keep it pending (it never runs).
  pending.insert(pending.end(), undecided.begin(), undecided.end());
  std::sort(pending.begin(), pending.end());

  const size_t m = dag.node.size();
  dag.sig.resize(m);
  dag.depth.assign(m, 0);
  dag.arg_begin.assign(1, 0);
  dag.use_begin.assign(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    NodeId n = dag.node[i];
    dag.sig[i] = s.sig[n];
    uint32_t d = 0;
    for (NodeId a : s.args_of(n)) {
      NodeId r = s.resolve(a);
      if (s.has(r, NodeStore::kComputed)) continue;
      uint32_t la = local_of[r];
      dag.args.push_back(la);
      ++dag.use_begin[la + 1];
      d = std::max(d, dag.depth[la] + 1);
    }
    dag.depth[i] = d;
    dag.max_depth = std::max(dag.max_depth, d);
    dag.arg_begin.push_back(static_cast<uint32_t>(dag.args.size()));
  }
  for (size_t i = 0; i < m; ++i) dag.use_begin[i + 1] += dag.use_begin[i];
  dag.uses.resize(dag.args.size());
  auto& fill = dag.local_of;  // free again: reuse it as the fill cursor per node
  fill.assign(dag.use_begin.begin(), dag.use_begin.end() - 1);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t la : dag.args_of(i)) dag.uses[fill[la]++] = i;
}

}  // namespace sheaf
