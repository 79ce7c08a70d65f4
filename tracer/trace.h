// Trace: records the nodes of many examples into one NodeStore. Every recording
// runs the op's shape inference first, so a user's mistake is a UserError naming
// the op, the example and the user's line, and records nothing.
//
// Shapes downstream of an unresolved dsl::cond are unknown until the branch is
// recorded; such nodes wait on the nodes they read (a dependency list), and are
// inferred, in order, when those become known: each deferred node is inferred
// once, whatever the number of conds.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/core/flat_index.h>
#include <sheaf/core/ids.h>
#include <sheaf/ops/op.h>

#include "node_store.h"
#include "ready.h"

namespace sheaf {

// The rank of node n's rows if it batches by rows (OpTraits::rowwise): per-example
// arguments of a lower rank are repeated on each row.
int rows_rank(const NodeStore& s, NodeId n, const OpTraits& traits);

class Trace {
 public:
  explicit Trace(c10::Device device) : device_(device) {}

  const NodeStore& store() const { return s_; }
  NodeStore& store() { return s_; }
  size_t size() const { return s_.size(); }

  // ---- Recording. Each returns the new node; on misuse, throws UserError and
  // records nothing.
  // Most ops take one to three arguments: a body for each count, where the
  // work per argument is written out (a loop's tests cost as much as its
  // work). In line, so that a caller whose count is known calls that body
  // directly (one call a node fewer).
  NodeId record(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                std::source_location loc) {
    switch (args.size()) {
      case 1: return record_of(op, args.first<1>(), attrs, payload, loc);
      case 2: return record_of(op, args.first<2>(), attrs, payload, loc);
      case 3: return record_of(op, args.first<3>(), attrs, payload, loc);
      default: return record_any(op, args, attrs, payload, loc);
    }
  }
  NodeId input(const at::Tensor& x, std::source_location loc);
  // The same tensor is one node. A model reads a few parameters over and
  // over (every op that takes a weight): the recent ones are found in line.
  NodeId param(const at::Tensor& w, std::source_location loc) {
    if (const void* impl = w.defined() ? w.unsafeGetTensorImpl() : nullptr)
      for (const RecentParam& r : recent_params_)
        if (r.impl == impl) return r.node;
    return param_lookup(w, loc);
  }
  NodeId constant(const Shape& shape, double value, std::source_location loc);
  NodeId lookup(const at::Tensor& table, int64_t id, bool sparse_grad, std::source_location loc);
  NodeId lookup(const at::Tensor& table, std::span<const int64_t> ids, bool sparse_grad, std::source_location loc);

  // ---- Control flow. A placeholder stands for a value decided later (a cond's
  // result, a loop's final state); resolve() binds it to the node it became and
  // infers the shapes that waited for it. `made_by` names what made the
  // placeholder (dsl::cond, dsl::loop, a function's name): errors about it
  // name that op. A value that is the placeholder itself (a branch that
  // returns its own cond's result) is a UserError. A per-example placeholder
  // that becomes a shared value (a branch returning a parameter) is bound to
  // a per-example copy of it: what read the placeholder before it was
  // resolved was signed as reading a per-example value, and batches with
  // nodes that read other examples' own values.
  NodeId placeholder(ShapeId shape, int64_t example, std::string_view made_by, std::source_location loc);
  void resolve(NodeId placeholder, NodeId value);

  // A call of a function's body (ops/call.h): attrs and shape are the body's
  // (engine/functions.h), and `verdict`, kept by the caller per body, is the
  // signature of its last call. A call whose arguments read the same shared
  // nodes (their shapes are the body's) has the same one: appended with it,
  // without record()'s memo (whose key for a call is ~10 words); otherwise
  // recorded, and the verdict kept. A clear() voids every verdict.
  struct CallVerdict {
    uint64_t clears = ~uint64_t{0};  // clears_ when it was made
    SigId sig = kNoSig;
    std::vector<NodeId> shared;  // per argument: the shared node it reads (resolved), else kNoNode
  };
  // `key`: the body's signature (call_word per argument; the arguments have it).
  NodeId call(std::span<const NodeId> args, std::span<const uint32_t> key, std::span<const int64_t> attrs,
              ShapeId shape, CallVerdict& verdict, std::source_location loc);
  // An argument as a function body's signature sees it: its shape and whether it is shared, in one word.
  static uint32_t call_word(ShapeId shape, bool shared) { return shape << 1 | uint32_t{shared}; }
  // The usual call, in one pass over its arguments: a call of the body whose
  // signature (call_word per argument) is `key`, with `verdict`. When the
  // arguments have that signature (every shape known) and the verdict holds
  // for them, the call node, as call() would append it; otherwise kNoNode and
  // nothing recorded (the caller takes the full path: call_later, the body
  // for these shapes, call()).
  NodeId call_again(std::span<const NodeId> args, std::span<const uint32_t> key, std::span<const int64_t> attrs,
                    ShapeId shape, const CallVerdict& verdict, std::source_location loc);

  // Result k >= 1 of call node `call` (ops/call.h), recorded right after the
  // call with the shape its function's body gave (attrs: k, rank, dims): no
  // inference, no signature, and not a candidate of its own (a round places
  // it with its call: scheduler/round.cpp).
  NodeId call_result(NodeId call, std::span<const int64_t> attrs, ShapeId shape, std::source_location loc);

  // Calls `fn` once every node of `nodes` has a known shape: now, if they all
  // have one; else right after the resolve() that makes the last one known
  // (never from inside shape propagation, so `fn` may record and resolve).
  // A function call on values downstream of a dsl::cond waits so (engine/).
  void when_shapes_known(std::span<const NodeId> nodes, std::function<void()> fn);

  // ---- Examples: the user's id (any int64 >= 0) tags what is recorded while it is current.
  int64_t current_example() const { return current_example_; }
  void set_current_example(int64_t id) { current_example_ = id; }

  // What the next round looks at (new nodes, and nodes no longer waiting); the
  // scheduler takes its rounds from here and parks what cannot run yet.
  ReadyQueue& ready() { return ready_; }
  // Shape inferences made after a dsl::cond resolved (work that a round's
  // control flow costs; it grows with the nodes that depend on the cond).
  uint64_t deferred_inferences() const { return deferred_inferences_; }

  void clear();
  std::string dump() const;
  // The op, example and line that recorded node n (for errors about it).
  Site site_of(NodeId n) const;
  // How many recorded nodes read parameter node p (a shared tensor read by one
  // node only was probably made per example, and splits batches: Stats::split_shared).
  uint32_t param_uses(NodeId p) const { return p < param_uses_.size() ? param_uses_[p] : 0; }
  // Throws UserError (naming the g.param line) if a parameter's tensor was
  // resized, or moved to another dtype or device, since it was recorded: its
  // readers were inferred and planned for what it was, and read what it is.
  void expect_params_unchanged() const;
  // Throws UserError (naming `loc` and n's own line) if n's shape waits on a dsl::cond.
  void expect_known_shape(NodeId n, std::string_view what, std::source_location loc) const;

 private:
  SigId signature(NodeId n, const OpTraits& traits);
  // record()'s memo key (see last_record_): op, payload, arity and
  // sharedness, then a word per argument, then the attributes.
  static constexpr size_t kRecordKeyWords = 16;  // (LastRecord::key has as many: compared and copied word for word)
  struct RecordKey {
    static constexpr size_t kHead = 3;
    std::array<int64_t, kRecordKeyWords> words;
    size_t len = 0;
  };
  bool list_key(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                bool is_shared, RecordKey& key) const;
  // An argument's word in record()'s key: a shared one's node; a per-example
  // one's shape, and whether it is packed by rows or a placeholder (either
  // decides whether the node packs: Trace::by_rows).
  int64_t key_word(NodeId a, bool is_shared, ShapeId sh) const {
    const NodeId r = s_.resolve(a);
    const uint8_t f = s_.flags[r];
    return is_shared ? (int64_t{1} << 40) | r
                     : sh | ((f & NodeStore::kRowwise) ? int64_t{1} << 41 : 0) |
                           ((f & NodeStore::kPlaceholder) ? int64_t{1} << 42 : 0);
  }
  // record() for any number of arguments: every check, the memo, and a miss.
  [[gnu::noinline]] NodeId record_any(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs,
                                      int64_t payload, std::source_location loc);
  // record() for N arguments where the memo knows the node; else record_any.
  template <size_t N>
  NodeId record_of(OpCode op, std::span<const NodeId, N> args, std::span<const int64_t> attrs, int64_t payload,
                   std::source_location loc);
  [[gnu::noinline]] NodeId record_miss(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs,
                                       int64_t payload, std::source_location loc, int64_t example, bool unknown,
                                       const RecordKey* key);
  NodeId append_known(OpCode op, ShapeId shape, std::span<const NodeId> args, std::span<const int64_t> attrs,
                      int64_t payload, int64_t example, SigId sig, std::source_location loc);
  int by_rows(NodeId n, const OpTraits& traits) const;
  bool reduces_rows(NodeId n, const OpTraits& traits) const;
  ShapeId row_shape(NodeId x);
  uint64_t next_key(int64_t example);  // a dropout key, unique per (example, node ordinal)
  void wait_for_shapes(NodeId n);
  void depend(NodeId a, NodeId waiter);
  void shape_became_known(NodeId n);
  bool infer_deferred(NodeId n);

  NodeStore s_;
  c10::Device device_;
  int64_t current_example_ = 0;
  ReadyQueue ready_;
  uint64_t deferred_inferences_ = 0;
  // Parameter nodes by tensor (an open-addressing index: clear() keeps its memory).
  std::vector<std::pair<const void*, NodeId>> params_;
  FlatIndex param_index_;
  std::vector<uint32_t> param_uses_;  // per node (parameters only)
  // Per example: nodes recorded so far (dropout keys). Indexed through a hash
  // index, so memory follows the number of examples, not the largest id.
  std::vector<int64_t> example_ids_;
  std::vector<uint32_t> example_ordinal_;
  FlatIndex example_index_;
  // Deferred shapes: per node waited on, a list of the nodes waiting (linked
  // through dep_next_), and per waiting node how many of its arguments are unknown.
  std::vector<uint32_t> dep_head_, dep_next_, missing_;
  std::vector<NodeId> dep_node_;
  std::vector<NodeId> known_;  // scratch: nodes whose shapes became known, to propagate from
  // when_shapes_known's watchers: a dependency entry naming kWatcher | w
  // counts down watcher w; the callbacks of those at zero run after resolve().
  static constexpr NodeId kWatcher = NodeId{1} << 31;
  std::vector<std::function<void()>> watcher_fn_;
  std::vector<uint32_t> watcher_missing_;
  std::vector<uint32_t> watchers_due_;
  void run_due_watchers();
  // What made each placeholder (its payload indexes this): a few names, each
  // once, never moved (a Site holds a view of one); kept across clear().
  // cond and loop are entries 0 and 1; function names are found among the
  // recent ones by address (then checked), not searched for per placeholder.
  std::deque<std::string> makers_{"cond", "loop"};
  struct RecentMaker {
    const char* data = nullptr;
    const std::string* name = nullptr;  // (checked too: another name may come to live at a freed one's address)
    int64_t index = 0;
  };
  std::array<RecentMaker, 4> recent_makers_{};
  size_t next_maker_ = 0;
  int64_t maker_index(std::string_view made_by);
  // record()'s scratch, for ops with many arguments.
  std::vector<const Shape*> arg_shapes_;
  std::vector<uint8_t> arg_shared_;
  std::vector<int64_t> key_scratch_;
  // The last few nodes of each op (by op code) whose shapes were inferred,
  // keyed by everything their shape and signature depend on (arguments'
  // shapes, shared arguments themselves, attributes, payload unless it is an
  // index: OpTraits::payload_index): most nodes repeat one of them, and a hit
  // skips inference, interning and the signature's key.
  struct LastRecord {
    std::array<int64_t, kRecordKeyWords> key{};
    size_t len = 0;
    ShapeId shape = kUnknownShape;
    SigId sig = kNoSig;
    uint8_t flags = 0;  // what signature() set besides the signature (NodeStore::kRowwise)
    int64_t bound = 0;  // an index payload must lie in [0, bound) (argument 0's axis 0)
  };
  static constexpr size_t kRecordWays = 4;  // a TreeLSTM's leaf and inner calls, a gated net's gate and two cells
  std::array<std::array<LastRecord, kRecordWays>, 64> last_record_{};
  static bool same_key(const LastRecord& w, const RecordKey& key) {
    bool same = w.len == key.len;
    for (size_t i = 0; i < key.len && same; ++i) same = w.key[i] == key.words[i];  // a few words: no memcmp call
    return same;
  }
  std::array<uint8_t, 64> next_way_{};
  // The last signature key of each op (by op code): most nodes repeat it.
  struct LastSig {
    std::array<int64_t, 12> key{};
    size_t len = 0;
    SigId sig = kNoSig;
  };
  std::array<LastSig, 64> last_sig_{};
  // The last Trace::lookup of one id recorded through record(): its table
  // node, gradient kind, whether shared, the table's rows, and its verdict.
  struct LastLookup {
    NodeId table = kNoNode;
    int64_t attr = 0;
    bool shared = false;
    int64_t rows = 0;
    ShapeId shape = kUnknownShape;
    SigId sig = kNoSig;
  };
  LastLookup last_lookup_;
  uint64_t clears_ = 0;  // clear()s so far (CallVerdict)
  NodeId param_lookup(const at::Tensor& w, std::source_location loc);  // not a recent one: the index, or a new node
  // The parameters read last (a model reads a few of them over and over).
  struct RecentParam {
    const void* impl = nullptr;
    NodeId node = kNoNode;
  };
  std::array<RecentParam, 8> recent_params_{};
  size_t next_recent_ = 0;
};

// record()'s bodies are made once, in trace.cpp.
extern template NodeId Trace::record_of<1>(OpCode, std::span<const NodeId, 1>, std::span<const int64_t>, int64_t,
                                           std::source_location);
extern template NodeId Trace::record_of<2>(OpCode, std::span<const NodeId, 2>, std::span<const int64_t>, int64_t,
                                           std::source_location);
extern template NodeId Trace::record_of<3>(OpCode, std::span<const NodeId, 3>, std::span<const int64_t>, int64_t,
                                           std::source_location);

// Records under `example` while alive: control flow's callbacks and deferred
// function calls run later, for the example that made them.
class ExampleGuard {
 public:
  ExampleGuard(Trace& t, int64_t example) : t_(t), saved_(t.current_example()) { t.set_current_example(example); }
  ~ExampleGuard() { t_.set_current_example(saved_); }
  ExampleGuard(const ExampleGuard&) = delete;
  ExampleGuard& operator=(const ExampleGuard&) = delete;

 private:
  Trace& t_;
  int64_t saved_;
};

}  // namespace sheaf
