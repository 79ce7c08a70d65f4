#include "graph.h"

#include <ATen/ops/ones_like.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>

#include "../backend/runtime.h"
#include "../dsl/op.h"
#include "../scheduler/plan.h"
#include "../scheduler/strategy.h"

namespace sheaf {

// ---------------------------------------------------------------------------
// Expr handles name a graph by slot and generation, so a handle that outlived
// its graph (or a clear()) is detected instead of dereferencing freed memory.
namespace {

constexpr uint32_t kSlots = 1u << 14;

struct Slot {
  std::atomic<Graph*> graph{nullptr};
  std::atomic<uint32_t> generation{0};
};

Slot g_slots[kSlots];
std::mutex g_slots_mu;
std::vector<uint32_t> g_free_slots;
uint32_t g_slots_used = 0;

uint32_t acquire_slot(Graph* g) {
  std::lock_guard lock(g_slots_mu);
  uint32_t s;
  if (!g_free_slots.empty()) {
    s = g_free_slots.back();
    g_free_slots.pop_back();
  } else {
    if (g_slots_used == kSlots)
      throw UserError("sheaf: more than 16384 sheaf::Graph objects alive at once");
    s = g_slots_used++;
  }
  g_slots[s].graph.store(g);
  return s;
}

void release_slot(uint32_t s) {
  std::lock_guard lock(g_slots_mu);
  g_slots[s].generation.fetch_add(1);
  g_slots[s].graph.store(nullptr);
  g_free_slots.push_back(s);
}

// Leaves carry their shape as attributes: rank, dims...
std::vector<int64_t> shape_attrs(const at::Tensor& t) {
  std::vector<int64_t> a{t.dim()};
  for (int64_t d : t.sizes()) a.push_back(d);
  return a;
}

}  // namespace

// ---------------------------------------------------------------------------
// Shapes and signatures.

Shape Shape::of(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    throw UserError(detail::cat("sheaf: per-example values have rank at most ", kMaxRank, ", got rank ",
                                dims.size()));
  Shape s;
  for (int64_t d : dims) s.push(d);
  return s;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

namespace {
uint64_t hash_words(std::span<const int64_t> w) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ w.size();
  for (int64_t x : w) {
    h ^= static_cast<uint64_t>(x);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return h;
}
}  // namespace

ShapeId ShapeTable::intern_slow(const Shape& s) {
  const auto fresh = static_cast<ShapeId>(shapes_.size());
  uint32_t id = index_.find_or_insert(hash_words(s.dims()), fresh, [&](uint32_t k) { return shapes_[k] == s; });
  if (id != FlatIndex::kEmpty) return id;
  shapes_.push_back(s);
  return fresh;
}

uint32_t SigTable::intern(std::span<const int64_t> key) {
  const auto fresh = static_cast<uint32_t>(begin_.size());
  uint32_t id = index_.find_or_insert(hash_words(key), fresh, [&](uint32_t k) {
    if (len_[k] != key.size()) return false;
    const int64_t* have = keys_.data() + begin_[k];
    for (size_t i = 0; i < key.size(); ++i)  // keys are a handful of words: no memcmp call
      if (have[i] != key[i]) return false;
    return true;
  });
  if (id != FlatIndex::kEmpty) return id;
  begin_.push_back(static_cast<uint32_t>(keys_.size()));
  len_.push_back(static_cast<uint32_t>(key.size()));
  keys_.insert(keys_.end(), key.begin(), key.end());
  return fresh;
}

void SigTable::clear() {
  keys_.clear();
  begin_.clear();
  len_.clear();
  index_.clear();
}

void NodeStore::clear() {
  op.clear();
  shape.clear();
  arg_begin.assign(1, 0);
  args.clear();
  attr_begin.assign(1, 0);
  attrs.clear();
  payload.clear();
  example.clear();
  loc.clear();
  sig.clear();
  flags.clear();
  alias.clear();
  value_batch.clear();
  value_row.clear();
  batch_out.clear();
  user_tensors.clear();
  sigs.clear();
  // Shapes stay interned: the same model uses the same few shapes batch after batch.
}

// ---------------------------------------------------------------------------
// Errors.

std::string detail::format_site(const Site& s) {
  std::ostringstream os;
  if (s.loc.line() != 0) {
    std::string_view file = s.loc.file_name();
    os << file << ":" << s.loc.line() << ": ";
  }
  os << "sheaf: op '" << s.op << "'";
  if (s.example >= 0)
    os << " (example " << s.example << ")";
  else if (s.example == kMixedExample)
    os << " (across examples)";
  os << ": ";
  return os.str();
}

std::string Stats::str() const {
  std::ostringstream os;
  os << "nodes " << nodes << ", batches " << batches << ", rounds " << rounds << ", inputs zero-copy "
     << zero_copy_inputs << " / gathered " << gathered_inputs << " (" << gather_launches << " launches, "
     << gathered_bytes / 1024 << " KiB), fetches " << fetches << "; ms: trace " << trace_ms << ", schedule "
     << schedule_ms << ", execute " << execute_ms << ", fetch " << fetch_ms;
  if (gather_ms > 0 || op_ms > 0) os << " (profiled: gathers " << gather_ms << ", ops " << op_ms << ")";
  return os.str();
}

// ---------------------------------------------------------------------------
// Graph.

namespace {
GraphOptions with_concrete_device(GraphOptions o) {
  o.device = concrete_device(o.device);
  return o;
}
}  // namespace

Graph::Graph(GraphOptions options)
    : options_(with_concrete_device(options)),
      default_strategy_(&default_strategy()),
      slot_(acquire_slot(this)),
      last_plan_(std::make_unique<Plan>()),
      round_(std::make_unique<RoundBuffers>()) {
  generation_ = g_slots[slot_].generation.load();
  trace_start_ = std::chrono::steady_clock::now();
}

Graph::~Graph() { release_slot(slot_); }

const Plan* Graph::last_plan() const { return last_plan_->batches.empty() ? nullptr : last_plan_.get(); }

Graph& Graph::of(const Expr& e) {
  if (!e.defined()) throw UserError("sheaf: use of an empty Expr (default-constructed, never assigned)");
  if (e.slot_ >= kSlots) throw UserError("sheaf: use of an invalid Expr (a dangling reference to one?)");
  Slot& s = g_slots[e.slot_];
  Graph* g = s.graph.load();
  if (g == nullptr || s.generation.load() != e.gen_)
    throw UserError("sheaf: use of an Expr whose graph was cleared or destroyed since it was made");
  return *g;
}

Graph* Graph::find(const Expr& e) {
  if (!e.defined() || e.slot_ >= kSlots) return nullptr;
  Slot& s = g_slots[e.slot_];
  Graph* g = s.graph.load();
  return g != nullptr && s.generation.load() == e.gen_ ? g : nullptr;
}

NodeId Graph::node_of(const Expr& e, std::string_view op, std::source_location loc) const {
  Site site{op, current_example_, loc};
  if (!e.defined()) throw_user(site, "an argument is an empty Expr (default-constructed, never assigned)");
  if (e.slot_ != slot_)
    throw_user(site, "an argument belongs to a different sheaf::Graph; all Exprs of one op must come from "
                     "the same graph");
  if (e.gen_ != generation_)
    throw_user(site, "an argument is an Expr from before this graph's clear(); Exprs do not survive clear()");
  return e.node_;
}

void Graph::clear() {
  store_.clear();
  pending_.clear();
  unknown_shape_.clear();
  waiters_.clear();
  param_nodes_.clear();
  example_ordinal_.clear();
  stats_ = Stats();
  last_plan_->batches.clear();
  prepared_ = false;
  current_example_ = 0;
  generation_ = g_slots[slot_].generation.fetch_add(1) + 1;
  trace_start_ = std::chrono::steady_clock::now();
}

Graph::ExampleScope::ExampleScope(Graph& g, int id) : g_(g), previous_(g.current_example_) {
  if (id < 0) throw UserError(detail::cat("sheaf: example ids are >= 0, got ", id));
  g.current_example_ = id;
}
Graph::ExampleScope::~ExampleScope() { g_.current_example_ = previous_; }
Graph::ExampleScope Graph::example(int id) { return ExampleScope(*this, id); }

Expr Graph::record(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
                   std::source_location loc) {
  const OpInfo& info = op_info(op);
  // Scratch space for the inferer's view of the arguments; reused across calls.
  auto& shapes = arg_shapes_;
  auto& shared = arg_shared_;
  shapes.clear();
  shared.clear();
  bool unknown = false;
  int example = kSharedExample;
  for (NodeId a : args) {
    bool is_shared = store_.has(a, NodeStore::kShared);
    shared.push_back(is_shared);
    if (store_.shape[a] == kUnknownShape) {
      unknown = true;
      shapes.push_back(nullptr);
    } else {
      shapes.push_back(&store_.shape_of(a));
    }
    if (is_shared) continue;
    int e = store_.example[a];
    example = example == kSharedExample || example == e ? e : kMixedExample;
  }
  if (info.traits.source) example = current_example_;
  const bool is_shared = example == kSharedExample;

  Site site{info.name, example, loc};
  if (info.traits.arity != OpTraits::kVariadic && args.size() != static_cast<size_t>(info.traits.arity))
    throw_internal("op ", info.name, " recorded with ", args.size(), " arguments, expects ", info.traits.arity);
  ShapeId shape = kUnknownShape;
  if (!unknown) {
    InferCtx ctx(shapes, shared, attrs, payload, site);
    shape = store_.shapes.intern(info.infer(ctx));
  }

  // Checks passed: from here on nothing throws a UserError, so a failed op records nothing.
  auto n = static_cast<NodeId>(store_.size());
  if (info.traits.keyed && example >= 0) {
    auto e = static_cast<size_t>(example);
    if (example_ordinal_.size() <= e) example_ordinal_.resize(e + 1, 0);
    payload = static_cast<int64_t>((static_cast<uint64_t>(example) << 32) | example_ordinal_[e]);
  }
  if (example >= 0) {
    auto e = static_cast<size_t>(example);
    if (example_ordinal_.size() <= e) example_ordinal_.resize(e + 1, 0);
    ++example_ordinal_[e];
  }
  store_.op.push_back(op);
  store_.shape.push_back(shape);
  store_.args.insert(store_.args.end(), args.begin(), args.end());
  store_.arg_begin.push_back(static_cast<uint32_t>(store_.args.size()));
  store_.attrs.insert(store_.attrs.end(), attrs.begin(), attrs.end());
  store_.attr_begin.push_back(static_cast<uint32_t>(store_.attrs.size()));
  store_.payload.push_back(payload);
  store_.example.push_back(example);
  store_.loc.push_back(loc);
  store_.sig.push_back(kNoSig);
  store_.flags.push_back(is_shared ? NodeStore::kShared : 0);
  store_.alias.push_back(kNoNode);
  store_.value_batch.push_back(0);
  store_.value_row.push_back(0);
  if (unknown)
    unknown_shape_.push_back(n);
  else if (!is_shared)
    store_.sig[n] = signature(store_, n);
  pending_.push_back(n);
  return expr(n);
}

Expr Graph::input(const at::Tensor& x, std::source_location loc) {
  Site site{"input", current_example_, loc};
  if (!x.defined()) throw_user(site, "the tensor is undefined");
  if (!x.is_floating_point()) throw_user(site, "expects a floating-point tensor, got ", x.scalar_type());
  if (x.dim() > kMaxRank) throw_user(site, "per-example values have rank at most ", kMaxRank, ", got ", x.dim());
  auto slot = static_cast<int64_t>(store_.user_tensors.size());
  auto attrs = shape_attrs(x);
  Expr e = record(code_of<op::Input>, {}, attrs, slot, loc);
  store_.user_tensors.push_back(x);
  return e;
}

Expr Graph::param(const at::Tensor& w, std::source_location loc) {
  // A tensor already recorded has passed the checks below.
  if (w.defined())
    if (auto it = param_nodes_.find(w.unsafeGetTensorImpl()); it != param_nodes_.end()) return expr(it->second);
  Site site{"param", kSharedExample, loc};
  if (!w.defined()) throw_user(site, "the tensor is undefined");
  if (w.dim() > kMaxRank) throw_user(site, "shared values have rank at most ", kMaxRank, ", got ", w.dim());
  if (w.scalar_type() != at::kFloat)
    throw_user(site, "the tensor has dtype ", w.scalar_type(), "; sheaf computes in float32 (convert with .to(at::kFloat))");
  if (w.device() != options_.device)
    throw_user(site, "the tensor is on ", w.device(), " but the graph runs on ", options_.device,
               "; move the parameters with .to(device) first");
  auto slot = static_cast<int64_t>(store_.user_tensors.size());
  auto attrs = shape_attrs(w);
  Expr e = record(code_of<op::Param>, {}, attrs, slot, loc);
  store_.user_tensors.push_back(w);
  NodeId n = e.id();
  // A parameter needs no launch: its value is the tensor itself.
  pending_.pop_back();
  store_.flags[n] |= NodeStore::kShared | NodeStore::kComputed;
  store_.example[n] = kSharedExample;
  store_.value_batch[n] = static_cast<uint32_t>(store_.batch_out.size());
  store_.value_row[n] = kWholeRow;
  store_.batch_out.push_back(w);
  param_nodes_.emplace(w.unsafeGetTensorImpl(), n);
  return e;
}

Expr Graph::constant(Shape shape, double value, std::source_location loc) {
  std::array<int64_t, kMaxRank + 2> attrs{};
  attrs[0] = attr_of(value);
  attrs[1] = shape.rank();
  for (int i = 0; i < shape.rank(); ++i) attrs[static_cast<size_t>(2 + i)] = shape[i];
  return record(code_of<op::Constant>, {}, std::span(attrs.data(), static_cast<size_t>(2 + shape.rank())), 0, loc);
}

Expr Graph::lookup(const at::Tensor& table, int64_t id, bool sparse_grad, std::source_location loc) {
  NodeId t = param(table, loc).id();
  int64_t attr = sparse_grad ? 1 : 0;
  return record(code_of<op::Lookup>, std::span(&t, 1), std::span(&attr, 1), id, loc);
}

Expr Graph::placeholder(ShapeId shape, int example, std::source_location loc) {
  auto scope = ExampleScope(*this, example < 0 ? current_example_ : example);
  Expr e = record(code_of<op::Placeholder>, {}, {}, 0, loc);
  NodeId n = e.id();
  store_.flags[n] |= NodeStore::kPlaceholder;
  store_.example[n] = example;
  store_.shape[n] = shape;
  store_.sig[n] = kNoSig;
  if (shape == kUnknownShape) unknown_shape_.push_back(n);
  return e;
}

void Graph::resolve(NodeId p, NodeId value) {
  SHEAF_ASSERT(store_.has(p, NodeStore::kPlaceholder) && store_.alias[p] == kNoNode, "node ", p,
               " is not an unresolved placeholder");
  ShapeId want = store_.shape[p];
  ShapeId got = store_.shape[store_.resolve(value)];
  if (want != kUnknownShape && got != kUnknownShape && want != got)
    throw_user(Site{"loop", store_.example[p], store_.loc[p]}, "the body returned shape ",
               store_.shapes[got].str(), " but the loop state has shape ", store_.shapes[want].str());
  store_.alias[p] = value;
  if (!unknown_shape_.empty()) infer_deferred();
}

// Shapes downstream of a dsl::cond are unknown until its branch is recorded; once
// it is, infer them now (in dependency order) and report any mistake at the line
// of the op that made it.
void Graph::infer_deferred() {
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < unknown_shape_.size(); ++i) {
      NodeId n = unknown_shape_[i];
      if (store_.has(n, NodeStore::kPlaceholder)) {
        NodeId r = store_.alias[n];
        if (r == kNoNode || store_.shape[store_.resolve(r)] == kUnknownShape) continue;
        store_.shape[n] = store_.shape[store_.resolve(r)];
      } else {
        auto& shapes = arg_shapes_;
        auto& shared = arg_shared_;
        shapes.clear();
        shared.clear();
        bool ready = true;
        for (NodeId a : store_.args_of(n)) {
          if (store_.shape[a] == kUnknownShape) ready = false;
          else shapes.push_back(&store_.shape_of(a));
          shared.push_back(store_.has(a, NodeStore::kShared));
        }
        if (!ready) continue;
        const OpInfo& info = op_info(store_.op[n]);
        Site site{info.name, store_.example[n], store_.loc[n]};
        InferCtx ctx(shapes, shared, store_.attrs_of(n), store_.payload[n], site);
        store_.shape[n] = store_.shapes.intern(info.infer(ctx));
        if (!store_.has(n, NodeStore::kShared)) store_.sig[n] = signature(store_, n);
      }
      unknown_shape_[i] = unknown_shape_.back();
      unknown_shape_.pop_back();
      --i;
      progress = true;
    }
  }
}

void Graph::when_computed(NodeId node, ValueCallback callback) {
  waiters_.push_back(Waiter{node, std::move(callback)});
}

at::Tensor Graph::value(NodeId n) const {
  NodeId r = store_.resolve(n);
  if (!store_.has(r, NodeStore::kComputed)) {
    const OpInfo& info = op_info(store_.op[n]);
    throw_user(Site{info.name, store_.example[n], store_.loc[n]},
               "value() of a node that has not been computed; call forward() after recording it");
  }
  const at::Tensor& t = store_.batch_out[store_.value_batch[r]];
  uint32_t row = store_.value_row[r];
  return row == kWholeRow ? t : t.select(0, row);
}

void Graph::check_shape_now(NodeId n, std::string_view what) const {
  if (store_.shape[n] == kUnknownShape)
    throw UserError(detail::cat("sheaf: ", what, " of node %", n,
                                " is not known yet: it depends on a dsl::cond whose branch is chosen during "
                                "forward(); read it after forward()"));
}

std::string Graph::dump() const {
  std::ostringstream os;
  for (NodeId n = 0; n < store_.size(); ++n) {
    os << "%" << n << " = " << op_info(store_.op[n]).name << "(";
    bool first = true;
    for (NodeId a : store_.args_of(n)) {
      os << (first ? "" : ", ") << "%" << a;
      first = false;
    }
    os << ")";
    for (int64_t a : store_.attrs_of(n)) os << " #" << a;
    os << " : " << (store_.shape[n] == kUnknownShape ? std::string("?") : store_.shape_of(n).str());
    if (store_.example[n] >= 0) os << " ex " << store_.example[n];
    else os << (store_.example[n] == kSharedExample ? " shared" : " mixed");
    if (store_.sig[n] != kNoSig) os << " sig " << store_.sig[n];
    if (store_.has(n, NodeStore::kPlaceholder))
      os << (store_.alias[n] == kNoNode ? " (unresolved)" : " -> %" + std::to_string(store_.alias[n]));
    if (store_.has(n, NodeStore::kComputed)) os << " done";
    os << "  @" << store_.loc[n].file_name() << ":" << store_.loc[n].line() << "\n";
  }
  return os.str();
}

// ---------------------------------------------------------------------------
// Expr.

const Shape& Expr::shape() const {
  Graph& g = Graph::of(*this);
  g.check_shape_now(node_, "the shape");
  return g.store_.shape_of(node_);
}
int Expr::example() const { return Graph::of(*this).store_.example[node_]; }
at::Tensor Expr::value() const { return Graph::of(*this).value(node_); }
double Expr::item() const { return value().item<double>(); }

}  // namespace sheaf
