// Elementwise fusion: connected elementwise work of one example becomes one
// node of the round (a region), and regions of equal pattern across examples
// become one batch: ONE kernel launch forward and ONE autograd node backward
// (backend/fused.h), instead of one launch and one node per op.
//
// Fusible nodes: per-example nodes whose op has a Pointwise form (ops/op.h), and
// slices whose per-example result is contiguous (a cut along the first axis of
// size > 1): a slice is only an offset into its input's rows. A region is a set
// of fusible nodes of one shape connected by their arguments, with equal
// "non-fusible depth" (the most non-fusible ops on a path from the round's
// inputs): two nodes on a path through a non-fusible op (a GEMM, a reduction, a
// gather) have different depths, so every region can run as one step and
// contracting it keeps the round acyclic. Nothing is pattern-matched: any
// program's elementwise glue fuses (LSTM, GRU, Tree-LSTM cells, user cells).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <sheaf/tracer/node_store.h>

#include "round.h"

namespace sheaf {

// One step of a fused program: member k of the region computes register
// `inputs + k` from registers a and b (b unused by unary ops). A slice only
// names elements [offset, offset + numel) of its operand's row: no work.
struct FusedInstr {
  OpCode op = 0;
  uint32_t a = 0, b = 0;
  int64_t attr = 0;     // the op's scalar attribute (a double, bit for bit: attr_to_double)
  int64_t offset = 0;   // slices: first element in the operand's per-example value
  bool slice = false;
};

// What runs for a region pattern, the same for every batch of it. Registers
// 0..inputs-1 are the region's external inputs (per row: input_numel[i]
// elements; broadcast over the row when 1 and numel > 1; over rows when
// shared); register inputs + k holds member k's row of `numel` elements.
struct FusedProgram {
  uint32_t inputs = 0;
  std::vector<int64_t> input_numel;
  std::vector<uint8_t> input_shared;
  std::vector<FusedInstr> code;
  int64_t numel = 0;
  Shape shape;  // every member's per-example shape (numel elements)
  uint64_t hash = 0;          // of `key`: names the program in kernel caches
  std::vector<int64_t> key;   // what determines the program (the same in every graph, across clears)
  // Per instruction: a later round read this member of a batch that did not
  // keep it (control flow records its readers after the round ran), so it had
  // to be recomputed. Learned per pattern; batches planned from then on keep it.
  mutable std::vector<uint8_t> read_later;
  std::string str() const;  // "fused{tanh(i0), sigmoid(i1), mul(r2, r3)}"
};

// A region of the current round: its members (graph nodes in program order)
// and its external inputs (graph nodes, per-example or shared).
struct Region {
  uint32_t members_begin = 0, members_len = 0;
  uint32_t inputs_begin = 0, inputs_len = 0;
  std::shared_ptr<const FusedProgram> program;
  // Every member computes row by row (NodeStore::kRowwise): regions of any
  // length share a pattern, and the program runs over rows (its shape is one
  // row's); a batch of them is packed (scheduler/plan.h).
  bool packed = false;
};

class Fuser {
 public:
  Fuser();
  // On the CPU, a region may also be one node of an op worth a kernel alone
  // (PointwiseInfo::alone_on_cpu: LibTorch's CPU loop for it is several times
  // slower than the fused kernel's). Set by the graph from its device.
  void fuse_lone_ops(bool on) { lone_ = on; }
  // Finds the round's regions (two or more fusible nodes, or one as above) and rewrites `dag` so
  // that each is one entry: dag.node[i] = kNoNode, dag.region[i] = its index,
  // dag.sig[i] = the pattern's signature. Other entries keep their node (and
  // dag.region[i] = kNone32). Strategies and the planner then see regions as
  // nodes. Programs of patterns are kept across rounds and clears.
  void fuse(NodeStore& store, RoundDag& dag);

  const Region& region(uint32_t r) const { return regions_[r]; }
  std::span<const NodeId> members(const Region& r) const { return {members_.data() + r.members_begin, r.members_len}; }
  std::span<const NodeId> inputs(const Region& r) const { return {inputs_.data() + r.inputs_begin, r.inputs_len}; }
  // Per member: read outside its region in this round, or by nothing in it (a
  // target, or read later): its value must leave the kernel.
  std::span<const uint8_t> escapes(const Region& r) const { return {escapes_.data() + r.members_begin, r.members_len}; }
  size_t num_regions() const { return regions_.size(); }
  size_t num_programs() const { return programs_.size(); }

 private:
  bool fusible(const NodeStore& s, NodeId n) const;
  uint32_t find(uint32_t i);
  void collect_regions(const NodeStore& s, const RoundDag& dag);
  void collect_members(const NodeStore& s, const RoundDag& dag);  // collect_regions' second half: regions from the sets
  void find_inputs(const NodeStore& s, const RoundDag& dag, uint32_t region);
  std::shared_ptr<const FusedProgram> program_for(NodeStore& s, const RoundDag& dag, uint32_t region, SigId& sig);
  std::shared_ptr<const FusedProgram> build_program(const NodeStore& s, const Region& region, const Shape& shape,
                                                    uint64_t hash);
  int64_t input_numel(const NodeStore& s, const Region& region, NodeId in) const;
  void contract(RoundDag& dag);
  void contract_kahn(RoundDag& dag);
  void swap_in(RoundDag& dag);

  // Per round (reused: no allocation per round once warm).
  std::vector<uint8_t> fusible_;
  struct Local {
    uint32_t nd;     // non-fusible depth: regions never span a non-fusible node
    ShapeId shape;
    bool fusible;
    bool cut;        // a fusible slice
  };
  // The depth an edge adds, from argument `a` to a reader (a fusible slice
  // when `cut`) of shape `shape`: see collect_regions.
  static uint32_t step(const Local& a, bool cut, ShapeId shape) { return !a.fusible || (cut && a.shape != shape) ? 1 : 0; }
  std::vector<Local> local_;
  std::vector<uint32_t> parent_, region_of_, member_pos_, count_, id_of_root_;
  std::vector<SigId> region_sig_;
  std::vector<Region> regions_;
  std::vector<NodeId> members_, inputs_;
  std::vector<uint32_t> member_local_;  // members' local ids (same slots as members_)
  // Per built-in op: whether it is elementwise, and worth a kernel of its own
  // (PointwiseInfo::alone_on_cpu); users' ops lie past the table: never fused.
  enum PointwiseKind : uint8_t { kNotPointwise, kPointwise, kWorthAlone };
  std::vector<uint8_t> pointwise_op_;
  PointwiseKind pointwise_kind(OpCode op) const {
    return op < pointwise_op_.size() ? static_cast<PointwiseKind>(pointwise_op_[op]) : kNotPointwise;
  }
  // The ops a region may hold (fusible() then checks the node's operands).
  bool fusible_op(OpCode op) const;
  bool lone_ = false;
  std::vector<uint8_t> escapes_;
  std::vector<int64_t> key_, last_key_, program_key_;
  std::vector<FusedInstr> code_;  // program_for's: the region's instructions
  SigId last_sig_ = kNoSig;
  std::shared_ptr<const FusedProgram> last_program_;
  // contract()'s scratch.
  std::vector<uint32_t> entry_of_, first_local_, out_begin_, out_, indeg_, order_, position_, fill_;
  RoundDag scratch_;
  // Programs of every pattern seen, by the program's key (FusedProgram::key).
  // Shared: a fused autograd node keeps its program alive after the graph is gone.
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<int64_t>, std::shared_ptr<const FusedProgram>>>>
      programs_;
};

}  // namespace sheaf
