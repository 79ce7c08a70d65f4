// One round of scheduling: the recorded nodes that can run now (every argument is
// computed or runs in this round), as a small DAG over local ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include <sheaf/core/column.h>
#include <sheaf/tracer/node_store.h>
#include <sheaf/tracer/ready.h>

namespace sheaf {

// Columns where every entry is written after a resize (no zero-fill as they
// grow, round after round).
struct RoundDag {
  Column<NodeId> node;           // local id -> graph node, in a topological order (kNoNode: a region)
  std::vector<uint32_t> region;  // with fusion: local id -> fused region (scheduler/fusion.h), else kNone32
  Column<SigId> sig;             // kNoSig: runs alone (a shared value)
  Column<uint32_t> arg_begin;    // CSR: in-round arguments (local ids)
  Column<uint32_t> args;
  std::vector<uint32_t> use_begin;  // CSR: in-round consumers (local ids)
  Column<uint32_t> uses;
  Column<uint32_t> depth;        // longest path from the round's inputs, 0-based
  uint32_t max_depth = 0;
  // Which graph nodes are in the round, with which local id (a call's
  // further results: their call's): in_round(n), local(n). A round built
  // the general way marks them (stamp, local_of); a round taken as recorded
  // has them from the queue (ReadyQueue::take_local), by node id from its first
  // node: nothing written per node to mark it.
  bool in_round(NodeId n) const {
    if (!recorded) return stamp[n] == round;
    const uint32_t i = n - first;  // (unsigned: a node before the round is far past `listed`)
    return i < listed && recorded_local[i] != kNone32;
  }
  uint32_t local(NodeId n) const { return recorded ? recorded_local[n - first] : local_of[n]; }
  // Scratch reused between rounds (a graph keeps its RoundDag: no reallocation per round).
  // stamp[n] == round: n was found ready this round (and local_of[n] is valid).
  // A stamp, not a flag: no reset of the whole graph's marks per round
  // (control flow runs many small rounds over a large graph).
  std::vector<uint32_t> stamp;
  uint32_t round = 0;
  Column<uint32_t> local_of;  // graph node -> local id: valid where stamp[n] == round (unwritten elsewhere)
  // A round taken as recorded: local ids by node id from `first` (`listed` of
  // them valid; kNone32: not in the round), the queue's own (ReadyQueue::take_local).
  bool recorded = false;
  NodeId first = 0;
  uint32_t listed = 0;
  Column<uint32_t> recorded_local;
  NodeList undecided;  // the round's work list
  std::vector<NodeId> stack;      // scratch: the walk from awaited nodes
  std::vector<uint64_t> bits;     // scratch: sorting the work list (a bit per node)
  size_t size() const { return node.size(); }
  // Signatures are dense ids: a table indexed by signature needs this many
  // entries. Found once a round (a strategy and its merge each ask), or
  // while the round is taken (build_round).
  uint32_t num_sigs() const {
    static_assert(kNoSig + 1 == 0, "kNoSig + 1 must wrap to 0: it counts for no signature");
    if (!sigs_known) {
      uint32_t m = 0;
      for (SigId s : sig) m = std::max(m, s + 1);  // (branch-free: the loop vectorizes)
      sigs_end = m;
      sigs_known = true;
    }
    return sigs_end;
  }
  mutable uint32_t sigs_end = 0;
  mutable bool sigs_known = false;  // whoever rewrites `sig` clears it
  std::span<const uint32_t> args_of(uint32_t i) const { return {args.data() + arg_begin[i], args.data() + arg_begin[i + 1]}; }
  std::span<const uint32_t> uses_of(uint32_t i) const { return {uses.data() + use_begin[i], uses.data() + use_begin[i + 1]}; }
};

// The nodes that can run now, as a DAG, from the queue's candidates (the rest
// park in the queue until what they wait for is ready; a round's work follows
// what changed). Resolved placeholders whose value is ready go to `aliases`:
// they need no launch. `visits` counts the nodes looked at. `dag` is
// overwritten; its buffers are reused. With `awaited`, a node from
// awaited->defer_from on that none of awaited->nodes needs is deferred in the
// queue (tracer/ready.h); without, every deferred node is looked at again.
struct Awaited {
  std::span<const NodeId> nodes;  // what control flow waits for
  // Nodes recorded before control flow started (below this) are never
  // deferred: known up front, they batch best in the first round (a
  // sentence's word vectors, an encoder).
  NodeId defer_from = 0;
};
void build_round(const NodeStore& store, ReadyQueue& queue, std::vector<NodeId>& aliases, RoundDag& dag,
                 uint64_t& visits, const Awaited* awaited = nullptr);

// Sorts node ids (each below `size`) and drops repeats: a round's work list,
// which control flow hands over in callback order. Linear in the ids plus
// size / 64 where that beats a comparison sort; `bits` is scratch.
void sort_unique(NodeList& ids, size_t size, std::vector<uint64_t>& bits);

// A DAG built by hand (tests, tools): nodes 0..n-1 with the given signatures and
// in-round arguments (each argument's id below its user's).
void build_dag(std::span<const SigId> sigs, std::span<const std::vector<uint32_t>> args, RoundDag& dag);

// Depths, max_depth and the lists of uses, from the entries' argument lists
// (which must be in a topological order); or only the uses.
void link_dag(RoundDag& dag);
void link_uses(RoundDag& dag);

}  // namespace sheaf
