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

// Elements per row after dimension `axis` of a per-example shape.
int64_t inner_of(const Shape& s, int axis) {
  int64_t inner = 1;
  for (int d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  return inner;
}

}  // namespace

bool Fuser::fusible(const NodeStore& s, NodeId n) const {
  if (s.sig[n] == kNoSig) return false;  // shared: computed once, never batched
  const OpInfo& info = op_info(s.op[n]);
  if (info.pointwise != nullptr) return true;
  if (s.op[n] != code_of<op::Slice>) return false;
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
// and non-fusible depth; then the regions (two or more members) in local order.
void Fuser::collect_regions(const NodeStore& s, const RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  fusible_.resize(m);
  nd_.resize(m);
  parent_.resize(m);
  for (uint32_t i = 0; i < m; ++i) {
    const NodeId n = dag.node[i];
    fusible_[i] = fusible(s, n);
    parent_[i] = i;
    uint32_t d = 0;
    for (uint32_t a : dag.args_of(i)) d = std::max(d, nd_[a] + (fusible_[a] ? 0u : 1u));
    nd_[i] = d;
    if (!fusible_[i]) continue;
    for (uint32_t a : dag.args_of(i))
      if (fusible_[a] && nd_[a] == d && s.shape[dag.node[a]] == s.shape[n]) parent_[find(a)] = find(i);
  }
  // Members per root, then region ids for roots with two or more, by first member.
  std::vector<uint32_t>& count = region_of_;
  count.assign(m, 0);
  for (uint32_t i = 0; i < m; ++i)
    if (fusible_[i]) ++count[find(i)];
  std::vector<uint32_t> id_of_root(m, kNone32);
  regions_.clear();
  members_.clear();
  std::vector<uint32_t> size;
  for (uint32_t i = 0; i < m; ++i) {
    if (!fusible_[i]) continue;
    const uint32_t r = find(i);
    if (count[r] < 2) continue;
    if (id_of_root[r] == kNone32) {
      id_of_root[r] = static_cast<uint32_t>(regions_.size());
      regions_.push_back(Region{});
      size.push_back(count[r]);
    }
  }
  uint32_t at = 0;
  for (size_t k = 0; k < regions_.size(); ++k) {
    regions_[k].members_begin = at;
    at += size[k];
  }
  members_.resize(at);
  escapes_.resize(at);
  std::vector<uint32_t> fill(regions_.size(), 0);
  region_of_.assign(m, kNone32);
  for (uint32_t i = 0; i < m; ++i)
    if (fusible_[i] && id_of_root[find(i)] != kNone32) region_of_[i] = id_of_root[find(i)];
  for (uint32_t i = 0; i < m; ++i) {
    const uint32_t k = region_of_[i];
    if (k == kNone32) continue;
    bool escapes = dag.uses_of(i).empty();
    for (uint32_t u : dag.uses_of(i)) escapes = escapes || region_of_[u] != k;
    escapes_[regions_[k].members_begin + fill[k]] = escapes;
    members_[regions_[k].members_begin + fill[k]++] = dag.node[i];
  }
  for (size_t k = 0; k < regions_.size(); ++k) regions_[k].members_len = fill[k];
}

// The region's external inputs (first use first) and pattern key; the program
// of that pattern, built the first time it is seen.
std::shared_ptr<const FusedProgram> Fuser::program_for(NodeStore& s, uint32_t k, SigId& sig) {
  Region& region = regions_[k];
  const std::span<const NodeId> members = this->members(region);
  region.inputs_begin = static_cast<uint32_t>(inputs_.size());
  key_.assign({kPatternTag, s.shapes[s.shape[members[0]]].numel(), static_cast<int64_t>(members.size())});
  auto member_index = [&](NodeId r) -> int64_t {
    for (size_t j = 0; j < members.size(); ++j)
      if (members[j] == r) return static_cast<int64_t>(j);
    return -1;
  };
  auto ref_of = [&](NodeId arg) -> int64_t {  // >= 0: a member; < 0: -(1 + input slot)
    const NodeId r = s.resolve(arg);
    if (int64_t j = member_index(r); j >= 0) return j;
    for (uint32_t e = region.inputs_begin; e < inputs_.size(); ++e)
      if (inputs_[e] == r) return -1 - static_cast<int64_t>(e - region.inputs_begin);
    inputs_.push_back(r);
    return -static_cast<int64_t>(inputs_.size() - region.inputs_begin);
  };
  for (NodeId n : members) {
    key_.push_back(s.sig[n]);
    for (NodeId a : s.args_of(n)) key_.push_back(ref_of(a));
  }
  region.inputs_len = static_cast<uint32_t>(inputs_.size()) - region.inputs_begin;
  sig = s.sigs.intern(key_);

  const uint64_t h = hash_words(key_);
  auto& bucket = programs_[h];
  for (auto& [key, program] : bucket)
    if (key == key_) return program;
  auto p = std::make_shared<FusedProgram>();
  p->inputs = region.inputs_len;
  p->shape = s.shapes[s.shape[members[0]]];
  p->numel = p->shape.numel();
  p->hash = h;
  for (NodeId in : inputs(region)) {
    p->input_numel.push_back(s.shape_of(in).numel());
    p->input_shared.push_back(s.has(in, NodeStore::kShared));
  }
  auto reg_of = [&](NodeId arg) {
    const int64_t ref = ref_of(arg);  // every input is known by now: nothing is appended
    return static_cast<uint32_t>(ref >= 0 ? p->inputs + ref : -1 - ref);
  };
  for (NodeId n : members) {
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
    p->code.push_back(in);
  }
  bucket.emplace_back(key_, p);
  return p;
}

// Each region becomes one entry of the round; a topological order of the
// contracted graph (it is acyclic: regions are convex) by Kahn's algorithm.
void Fuser::contract(RoundDag& dag) {
  const auto m = static_cast<uint32_t>(dag.size());
  std::vector<uint32_t> entry_of(m), first_local;
  std::vector<uint32_t> entry_of_region(regions_.size(), kNone32);
  for (uint32_t i = 0; i < m; ++i) {
    const uint32_t k = region_of_[i];
    if (k != kNone32 && entry_of_region[k] != kNone32) {
      entry_of[i] = entry_of_region[k];
      continue;
    }
    entry_of[i] = static_cast<uint32_t>(first_local.size());
    if (k != kNone32) entry_of_region[k] = entry_of[i];
    first_local.push_back(i);
  }
  const auto e = static_cast<uint32_t>(first_local.size());
  // Edges between entries, as CSR by source; in-degrees.
  std::vector<uint32_t> out_begin(e + 1, 0), indeg(e, 0);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of[a] != entry_of[i]) ++out_begin[entry_of[a] + 1];
  for (uint32_t x = 0; x < e; ++x) out_begin[x + 1] += out_begin[x];
  std::vector<uint32_t> out(out_begin[e]), fill(out_begin.begin(), out_begin.end() - 1);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of[a] != entry_of[i]) {
        out[fill[entry_of[a]]++] = entry_of[i];
        ++indeg[entry_of[i]];
      }
  std::vector<uint32_t> order, position(e);
  std::deque<uint32_t> ready;
  for (uint32_t x = 0; x < e; ++x)
    if (indeg[x] == 0) ready.push_back(x);
  while (!ready.empty()) {
    const uint32_t x = ready.front();
    ready.pop_front();
    position[x] = static_cast<uint32_t>(order.size());
    order.push_back(x);
    for (uint32_t q = out_begin[x]; q < out_begin[x + 1]; ++q)
      if (--indeg[out[q]] == 0) ready.push_back(out[q]);
  }
  SHEAF_ASSERT(order.size() == e, "fused regions made the round cyclic");

  // The contracted DAG, in that order; arguments are the entries' external producers.
  RoundDag& c = scratch_;
  c.node.resize(e);
  c.region.resize(e);
  c.sig.resize(e);
  c.arg_begin.assign(1, 0);
  c.args.clear();
  std::vector<std::vector<uint32_t>> args_of_entry(e);
  for (uint32_t i = 0; i < m; ++i)
    for (uint32_t a : dag.args_of(i))
      if (entry_of[a] != entry_of[i]) args_of_entry[entry_of[i]].push_back(position[entry_of[a]]);
  for (uint32_t p = 0; p < e; ++p) {
    const uint32_t x = order[p];
    const uint32_t i = first_local[x];
    const uint32_t k = region_of_[i];
    c.node[p] = k == kNone32 ? dag.node[i] : kNoNode;
    c.region[p] = k;
    c.sig[p] = k == kNone32 ? dag.sig[i] : region_sig_[k];
    c.args.insert(c.args.end(), args_of_entry[x].begin(), args_of_entry[x].end());
    c.arg_begin.push_back(static_cast<uint32_t>(c.args.size()));
  }
  link_dag(c);
  dag.node.swap(c.node);
  dag.region.swap(c.region);
  dag.sig.swap(c.sig);
  dag.arg_begin.swap(c.arg_begin);
  dag.args.swap(c.args);
  dag.depth.swap(c.depth);
  dag.use_begin.swap(c.use_begin);
  dag.uses.swap(c.uses);
  std::swap(dag.max_depth, c.max_depth);
}

void Fuser::fuse(NodeStore& store, RoundDag& dag) {
  inputs_.clear();
  collect_regions(store, dag);
  if (regions_.empty()) return;
  region_sig_.resize(regions_.size());
  for (uint32_t k = 0; k < regions_.size(); ++k) regions_[k].program = program_for(store, k, region_sig_[k]);
  contract(dag);
}

std::string FusedProgram::str() const {
  std::ostringstream os;
  os << "fused{";
  for (size_t k = 0; k < code.size(); ++k) {
    const FusedInstr& in = code[k];
    auto reg = [&](uint32_t r) { return (r < inputs ? "i" : "r") + std::to_string(r < inputs ? r : r - inputs); };
    os << (k ? ", " : "") << "r" << k << "=" << op_name(in.op) << "(" << reg(in.a);
    if (in.slice) os << " @" << in.offset;
    else if (op_info(in.op).pointwise->operands == 2) os << ", " << reg(in.b);
    os << ")";
  }
  return os.str() + "}";
}

}  // namespace sheaf
