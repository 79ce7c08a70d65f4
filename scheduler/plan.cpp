#include "plan.h"

#include "row_sort.h"

#include <algorithm>
#include <span>
#include <tuple>
#include <utility>
#include <sstream>

#include <c10/core/GradMode.h>

#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>
#include <sheaf/tracer/trace.h>

namespace sheaf {

namespace {

// Rows of an input that lie in one place: `len` consecutive rows of a batch
// output from `row` on, or one row `len` times (`repeat`), or (row kWholeRow,
// len 1) a whole tensor. An input is planned run by run, not row by row: a
// packed value's L rows are one run, and so are the values of a batch that
// reads the one before it in order.
struct Run {
  uint32_t batch, row, len;
  bool flatten;  // rows of a row: Read::flatten
  bool repeat;   // (only with len > 1)
};

// A batch an input reads rows of (read_by_source): its first row and the row
// after its last run so far, its rows, where they start in the input and
// where their row numbers go in plan.indices.
constexpr int64_t kNoIndex = -1;  // a range: no row numbers
struct Source {
  uint32_t batch, first, next, rows, at;
  bool consecutive, flatten;
  int64_t index = kNoIndex;
};

// A slice batch reading a whole batch in place: (source, axis) is its key;
// source | kGatheredSource: the gathered input of batch `source` instead.
constexpr uint32_t kGatheredSource = 0x80000000u;
struct SliceRead {
  uint32_t source;
  int64_t axis, begin, end;  // axis: the source tensor's
  uint32_t batch;
  int own_axis;  // the per-example axis
  auto key() const { return std::tuple(source, axis, begin, batch); }
};

// The planner's buffers, kept per thread so that planning a round (every round,
// batch after batch) does not allocate once they have grown.
// Buffers written in full after a resize are Columns (grown without zero-filling).
struct PlanScratch {
  std::vector<uint32_t> rows;
  // (first reader, ~height, where the first input lives, node or region): see order_rows
  Column<RowKey> order;
  SortScratch sort;
  // local entry -> longest path to what nothing in the round reads, and its
  // first reader (order_rows): side by side, as every edge updates both.
  struct Ahead {
    uint32_t height, reader;
  };
  std::vector<Ahead> ahead;
  Column<Run> runs;
  Column<NodeId> src_nodes;  // the values an input is made of, before fill_sources
  Column<NodeStore::Place> places;  // plan_inputs: where each row's arguments live, row by row
  std::vector<uint32_t> src_rows;
  std::vector<Source> srcs;
  std::vector<std::pair<uint32_t, uint32_t>> partial;
  std::vector<SliceRead> slices;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // (first row, read)
  // read_by_source: each run's source slot; per batch id its slot, valid
  // where its stamp is the current one.
  Column<uint32_t> slot;
  std::vector<uint32_t> src_slot, src_stamp;
  uint32_t stamp = 1;
};
thread_local PlanScratch t_scratch;

class Planner {
 public:
  Planner(NodeStore& s, Plan& p, const Fuser* fuser)
      : s_(s), p_(p), fuser_(fuser), base_(static_cast<uint32_t>(s.batch_out.size())) {
    SHEAF_ASSERT(s.batch_rows.size() == s.batch_out.size(), "batch values appended without NodeStore::push_batch");
    rows_.clear();
  }

  void index_batches(const RoundDag& dag, const Batches& batches) {
    batches_ = &batches;
    // Each entry's first reader (order_rows' key 1) and its height (key 2), in
    // one pass over the round's edges, batch by batch from the last: a batch
    // runs after its nodes' arguments' batches, so an entry's users have all
    // been visited when its own turn comes, and its height is final. A batch
    // counts as a reader for the order unless it is a list op's (those
    // gather from several places anyway): known per batch (one op).
    ahead_.assign(dag.size(), PlanScratch::Ahead{0, kNone32});
    for (auto k = static_cast<uint32_t>(batches.size()); k-- > 0;) {
      const NodeId first = dag.node[batches[k][0]];
      const OpTraits* t = first != kNoNode ? &op_info(s_.op[first]).traits : nullptr;
      const uint32_t b = t == nullptr || !(t->stackable || t->segmented) ? k : kNone32;
      for (uint32_t u : batches[k]) {
        const uint32_t h = ahead_[u].height + 1;
        for (uint32_t a : dag.args_of(u)) {
          ahead_[a].height = std::max(ahead_[a].height, h);
          ahead_[a].reader = std::min(ahead_[a].reader, b);  // (kNone32: no change)
        }
      }
    }
  }

  void add_batch(const RoundDag& dag, std::span<const uint32_t> locals) {
    if (dag.region[locals[0]] != kNone32) return add_fused_batch(dag, locals);
    const NodeId first = dag.node[locals[0]];
    if (s_.op[first] == code_of<op::Lookup>)
      if (const uint32_t table = table_batch(s_, first); table != kNone32) return place_in_table(dag, locals, table);
    PlannedBatch b{};
    b.op = s_.op[first];
    b.shared = s_.has(first, NodeStore::kShared);
    b.out = base_ + static_cast<uint32_t>(rows_.size());
    b.n = static_cast<uint32_t>(locals.size());
    const uint64_t follow = order_rows(dag, locals);
    place_rows(b);
    if (b.op == code_of<op::Call>) place_results(b);
    plan_inputs(b, op_info(b.op).traits, follow);
    p_.batches.push_back(b);
  }

  void place_in_table(const RoundDag& dag, std::span<const uint32_t> locals, uint32_t table) {
    for (uint32_t l : locals) {
      const NodeId n = dag.node[l];
      s_.value_at[n] = {table, static_cast<uint32_t>(s_.payload[n])};
      p_.placed.push_back(n);
    }
  }

  // Whether a fused batch's rows feed two or more batches of one non-fused op
  // (a BiLSTM step's cell read by each direction's next projection): grouped
  // by reader, each reads its rows as a range, and the kernel reads its own
  // inputs in place whatever their order (backend/fused.h). Other readers (a
  // Tree-LSTM's parent cells, a parser's next state) keep the chain order:
  // grouping them cost more than it saved.
  bool parallel_readers(const RoundDag& dag, std::span<const uint32_t> locals) const {
    uint32_t first = kNone32;
    OpCode op = 0;
    bool two = false;
    for (uint32_t l : locals) {
      const uint32_t rb = ahead_[l].reader;
      if (rb == kNone32) continue;
      const uint32_t entry = (*batches_)[rb][0];
      if (dag.region[entry] != kNone32) return false;
      const OpCode o = s_.op[dag.node[entry]];
      if (first == kNone32) {
        first = rb;
        op = o;
      } else if (o != op) {
        return false;
      }
      two = two || rb != first;
    }
    return two;
  }

  // n regions of one pattern: rows ordered by reader where parallel_readers
  // says so, then by the path ahead and where each region's first per-example
  // input lives (order_rows' keys);
  // member k of row i is batch out + k, row i.
  void add_fused_batch(const RoundDag& dag, std::span<const uint32_t> locals) {
    const Region& first = fuser_->region(dag.region[locals[0]]);
    PlannedBatch b{};
    b.program = first.program;
    b.outputs = first.members_len;
    b.op = s_.op[fuser_->members(first).back()];
    b.shared = false;
    b.out = base_ + static_cast<uint32_t>(rows_.size());
    b.n = static_cast<uint32_t>(locals.size());
    const bool packed = first.packed;
    order_.clear();
    for (uint32_t l : locals) {
      const Region& r = fuser_->region(dag.region[l]);
      uint64_t key = fuser_->members(r)[0];
      bool fed = false;
      for (NodeId in : fuser_->inputs(r))
        if (!s_.has(in, NodeStore::kShared)) {
          key = (uint64_t{s_.value_at[in].batch} << 32) | s_.value_at[in].row;
          fed = true;
          break;
        }
      const uint32_t h = packed ? (fed ? 0 : length_of(fuser_->members(r)[0])) : ahead_[l].height;
      order_.push_back({first_key(ahead_[l].reader, h), key, dag.region[l]});
    }
    if (packed || !parallel_readers(dag, locals))
      for (RowKey& o : order_) o.first &= 0xffffffffu;  // reader 0, height (packed: length) kept
    sort_rows(order_, x_.sort);
    b.nodes_begin = static_cast<uint32_t>(p_.nodes.size());
    p_.nodes.resize(p_.nodes.size() + size_t{b.outputs} * b.n);
    NodeId* const at = p_.nodes.data() + b.nodes_begin;
    // Region by region: a region's members are neighbours in the store, so
    // their (batch, row) writes share cache lines (member-major order did not).
    // Packed, region i's rows follow region i-1's.
    uint32_t row = 0;
    for (uint32_t i = 0; i < b.n; ++i) {
      const std::span<const NodeId> members = fuser_->members(fuser_->region(order_[i].id));
      for (uint32_t k = 0; k < b.outputs; ++k) {
        const NodeId node = members[k];
        at[size_t{k} * b.n + i] = node;
        s_.value_at[node] = {b.out + k, packed ? row : i};
        if (packed) s_.flags[node] |= NodeStore::kPacked;
      }
      row += packed ? length_of(members[0]) : 1;
    }
    b.rows = packed ? row : 0;
    rows_.insert(rows_.end(), b.outputs, row);
    // A member's value leaves the kernel if any region of the batch needs it
    // outside, or if a later round read it in an earlier batch of this pattern.
    b.keep_begin = static_cast<uint32_t>(p_.keep.size());
    p_.keep.resize(p_.keep.size() + b.outputs, 0);
    const std::vector<uint8_t>& read_later = first.program->read_later;
    for (uint32_t k = 0; k < b.outputs; ++k) p_.keep[b.keep_begin + k] = read_later[k];
    for (uint32_t i = 0; i < b.n; ++i) {
      const std::span<const uint8_t> escapes = fuser_->escapes(fuser_->region(order_[i].id));
      for (uint32_t k = 0; k < b.outputs; ++k) p_.keep[b.keep_begin + k] |= escapes[k];
    }
    b.args_begin = static_cast<uint32_t>(p_.args.size());
    b.arity = first.inputs_len;
    for (uint32_t e = 0; e < b.arity; ++e) {
      const NodeId in0 = fuser_->inputs(first)[e];
      if (s_.has(in0, NodeStore::kShared)) {  // the pattern makes it the same node for all rows
        const uint32_t r = read(Read{s_.value_at[in0].batch, kWholeRow, 1});
        p_.args.push_back(BatchArg{BatchArg::kShared, r, r + 1});
        continue;
      }
      src_nodes_.clear();
      src_rows_.clear();
      for (uint32_t i = 0; i < b.n; ++i) {
        const Region& ri = fuser_->region(order_[i].id);
        src_nodes_.push_back(fuser_->inputs(ri)[e]);
        if (packed) src_rows_.push_back(length_of(fuser_->members(ri)[0]));
      }
      packed_rank_ = s_.shape_of(fuser_->members(first)[0]).rank();
      fill_sources(packed);
      add_input(in0);
    }
    b.payload = -1;  // (no fusible op reads one)
    p_.batches.push_back(b);
  }

  // After every batch is planned: slice batches that read the same batch whole,
  // in order, along one axis, with disjoint ranges, become one split.
  void group_slices() {
    slices_.clear();
    for (uint32_t k = 0; k < p_.batches.size(); ++k) {
      const PlannedBatch& b = p_.batches[k];
      if (b.op != code_of<op::Slice> || b.shared || b.program != nullptr) continue;
      const BatchArg& arg = p_.args[b.args_begin];
      const Read& r = p_.reads[arg.reads_begin];
      const NodeId node = p_.nodes[b.nodes_begin];
      auto attrs = s_.attrs_of(node);
      const int axis = s_.shape_of(node).axis(static_cast<int>(attrs[0]));  // a slice keeps the rank
      const int64_t tensor_axis = b.rows > 0 ? axis : axis + 1;
      if (arg.kind == BatchArg::kGather && arg.unpack == kNone32) {
        // Slices of one gathered input (the heads of Q, K and V packed
        // together): one gather, then one split, as slices of a batch.
        slices_.push_back(SliceRead{kGatheredSource | same_gather(k), tensor_axis, attrs[1], attrs[2], k, axis});
        continue;
      }
      if (arg.kind != BatchArg::kView || arg.unpack != kNone32 || r.flatten || r.index >= 0 || r.start != 0 ||
          r.len != rows(r.batch))
        continue;
      // The source's axis: per-example axis + 1, or the axis itself where both
      // are packed (rows end to end: the first per-example axis is the rows').
      slices_.push_back(SliceRead{r.batch, tensor_axis, attrs[1], attrs[2], k, axis});
    }
    // By source and axis, then by where each slice begins (then batch order).
    std::sort(slices_.begin(), slices_.end(), [](const SliceRead& a, const SliceRead& b) { return a.key() < b.key(); });
    for (size_t i = 0, j; i < slices_.size(); i = j) {
      for (j = i; j < slices_.size() && slices_[j].source == slices_[i].source && slices_[j].axis == slices_[i].axis;)
        ++j;
      const std::span<const SliceRead> members(slices_.data() + i, j - i);
      if (members.size() < 2) continue;
      bool disjoint = true;
      for (size_t q = 1; q < members.size(); ++q) disjoint = disjoint && members[q].begin >= members[q - 1].end;
      if (!disjoint) continue;
      const NodeId some_slice = p_.nodes[p_.batches[members[0].batch].nodes_begin];
      const int64_t extent = s_.shape_of(s_.resolve(s_.args_of(some_slice)[0]))[members[0].own_axis];
      SplitGroup g = open_split(members[0].source, members[0].axis);
      if (members[0].source & kGatheredSource) {
        g.batch = 0;
        g.gathered = static_cast<int32_t>(members[0].source & ~kGatheredSource);
      }
      int64_t at = 0;
      for (const SliceRead& m : members) {
        if (m.begin > at) add_piece(g, m.begin - at);  // a gap: a piece nobody reads
        p_.batches[m.batch].split = static_cast<int32_t>(p_.splits.size());
        p_.batches[m.batch].piece = add_piece(g, m.end - m.begin);
        at = m.end;
      }
      if (at < extent) add_piece(g, extent - at);
      p_.splits.push_back(g);
    }
  }

  // The first slice batch k0 <= k whose input reads exactly what batch k's does.
  uint32_t same_gather(uint32_t k) const {
    const BatchArg& a = p_.args[p_.batches[k].args_begin];
    for (const SliceRead& other : slices_) {
      if (!(other.source & kGatheredSource)) continue;
      const BatchArg& o = p_.args[p_.batches[other.batch].args_begin];
      if (o.perm >= 0 || a.perm >= 0 || o.reads_end - o.reads_begin != a.reads_end - a.reads_begin) continue;
      bool same = true;
      for (uint32_t q = 0; same && q < a.reads_end - a.reads_begin; ++q) {
        const Read& x = p_.reads[a.reads_begin + q];
        const Read& y = p_.reads[o.reads_begin + q];
        same = x.batch == y.batch && x.start == y.start && x.len == y.len && x.index < 0 && y.index < 0 &&
               x.flatten == y.flatten;
      }
      if (same) return other.source & ~kGatheredSource;
    }
    return k;
  }

  // After every batch is planned: a batch read partially by two or more inputs
  // gets one gather node for all those reads (see Read::group).
  void group_reads() {
    // (batch, read) of every partial read, sorted: work in proportion to the
    // round's reads, not to every batch the graph ever ran.
    // Sorted as words, batch << 32 | read: the reads ascend, so a radix sort
    // by batch alone orders them (sort_positioned), not a sort of pairs.
    Column<uint64_t>& words = x_.sort.words;  // (free: every batch's rows are sorted)
    words.clear();
    for (uint32_t r = 0; r < p_.reads.size(); ++r) {
      const Read& rd = p_.reads[r];
      if (rd.start == kWholeRow || rd.flatten) continue;  // (flattened: rows in other units than the batch's)
      if (rd.index < 0 && rd.start == 0 && rd.len == rows(rd.batch)) continue;  // the whole batch, in order
      words.push_back(uint64_t{rd.batch} << 32 | r);
    }
    sort_positioned(words, x_.sort.words_tmp);
    partial_.resize(words.size());
    for (size_t i = 0; i < words.size(); ++i)
      partial_[i] = {static_cast<uint32_t>(words[i] >> 32), static_cast<uint32_t>(words[i])};
    for (size_t i = 0, j; i < partial_.size(); i = j) {
      for (j = i; j < partial_.size() && partial_[j].first == partial_[i].first;) ++j;
      if (j - i < 2) continue;
      if (split_rows({partial_.data() + i, j - i})) continue;
      // Row ranges (two or more, disjoint) as one split, index reads grouped apart:
      // a recurrence's next steps read their rows as views although a list op
      // (a tagger's concat of both directions) reads every row by index.
      if (split_ranges(i, j)) continue;
      group(i, j);
    }
  }

 private:
  void group(size_t i, size_t j) {
    if (j - i < 2) return;
    for (size_t k = i; k < j; ++k) {
      p_.reads[partial_[k].second].group = static_cast<int32_t>(p_.groups.size());
      p_.reads[partial_[k].second].slot = static_cast<uint32_t>(k - i);
      p_.groups.nodes.push_back(partial_[k].second);
    }
    p_.groups.close();
  }
  // partial_[i, j): the range reads first, then the index reads; splits the ranges.
  bool split_ranges(size_t i, size_t j) {
    const auto mid = std::partition(partial_.begin() + static_cast<std::ptrdiff_t>(i),
                                    partial_.begin() + static_cast<std::ptrdiff_t>(j),
                                    [&](const auto& pr) { return p_.reads[pr.second].index < 0; });
    const auto m = static_cast<size_t>(mid - partial_.begin());
    if (m - i < 2 || !split_rows({partial_.data() + i, m - i})) return false;
    group(m, j);
    return true;
  }

  // Reads (batch, read) of one batch that are row ranges, disjoint: ONE split
  // of the batch serves them all, as views. False (nothing changed) otherwise.
  bool split_rows(std::span<const std::pair<uint32_t, uint32_t>> reads) {
    ranges_.clear();
    for (const auto& [batch, r] : reads) {
      const Read& rd = p_.reads[r];
      if (rd.index >= 0) return false;
      ranges_.emplace_back(rd.start, r);
    }
    std::sort(ranges_.begin(), ranges_.end());
    auto same = [&](size_t k) {  // two readers of the same rows share a piece
      return p_.reads[ranges_[k].second].start == p_.reads[ranges_[k - 1].second].start &&
             p_.reads[ranges_[k].second].len == p_.reads[ranges_[k - 1].second].len;
    };
    for (size_t k = 1; k < ranges_.size(); ++k)
      if (!same(k) && ranges_[k].first < ranges_[k - 1].first + p_.reads[ranges_[k - 1].second].len) return false;
    const uint32_t batch = reads[0].first;
    SplitGroup g = open_split(batch, 0);
    const auto split = static_cast<int32_t>(p_.splits.size());
    uint32_t at = 0;
    for (size_t k = 0; k < ranges_.size(); ++k) {
      const auto [start, r] = ranges_[k];
      p_.reads[r].split = split;
      if (k > 0 && same(k)) {
        p_.reads[r].slot = p_.reads[ranges_[k - 1].second].slot;
        continue;
      }
      if (start > at) add_piece(g, start - at);  // rows nobody reads here
      p_.reads[r].slot = add_piece(g, p_.reads[r].len);
      at = start + p_.reads[r].len;
    }
    if (at < rows(batch)) add_piece(g, rows(batch) - at);
    p_.splits.push_back(g);
    return true;
  }

  SplitGroup open_split(uint32_t batch, int64_t axis) const {
    return SplitGroup{batch, axis, static_cast<uint32_t>(p_.split_sizes.size()), 0};
  }
  // Appends a piece to g (the group being built: its sizes are the buffer's tail); its index.
  uint32_t add_piece(SplitGroup& g, int64_t size) {
    p_.split_sizes.push_back(size);
    return g.sizes_len++;
  }

  std::span<const NodeId> nodes_of(const PlannedBatch& b) const { return {p_.nodes.data() + b.nodes_begin, b.n}; }

  // Row order, by three keys:
  // 1. The batch of this round that first reads the row (not counting list
  //    ops, concat or sum of a list: they gather from several places anyway),
  //    when the rows have three or more such readers: each then finds its rows side by side (a
  //    range; disjoint ranges are views, see split_rows). This is the batch that
  //    projected every step's input of a recurrence at once, read by the steps.
  //    With fewer readers (a branch's two sides, one consumer) the next key
  //    wins more: it keeps the batch's input a view.
  // 2. The longest path still ahead of the row, longest first: chains that end
  //    early (short sentences) hold the last rows, so the rows that go on are a
  //    prefix and the next step reads them in place (hand-batched code sorts
  //    by length for the same reason).
  // 3. Where the first per-example argument lives, so that a batch fed by one
  //    earlier batch in the same order reads it as a view (chains stay zero-copy).
  // Fused batches (add_fused_batch) use key 1 only when their readers are two
  // or more batches of one non-fused op (parallel_readers).
  // A packed batch ignores the first reader and the path ahead: its values
  // follow their input (packed batches in a chain keep one order, each
  // reading the one before as a view, and a batch of several sources reads
  // each in order), and where they have none (lookups, inputs), go longest
  // first: batches that split by length further on (attention scores of each
  // length) then read ranges.
  // Returns where the rows' first per-example input starts (batch << 32 |
  // row) where the rows, in their order, read that batch's rows one after
  // another, none packed (kNoFollow otherwise, or where the sort did not
  // say: sort_rows): that input is then a view, found without a look at
  // each row again (plan_inputs).
  static constexpr uint64_t kNoFollow = ~uint64_t{0};
  uint64_t order_rows(const RoundDag& dag, std::span<const uint32_t> locals) {
    const bool packed = !locals.empty() && s_.has(dag.node[locals[0]], NodeStore::kRowwise) &&
                        !s_.has(dag.node[locals[0]], NodeStore::kShared);
    // Key 1 counts where the rows have three readers or more: looked for
    // first (most batches with that many show them within a few rows), so
    // that each key is written once, with or without its reader.
    bool by_reader = false;
    if (!packed) {
      uint32_t seen[2] = {kNone32, kNone32};
      for (uint32_t l : locals) {
        const uint32_t r = ahead_[l].reader;
        if (r == kNone32 || r == seen[0] || r == seen[1]) continue;
        if (seen[0] == kNone32) {
          seen[0] = r;
        } else if (seen[1] == kNone32) {
          seen[1] = r;
        } else {
          by_reader = true;
          break;
        }
      }
    }
    order_.resize(locals.size());
    RowKey* out = order_.data();
    bool all_fed = true, any_packed = false;
    for (uint32_t l : locals) {
      const NodeId node = dag.node[l];
      uint64_t key = node;
      bool fed = false;
      for (NodeId arg : s_.args_of(node)) {
        const NodeId a = s_.resolve(arg);
        const uint8_t flags = s_.flags[a];
        if (flags & NodeStore::kShared) continue;
        key = (uint64_t{s_.value_at[a].batch} << 32) | s_.value_at[a].row;
        fed = true;
        any_packed = any_packed || (flags & NodeStore::kPacked);
        break;
      }
      all_fed = all_fed && fed;
      const uint32_t h = packed ? (fed ? 0 : length_of(node)) : ahead_[l].height;
      // Without key 1: reader 0, height (packed: length) kept.
      *out++ = {by_reader ? first_key(ahead_[l].reader, h) : first_key(0, h), key, node};
    }
    const bool follow = sort_rows(order_, x_.sort);
    if (!follow || !all_fed || any_packed || packed) return kNoFollow;
    // (Rows t, t + 1, ... of one batch: none is whole, kWholeRow, if the last is not.)
    const uint64_t t = order_[0].then;
    return (t & 0xFFFFFFFFu) + (locals.size() - 1) < kWholeRow ? t : kNoFollow;
  }

  // Row i of the batch is order_[i]: the node's value lives there.
  // A packed batch (OpTraits::rowwise) puts node i's L rows after node i-1's.
  // Each row's payload, where the op reads one, goes to plan.indices in the
  // same pass (b.payload; else -1).
  void place_rows(PlannedBatch& b) {
    b.nodes_begin = static_cast<uint32_t>(p_.nodes.size());
    const bool packed = !b.shared && s_.has(order_[0].id, NodeStore::kRowwise);
    uint32_t at = 0;
    // Per-row buffers here are sized once and written by count: a push_back's
    // capacity check per row was a tenth of planning's instructions.
    p_.nodes.resize(p_.nodes.size() + b.n);
    NodeId* const rows = p_.nodes.data() + b.nodes_begin;
    const bool payloads = reads_payload(b.op);
    b.payload = payloads ? static_cast<int64_t>(p_.indices.size()) : -1;
    int64_t* const payload = payloads ? grow_indices(b.n) : nullptr;
    for (uint32_t i = 0; i < b.n; ++i) {
      const NodeId node = order_[i].id;
      rows[i] = node;
      if (payloads) payload[i] = s_.payload[node];
      s_.value_at[node] = {b.out, b.shared ? kWholeRow : packed ? at : i};
      if (packed) {
        s_.flags[node] |= NodeStore::kPacked;
        at += length_of(node);
      }
    }
    b.rows = at;
    rows_.push_back(b.shared ? 0 : packed ? at : b.n);
  }

  // A batch of function calls with K results: result k of row i is the node
  // recorded k after the call (a CallResult), in batch out + k, row i.
  void place_results(PlannedBatch& b) {
    b.outputs = static_cast<uint32_t>(s_.attrs_of(p_.nodes[b.nodes_begin])[1]);
    for (uint32_t k = 1; k < b.outputs; ++k) {
      for (uint32_t i = 0; i < b.n; ++i) {
        const NodeId call = p_.nodes[b.nodes_begin + i];
        const NodeId node = call + k;
        SHEAF_ASSERT(node < s_.size() && s_.op[node] == code_of<op::CallResult> && s_.args_of(node)[0] == call,
                     "result ", k, " of call %", call, " is not recorded right after it");
        p_.nodes.push_back(node);
        s_.value_at[node] = {b.out + k, b.shared ? kWholeRow : i};
      }
      rows_.push_back(b.shared ? 0 : b.n);
    }
  }

  void plan_inputs(PlannedBatch& b, const OpTraits& traits, uint64_t follow) {
    const std::span<const NodeId> nodes = nodes_of(b);
    const NodeId first = nodes[0];
    b.args_begin = static_cast<uint32_t>(p_.args.size());
    if (traits.segmented) {
      // The lists of all nodes, flattened in row order, are one input.
      b.segments = static_cast<int64_t>(p_.indices.size());
      size_t total = 0;
      for (NodeId node : nodes) total += s_.args_of(node).size();
      src_nodes_.resize(total);
      p_.indices.resize(p_.indices.size() + total);
      NodeId* elements = src_nodes_.data();
      int64_t* segment = p_.indices.data() + b.segments;
      NodeId like = kNoNode;
      for (uint32_t i = 0; i < b.n; ++i)
        for (NodeId a : s_.args_of(nodes[i])) {
          *elements++ = a;
          *segment++ = i;
          like = a;
        }
      b.total = static_cast<uint32_t>(total);
      // (Elements from many batches, a row each: a loss per tree node, summed per tree.)
      const bool placed = total > 0 && fill_places(std::span<const NodeId>(src_nodes_.data(), total));
      b.counts = static_cast<int64_t>(p_.indices.size());
      for (NodeId node : nodes) p_.indices.push_back(static_cast<int64_t>(s_.args_of(node).size()));
      b.arity = 1;
      if (placed && gather_places(places_.data(), 1, total, like)) return;
      fill_sources(false);
      add_input(like);
      return;
    }
    if (s_.has(first, NodeStore::kRowReduce)) {
      // A reduction of its arguments' rows (OpTraits::row_reduce): every
      // value's rows end to end are one input per argument, with each row's
      // node (segment ids) and each node's number of rows (counts), as a list
      // op's elements.
      b.arity = static_cast<uint32_t>(s_.args_of(first).size());
      add_segments(b, nodes, [&](NodeId node) { return length_of(s_.resolve(s_.args_of(node)[0])); });
      for (uint32_t k = 0; k < b.arity; ++k) {
        src_nodes_.clear();
        src_rows_.clear();
        for (NodeId node : nodes) {
          src_nodes_.push_back(s_.args_of(node)[k]);
          src_rows_.push_back(length_of(s_.resolve(src_nodes_.back())));
        }
        packed_rank_ = s_.shape_of(s_.resolve(src_nodes_[0])).rank();
        fill_sources(true);
        add_input(src_nodes_[0]);
      }
      return;
    }
    if (b.rows == 0 && stackable(first, traits)) {
      src_nodes_.clear();
      for (NodeId node : nodes)
        for (NodeId a : s_.args_of(node)) src_nodes_.push_back(a);
      fill_sources(false);
      b.arity = 1;
      b.stacked = true;
      add_input(s_.args_of(first)[0]);
      return;
    }
    b.arity = static_cast<uint32_t>(s_.args_of(first).size());
    // Two or more per-example arguments (a call's four): where each row's
    // arguments live, found row by row, one visit to each node's argument
    // list (not one per argument, each a pass over the rows that evicted the
    // lists the pass before read: fewer instructions, but more time).
    const bool by_row = b.rows == 0 && per_example_args(first) >= 2;
    if (by_row) place_args(nodes, b.arity);
    bool keyed = false;  // (the first per-example argument: order_rows' key)
    for (uint32_t k = 0; k < b.arity; ++k) {
      const NodeId a0 = s_.resolve(s_.args_of(first)[k]);
      if (s_.has(a0, NodeStore::kShared)) {  // the signature makes it the same node for all rows
        const uint32_t r = read(Read{s_.value_at[a0].batch, kWholeRow, 1});
        p_.args.push_back(BatchArg{BatchArg::kShared, r, r + 1});
        continue;
      }
      if (!std::exchange(keyed, true) && follow != kNoFollow && b.rows == 0) {  // rows in order: a view
        const uint32_t r = read(Read{static_cast<uint32_t>(follow >> 32), static_cast<uint32_t>(follow), b.n});
        p_.args.push_back(BatchArg{BatchArg::kView, r, r + 1});
        continue;
      }
      if (by_row && gather_places(places_.data() + k, b.arity, nodes.size(), a0)) continue;
      // A row per node, read from the nodes' argument lists directly: the
      // usual case (no value packed) needs no list of the values first.
      if (by_row ? fill_runs(nodes.size(),
                             [&](size_t i, NodeStore::Place& at) {
                               at = places_[i * b.arity + k];
                               return at.batch != kNone32;
                             })
                 : b.rows == 0 && fill_rows(nodes.size(), [&](size_t i) { return s_.args_of(nodes[i])[k]; })) {
        add_input(a0);
        continue;
      }
      src_nodes_.resize(nodes.size());
      for (size_t i = 0; i < nodes.size(); ++i) src_nodes_[i] = s_.args_of(nodes[i])[k];
      src_rows_.clear();
      if (b.rows > 0)
        for (NodeId node : nodes) src_rows_.push_back(length_of(node));
      packed_rank_ = rows_rank(s_, first, traits);
      fill_expanded(b.rows > 0);
      add_input(a0);
    }
    // Across the elements of packed vectors (softmax of scores), or each value
    // from its own rows (attention): which value each row is.
    if (b.rows > 0 && (traits.per_value || (traits.across_rows && s_.shape_of(first).rank() == 1)))
      add_segments(b, nodes, [&](NodeId node) { return length_of(node); });
    // Arguments with rows of their own number (attention's keys): theirs too.
    if (b.rows > 0 && traits.own_rows != 0) {
      uint32_t k = 0;
      while (k + 1 < b.arity && !traits.own_rows_arg(k)) ++k;
      b.own_counts = static_cast<int64_t>(p_.indices.size());
      for (NodeId node : nodes) p_.indices.push_back(length_of(s_.resolve(s_.args_of(node)[k])));
    }
  }

  uint32_t per_example_args(NodeId node) const {
    uint32_t n = 0;
    for (NodeId a : s_.args_of(node)) n += !s_.has(s_.resolve(a), NodeStore::kShared);
    return n;
  }
  // places_[i * arity + k]: where argument k of nodes[i] lives.
  void place_args(std::span<const NodeId> nodes, uint32_t arity) {
    places_.resize(nodes.size() * arity);
    NodeStore::Place* out = places_.data();
    for (NodeId node : nodes) {
      const std::span<const NodeId> args = s_.args_of(node);
      for (uint32_t k = 0; k < arity; ++k, ++out)
        if (!place_of(args[k], *out)) *out = NodeStore::Place{kNone32, 0};  // (packed: fill_rows' case)
    }
  }

  // Segment ids (each row's node: `length(node)` rows each) and counts.
  template <class Length>
  void add_segments(PlannedBatch& b, std::span<const NodeId> nodes, Length length) {
    b.segments = static_cast<int64_t>(p_.indices.size());
    uint32_t total = 0;
    for (uint32_t i = 0; i < b.n; ++i) {
      const uint32_t len = length(nodes[i]);
      p_.indices.insert(p_.indices.end(), len, static_cast<int64_t>(i));
      total += len;
    }
    b.total = total;
    b.counts = static_cast<int64_t>(p_.indices.size());
    for (uint32_t i = 0; i < b.n; ++i) p_.indices.push_back(length(nodes[i]));
  }

  // Every argument per-example with one shape (the signature makes it so for all rows).
  bool stackable(NodeId first, const OpTraits& traits) const {
    auto args = s_.args_of(first);
    if (!traits.stackable || args.size() < 2) return false;
    for (NodeId a : args)
      if (s_.has(s_.resolve(a), NodeStore::kShared) || s_.shape[a] != s_.shape[args[0]]) return false;
    return true;
  }
  // runs_ from the values src_nodes_: a row each, or, where the batch is
  // packed (`packed`) or a value is (kPacked), each value's rows (its length
  // L of them): rows of a packed batch in place, rows of a row of another
  // batch through a flattened read; the batch's input is then unpacked to
  // [-1, shape...] unless the batch itself is packed. A value whose rows
  // follow the run before it joins that run.
  void fill_sources(bool packed) {
    SHEAF_ASSERT(!packed || src_rows_.size() == src_nodes_.size(), "a packed batch's inputs without their lengths");
    if (!packed && fill_rows(src_nodes_.size(), [&](size_t i) { return src_nodes_[i]; })) return;
    fill_expanded(packed);
  }
  // The usual case, no value packed: runs_ of a row each from the n values
  // value(0 .. n-1), written by count (at most a run a value). False, with
  // runs_ empty, at the first packed value: fill_expanded's case.
  template <class Value>
  bool fill_rows(size_t n, Value value) {
    return fill_runs(n, [&](size_t i, NodeStore::Place& at) { return place_of(value(i), at); });
  }
  // places_[i]: where values[i] lives; false where one is packed.
  bool fill_places(std::span<const NodeId> values) {
    places_.resize(values.size());
    NodeStore::Place* at = places_.data();
    for (NodeId v : values)
      if (!place_of(v, *at++)) return false;
    return true;
  }
  // Where a value lives, into `at`; false (`at` unchanged) where it is packed.
  bool place_of(NodeId value, NodeStore::Place& at) const {
    const NodeId r = s_.resolve(value);
    if (s_.has(r, NodeStore::kPacked)) return false;
    at = s_.value_at[r];
    return true;
  }
  // fill_rows from where each row's value lives: place(i, at) sets it, or
  // returns false where the value is packed.
  template <class Place>
  bool fill_runs(size_t n, Place place) {
    unpack_ = kNone32;
    whole_ = false;
    runs_.resize(n);
    Run* const out = runs_.data();
    size_t k = 0;
    uint32_t next_batch = kNone32, next_row = 0;  // what would extend the last run
    for (size_t i = 0; i < n; ++i) {
      NodeStore::Place at;
      if (!place(i, at)) [[unlikely]] {
        runs_.clear();
        whole_ = false;
        return false;
      }
      const auto [batch, row] = at;
      if (batch == next_batch && row == next_row) {
        ++out[k - 1].len;
      } else {
        out[k++] = Run{batch, row, 1, false, false};
        whole_ = whole_ || row == kWholeRow;
        next_batch = row == kWholeRow ? kNone32 : batch;  // a whole tensor is a run of its own
      }
      next_row = row + 1;
    }
    runs_.resize(k);
    expanded_ = false;
    rows_in_ = static_cast<uint32_t>(n);
    return true;
  }
  // fill_sources where the batch or a value is packed (src_nodes_; with
  // src_rows_ where `packed`).
  void fill_expanded(bool packed) {
    runs_.clear();
    unpack_ = kNone32;
    whole_ = false;
    expanded_ = true;
    rows_in_ = 0;
    if (!packed && !src_nodes_.empty()) unpack_ = s_.shape[s_.resolve(src_nodes_[0])];
    if (one_range()) return;
    for (size_t i = 0; i < src_nodes_.size(); ++i) {
      const NodeId r = s_.resolve(src_nodes_[i]);
      const uint32_t batch = s_.value_at[r].batch, row = s_.value_at[r].row;
      if (row == kWholeRow) {  // a shared value in a list: all its rows
        whole_ = true;
        add_run(Run{batch, kWholeRow, 1, true, false});
        continue;
      }
      if (packed && s_.shape_of(r).rank() < packed_rank_) {  // one row's shape: repeated on each row
        add_run(Run{batch, row, src_rows_[i], false, src_rows_[i] > 1});
        continue;
      }
      const uint32_t len = length_of(r);
      const bool in_place = s_.has(r, NodeStore::kPacked);
      add_run(Run{batch, in_place ? row : row * len, len, !in_place, false});
    }
  }
  void add_run(const Run& r) {
    if (r.len == 0) return;
    rows_in_ += r.len;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (!r.repeat && !last.repeat && last.row != kWholeRow && r.row != kWholeRow && last.batch == r.batch &&
          last.flatten == r.flatten && last.row + last.len == r.row) {
        last.len += r.len;
        return;
      }
    }
    runs_.push_back(r);
  }
  // Whether the values' rows are one range of one packed batch, in order (a
  // packed batch reading the one before it): then that range is the one run,
  // found without looking at the values' shapes.
  bool one_range() {
    uint32_t batch = kNone32, next = 0, first = 0;
    for (NodeId a : src_nodes_) {
      const NodeId r = s_.resolve(a);
      if (!s_.has(r, NodeStore::kPacked)) return false;
      if (batch == kNone32) {
        batch = s_.value_at[r].batch;
        first = next = s_.value_at[r].row;
      } else if (s_.value_at[r].batch != batch || s_.value_at[r].row != next) {
        return false;
      }
      next += length_of(r);
    }
    if (batch == kNone32) return false;
    runs_.push_back(Run{batch, first, next - first, false, false});
    rows_in_ = next - first;
    return true;
  }
  uint32_t length_of(NodeId n) const { return static_cast<uint32_t>(s_.shape_of(n)[0]); }
  uint32_t rows(uint32_t batch) const {
    return batch >= base_ ? rows_[batch - base_] : s_.batch_rows[batch];
  }
  uint32_t read(Read r) {
    p_.reads.push_back(r);
    return static_cast<uint32_t>(p_.reads.size() - 1);
  }

  // Plans one batched input from the runs of its rows (fill_sources): one read
  // when they are one run, else one read per source batch (a range or an index
  // list), concatenated, then permuted into row order if the sources interleave.
  // A row kWholeRow is a shared value (only in the list of a shared sum).
  // `like`: a node whose shape every row has (for the bytes a gather copies;
  // kNoNode: no rows).
  void add_input(NodeId like) {
    BatchArg arg{BatchArg::kGather, static_cast<uint32_t>(p_.reads.size()), 0};
    arg.unpack = unpack_;
    if (runs_.size() == 1 && !whole_ && !runs_[0].repeat) {
      arg.kind = BatchArg::kView;
      Read r{runs_[0].batch, runs_[0].row, runs_[0].len};
      r.flatten = runs_[0].flatten;
      read(r);
    } else if (whole_) {
      for (const Run& run : runs_)
        for (uint32_t t = 0; t < run.len; ++t) {
          Read r{run.batch, run.row == kWholeRow || run.repeat ? run.row : run.row + t, 1};
          r.flatten = run.flatten;
          read(r);
        }
    } else {
      read_by_source(arg);
      ++p_.gathers;
      if (like != kNoNode) {
        const Shape& shape = s_.shape_of(s_.resolve(like));
        const int64_t per_row = expanded_ && shape.rank() > 0 && shape[0] > 0 ? shape.numel() / shape[0] : shape.numel();
        p_.gathered_bytes += rows_in_ * static_cast<uint64_t>(per_row) * sizeof(float);
      }
    }
    arg.reads_end = static_cast<uint32_t>(p_.reads.size());
    p_.args.push_back(arg);
  }

  // Rows at places at[0], at[stride], ... (n of them), each a row of a
  // batch: the input add_input plans from fill_runs' runs of them, planned
  // row by row. A gather's runs are mostly a row long (a call's arguments
  // other than the one its rows are sorted by): the runs, written and then
  // read twice, cost more than the rows. False, with nothing planned, where
  // a value is packed (at.batch kNone32) or whole (kWholeRow): fill_runs'
  // and fill_expanded's cases.
  bool gather_places(const NodeStore::Place* at, uint32_t stride, size_t n, NodeId like) {
    srcs_.clear();
    size_slots();
    // Per row: its source's slot (sources in order of first appearance),
    // and whether each source's rows follow one another, and whether the
    // sources come one after another.
    bool ok = true, in_order = true;
    uint32_t last = 0;
    for (size_t i = 0; i < n; ++i) {
      const NodeStore::Place p = at[i * stride];
      if (p.batch == kNone32 || p.row == kWholeRow) [[unlikely]] {
        ok = false;
        break;
      }
      if (src_stamp_[p.batch] != stamp_) {
        src_stamp_[p.batch] = stamp_;
        src_slot_[p.batch] = static_cast<uint32_t>(srcs_.size());
        srcs_.push_back(Source{p.batch, p.row, p.row, 0, 0, true, false});
      }
      const uint32_t k = src_slot_[p.batch];
      in_order = in_order && k >= last;
      last = k;
      Source& src = srcs_[k];
      ++src.rows;
      src.consecutive = src.consecutive && p.row == src.next;
      src.next = p.row + 1;
    }
    next_stamp();  // (src_slot_ stays as it is: the pass below reads it)
    if (!ok) return false;
    BatchArg arg{BatchArg::kGather, static_cast<uint32_t>(p_.reads.size()), 0};
    if (srcs_.size() == 1 && srcs_[0].consecutive) {  // one run: a view
      arg.kind = BatchArg::kView;
      read(Read{srcs_[0].batch, srcs_[0].first, srcs_[0].rows});
    } else {
      int64_t* pos = plan_sources(in_order, arg);
      for (size_t i = 0; i < n; ++i) {
        const NodeStore::Place p = at[i * stride];
        Source& src = srcs_[src_slot_[p.batch]];
        if (pos != nullptr) pos[i] = src.at++;
        if (src.index != kNoIndex) p_.indices[static_cast<size_t>(src.index++)] = p.row;
      }
      ++p_.gathers;
      p_.gathered_bytes += n * static_cast<uint64_t>(s_.shape_of(s_.resolve(like)).numel()) * sizeof(float);
    }
    arg.reads_end = static_cast<uint32_t>(p_.reads.size());
    p_.args.push_back(arg);
    return true;
  }

  // One read per source batch, in the order sources first appear; rows of a
  // source keep their order. A counting sort of the runs by source: linear in
  // the runs, whatever the number of sources (a loss over every tree level
  // reads dozens); rows are written one by one only as indices.
  void read_by_source(BatchArg& arg) {
    srcs_.clear();
    const size_t runs = runs_.size();
    slot_.resize(runs);
    size_slots();
    // Each run's source; per source its rows, and whether its runs follow
    // one another (then its read is a range). The rows are in order when
    // each source's runs come together (sources take slots as they first
    // appear: a run never goes back to an earlier one).
    bool in_order = true;
    uint32_t last = 0;
    for (size_t j = 0; j < runs; ++j) {
      const Run& run = runs_[j];
      const uint32_t b = run.batch;
      if (src_stamp_[b] != stamp_) {
        src_stamp_[b] = stamp_;
        src_slot_[b] = static_cast<uint32_t>(srcs_.size());
        // (flatten: the same for every row of one batch)
        srcs_.push_back(Source{b, run.row, run.row, 0, 0, true, run.flatten});
      }
      const uint32_t k = src_slot_[b];
      slot_[j] = k;
      in_order = in_order && k >= last;
      last = k;
      Source& src = srcs_[k];
      src.rows += run.len;
      src.consecutive = src.consecutive && !run.repeat && run.row == src.next;
      src.next = run.row + run.len;
    }
    next_stamp();
    int64_t* pos = plan_sources(in_order, arg);
    // Every run's place (into the permutation, out of order), and its row
    // numbers where its source needs them: one pass.
    for (size_t j = 0; j < runs; ++j) {
      const Run& run = runs_[j];
      Source& src = srcs_[slot_[j]];
      if (pos != nullptr) {
        pos[0] = src.at;
        for (uint32_t t = 1; t < run.len; ++t) pos[t] = src.at + t;
        pos += run.len;
      }
      src.at += run.len;
      if (src.index == kNoIndex) continue;
      // (The first row apart: most runs of a gather are a row long.)
      int64_t* index = p_.indices.data() + src.index;
      index[0] = run.row;
      for (uint32_t t = 1; t < run.len; ++t) index[t] = run.row + (run.repeat ? 0 : t);
      src.index += run.len;
    }
  }
  // Rows are read from batches planned before this one (earlier rounds',
  // or this round's, in order: every argument's batch comes first), so a
  // slot for each batch up to the last planned covers every run. Sized
  // once an input: a check per run cost 8 instructions a node.
  void size_slots() {
    if (const size_t batches = base_ + rows_.size(); src_slot_.size() < batches) {
      src_slot_.resize(batches, kNone32);
      src_stamp_.resize(batches, 0);
    }
  }
  void next_stamp() {
    if (++stamp_ == 0) {  // wrapped: forget every old stamp
      std::fill(src_stamp_.begin(), src_stamp_.end(), 0);
      stamp_ = 1;
    }
  }
  // The reads of srcs_, one each: `at` becomes where each source's rows
  // start, `index` where its row numbers go (kNoIndex: a range needs none).
  // Where the sources interleave (not `in_order`), the permutation's
  // entries follow, to be written: returned (else nullptr).
  int64_t* plan_sources(bool in_order, BatchArg& arg) {
    uint32_t rows = 0;
    for (Source& src : srcs_) {
      src.at = rows;
      rows += src.rows;
      src.index = src.consecutive ? kNoIndex : static_cast<int64_t>(p_.indices.size());
      Read r = src.consecutive ? Read{src.batch, src.first, src.rows} : Read{src.batch, 0, src.rows, src.index};
      r.flatten = src.flatten;
      read(r);
      if (!src.consecutive) grow_indices(src.rows);
    }
    if (in_order) return nullptr;
    arg.perm = static_cast<int64_t>(p_.indices.size());
    return grow_indices(rows);
  }
  // n more entries at the end of plan.indices, to be written in full.
  int64_t* grow_indices(size_t n) {
    p_.indices.resize(p_.indices.size() + n);
    return p_.indices.data() + p_.indices.size() - n;
  }

  NodeStore& s_;
  Plan& p_;
  const Batches* batches_ = nullptr;
  const Fuser* fuser_;
  uint32_t base_;
  PlanScratch& x_ = t_scratch;
  std::vector<uint32_t>& rows_ = x_.rows;
  Column<RowKey>& order_ = x_.order;
  std::vector<PlanScratch::Ahead>& ahead_ = x_.ahead;
  Column<Run>& runs_ = x_.runs;
  Column<NodeId>& src_nodes_ = x_.src_nodes;
  Column<NodeStore::Place>& places_ = x_.places;
  std::vector<uint32_t>& src_rows_ = x_.src_rows;  // packed: each source's reader's length
  int packed_rank_ = 0;                            // packed: the reader's rank
  // fill_sources' verdict for add_input: how to view the rows, whether they
  // are each a value's rows (expanded_), how many, and whether any is a whole
  // shared value.
  uint32_t unpack_ = kNone32;
  bool expanded_ = false, whole_ = false;
  uint32_t rows_in_ = 0;
  std::vector<Source>& srcs_ = x_.srcs;
  std::vector<std::pair<uint32_t, uint32_t>>& partial_ = x_.partial;
  std::vector<SliceRead>& slices_ = x_.slices;
  std::vector<std::pair<uint32_t, uint32_t>>& ranges_ = x_.ranges;
  Column<uint32_t>& slot_ = x_.slot;
  std::vector<uint32_t>& src_slot_ = x_.src_slot;
  std::vector<uint32_t>& src_stamp_ = x_.src_stamp;
  uint32_t& stamp_ = x_.stamp;
};

}  // namespace

// Readers take a lookup's row from the table itself, gathered or in place as
// any row of a batch: no launch, and no copy of the rows that a gather then
// copies again. With a gradient the lookup runs: its backward gives the table
// the gradient it asked for (sparse when asked), where reads of the table
// itself would go through a gather's hub, a dense buffer the table's size.
uint32_t table_batch(const NodeStore& s, NodeId lookup) {
  if (s.has(lookup, NodeStore::kShared)) return kNone32;  // a shared value is its batch's whole value
  const NodeId t = s.resolve(s.args_of(lookup)[0]);
  if (!s.has(t, NodeStore::kComputed) || s.value_at[t].row != kWholeRow) return kNone32;
  const at::Tensor& table = s.batch_out[s.value_at[t].batch];
  if (!table.defined() || (table.requires_grad() && c10::GradMode::is_enabled())) return kNone32;
  return s.value_at[t].batch;
}

void make_plan(NodeStore& store, const RoundDag& dag, const Batches& batches, std::string_view strategy, Plan& plan,
               const Fuser* fuser) {
  plan.strategy = strategy;
  plan.batches.clear();
  plan.nodes.clear();
  plan.args.clear();
  plan.reads.clear();
  plan.groups.clear();
  plan.splits.clear();
  plan.split_sizes.clear();
  plan.indices.clear();
  plan.keep.clear();
  plan.placed.clear();
  plan.grad = c10::GradMode::is_enabled();
  plan.base = static_cast<uint32_t>(store.batch_out.size());
  plan.gathered_bytes = 0;
  plan.gathers = 0;
  plan.nodes.reserve(dag.size());
  plan.indices.reserve(3 * dag.size());  // payloads, and gathers for some inputs
  plan.args.reserve(2 * batches.size());
  plan.reads.reserve(3 * batches.size());
  Planner planner(store, plan, fuser);
  planner.index_batches(dag, batches);
  for (size_t k = 0; k < batches.size(); ++k) planner.add_batch(dag, batches[k]);
  planner.group_slices();
  planner.group_reads();
}

std::string Plan::str() const {
  std::ostringstream os;
  os << "plan (" << strategy << "): " << batches.size() << " batches, " << nodes.size() << " nodes, " << groups.size()
     << " gather groups, " << splits.size() << " splits\n";
  if (!placed.empty())
    os << "  " << placed.size() << " lookup(s) read from their tables, not launched\n";
  for (const PlannedBatch& b : batches) {
    os << "  b" << b.out;
    if (b.outputs > 1) os << "..b" << b.out + b.outputs - 1;
    if (b.program) os << " = " << b.program->str() << " x" << b.n;
    else os << " = " << op_info(b.op).name << " x" << b.n;
    if (b.shared) os << " (shared)";
    if (b.segments >= 0) os << " (" << b.total << " list elements)";
    if (b.stacked) os << " (stacked)";
    if (b.rows > 0) os << " (packed: " << b.rows << " rows)";
    if (b.split >= 0) os << " (split #" << b.split << ")";
    os << " [nodes %" << nodes[b.nodes_begin] << (b.n > 1 ? ".." : "") << "] <-";
    for (uint32_t k = 0; k < b.arity; ++k) {
      const BatchArg& a = args[b.args_begin + k];
      os << (k ? ", " : " ");
      if (a.kind == BatchArg::kShared) {
        os << "shared b" << reads[a.reads_begin].batch;
        continue;
      }
      os << (a.kind == BatchArg::kView ? "view " : "gather(");
      for (uint32_t q = a.reads_begin; q < a.reads_end; ++q) {
        const Read& r = reads[q];
        os << (q > a.reads_begin ? " + " : "") << "b" << r.batch;
        if (r.index >= 0) os << "{" << r.len << " rows}";
        else if (r.start != kWholeRow) os << "[" << r.start << ":" << r.start + r.len << "]";
        if (r.flatten) os << " (flattened)";
        if (r.group >= 0) os << "#" << r.group;
        if (r.split >= 0) os << " (split #" << r.split << ")";
      }
      if (a.kind == BatchArg::kGather) os << (a.perm >= 0 ? ", permuted)" : ")");
      if (a.unpack != kNone32) os << " (rows unpacked)";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace sheaf
