#include "plan.h"

#include <algorithm>
#include <sstream>

#include "../dsl/op.h"

namespace sheaf {

namespace {

struct Loc {
  uint32_t batch, row;
};

// Beyond this many contiguous runs, a concatenation of views costs more than
// gathering each source with one index_select.
constexpr size_t kMaxRuns = 4;

class Planner {
 public:
  Planner(NodeStore& s, Plan& p) : s_(s), p_(p), base_(static_cast<uint32_t>(s.batch_out.size())) {}

  void add_batch(const RoundDag& dag, std::span<const uint32_t> locals) {
    const NodeId first = dag.node[locals[0]];
    const OpCode op = s_.op[first];
    const OpTraits& traits = op_info(op).traits;
    const bool shared = s_.has(first, NodeStore::kShared);
    const auto out = base_ + static_cast<uint32_t>(p_.batches.size());
    const auto n = static_cast<uint32_t>(locals.size());

    // Row order: by where the first argument lives, so that a batch fed by one
    // earlier batch in the same order reads it as a view (chains stay zero-copy).
    order_.clear();
    for (uint32_t l : locals) {
      NodeId node = dag.node[l];
      uint64_t key = node;
      auto args = s_.args_of(node);
      if (!args.empty()) {
        NodeId a = s_.resolve(args[0]);
        if (!s_.has(a, NodeStore::kShared))
          key = (uint64_t{s_.value_batch[a]} << 32) | s_.value_row[a];
      }
      order_.push_back({key, node});
    }
    std::sort(order_.begin(), order_.end());

    PlannedBatch b{};
    b.op = op;
    b.sig = s_.sig[first];
    b.shared = shared;
    b.out = out;
    b.nodes_begin = static_cast<uint32_t>(p_.nodes.size());
    b.n = n;
    for (uint32_t i = 0; i < n; ++i) {
      NodeId node = order_[i].second;
      p_.nodes.push_back(node);
      s_.value_batch[node] = out;
      s_.value_row[node] = shared ? kWholeRow : i;
    }
    rows_.push_back(shared ? 0 : n);
    std::span<const NodeId> nodes(p_.nodes.data() + b.nodes_begin, n);

    b.args_begin = static_cast<uint32_t>(p_.args.size());
    if (traits.segmented) {
      // The lists of all nodes, flattened in row order, are one input.
      sources_.clear();
      b.segments = static_cast<int64_t>(p_.indices.size());
      for (uint32_t i = 0; i < n; ++i)
        for (NodeId a : s_.args_of(nodes[i])) {
          sources_.push_back(loc_of(a));
          p_.indices.push_back(i);
        }
      b.total = static_cast<uint32_t>(sources_.size());
      b.counts = static_cast<int64_t>(p_.indices.size());
      for (NodeId node : nodes) p_.indices.push_back(static_cast<int64_t>(s_.args_of(node).size()));
      b.arity = 1;
      add_input();
    } else {
      b.arity = static_cast<uint32_t>(s_.args_of(first).size());
      for (uint32_t k = 0; k < b.arity; ++k) {
        NodeId a0 = s_.resolve(s_.args_of(first)[k]);
        if (s_.has(a0, NodeStore::kShared)) {  // the signature makes it the same node for all rows
          uint32_t q = part(ArgPart{s_.value_batch[a0], kWholeRow, 1});
          p_.args.push_back(BatchArg{BatchArg::kShared, q, q + 1});
          continue;
        }
        sources_.clear();
        for (NodeId node : nodes) sources_.push_back(loc_of(s_.args_of(node)[k]));
        add_input();
      }
    }
    b.payload = static_cast<int64_t>(p_.indices.size());
    for (NodeId node : nodes) p_.indices.push_back(s_.payload[node]);
    p_.batches.push_back(b);
  }

 private:
  Loc loc_of(NodeId a) const {
    NodeId r = s_.resolve(a);
    return {s_.value_batch[r], s_.value_row[r]};
  }
  uint32_t rows(uint32_t batch) const {
    return batch >= base_ ? rows_[batch - base_] : static_cast<uint32_t>(s_.batch_out[batch].size(0));
  }
  uint32_t part(ArgPart p) {
    p_.parts.push_back(p);
    return static_cast<uint32_t>(p_.parts.size() - 1);
  }

  // Plans one batched input from the (batch, row) of each of its rows. A row
  // kWholeRow is a shared value (only in the list of a shared sum): its own part.
  void add_input() {
    BatchArg arg{BatchArg::kGather, static_cast<uint32_t>(p_.parts.size()), 0};
    runs_.clear();
    bool whole = false;
    for (const Loc& l : sources_) {
      whole = whole || l.row == kWholeRow;
      if (!runs_.empty() && l.row != kWholeRow && runs_.back().batch == l.batch &&
          runs_.back().start + runs_.back().len == l.row)
        ++runs_.back().len;
      else
        runs_.push_back(ArgPart{l.batch, l.row, 1});
    }
    if (runs_.size() == 1) {
      arg.kind = BatchArg::kView;
      part(runs_[0]);
    } else if (runs_.size() <= kMaxRuns || whole) {
      for (const ArgPart& r : runs_) part(r);
    } else {
      gather_by_source(arg);
    }
    arg.parts_end = static_cast<uint32_t>(p_.parts.size());
    p_.args.push_back(arg);
  }

  // One index_select per source batch; then, if the sources interleave, one more
  // to put rows back in order.
  void gather_by_source(BatchArg& arg) {
    srcs_.clear();
    for (const Loc& l : sources_)
      if (std::find(srcs_.begin(), srcs_.end(), l.batch) == srcs_.end()) srcs_.push_back(l.batch);
    std::vector<int64_t> pos(sources_.size());
    int64_t offset = 0;
    bool in_order = true;
    for (uint32_t src : srcs_) {
      auto index = static_cast<int64_t>(p_.indices.size());
      uint32_t len = 0;
      for (size_t j = 0; j < sources_.size(); ++j)
        if (sources_[j].batch == src) {
          p_.indices.push_back(sources_[j].row);
          in_order = in_order && static_cast<int64_t>(j) == offset + len;
          pos[j] = offset + len++;
        }
      part(ArgPart{src, 0, len, index});
      offset += len;
    }
    if (!in_order) {
      arg.perm = static_cast<int64_t>(p_.indices.size());
      p_.indices.insert(p_.indices.end(), pos.begin(), pos.end());
    }
  }

  NodeStore& s_;
  Plan& p_;
  uint32_t base_;
  std::vector<uint32_t> rows_;
  std::vector<std::pair<uint64_t, NodeId>> order_;
  std::vector<Loc> sources_;
  std::vector<ArgPart> runs_;
  std::vector<uint32_t> srcs_;
};

}  // namespace

Plan make_plan(NodeStore& store, const RoundDag& dag, const Batches& batches, std::string_view strategy) {
  Plan plan;
  plan.strategy = strategy;
  Planner planner(store, plan);
  for (size_t k = 0; k < batches.size(); ++k) planner.add_batch(dag, batches[k]);
  return plan;
}

std::string Plan::str() const {
  std::ostringstream os;
  os << "plan (" << strategy << "): " << batches.size() << " batches, " << nodes.size() << " nodes\n";
  for (const PlannedBatch& b : batches) {
    os << "  b" << b.out << " = " << op_info(b.op).name << " x" << b.n;
    if (b.shared) os << " (shared)";
    if (b.segments >= 0) os << " (" << b.total << " list elements)";
    os << " [nodes %" << nodes[b.nodes_begin] << (b.n > 1 ? ".." : "") << "] <-";
    for (uint32_t k = 0; k < b.arity; ++k) {
      const BatchArg& a = args[b.args_begin + k];
      os << (k ? ", " : " ");
      if (a.kind == BatchArg::kShared) {
        os << "shared b" << parts[a.parts_begin].batch;
        continue;
      }
      if (a.kind == BatchArg::kView) {
        const ArgPart& p = parts[a.parts_begin];
        os << "view b" << p.batch << "[" << p.start << ":" << p.start + p.len << "]";
        continue;
      }
      os << "gather(";
      for (uint32_t q = a.parts_begin; q < a.parts_end; ++q) {
        const ArgPart& p = parts[q];
        os << (q > a.parts_begin ? " + " : "") << "b" << p.batch;
        if (p.index >= 0) os << "{" << p.len << " rows}";
        else os << "[" << p.start << ":" << p.start + p.len << "]";
      }
      os << (a.perm >= 0 ? ", permuted)" : ")");
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace sheaf
