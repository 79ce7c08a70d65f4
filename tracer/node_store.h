// The graph store: one flat struct-of-arrays per graph. Recording a node
// writes a handful of columns by count; no per-node heap object. The
// scheduler and backend read these arrays directly.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <source_location>
#include <span>
#include <utility>
#include <vector>

#include <sheaf/core/column.h>
#include <sheaf/core/flat_index.h>
#include <sheaf/core/ids.h>
#include <sheaf/core/shape.h>

namespace sheaf {

// Interned shapes: nodes store a ShapeId; equal shapes have equal ids.
class ShapeTable {
 public:
  ShapeId intern(const Shape& s) {
    // A model uses a handful of shapes over and over: look at the recent ones first.
    for (ShapeId id : recent_)
      if (id != kUnknownShape && shapes_[id] == s) return id;
    ShapeId id = intern_slow(s);
    recent_[next_++ % recent_.size()] = id;
    return id;
  }
  const Shape& operator[](ShapeId id) const { return shapes_[id]; }
  size_t size() const { return shapes_.size(); }
  // The id of shape id's row (Shape::row), remembered: packed nodes ask per node.
  ShapeId row(ShapeId id) {
    if (id >= rows_.size()) rows_.resize(shapes_.size(), kUnknownShape);
    if (rows_[id] == kUnknownShape) rows_[id] = intern(shapes_[id].row());
    return rows_[id];
  }

 private:
  ShapeId intern_slow(const Shape& s);
  std::vector<Shape> shapes_;
  std::vector<ShapeId> rows_;  // by ShapeId: its row's id, or kUnknownShape until asked
  FlatIndex index_;
  std::array<ShapeId, 8> recent_{kUnknownShape, kUnknownShape, kUnknownShape, kUnknownShape,
                                 kUnknownShape, kUnknownShape, kUnknownShape, kUnknownShape};
  size_t next_ = 0;
};

// Signatures: two nodes may share a batched launch iff their signature ids are
// equal. Key = op, output shape, attributes, arity (unless segmented), and per
// argument either the identity of a shared input or the per-example input shape.
class SigTable {
 public:
  SigId intern(std::span<const int64_t> key);
  size_t size() const { return begin_.size(); }
  void clear();

 private:
  std::vector<int64_t> keys_;
  std::vector<uint32_t> begin_, len_;
  FlatIndex index_;
};

struct NodeStore {
  enum Flag : uint8_t {
    kShared = 1,       // one value for all examples (a parameter, or an op on parameters only)
    kComputed = 2,
    kPlaceholder = 4,  // result of dsl::cond/loop; alias[] says what it became, once known
    kFailed = 8,       // its launch failed: never retried (what depends on it never runs)
    kRowwise = 16,     // its signature batches it by rows (OpTraits::rowwise): lengths may differ
    kPacked = 32,      // its value is shape[0] rows of its batch from value_at's row (a packed batch)
    kRowReduce = 64,   // its signature batches it by its argument's rows (OpTraits::row_reduce)
  };

  // Per-node columns, sized to the capacity (size() nodes are valid; the rest
  // unwritten): append() writes a node with one capacity check for all of
  // them (the lists below have their own).
  Column<OpCode> op;
  Column<ShapeId> shape;
  // CSR lists: node n's are [begin[n], begin[n + 1]). The lists' buffers
  // only grow (their size is a capacity, the lists end at begin[size()]):
  // append() writes by count, with one capacity check a list.
  Column<uint32_t> arg_begin{0};   // (size() + 1 valid)
  Column<NodeId> args;
  Column<uint32_t> attr_begin{0};  // (part of the signature)
  Column<int64_t> attrs;
  Column<int64_t> payload;  // per-example data: an id, a label, a key (not in the signature)
  Column<int64_t> example;  // the user's example id, or kSharedExample / kMixedExample
  std::vector<std::source_location> loc;
  Column<SigId> sig;
  Column<uint8_t> flags;
  Column<NodeId> alias;  // placeholders: the node they resolved to, else kNoNode
  // Where the value lives once computed: row `row` of batch value `batch`
  // (kWholeRow: the whole tensor). One column for both: whoever reads one
  // reads the other, and the planner reads them for nodes scattered by id.
  struct Place {
    uint32_t batch, row;
  };
  Column<Place> value_at;

  // Values: one tensor per executed batch; node values are rows of these. A
  // tensor may be left undefined until read (backend/lazy.h): batch_rows says
  // how many rows it has all the same (the size of its first axis when defined;
  // `unmade_rows` otherwise).
  std::vector<at::Tensor> batch_out;
  std::vector<uint32_t> batch_rows;
  void push_batch(at::Tensor t, int64_t unmade_rows) {
    const int64_t rows = !t.defined() ? unmade_rows : t.dim() > 0 ? t.size(0) : 0;
    batch_rows.push_back(static_cast<uint32_t>(rows));
    batch_out.push_back(std::move(t));
  }
  std::vector<at::Tensor> user_tensors;  // inputs and parameters the user handed in
  ShapeTable shapes;
  SigTable sigs;

  size_t size() const { return size_; }
  // A node's arguments or attributes: a few of each, copied by count in line
  // (a range copy is an out-of-line call and a memmove per node; a loop's
  // test per element cost more than the jump to the count's case).
  template <class T>
  [[gnu::always_inline]] static void copy_few(T* to, std::span<const T> from) {
    if (from.empty()) return;  // (most ops have no attributes: a test, not the jump)
    switch (from.size()) {
      case 4: to[3] = from[3]; [[fallthrough]];
      case 3: to[2] = from[2]; [[fallthrough]];
      case 2: to[1] = from[1]; [[fallthrough]];
      case 1: to[0] = from[0]; [[fallthrough]];
      case 0: return;  // (where the cases end: an empty list returned above)
      default:
        for (size_t i = 0; i < from.size(); ++i) to[i] = from[i];
    }
  }
  // A new node with the given fields (its signature, if known, too); a
  // placeholder starts with no alias. Its arguments and attributes are
  // appended to the CSR lists. Only what is read before it is written
  // again is written here: alias is read only for placeholders, value_at
  // only once the node is placed or computed (stores are much of a node's
  // recording: a dozen columns each).
  [[gnu::always_inline]] NodeId append(OpCode o, ShapeId sh, std::span<const NodeId> a, std::span<const int64_t> at,
                                       int64_t pay, int64_t ex, std::source_location where, uint8_t fl,
                                       SigId sg = kNoSig) {
    const auto n = static_cast<NodeId>(size_);
    if (size_ == capacity_) grow();
    op[n] = o;
    shape[n] = sh;
    const uint32_t a0 = arg_begin[n], t0 = attr_begin[n];
    if (a0 + a.size() > args.size() || t0 + at.size() > attrs.size()) grow_lists(a.size(), at.size());
    copy_few(args.data() + a0, a);
    arg_begin[n + 1] = a0 + static_cast<uint32_t>(a.size());
    copy_few(attrs.data() + t0, at);
    attr_begin[n + 1] = t0 + static_cast<uint32_t>(at.size());
    payload[n] = pay;
    example[n] = ex;
    loc[n] = where;
    sig[n] = sg;
    flags[n] = fl;
    if (fl & kPlaceholder) alias[n] = kNoNode;
    ++size_;
    return n;
  }
  std::span<const NodeId> args_of(NodeId n) const {
    return {args.data() + arg_begin[n], args.data() + arg_begin[n + 1]};
  }
  std::span<const int64_t> attrs_of(NodeId n) const {
    return {attrs.data() + attr_begin[n], attrs.data() + attr_begin[n + 1]};
  }
  bool has(NodeId n, Flag f) const { return (flags[n] & f) != 0; }
  // Follows resolved placeholders to the node that holds the value.
  NodeId resolve(NodeId n) const {
    while (has(n, kPlaceholder) && alias[n] != kNoNode) n = alias[n];
    return n;
  }
  const Shape& shape_of(NodeId n) const { return shapes[shape[n]]; }
  void clear();  // keeps capacity: a graph cleared per batch does not reallocate

 private:
  void grow();
  void grow_lists(size_t more_args, size_t more_attrs);  // room for one more node's lists
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace sheaf
