#include "fusion.h"

#include <algorithm>
#include <deque>
#include <sstream>

#include <sheaf/core/hash.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

namespace sheaf {

namespace {

constexpr int64_t kPatternTag = -7;  // pattern keys never collide with node signature keys (op >= 0)
constexpr int64_t kProgramTag = -8;

// Elements per row after dimension `axis` of a per-example shape.
int64_t inner_of(const Shape& s, int axis) {
  int64_t inner = 1;
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  return inner;
}

}  // namespace

Fuser::Fuser() {
  pointwise_op_.resize(kNumOps);
  for (OpCode op = 0; op < kNumOps; ++op) {
    const PointwiseInfo* p = op_info(op).pointwise;
    pointwise_op_[op] = p == nullptr ? kNotPointwise : p->alone_on_cpu ? kWorthAlone : kPointwise;
  }
}

inline bool Fuser::fusible_op(OpCode op) const { return pointwise_kind(op) != kNotPointwise || op == code_of<op::Slice>; }

bool Fuser::fusible(const NodeStore& s, NodeId n) const {
  if (s.sig[n] == kNoSig) return false;  // shared: computed once, never batched
  const OpCode op = s.op[n];
  if (!fusible_op(op)) return false;
  if (pointwise_kind(op) != kNotPointwise) {
    // A fused kernel reads each operand as a row of the node's size or as one
    // value: an operand broadcast along some dims (a [d] bias on [t, d]) runs alone.
    for (NodeId a : s.args_of(n)) {
      const NodeId r = s.resolve(a);
      if (s.shape[r] != s.shape[n] && s.shape_of(r).numel() != 1) return false;
    }
    return true;
  }
  // A slice fuses when its rows are contiguous in the input's rows: every
  // dimension before the cut has size 1.
  const NodeId in = s.resolve(s.args_of(n)[0]);
  if (s.has(in, NodeStore::kShared)) return false;
  const Shape& shape = s.shape_of(in);
  const int axis = shape.axis(static_cast<int>(s.attrs_of(n)[0]));
  for (int d = 0; d < axis; ++d)
    if (shape[d] != 1) return false;
  return true;
}

uint32_t Fuser::find(uint32_t i) {
  while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
  return i;
}

// Union-find over fusible nodes joined to fusible arguments of the same shape
// and non-fusible depth; then the regions (two or more members, or one alone_on_cpu op) in local order,
// their members (in local order: a topological order) and which members escape.
//
// Depth rises through every non-fusible node and at every slice that cuts
// a fusible value to another shape. So along a path of equal depth every node
// is fusible and no shape shrinks (a pointwise op's value is as big as each
// operand); around a cycle every shape would be the same, and union-find
// would have joined it into one region: contracting regions keeps the round
// acyclic. (Without the slice rule, a scalar read by a [4] region and added
// to a slice of that region's value made two regions that read each other.)
//
// A fusible node's depth is then as late as its readers allow, not as early
// as its arguments do: `h * 0.5` of an argument, read by a cell after a
// product, would otherwise be a region of its own (a launch, and an autograd
// node) at depth 0. Every edge keeps the step it had, so the above holds.
void Fuser::collect_regions(const NodeStore& s, const RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  // A round without a pointwise op or a slice has nothing to fuse (a TreeLSTM's
  // calls, lookups and products): one look at each op, not the pass below
  // over every argument.
  bool maybe = false;
  for (uint32_t i = 0; i < m && !maybe; ++i) maybe = fusible_op(s.op[dag.node[i]]);
  if (!maybe) {
    regions_.clear();
    return;
  }
  fusible_.resize(m);
  local_.resize(m);
  parent_.resize(m);
  bool any = false;
  for (uint32_t i = 0; i < m; ++i) {
    const NodeId n = dag.node[i];
    const bool f = fusible(s, n);
    fusible_[i] = f;
    parent_[i] = i;
    const ShapeId shape = s.shape[n];
    const bool cut = f && s.op[n] == code_of<op::Slice>;
    // What the arguments' loop needs of a local, in one place (one cache miss per argument, not three).
    uint32_t d = 0;
    for (uint32_t a : dag.args_of(i)) d = std::max(d, local_[a].nd + step(local_[a], cut, shape));
    local_[i] = Local{d, shape, f, cut};
    any = any || f;
  }
  if (!any) {  // its pointwise ops and slices cannot fuse (shared, broadcast, a cut across rows): no regions
    regions_.clear();
    return;
  }
  for (uint32_t i = m; i-- > 0;) {
    if (!fusible_[i] || dag.uses_of(i).empty()) continue;
    uint32_t late = kNone32;
    for (uint32_t u : dag.uses_of(i)) late = std::min(late, local_[u].nd - step(local_[i], local_[u].cut, local_[u].shape));
    local_[i].nd = late;  // >= its own: a reader is never earlier
  }
  for (uint32_t i = 0; i < m; ++i) {
    if (!fusible_[i]) continue;
    const Local l = local_[i];
    for (uint32_t a : dag.args_of(i))
      if (local_[a].fusible && local_[a].nd == l.nd && local_[a].shape == l.shape) parent_[find(a)] = find(i);
  }
  collect_members(s, dag);
}

void Fuser::collect_members(const NodeStore& s, const RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  count_.assign(m, 0);
  for (uint32_t i = 0; i < m; ++i)
    if (fusible_[i]) ++count_[parent_[i] = find(i)];
  // Region ids by first member, members' slots reserved as each region
  // appears; a member escapes if used by nothing here or by another root.
  id_of_root_.assign(m, kNone32);
  region_of_.assign(m, kNone32);
  member_pos_.resize(m);
  members_.resize(m);
  member_local_.resize(m);
  escapes_.resize(m);
  regions_.clear();
  uint32_t at = 0;
  for (uint32_t i = 0; i < m; ++i) {
    if (!fusible_[i]) continue;
    const uint32_t r = parent_[i];
    if (count_[r] < 2 && !(lone_ && pointwise_kind(s.op[dag.node[i]]) == kWorthAlone)) continue;
    uint32_t& k = id_of_root_[r];
    if (k == kNone32) {
      k = static_cast<uint32_t>(regions_.size());
      regions_.push_back(Region{at, 0, 0, 0, nullptr});
      at += count_[r];
    }
    region_of_[i] = k;
    const uint32_t pos = regions_[k].members_len++;
    member_pos_[i] = pos;
    const uint32_t slot = regions_[k].members_begin + pos;
    bool escapes = dag.uses_of(i).empty();
    for (uint32_t u : dag.uses_of(i)) escapes = escapes || !fusible_[u] || parent_[u] != r;
    members_[slot] = dag.node[i];
    member_local_[slot] = i;
    escapes_[slot] = escapes;
  }
}

// The region's external inputs, first use first.
void Fuser::find_inputs(const NodeStore& s, const RoundDag& dag, uint32_t k) {
  Region& region = regions_[k];
  region.inputs_begin = static_cast<uint32_t>(inputs_.size());
  for (NodeId n : members(region))
    for (NodeId a : s.args_of(n)) {
      const NodeId r = s.resolve(a);
      // (A local id is valid only for nodes of this round: an argument not
      // computed must be one. round.h. This check also covers program_for,
      // which reads the same arguments' local ids next.)
      SHEAF_ASSERT(s.has(r, NodeStore::kComputed) || dag.in_round(r), "argument %", r, " of %", n,
                   " is neither computed nor in the round");
      if (!s.has(r, NodeStore::kComputed) && region_of_[dag.local(r)] == k) continue;
      bool seen = false;
      for (size_t e = region.inputs_begin; e < inputs_.size() && !seen; ++e) seen = inputs_[e] == r;
      if (!seen) inputs_.push_back(r);
    }
  region.inputs_len = static_cast<uint32_t>(inputs_.size()) - region.inputs_begin;
}

// The pattern of region k: its key (member signatures and operand references)
// interned as a signature, and its program (built the first time it is seen).
std::shared_ptr<const FusedProgram> Fuser::program_for(NodeStore& s, const RoundDag& dag, uint32_t k, SigId& sig) {
  const Region& region = regions_[k];
  const std::span<const NodeId> ins = inputs(region);
  // An operand's register: an input's slot, or inputs + a member's position.
  auto reg_of = [&](NodeId arg) -> uint32_t {
    const NodeId r = s.resolve(arg);
    if (!s.has(r, NodeStore::kComputed)) {
      const uint32_t la = dag.local(r);
      if (region_of_[la] == k) return region.inputs_len + member_pos_[la];
    }
    for (uint32_t e = 0; e < ins.size(); ++e)
      if (ins[e] == r) return e;
    throw_internal("fused operand %", r, " is neither a member nor an input");
  };
  // The batching key: the members' signatures (which name the shared inputs)
  // and how they read each other. Signature ids are this graph's own, and
  // restart at clear(): they key the round's batches, never the program cache.
  bool packed = true;
  for (NodeId n : members(region)) packed = packed && s.has(n, NodeStore::kRowwise);
  regions_[k].packed = packed;
  // Packed, the program runs over rows: one row's shape (negated numel in the key).
  const Shape& full = s.shapes[s.shape[members(region)[0]]];
  const Shape shape = packed ? full.row() : full;
  key_.assign({kPatternTag, packed ? -shape.numel() : shape.numel(), static_cast<int64_t>(region.members_len),
               static_cast<int64_t>(region.inputs_len)});
  for (NodeId n : members(region)) {
    key_.push_back(s.sig[n]);
    for (NodeId a : s.args_of(n)) key_.push_back(reg_of(a));
  }
  // Consecutive regions usually share a pattern: skip the interning then.
  bool same = last_program_ != nullptr && key_.size() == last_key_.size();
  for (size_t i = 0; same && i < key_.size(); ++i) same = key_[i] == last_key_[i];
  if (same) {
    sig = last_sig_;
    return last_program_;
  }
  sig = s.sigs.intern(key_);

  // The program, keyed by what it computes (instructions, the shape, the
  // inputs' sizes and sharing): the same key means the same program in any
  // graph, before or after a clear.
  code_.clear();
  for (NodeId n : members(region)) {
    FusedInstr in;
    in.op = s.op[n];
    auto args = s.args_of(n);
    in.a = reg_of(args[0]);
    in.b = args.size() > 1 ? reg_of(args[1]) : in.a;
    const OpInfo& info = op_info(in.op);
    if (info.pointwise == nullptr) {  // a slice
      const Shape& from = s.shape_of(s.resolve(args[0]));
      const int axis = from.axis(static_cast<int>(s.attrs_of(n)[0]));
      in.slice = true;
      in.offset = s.attrs_of(n)[1] * inner_of(from, axis);
    } else if (info.pointwise->scalar) {
      in.attr = s.attrs_of(n)[0];
    }
    code_.push_back(in);
  }
  program_key_.assign({kProgramTag, shape.rank()});
  program_key_.insert(program_key_.end(), shape.dims().begin(), shape.dims().end());
  program_key_.push_back(region.inputs_len);
  for (NodeId in : ins) {
    program_key_.push_back(input_numel(s, region, in));
    program_key_.push_back(s.has(in, NodeStore::kShared));
  }
  for (const FusedInstr& in : code_)
    program_key_.insert(program_key_.end(), {in.op, in.a, in.b, in.attr, in.offset, in.slice});
  const uint64_t h = hash_words(program_key_);
  auto& bucket = programs_[h];
  std::shared_ptr<const FusedProgram> program;
  for (auto& [key, p] : bucket)
    if (key == program_key_) program = p;
  if (!program) {
    program = build_program(s, region, shape, h);
    bucket.emplace_back(program_key_, program);
  }
  last_key_ = key_;
  last_sig_ = sig;
  last_program_ = program;
  return program;
}

// From the instructions program_for described (code_) and the region's inputs.
std::shared_ptr<const FusedProgram> Fuser::build_program(const NodeStore& s, const Region& region, const Shape& shape,
                                                         uint64_t hash) {
  auto p = std::make_shared<FusedProgram>();
  p->inputs = region.inputs_len;
  p->shape = shape;
  p->numel = shape.numel();
  p->hash = hash;
  p->key = program_key_;
  for (NodeId in : inputs(region)) {
    p->input_numel.push_back(input_numel(s, region, in));
    p->input_shared.push_back(s.has(in, NodeStore::kShared));
  }
  p->code = code_;
  p->read_later.assign(p->code.size(), 0);
  return p;
}

// Elements of input `in` per row of the program: its value's, or in a packed
// region one row's of a per-example value (a shared one is a scalar there:
// OpTraits::rowwise).
int64_t Fuser::input_numel(const NodeStore& s, const Region& region, NodeId in) const {
  const Shape& shape = s.shape_of(in);
  if (!region.packed || s.has(in, NodeStore::kShared) || shape.rank() == 0 || shape[0] == 0) return shape.numel();
  // One row's shape (repeated on each row), or the rows of a value of the region's rank.
  if (shape.rank() < s.shape_of(members(region)[0]).rank()) return shape.numel();
  return shape.numel() / shape[0];
}

// Each region becomes one entry of the round, placed where its last member
// was. That order is usually topological already (checked as the arguments are
// listed); when an outside node reads an early member before the region ends,
// contract_kahn() orders the entries instead (the graph is acyclic either way:
// regions are convex).
void Fuser::contract(RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  entry_of_.resize(m);
  std::vector<uint32_t>& entry_of_region = id_of_root_;  // free again: reused
  entry_of_region.assign(regions_.size(), kNone32);
  uint32_t e = 0;
  for (uint32_t i = 0; i < m; ++i) {
    const uint32_t k = region_of_[i];
    if (k == kNone32) {
      entry_of_[i] = e++;
    } else if (member_pos_[i] + 1 == regions_[k].members_len) {
      entry_of_region[k] = e++;
    }
  }
  for (uint32_t i = 0; i < m; ++i)
    if (region_of_[i] != kNone32) entry_of_[i] = entry_of_region[region_of_[i]];

  RoundDag& c = scratch_;
  c.node.resize(e);
  c.region.resize(e);
  c.sig.resize(e);
  c.arg_begin.resize(e + 1);
  c.arg_begin[0] = 0;
  c.args.clear();
  bool ordered = true;
  auto add_args = [&](uint32_t i, uint32_t x) {
    for (uint32_t a : dag.args_of(i)) {
      const uint32_t ea = entry_of_[a];
      if (ea == x) continue;
      ordered = ordered && ea < x;
      c.args.push_back(ea);
    }
  };
  for (uint32_t i = 0; i < m && ordered; ++i) {
    const uint32_t k = region_of_[i];
    if (k == kNone32) {
      const uint32_t x = entry_of_[i];
      c.node[x] = dag.node[i];
      c.region[x] = kNone32;
      c.sig[x] = dag.sig[i];
      add_args(i, x);
      c.arg_begin[x + 1] = static_cast<uint32_t>(c.args.size());
    } else if (member_pos_[i] + 1 == regions_[k].members_len) {
      const uint32_t x = entry_of_[i];
      c.node[x] = kNoNode;
      c.region[x] = k;
      c.sig[x] = region_sig_[k];
      const Region& r = regions_[k];
      for (uint32_t q = r.members_begin; q < r.members_begin + r.members_len; ++q) add_args(member_local_[q], x);
      c.arg_begin[x + 1] = static_cast<uint32_t>(c.args.size());
    }
  }
  if (!ordered) return contract_kahn(dag);
  link_dag(c);
  swap_in(dag);
}

void Fuser::swap_in(RoundDag& dag) {
  RoundDag& c = scratch_;
  dag.node.swap(c.node);
  dag.region.swap(c.region);
  dag.sig.swap(c.sig);
  dag.arg_begin.swap(c.arg_begin);
  dag.args.swap(c.args);
  dag.depth.swap(c.depth);
  dag.use_begin.swap(c.use_begin);
  dag.uses.swap(c.uses);
  std::swap(dag.max_depth, c.max_depth);
  dag.sigs_known = false;
}

// The same by Kahn's algorithm, for any order of the members.
void Fuser::contract_kahn(RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  entry_of_.resize(m);
  first_local_.clear();
  std::vector<uint32_t>& entry_of_region = id_of_root_;  // free again: reused
  entry_of_region.assign(regions_.size(), kNone32);
  for (uint32_t i = 0; i < m; ++i) {
    const uint32_t k = region_of_[i];
    if (k != kNone32 && entry_of_region[k] != kNone32) {
      entry_of_[i] = entry_of_region[k];
      continue;
    }
    entry_of_[i] = static_cast<uint32_t>(first_local_.size());
    if (k != kNone32) entry_of_region[k] = entry_of_[i];
    first_local_.push_back(i);
  }
  const auto e = static_cast<uint32_t>(first_local_.size());
  // Edges between entries (CSR by source) and in-degrees (= argument counts).
  out_begin_.assign(e + 1, 0);
  indeg_.assign(e, 0);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of_[a] != entry_of_[i]) {
        ++out_begin_[entry_of_[a] + 1];
        ++indeg_[entry_of_[i]];
      }
  for (uint32_t x = 0; x < e; ++x) out_begin_[x + 1] += out_begin_[x];
  out_.resize(out_begin_[e]);
  fill_.assign(out_begin_.begin(), out_begin_.end() - 1);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of_[a] != entry_of_[i]) out_[fill_[entry_of_[a]]++] = entry_of_[i];

  RoundDag& c = scratch_;
  c.arg_begin.assign(e + 1, 0);  // argument counts, by entry, before Kahn uses up the in-degrees
  for (uint32_t x = 0; x < e; ++x) c.arg_begin[x + 1] = indeg_[x];
  order_.clear();
  position_.resize(e);
  for (uint32_t x = 0; x < e; ++x)
    if (indeg_[x] == 0) order_.push_back(x);
  for (size_t q = 0; q < order_.size(); ++q) {
    const uint32_t x = order_[q];
    position_[x] = static_cast<uint32_t>(q);
    for (uint32_t o = out_begin_[x]; o < out_begin_[x + 1]; ++o)
      if (--indeg_[out_[o]] == 0) order_.push_back(out_[o]);
  }
  SHEAF_ASSERT(order_.size() == e, "fused regions made the round cyclic");

  // The contracted DAG in that order; arguments are the entries' outside producers.
  c.node.resize(e);
  c.region.resize(e);
  c.sig.resize(e);
  std::vector<uint32_t>& counts = fill_;  // reused: argument counts by new position
  counts.assign(e + 1, 0);
  for (uint32_t x = 0; x < e; ++x) counts[position_[x] + 1] = c.arg_begin[x + 1];
  for (uint32_t p = 0; p < e; ++p) counts[p + 1] += counts[p];
  c.arg_begin.assign(counts.begin(), counts.end());
  c.args.resize(counts[e]);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of_[a] != entry_of_[i]) c.args[counts[position_[entry_of_[i]]]++] = position_[entry_of_[a]];
  for (uint32_t p = 0; p < e; ++p) {
    const uint32_t i = first_local_[order_[p]];
    const uint32_t k = region_of_[i];
    c.node[p] = k == kNone32 ? dag.node[i] : kNoNode;
    c.region[p] = k;
    c.sig[p] = k == kNone32 ? dag.sig[i] : region_sig_[k];
  }
  link_dag(c);
  swap_in(dag);
}

void Fuser::fuse(NodeStore& store, RoundDag& dag) {
  inputs_.clear();
  collect_regions(store, dag);
  if (regions_.empty()) return;
  region_sig_.resize(regions_.size());
  last_program_ = nullptr;  // signatures are per graph: a clear() may have reset them
  for (uint32_t k = 0; k < regions_.size(); ++k) {
    find_inputs(store, dag, k);
    regions_[k].program = program_for(store, dag, k, region_sig_[k]);
  }
  contract(dag);
}

std::string FusedProgram::str() const {
  std::ostringstream os;
  os << "fused{";
  for (size_t k = 0; k < code.size(); ++k) {
    const FusedInstr& in = code[k];
    auto reg = [&](uint32_t r) {
      std::string name(1, r < inputs ? 'i' : 'r');  // (char + string: a -Wrestrict false positive in GCC 12)
      name += std::to_string(r < inputs ? r : r - inputs);
      return name;
    };
    os << (k ? ", " : "") << "r" << k << "=" << op_name(in.op) << "(" << reg(in.a);
    if (in.slice) os << " @" << in.offset;
    else if (op_info(in.op).pointwise->operands == 2) os << ", " << reg(in.b);
    os << ")";
  }
  return os.str() + "}";
}

}  // namespace sheaf
