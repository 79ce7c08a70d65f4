#include "trace.h"

#include <algorithm>
#include <array>
#include <sstream>

#include <ATen/ops/empty.h>

#include <sheaf/core/hash.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

namespace sheaf {

namespace {

// Leaves carry their shape as attributes: rank, dims...
// A leaf's attributes (rank, then sizes), on the stack: one per input, so no allocation.
struct ShapeAttrs {
  std::array<int64_t, 1 + kMaxRank> a{};
  size_t n = 0;
  explicit ShapeAttrs(const at::Tensor& t) {  // the caller has checked the rank
    a[n++] = t.dim();
    for (int64_t d : t.sizes()) a[n++] = d;
  }
  std::span<const int64_t> span() const { return {a.data(), n}; }
};

// A placeholder whose shape was given up front (a dsl::loop's state, a
// dsl::cond's declared shape) bound to a value of another shape.
std::string declared_mismatch(const Shape& got, const Shape& want) {
  return "the value it became has shape " + got.str() + " but a shape of " + want.str() +
         " was declared (a dsl::loop body must keep its state's shapes; a dsl::cond with a declared shape must "
         "return it from both branches)";
}

// A sparse (or other non-strided) tensor would be taken here and fail in the
// first batched op that reads it, with LibTorch's list of backends.
std::string not_dense(const at::Tensor& t) {
  std::ostringstream os;
  os << "the tensor's layout is " << t.layout() << "; sheaf reads dense (strided) tensors: pass .to_dense()";
  return os.str();
}

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

// ---------------------------------------------------------------------------
// Recording.

NodeId Trace::record_any(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                         std::source_location loc) {
  const OpInfo& info = op_info(op);
  if (info.traits.arity != OpTraits::kVariadic && args.size() != static_cast<size_t>(info.traits.arity))
    throw_internal("op ", info.name, " recorded with ", args.size(), " arguments, expects ", info.traits.arity);
  // The key of what this node's shape and signature depend on; empty when
  // too long to keep (or unknown shapes: inferred later). Its words for the
  // arguments are written in the same pass that checks their shapes are known.
  RecordKey key;
  const bool keyed = RecordKey::kHead + args.size() + attrs.size() <= key.words.size();
  bool unknown = false;
  int64_t example = kSharedExample;
  for (size_t i = 0; i < args.size(); ++i) {
    const NodeId a = args[i];
    const bool is_shared = s_.has(a, NodeStore::kShared);
    const ShapeId sh = s_.shape[a];
    unknown = unknown || sh == kUnknownShape;
    // (Whether a per-example argument is packed, or a placeholder that may
    // become packed, decides whether this node packs: Trace::by_rows.)
    if (keyed) key.words[RecordKey::kHead + i] = key_word(a, is_shared, sh);
    if (is_shared) {
      if (a < param_uses_.size()) ++param_uses_[a];
      continue;
    }
    const int64_t e = s_.example[a];
    example = example == kSharedExample || example == e ? e : kMixedExample;
  }
  if (info.traits.source) example = current_example_;
  const bool is_shared = example == kSharedExample;
  // An index payload is checked against its range, not keyed: a lookup per
  // word, a label per example would otherwise each infer anew.
  const bool index_payload = info.traits.payload_index;
  if (unknown || !keyed) [[unlikely]]
    return record_miss(op, args, attrs, payload, loc, example, unknown, nullptr);
  key.words[0] = op;
  key.words[1] = index_payload ? 0 : payload;
  key.words[2] = static_cast<int64_t>(args.size()) << 1 | is_shared;
  std::copy(attrs.begin(), attrs.end(), key.words.begin() + static_cast<std::ptrdiff_t>(RecordKey::kHead + args.size()));
  key.len = RecordKey::kHead + args.size() + attrs.size();
  const LastRecord* hit = nullptr;
  for (const LastRecord& w : last_record_[op % last_record_.size()])
    if (same_key(w, key) && (!index_payload || (payload >= 0 && payload < w.bound))) {
      hit = &w;
      break;
    }
  // A miss (a new kind of node: a few per model) infers, interns and signs
  // out of line.
  if (hit == nullptr) [[unlikely]]
    return record_miss(op, args, attrs, payload, loc, example, false, &key);
  // The same inputs passed the same checks. From here on nothing throws.
  if (info.traits.keyed && example >= 0) payload = static_cast<int64_t>(next_key(example));
  // (hit->flags: kRowwise, kRowReduce: the same shapes, the same verdict.)
  const NodeId n = s_.append(op, hit->shape, args, attrs, payload, example, loc,
                             static_cast<uint8_t>((is_shared ? NodeStore::kShared : 0) | hit->flags), hit->sig);
  ready_.add_recorded(s_, n, args);
  return n;
}

// A node of N arguments that the memo knows (most nodes): record_any's hit,
// and nothing else. Anything else (a new kind, an unknown shape, a key too
// long, an argument count the op does not take: such a node never made a
// way) goes to record_any, which starts over. Apart from it, this frame
// holds no key and no miss's state, and each argument's work is written
// out: one body for both, its loop and key spilled to the stack, took 360
// instructions an affine node, against 336 here.
template <size_t N>
NodeId Trace::record_of(OpCode op, std::span<const NodeId, N> args, std::span<const int64_t> attrs, int64_t payload,
                        std::source_location loc) {
  const OpInfo& info = op_info(op);
  const size_t len = RecordKey::kHead + N + attrs.size();
  std::array<int64_t, N> words;
  uint32_t shared_args = 0;  // bit i: argument i is shared
  bool unknown = false;
  int64_t example = kSharedExample;
#pragma GCC unroll 4
  for (size_t i = 0; i < N; ++i) {
    const NodeId a = args[i];
    const bool is_shared = s_.has(a, NodeStore::kShared);
    const ShapeId sh = s_.shape[a];
    unknown |= sh == kUnknownShape;
    words[i] = key_word(a, is_shared, sh);
    shared_args |= uint32_t{is_shared} << i;
    const int64_t e = is_shared ? example : s_.example[a];
    example = example == kSharedExample || example == e ? e : kMixedExample;
  }
  if (info.traits.source) example = current_example_;
  const bool is_shared = example == kSharedExample;
  const bool index_payload = info.traits.payload_index;
  const int64_t head1 = index_payload ? 0 : payload, head2 = int64_t{N} << 1 | is_shared;
  const LastRecord* hit = nullptr;
  if (!unknown && len <= kRecordKeyWords) [[likely]]
    for (const LastRecord& w : last_record_[op % last_record_.size()]) {
      bool same = (w.len == len) & (w.key[0] == op) & (w.key[1] == head1) & (w.key[2] == head2);
#pragma GCC unroll 4
      for (size_t i = 0; i < N; ++i) same &= w.key[RecordKey::kHead + i] == words[i];
      for (size_t j = 0; j < attrs.size() && same; ++j) same = w.key[RecordKey::kHead + N + j] == attrs[j];
      if (same && (!index_payload || (payload >= 0 && payload < w.bound))) [[likely]] {
        hit = &w;
        break;
      }
    }
  if (hit == nullptr) [[unlikely]]
    return record_any(op, args, attrs, payload, loc);
#pragma GCC unroll 4
  for (size_t i = 0; i < N; ++i)
    if ((shared_args >> i & 1) && args[i] < param_uses_.size()) ++param_uses_[args[i]];
  if (info.traits.keyed && example >= 0) payload = static_cast<int64_t>(next_key(example));
  const NodeId n = s_.append(op, hit->shape, args, attrs, payload, example, loc,
                             static_cast<uint8_t>((is_shared ? NodeStore::kShared : 0) | hit->flags), hit->sig);
  ready_.add_recorded(s_, n, args);
  return n;
}

// The bodies Trace::record (in line, trace.h) calls.
template NodeId Trace::record_of<1>(OpCode, std::span<const NodeId, 1>, std::span<const int64_t>, int64_t,
                                    std::source_location);
template NodeId Trace::record_of<2>(OpCode, std::span<const NodeId, 2>, std::span<const int64_t>, int64_t,
                                    std::source_location);
template NodeId Trace::record_of<3>(OpCode, std::span<const NodeId, 3>, std::span<const int64_t>, int64_t,
                                    std::source_location);

// A list op's memo key (OpTraits::segmented: a sum of a list) when the list is
// too long for a word per element: its shape is its elements' and its
// signature leaves out their number, so when every element has one word (one
// shape, or one shared value) that word once keys the list, whatever its
// length. A loss per tree node, summed per tree, was otherwise inferred and
// signed anew, a pass over its elements each. False where the elements differ.
bool Trace::list_key(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                     bool is_shared, RecordKey& key) const {
  if (args.empty() || RecordKey::kHead + 1 + attrs.size() > key.words.size()) return false;
  auto word = [&](NodeId a) { return key_word(a, s_.has(a, NodeStore::kShared), s_.shape[a]); };
  const int64_t first = word(args[0]);
  for (size_t i = 1; i < args.size(); ++i)
    if (word(args[i]) != first) return false;
  key.words[0] = op;
  key.words[1] = payload;
  key.words[2] = -2 + is_shared;  // (record() puts the length here: never negative)
  key.words[3] = first;
  key.len = RecordKey::kHead + 1;
  for (int64_t a : attrs) key.words[key.len++] = a;
  return true;
}

// record() for a node its memo does not know: arguments of unknown shape
// (inferred later), a key too long to keep (`key` null, with `unknown`
// false; a list op may still hit by one word, list_key), or a new kind (`key`
// given: kept in the memo once inferred).
NodeId Trace::record_miss(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                          std::source_location loc, int64_t example, bool unknown, const RecordKey* key) {
  const OpInfo& info = op_info(op);
  const bool is_shared = example == kSharedExample;
  // A list too long a key for record() may be keyed by one word (list_key).
  RecordKey list;
  const LastRecord* hit = nullptr;
  if (key == nullptr && !unknown && info.traits.segmented && !info.traits.payload_index &&
      list_key(op, args, attrs, payload, is_shared, list)) {
    for (const LastRecord& w : last_record_[op % last_record_.size()])
      if (same_key(w, list)) {
        hit = &w;
        break;
      }
    if (hit == nullptr) key = &list;
  }
  ShapeId shape = hit != nullptr ? hit->shape : kUnknownShape;
  if (!unknown && hit == nullptr) {
    // The inferer's view of the arguments. On the stack for the usual few.
    constexpr size_t kInline = 8;
    std::array<const Shape*, kInline> shapes_inline;
    std::array<uint8_t, kInline> shared_inline;
    const Shape** shapes = shapes_inline.data();
    uint8_t* shared = shared_inline.data();
    if (args.size() > kInline) {
      arg_shapes_.resize(args.size());
      arg_shared_.resize(args.size());
      shapes = arg_shapes_.data();
      shared = arg_shared_.data();
    }
    for (size_t i = 0; i < args.size(); ++i) {
      shapes[i] = &s_.shape_of(args[i]);
      shared[i] = s_.has(args[i], NodeStore::kShared);
    }
    const Site site{info.name, example, loc};
    const InferCtx ctx(std::span(shapes, args.size()), std::span(shared, args.size()), attrs, payload, site);
    shape = s_.shapes.intern(info.infer(ctx));
  }

  // Checks passed: from here on nothing throws a UserError, so a failed op records nothing.
  if (info.traits.keyed && example >= 0) payload = static_cast<int64_t>(next_key(example));
  const NodeId n =
      s_.append(op, shape, args, attrs, payload, example, loc, is_shared ? uint8_t{NodeStore::kShared} : uint8_t{0});
  if (unknown) {
    wait_for_shapes(n);
  } else if (hit != nullptr) {  // as record() on a hit
    s_.sig[n] = hit->sig;
    s_.flags[n] |= hit->flags;
  } else {
    if (!is_shared) s_.sig[n] = signature(n, info.traits);
    if (key != nullptr) {  // round robin over the op's ways: a model alternates a few kinds of call, lookup, ...
      LastRecord& last = last_record_[op % last_record_.size()][next_way_[op % next_way_.size()]++ % kRecordWays];
      std::copy(key->words.begin(), key->words.begin() + static_cast<std::ptrdiff_t>(key->len), last.key.begin());
      last.len = key->len;
      last.shape = shape;
      last.sig = is_shared ? kNoSig : s_.sig[n];
      last.flags = static_cast<uint8_t>(s_.flags[n] & (NodeStore::kRowwise | NodeStore::kRowReduce));
      // The range an index payload is checked against on a hit: the first
      // argument's rows (a table's, a row of scores').
      last.bound = info.traits.payload_index && !args.empty() && s_.shape_of(args[0]).rank() > 0
                       ? s_.shape_of(args[0])[0]
                       : 0;
    }
  }
  if (unknown) ready_.add(n);  // (the round drops it until its shape is inferred)
  else ready_.add_recorded(s_, n, args);
  return n;
}

// The ordinal of this keyed node within its example: the same whether the
// example is recorded alone or among others.
uint64_t Trace::next_key(int64_t example) {
  const auto fresh = static_cast<uint32_t>(example_ids_.size());
  uint32_t k = example_index_.find_or_insert(mix64(static_cast<uint64_t>(example)), fresh,
                                             [&](uint32_t i) { return example_ids_[i] == example; });
  if (k == FlatIndex::kEmpty) {
    k = fresh;
    example_ids_.push_back(example);
    example_ordinal_.push_back(0);
  }
  return mix64(static_cast<uint64_t>(example)) + example_ordinal_[k]++;
}

NodeId Trace::input(const at::Tensor& x, std::source_location loc) {
  const Site site{"input", current_example_, loc};
  if (!x.defined()) throw_user(site, "the tensor is undefined");
  if (x.layout() != at::kStrided) throw_user(site, not_dense(x));
  if (!x.is_floating_point()) throw_user(site, "expects a floating-point tensor, got ", x.scalar_type());
  if (x.dim() > kMaxRank) throw_user(site, "per-example values have rank at most ", kMaxRank, ", got ", x.dim());
  if (x.device() != device_ && !x.is_cpu())
    throw_user(site, "the tensor is on ", x.device(), " but the graph runs on ", device_,
               "; give inputs on the CPU (uploaded in one copy per batch) or on the graph's device");
  const auto slot = static_cast<int64_t>(s_.user_tensors.size());
  const NodeId n = record(code_of<op::Input>, {}, ShapeAttrs(x).span(), slot, loc);
  s_.user_tensors.push_back(x);
  return n;
}

NodeId Trace::param_lookup(const at::Tensor& w, std::source_location loc) {
  // A tensor already recorded has passed the checks below.
  const void* impl = w.defined() ? w.unsafeGetTensorImpl() : nullptr;
  const uint64_t hash = mix64(reinterpret_cast<uintptr_t>(impl));
  auto same = [&](uint32_t k) { return params_[k].first == impl; };
  if (w.defined())
    if (const uint32_t k = param_index_.find(hash, same); k != FlatIndex::kEmpty) {
      recent_params_[next_recent_++ % recent_params_.size()] = RecentParam{impl, params_[k].second};
      return params_[k].second;
    }
  const Site site{"param", kSharedExample, loc};
  if (!w.defined()) throw_user(site, "the tensor is undefined");
  if (w.layout() != at::kStrided) throw_user(site, not_dense(w));
  if (w.dim() > kMaxRank) throw_user(site, "shared values have rank at most ", kMaxRank, ", got ", w.dim());
  if (w.scalar_type() != at::kFloat)
    throw_user(site, "the tensor has dtype ", w.scalar_type(), "; sheaf computes in float32 (convert with .to(at::kFloat))");
  if (w.device() != device_)
    throw_user(site, "the tensor is on ", w.device(), " but the graph runs on ", device_,
               "; move the parameters with .to(device) first");
  const auto slot = static_cast<int64_t>(s_.user_tensors.size());
  const NodeId n = record(code_of<op::Param>, {}, ShapeAttrs(w).span(), slot, loc);
  s_.user_tensors.push_back(w);
  // A parameter needs no launch: its value is the tensor itself.
  ready_.drop_last();
  s_.flags[n] |= NodeStore::kShared | NodeStore::kComputed;
  s_.example[n] = kSharedExample;
  s_.value_at[n] = {static_cast<uint32_t>(s_.batch_out.size()), kWholeRow};
  s_.push_batch(w, 0);
  param_index_.find_or_insert(hash, static_cast<uint32_t>(params_.size()), same);
  params_.emplace_back(impl, n);
  param_uses_.resize(n + 1, 0);
  recent_params_[next_recent_++ % recent_params_.size()] = RecentParam{impl, n};
  return n;
}

NodeId Trace::constant(const Shape& shape, double value, std::source_location loc) {
  std::array<int64_t, kMaxRank + 2> attrs{};
  attrs[0] = attr_of(value);
  attrs[1] = shape.rank();
  for (int i = 0; i < shape.rank(); ++i) attrs[static_cast<size_t>(2 + i)] = shape[i];
  return record(code_of<op::Constant>, {}, std::span(attrs.data(), static_cast<size_t>(2 + shape.rank())), 0, loc);
}

// What record() does after a memo hit (parameter uses, the shared flag, the
// signature, the candidates), for a node whose verdict its caller kept. In
// line: an out-of-line call cost the two callers 1.3% of a gated batch's host work.
inline NodeId Trace::append_known(OpCode op, ShapeId shape, std::span<const NodeId> args,
                                  std::span<const int64_t> attrs, int64_t payload, int64_t example, SigId sig,
                                  std::source_location loc) {
  for (NodeId a : args)
    if (s_.has(a, NodeStore::kShared) && a < param_uses_.size()) ++param_uses_[a];
  const bool shared = example == kSharedExample;
  const NodeId n = s_.append(op, shape, args, attrs, payload, example, loc,
                             shared ? uint8_t{NodeStore::kShared} : uint8_t{0}, shared ? kNoSig : sig);
  ready_.add_recorded(s_, n, args);
  return n;
}

NodeId Trace::lookup(const at::Tensor& table, int64_t id, bool sparse_grad, std::source_location loc) {
  const NodeId t = param(table, loc);
  const int64_t attr = sparse_grad ? 1 : 0;
  // A lookup per word, from one or two tables: the last one's verdict (shape,
  // signature) holds for another id in range of the same table node and
  // gradient kind, in the same example kind. What record() does then, without
  // its memo's key (~300 instructions a word).
  LastLookup& last = last_lookup_;
  const bool shared = current_example_ == kSharedExample;
  if (last.table == t && last.attr == attr && last.shared == shared && id >= 0 && id < last.rows)
    return append_known(code_of<op::Lookup>, last.shape, std::span(&t, 1), std::span(&attr, 1), id, current_example_,
                        last.sig, loc);
  const NodeId n = record(code_of<op::Lookup>, std::span(&t, 1), std::span(&attr, 1), id, loc);
  const Shape& rows = s_.shape_of(t);
  SHEAF_ASSERT(s_.has(t, NodeStore::kShared) && t < param_uses_.size() && s_.shape[n] != kUnknownShape &&
                   (s_.flags[n] & (NodeStore::kRowwise | NodeStore::kRowReduce)) == 0,
               "a lookup's table is not a parameter, or the lookup's verdict is not the plain one kept");
  last = LastLookup{t, attr, shared, rows[0], s_.shape[n], s_.sig[n]};
  return n;
}

NodeId Trace::lookup(const at::Tensor& table, std::span<const int64_t> ids, bool sparse_grad,
                     std::source_location loc) {
  const Site site{"lookup", current_example_, loc};
  if (ids.empty()) throw_user(site, "needs at least one id (an empty list has no rows to stack)");
  const NodeId t = param(table, loc);
  if (table.dim() >= 1)  // else the op's inference names the rank
    for (size_t k = 0; k < ids.size(); ++k)
      if (ids[k] < 0 || ids[k] >= table.size(0))
        throw_user(site, "id ", ids[k], " (position ", k, " of ", ids.size(), ") is out of range for a table of ",
                   table.size(0), " rows");
  const std::array<int64_t, 2> attrs{sparse_grad ? 1 : 0, static_cast<int64_t>(ids.size())};
  const auto slot = static_cast<int64_t>(s_.user_tensors.size());
  const NodeId n = record(code_of<op::LookupList>, std::span(&t, 1), attrs, slot, loc);
  at::Tensor held = at::empty({static_cast<int64_t>(ids.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(ids.begin(), ids.end(), held.data_ptr<int64_t>());
  s_.user_tensors.push_back(std::move(held));
  return n;
}

// ---------------------------------------------------------------------------
// Signatures: op, output shape, attributes, arity (unless segmented), and per
// argument the identity of a shared input or the shape of a per-example one.

SigId Trace::signature(NodeId n, const OpTraits& traits) {
  auto args = s_.args_of(n);
  auto attrs = s_.attrs_of(n);
  const size_t len = 3 + attrs.size() + args.size();
  constexpr size_t kInline = 16;
  std::array<int64_t, kInline> inline_key;
  int64_t* key = inline_key.data();
  if (len > kInline) {
    key_scratch_.resize(len);
    key = key_scratch_.data();
  }
  // Packed by rows (OpTraits::rowwise): the shapes in the key lose their
  // length, so that nodes of different lengths share a signature.
  const int row_rank = by_rows(n, traits);
  const bool rows = row_rank > 0;
  const bool reduce = !rows && reduces_rows(n, traits);  // its argument's rows, whatever their number
  s_.flags[n] = static_cast<uint8_t>(s_.flags[n] & ~(NodeStore::kRowwise | NodeStore::kRowReduce));
  if (rows) s_.flags[n] |= NodeStore::kRowwise;
  if (reduce) s_.flags[n] |= NodeStore::kRowReduce;
  // (A per-example argument below the rows' rank is repeated on every row: its own shape, marked.)
  auto shape_key = [&](NodeId x) -> int64_t {
    if (!rows) return s_.shape[x];
    return s_.shape_of(x).rank() < row_rank && x != n ? (int64_t{1} << 42) | s_.shape[x] : row_shape(x);
  };
  size_t k = 0;
  key[k++] = s_.op[n];
  key[k++] = shape_key(n);
  key[k++] = traits.segmented ? -1 : static_cast<int64_t>(args.size()) | (rows ? int64_t{1} << 41 : 0) |
                                        (reduce ? int64_t{1} << 43 : 0);
  for (size_t i = 0; i < attrs.size(); ++i)
    if (!rows || static_cast<int>(i) != traits.length_attr) key[k++] = attrs[i];
  for (size_t i = 0; i < args.size(); ++i) {
    // A shared input batches only with the same shared input (the same weight);
    // a per-example input with any input of the same shape. The elements of a
    // segmented list all have one shape (checked when recorded): count it once.
    const NodeId r = s_.resolve(args[i]);
    if (s_.has(r, NodeStore::kShared))
      key[k++] = (int64_t{1} << 40) | r;
    else if (reduce)
      key[k++] = row_shape(args[i]);
    else if (!traits.segmented || i == 0)
      key[k++] = shape_key(args[i]);
  }
  const std::span<const int64_t> whole(key, k);
  // The last signature of each op: consecutive nodes of an op usually share it.
  LastSig& last = last_sig_[s_.op[n] % last_sig_.size()];
  if (last.sig != kNoSig && last.len == k) {
    bool same = true;
    for (size_t i = 0; i < k && same; ++i) same = last.key[i] == key[i];  // a few words: no memcmp call
    if (same) return last.sig;
  }
  const SigId sig = s_.sigs.intern(whole);
  if (k <= last.key.size()) {
    std::copy(whole.begin(), whole.end(), last.key.begin());
    last.len = k;
    last.sig = sig;
  }
  return sig;
}

// The rank of node n's rows if it batches by rows: the highest of its result
// and its per-example row arguments (OpTraits::row_args).
int rows_rank(const NodeStore& s, NodeId n, const OpTraits& traits) {
  int rank = s.shape_of(n).rank();
  auto args = s.args_of(n);
  for (size_t i = 0; i < args.size(); ++i)
    if (traits.row_arg(i) && !s.has(s.resolve(args[i]), NodeStore::kShared))
      rank = std::max(rank, s.shape_of(args[i]).rank());
  return rank;
}

// The rank of node n's rows when it batches by rows (OpTraits::rowwise), or 0.
// Its rows are those of its row arguments (OpTraits::row_args) of the highest
// rank R among them and the result: each such per-example argument of rank R
// has the result's length, every other per-example argument one row's shape
// (repeated on every row; not packed itself), every shared one a rank below R
// (it broadcasts over the rows) or is a weight (a per-example weight is an
// argument like the others). A result of rank 1 packs when its rows are a
// matrix's (R = 2), or when an argument is a packed vector and the op computes
// each element alone (a fusible elementwise op) or across rows.
int Trace::by_rows(NodeId n, const OpTraits& traits) const {
  if (!traits.rowwise) return 0;
  const Shape& out = s_.shape_of(n);
  // (A value without rows batches by its shape: a packed batch's rows are its values' rows.)
  if (out.rank() == 0 || out[0] == 0) return 0;
  if (traits.axis_attr >= 0 && out.axis(static_cast<int>(s_.attrs_of(n)[static_cast<size_t>(traits.axis_attr)])) <= 0)
    return 0;  // along the length itself
  auto args = s_.args_of(n);
  const int rank = rows_rank(s_, n, traits);
  if (rank > out.rank() + 1) return 0;
  const Shape* rows_of = &out;  // the shape whose rows repeated arguments match
  for (size_t i = 0; i < args.size() && rank > out.rank(); ++i)
    if (traits.row_arg(i) && s_.shape_of(args[i]).rank() == rank) rows_of = &s_.shape_of(args[i]);
  bool aligned = false, packed_vector = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const NodeId r = s_.resolve(args[i]);
    const Shape& a = s_.shape_of(args[i]);
    // Own rows need the rows' rank, per-example values, and rows (none: the
    // packed input would read nothing): by shape otherwise.
    if (traits.own_rows_arg(i) && (s_.has(r, NodeStore::kShared) || a.rank() != rank || a[0] == 0)) return 0;
    if (s_.has(r, NodeStore::kShared)) {
      if (!traits.weight(i) && a.rank() >= rank) return 0;
    } else if (traits.row_arg(i) && a.rank() == rank) {
      if (traits.own_rows_arg(i)) continue;  // its own number of rows (OpTraits::own_rows)
      if (a[0] != out[0]) return 0;
      aligned = true;
      packed_vector = packed_vector || (rank == 1 && s_.has(r, NodeStore::kRowwise));
    } else if (a.rank() == rank - 1) {
      // Packed itself: its rows are not one row to repeat. A cond's or loop's
      // result not resolved yet may become such a value: not packed either.
      if (s_.has(r, NodeStore::kRowwise) || s_.has(r, NodeStore::kPlaceholder)) return 0;
      for (int d = 0; d < a.rank(); ++d)
        if (a[d] != (*rows_of)[d + 1]) return 0;
    } else {
      return 0;
    }
  }
  if (out.rank() >= 2) return rank;
  if (rank == 2) return aligned ? rank : 0;
  return packed_vector && (traits.across_rows || op_info(s_.op[n]).pointwise != nullptr) ? rank : 0;
}

// Whether node n reduces the rows of its arguments (OpTraits::row_reduce):
// every argument per-example and of one length, all but the last vectors (a
// weight per row, as x in x B), reduced whole or along axis 0, into a result
// of lower rank than the highest argument's, which is >= 2 or that of a
// packed vector.
bool Trace::reduces_rows(NodeId n, const OpTraits& traits) const {
  if (!traits.row_reduce) return false;
  auto args = s_.args_of(n);
  if (args.empty()) return false;
  int rank = 0;
  bool packed_vector = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const NodeId r = s_.resolve(args[i]);
    const Shape& in = s_.shape_of(args[i]);
    if (s_.has(r, NodeStore::kShared) || in.rank() < 1 || in[0] == 0 || in[0] != s_.shape_of(args[0])[0]) return false;
    if (i + 1 < args.size() && in.rank() != 1) return false;  // leading arguments weigh the rows (x B)
    rank = std::max(rank, in.rank());
    packed_vector = packed_vector || (in.rank() == 1 && s_.has(r, NodeStore::kRowwise));
  }
  if (s_.shape_of(n).rank() >= rank || (rank < 2 && !packed_vector)) return false;
  return traits.axis_attr < 0 || s_.shape_of(args[0]).axis(static_cast<int>(s_.attrs_of(n)[static_cast<size_t>(traits.axis_attr)])) == 0;
}

// The shape of one row of node x's value: its shape without the first axis.
ShapeId Trace::row_shape(NodeId x) { return s_.shapes.row(s_.shape[x]); }

// ---------------------------------------------------------------------------
// Placeholders and deferred shapes.

int64_t Trace::maker_index(std::string_view made_by) {
  // A cond or a loop (most placeholders): fixed entries, a compare of four bytes.
  if (made_by == "cond") return 0;
  if (made_by == "loop") return 1;
  for (const RecentMaker& m : recent_makers_)
    if (m.name != nullptr && m.data == made_by.data() && *m.name == made_by) return m.index;
  const auto at = std::find(makers_.begin(), makers_.end(), made_by);
  const auto maker = static_cast<int64_t>(at - makers_.begin());
  const std::string& name = at != makers_.end() ? *at : makers_.emplace_back(made_by);
  recent_makers_[next_maker_++ % recent_makers_.size()] = RecentMaker{made_by.data(), &name, maker};
  return maker;
}

// Nothing to infer or check (its shape is given, it has no arguments): appended
// directly, which record() would do after a memo lookup that cost a gated net's
// cond ~250 instructions. Not a candidate: a round would only drop it
// (unresolved), and resolve() adds it. (A gated net's placeholders were a
// ninth of its rounds' visits.)
NodeId Trace::placeholder(ShapeId shape, int64_t example, std::string_view made_by, std::source_location loc) {
  const bool shared = (example < 0 ? current_example_ : example) == kSharedExample;
  return s_.append(code_of<op::Placeholder>, shape, {}, {}, maker_index(made_by), example, loc,
                   static_cast<uint8_t>(NodeStore::kPlaceholder | (shared ? NodeStore::kShared : 0)));
}

NodeId Trace::call(std::span<const NodeId> args, std::span<const uint32_t> key, std::span<const int64_t> attrs,
                   ShapeId shape, CallVerdict& verdict, std::source_location loc) {
  if (const NodeId n = call_again(args, key, attrs, shape, verdict, loc); n != kNoNode) return n;
  const NodeId n = record(code_of<op::Call>, args, attrs, 0, loc);
  SHEAF_ASSERT(s_.shape[n] == shape && (s_.flags[n] & (NodeStore::kRowwise | NodeStore::kRowReduce)) == 0,
               "a call's shape is not its body's, or a call batches by rows");
  verdict.clears = clears_;
  verdict.sig = s_.sig[n];
  verdict.shared.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const NodeId r = s_.resolve(args[i]);
    verdict.shared[i] = s_.has(r, NodeStore::kShared) ? r : kNoNode;
  }
  return n;
}

NodeId Trace::call_again(std::span<const NodeId> args, std::span<const uint32_t> key, std::span<const int64_t> attrs,
                         ShapeId shape, const CallVerdict& verdict, std::source_location loc) {
  if (verdict.clears != clears_ || verdict.shared.size() != args.size() || key.size() != args.size()) return kNoNode;
  int64_t example = kSharedExample;
  bool same = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const NodeId a = args[i], r = s_.resolve(a);
    const bool shared = s_.has(a, NodeStore::kShared);
    const ShapeId sh = s_.shape[a];
    same = same && sh != kUnknownShape && key[i] == call_word(sh, shared) &&
           (s_.has(r, NodeStore::kShared) ? r : kNoNode) == verdict.shared[i];
    if (shared) continue;
    const int64_t e = s_.example[a];
    example = example == kSharedExample || example == e ? e : kMixedExample;
  }
  if (!same) return kNoNode;
  return append_known(code_of<op::Call>, shape, args, attrs, 0, example, verdict.sig, loc);
}

NodeId Trace::call_result(NodeId call, std::span<const int64_t> attrs, ShapeId shape, std::source_location loc) {
  SHEAF_ASSERT(s_.op[call] == code_of<op::Call> && shape != kUnknownShape, "node ", call,
               " is not a call, or a result's shape is unknown");
  const NodeId n = s_.append(code_of<op::CallResult>, shape, std::span(&call, 1), attrs, 0, s_.example[call], loc,
                             static_cast<uint8_t>(s_.flags[call] & NodeStore::kShared));
  ready_.add_result(n, call);
  return n;
}

void Trace::resolve(NodeId p, NodeId value) {
  SHEAF_ASSERT(s_.has(p, NodeStore::kPlaceholder) && s_.alias[p] == kNoNode, "node ", p,
               " is not an unresolved placeholder");
  NodeId r = s_.resolve(value);
  // (A chain of placeholders ends at p: the value is p itself, through others.)
  if (r == p)
    throw_user(site_of(p), "the value it resolves to is its own result (a branch or body returned the Expr this ",
               site_of(p).op, " gives, e.g. a variable captured by reference and then assigned the result): capture "
               "the value it had before by copy");
  const ShapeId want = s_.shape[p], got = s_.shape[r];
  if (want != kUnknownShape && got != kUnknownShape && want != got)
    throw_user(site_of(p), declared_mismatch(s_.shapes[got], s_.shapes[want]));
  if (s_.has(r, NodeStore::kShared) && !s_.has(p, NodeStore::kShared)) {
    // zeros + the shared value, recorded for p's example: a per-example node
    // with the shared value's value and gradient.
    SHEAF_ASSERT(got != kUnknownShape, "shared node ", r, " has no shape");
    ExampleGuard in_example(*this, s_.example[p]);
    const NodeId zeros = constant(s_.shapes[got], 0.0, s_.loc[p]);
    const NodeId both[] = {zeros, r};
    value = r = record(code_of<op::Add>, both, {}, 0, s_.loc[p]);
  }
  s_.alias[p] = value;
  ready_.add(p);  // the scheduler dropped it while unresolved
  if (got == kUnknownShape) {
    // The value itself waits on another cond: p follows it when it is known.
    wait_for_shapes(p);
    return;
  }
  if (want == kUnknownShape) {
    s_.shape[p] = got;
    std::exception_ptr error;  // one example's mistake: the others' watchers still run
    try {
      shape_became_known(p);
    } catch (const UserError&) {
      error = std::current_exception();
    }
    try {
      run_due_watchers();
    } catch (...) {
      if (!error) error = std::current_exception();  // the first of the two is reported
    }
    if (error) std::rethrow_exception(error);
  }
}

void Trace::when_shapes_known(std::span<const NodeId> nodes, std::function<void()> fn) {
  const auto w = static_cast<uint32_t>(watcher_fn_.size());
  uint32_t missing = 0;
  for (NodeId a : nodes) {
    if (s_.shape[a] != kUnknownShape) continue;
    depend(a, kWatcher | w);
    ++missing;
  }
  if (missing == 0) return fn();
  watcher_fn_.push_back(std::move(fn));
  watcher_missing_.push_back(missing);
}

// Callbacks may record and resolve, which may make more watchers due: run
// until none is left (each runs once).
void Trace::run_due_watchers() {
  std::exception_ptr first_error;
  while (!watchers_due_.empty()) {
    const uint32_t w = watchers_due_.back();
    watchers_due_.pop_back();
    std::function<void()> fn = std::move(watcher_fn_[w]);
    watcher_fn_[w] = nullptr;
    try {
      fn();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

// n has an unknown argument (or, for a placeholder, an unknown value): it is put
// on the waiting list of each.
void Trace::wait_for_shapes(NodeId n) {
  auto wait_on = [&](NodeId a) {
    depend(a, n);
    ++missing_[n];
  };
  if (s_.has(n, NodeStore::kPlaceholder)) {
    wait_on(s_.resolve(n));
    return;
  }
  for (NodeId a : s_.args_of(n))
    if (s_.shape[a] == kUnknownShape) wait_on(a);
}

// `waiter` (a node, or kWatcher | a watcher) goes on a's list of what its shape wakes.
void Trace::depend(NodeId a, NodeId waiter) {
  if (dep_head_.size() < s_.size()) {
    dep_head_.resize(s_.size(), kNone32);
    missing_.resize(s_.size(), 0);
  }
  dep_node_.push_back(waiter);
  dep_next_.push_back(dep_head_[a]);
  dep_head_[a] = static_cast<uint32_t>(dep_node_.size() - 1);
}

// Infers, in dependency order, every node that waited only on n. A user error
// in one of them is rethrown after the others are done, so one example's
// mistake leaves the other examples' shapes right.
void Trace::shape_became_known(NodeId n) {
  known_.clear();
  known_.push_back(n);
  std::exception_ptr first_error;
  while (!known_.empty()) {
    const NodeId k = known_.back();
    known_.pop_back();
    if (k >= dep_head_.size()) continue;
    for (uint32_t e = std::exchange(dep_head_[k], kNone32); e != kNone32; e = dep_next_[e]) {
      const NodeId d = dep_node_[e];
      if (d & kWatcher) {
        if (--watcher_missing_[d & ~kWatcher] == 0) watchers_due_.push_back(d & ~kWatcher);
        continue;
      }
      if (--missing_[d] != 0) continue;
      try {
        ++deferred_inferences_;
        if (infer_deferred(d)) {
          known_.push_back(d);
          ready_.add(d);  // the scheduler dropped it while its shape was unknown
        }
      } catch (const UserError&) {
        if (!first_error) first_error = std::current_exception();
      }
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

// Returns whether d's shape is now known (a placeholder may still wait on its value).
bool Trace::infer_deferred(NodeId d) {
  if (s_.has(d, NodeStore::kPlaceholder)) {
    const NodeId r = s_.resolve(d);
    if (s_.shape[r] == kUnknownShape) {  // resolved to another placeholder's pending value
      wait_for_shapes(d);
      return false;
    }
    if (s_.shape[d] == kUnknownShape) {
      s_.shape[d] = s_.shape[r];
      return true;
    }
    if (s_.shape[d] != s_.shape[r]) {
      s_.alias[d] = kNoNode;  // unbound again: nothing downstream runs on a value of the wrong shape
      throw_user(site_of(d), declared_mismatch(s_.shape_of(r), s_.shape_of(d)));
    }
    return false;  // known all along: nobody waited on it
  }
  arg_shapes_.clear();
  arg_shared_.clear();
  for (NodeId a : s_.args_of(d)) {
    arg_shapes_.push_back(&s_.shape_of(a));
    arg_shared_.push_back(s_.has(a, NodeStore::kShared));
  }
  const OpInfo& info = op_info(s_.op[d]);
  const Site site = site_of(d);  // named: the context keeps a reference to it
  InferCtx ctx(arg_shapes_, arg_shared_, s_.attrs_of(d), s_.payload[d], site);
  s_.shape[d] = s_.shapes.intern(info.infer(ctx));
  if (!s_.has(d, NodeStore::kShared)) s_.sig[d] = signature(d, info.traits);
  return true;
}

// ---------------------------------------------------------------------------

void Trace::expect_params_unchanged() const {
  for (const auto& [impl, n] : params_) {
    const at::Tensor& w = s_.user_tensors[static_cast<size_t>(s_.payload[n])];
    const Shape& recorded = s_.shape_of(n);
    if (w.scalar_type() != at::kFloat || w.device() != device_)
      throw_user(site_of(n), "the parameter's tensor became ", w.scalar_type(), " on ", w.device(),
                 " after it was recorded (as float on ", device_, "); parameters are read at forward()");
    if (!std::ranges::equal(w.sizes(), recorded.dims()))
      throw_user(site_of(n), "the parameter's sizes changed after it was recorded: recorded as ", recorded.str(),
                 ", now ", w.sizes(), " (parameters are read at forward(); record the graph again after resizing it)");
  }
}

void Trace::clear() {
  s_.clear();
  // Signature ids start again from 0, and node ids: forget the entries that
  // name them. An entry of length 0 matches no key (every key holds its op),
  // so marking is enough; filling them cost ~47 KB of writes a clear, four
  // clears a gated batch (the graph and its three function bodies).
  for (LastSig& l : last_sig_) l.sig = kNoSig;
  for (auto& ways : last_record_)
    for (LastRecord& w : ways) w.len = 0;
  next_way_.fill(0);  // which way each op evicts next: the same after every clear()
  recent_params_.fill(RecentParam{});
  last_lookup_ = LastLookup{};  // its table's node id and signature id start again
  ++clears_;                     // and every call's verdict
  ready_.clear();
  deferred_inferences_ = 0;
  params_.clear();
  param_index_.clear();
  param_uses_.clear();
  example_ids_.clear();
  example_ordinal_.clear();
  example_index_.clear();
  dep_head_.clear();
  dep_next_.clear();
  dep_node_.clear();
  missing_.clear();
  watcher_fn_.clear();
  watcher_missing_.clear();
  watchers_due_.clear();
  current_example_ = 0;
}

Site Trace::site_of(NodeId n) const {
  // A placeholder is named for what made it (the user wrote a cond, not a placeholder).
  const std::string_view op = s_.has(n, NodeStore::kPlaceholder)
                                  ? std::string_view(makers_[static_cast<size_t>(s_.payload[n])])
                                  : op_info(s_.op[n]).name;
  return Site{op, s_.example[n], s_.loc[n]};
}

void Trace::expect_known_shape(NodeId n, std::string_view what, std::source_location loc) const {
  if (s_.shape[n] != kUnknownShape) return;
  throw_user_at(loc, what, " of a value recorded by op '", site_of(n).op, "' at ",
                detail::format_loc(s_.loc[n]),
                " is not known yet: it depends on a dsl::cond whose branch is chosen during forward(); read it after "
                "forward()");
}

std::string Trace::dump() const {
  std::ostringstream os;
  for (NodeId n = 0; n < s_.size(); ++n) {
    os << "%" << n << " = " << op_info(s_.op[n]).name << "(";
    bool first = true;
    for (NodeId a : s_.args_of(n)) {
      os << (first ? "" : ", ") << "%" << a;
      first = false;
    }
    os << ")";
    for (int64_t a : s_.attrs_of(n)) os << " #" << a;
    os << " : " << (s_.shape[n] == kUnknownShape ? std::string("?") : s_.shape_of(n).str());
    if (s_.example[n] >= 0) os << " ex " << s_.example[n];
    else os << (s_.example[n] == kSharedExample ? " shared" : " mixed");
    if (s_.sig[n] != kNoSig) os << " sig " << s_.sig[n];
    if (s_.has(n, NodeStore::kPlaceholder))
      os << (s_.alias[n] == kNoNode ? " (unresolved)" : " -> %" + std::to_string(s_.alias[n]));
    if (s_.has(n, NodeStore::kComputed)) os << " done";
    os << "  @" << s_.loc[n].file_name() << ":" << s_.loc[n].line() << "\n";
  }
  return os.str();
}

}  // namespace sheaf
