#include "functions.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <sstream>

#include <sheaf/ops/op.h>

#include "engine.h"

namespace sheaf::detail {

namespace {

// More variants than this in one graph: Functions made per call, most likely.
constexpr size_t kMaxVariants = 1024;
// A variant no batch recorded for this many clears is forgotten.
constexpr uint32_t kKeepClears = 8;
// Bodies that call functions record them in graphs of their own, this deep at most.
constexpr int kMaxNesting = 32;
thread_local int t_nesting = 0;

// A body's error as the call that recorded it words it, with the Functions
// whose words it already carries: each wraps it once (a body that calls
// itself fails at the nesting limit, and every level would repeat the words
// kMaxNesting times), while two Functions of one name still each add theirs.
class BodyError : public UserError {
 public:
  BodyError(const std::string& what, std::vector<uint64_t> wrapped) : UserError(what), wrapped_(std::move(wrapped)) {}
  bool wraps(uint64_t def) const { return std::find(wrapped_.begin(), wrapped_.end(), def) != wrapped_.end(); }
  const std::vector<uint64_t>& wrapped() const { return wrapped_; }

 private:
  std::vector<uint64_t> wrapped_;
};

const Shape& shape_of(uint32_t word, const Trace& caller) { return caller.store().shapes[word >> 1]; }
bool shared_of(uint32_t word) { return (word & 1) != 0; }

std::string describe(std::span<const uint32_t> signature, const Trace& caller) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < signature.size(); ++i)
    os << (i ? ", " : "") << (shared_of(signature[i]) ? "shared " : "") << shape_of(signature[i], caller).str();
  return os.str() + ")";
}

}  // namespace

void check_results(const FunctionDef& def, std::span<const Expr> results, const Engine& graph, const Site& site) {
  if (results.empty()) throw_user(site, "function '", def.name, "' returned no results");
  for (size_t k = 0; k < results.size(); ++k)
    if (Engine::find(results[k]) != &graph)
      throw_user(site, "result ", k, " of function '", def.name,
                 "' is not computed in its body from its arguments (an Expr from outside the function, or an empty "
                 "one): pass outside values in as arguments");
}

void FunctionCache::trim(uint32_t epoch) {
  std::erase_if(variants_, [&](const std::unique_ptr<Variant>& v) {
    return !v->recorded || epoch - v->epoch > kKeepClears;  // (generations wrap: unsigned difference)
  });
  last_.fill(kNone32);
}

void FunctionCache::expect_params_unchanged(uint32_t epoch) const {
  for (const std::unique_ptr<Variant>& v : variants_)
    if (v->recorded && v->epoch == epoch) engine_of(*v->graph).expect_params_unchanged();
}

uint32_t FunctionCache::find_or_record(const FunctionDef& def, std::span<const uint32_t> signature, uint32_t epoch,
                                       const GraphOptions& options, const Site& site, const Trace& caller) {
  uint32_t index = kNone32;
  for (uint32_t k = 0; index == kNone32 && k < variants_.size(); ++k)
    if (matches(*variants_[k], def, signature)) index = k;
  if (index == kNone32) {
    if (variants_.size() >= kMaxVariants)
      throw_user(site, "this graph has recorded ", kMaxVariants, " function bodies (function '", def.name,
                 "' is the latest): make each sheaf::Function once (a member of the model) and call it many times; "
                 "a Function made per call records its body per call");
    auto v = std::make_unique<Variant>();
    v->def_id = def.id;
    v->key.assign(signature.begin(), signature.end());
    index = static_cast<uint32_t>(variants_.size());
    variants_.push_back(std::move(v));
  }
  last_[def.id % last_.size()] = index;
  Variant& v = *variants_[index];
  if (!v.recorded || v.epoch != epoch) {
    if (v.recording)
      throw_user(site, "function '", def.name, "' calls itself while its body is recorded: a body is recorded once "
                 "per argument signature, so it cannot recurse (recurse in the caller, as over a tree's nodes)");
    v.recorded = false;  // until recorded whole
    v.recording = true;
    struct Done {
      bool& flag;
      ~Done() { flag = false; }
    } done{v.recording};
    record(v, def, signature, options, site, caller);
    v.attrs.clear();
    v.attrs_begin.assign(1, 0);
    v.result_ids.clear();
    v.verdict = {};
    for (size_t k = 0; k < v.results.size(); ++k) {
      if (k == 0) v.attrs.insert(v.attrs.end(), {static_cast<int64_t>(index), static_cast<int64_t>(v.results.size())});
      else v.attrs.push_back(static_cast<int64_t>(k));
      v.attrs.push_back(v.results[k].rank());
      v.attrs.insert(v.attrs.end(), v.results[k].dims().begin(), v.results[k].dims().end());
      v.attrs_begin.push_back(static_cast<uint32_t>(v.attrs.size()));
    }
    v.epoch = epoch;
    v.recorded = true;
  }
  return index;
}

BodyNesting::BodyNesting(const FunctionDef& def, const Site& site) {
  if (t_nesting >= kMaxNesting)
    throw_user(site, "functions nested more than ", kMaxNesting, " deep (does function '", def.name,
               "' call itself? a body is recorded once per argument shapes, so it cannot recurse on data)");
  ++t_nesting;
}

BodyNesting::~BodyNesting() { --t_nesting; }

void FunctionCache::record(Variant& v, const FunctionDef& def, std::span<const uint32_t> signature,
                           const GraphOptions& options, const Site& site, const Trace& caller) {
  const BodyNesting nest(def, site);
  if (!v.graph) {
    // Only what recording and compiling read: the body runs inside its
    // callers' launches with their configuration (seed, train, weight
    // gradients, packing, profiling), it has no control flow to defer, no
    // randomness, and it is compiled, not scheduled.
    GraphOptions o;
    o.device = options.device;
    o.fuse = options.fuse;
    v.graph = std::make_unique<Graph>(o);
  }
  Graph& g = *v.graph;
  Engine& e = engine_of(g);
  e.clear();  // (frozen since its last recording: the library's own clear)
  std::vector<Expr> args, results;
  std::vector<NodeId> arg_nodes, result_nodes;
  {
    // Under the calling example's id: the body's own errors then name it.
    auto scope = g.example(site.example >= 0 ? site.example : 0);
    // Stand-ins: the body sees the arguments' shapes; their values come per
    // batch. Made at the variant's first recording and kept (its signature,
    // and so their shapes, never change): an at::empty each per recording
    // was ~0.4% of a gated net's inference.
    if (v.stand_ins.size() != signature.size()) {
      const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(options.device);
      v.stand_ins.clear();
      for (const uint32_t word : signature) {
        const Shape& shape = shape_of(word, caller);
        v.stand_ins.push_back(at::empty(std::vector<int64_t>(shape.dims().begin(), shape.dims().end()), f32));
      }
    }
    for (size_t i = 0; i < signature.size(); ++i) {
      const at::Tensor& stand_in = v.stand_ins[i];
      args.push_back(shared_of(signature[i]) ? g.param(stand_in, def.defined_at) : g.input(stand_in, def.defined_at));
      arg_nodes.push_back(args.back().id());
    }
    const size_t caller_nodes = caller.size();
    try {
      struct Recording {
        Engine& e;
        explicit Recording(Engine& engine) : e(engine) { e.set_recording_body(true); }
        ~Recording() { e.set_recording_body(false); }
      } recording(e);
      results = def.body(args);
    } catch (const UserError& err) {
      const auto* body = dynamic_cast<const BodyError*>(&err);
      if (body != nullptr && body->wraps(def.id)) throw;
      std::vector<uint64_t> wrapped = body != nullptr ? body->wrapped() : std::vector<uint64_t>{};
      wrapped.push_back(def.id);
      throw BodyError(format_site(site) + cat("recording the body of function '", def.name, "' (defined at ",
                                              format_loc(def.defined_at), ") for arguments ",
                                              describe(signature, caller), " failed: ", err.what()),
                      std::move(wrapped));
    }
    // The body wrote on the calling graph: it used an Expr from outside (not returned, or the
    // results check below would name it); those ops would run once per recording, not per call.
    if (caller.size() != caller_nodes)
      throw_user(site, "function '", def.name, "' recorded ops on the graph that calls it (op '",
                 caller.site_of(static_cast<NodeId>(caller_nodes)).op, "' at ",
                 format_loc(caller.site_of(static_cast<NodeId>(caller_nodes)).loc),
                 "): its body used an Expr from outside the function; pass outside values in as arguments");
  }
  check_results(def, results, e, site);
  const NodeStore& s = e.store();
  for (const Expr& r : results) result_nodes.push_back(r.id());
  for (NodeId n = 0; n < s.size(); ++n) {
    const Site at = e.trace().site_of(n);
    if (s.has(n, NodeStore::kPlaceholder) || s.shape[n] == kUnknownShape)
      throw_user(site, "function '", def.name, "' uses dsl::cond or dsl::loop (op '", at.op, "' at ",
                 format_loc(at.loc), "): a body runs the same steps for every call; call the function inside the "
                 "branch or the loop body instead");
    if (op_info(s.op[n]).traits.keyed)
      throw_user(site, "function '", def.name, "' applies op '", at.op, "' (at ", format_loc(at.loc),
                 ") whose randomness is drawn per example; apply it outside the function, to its arguments or results");
  }
  v.results.clear();
  for (NodeId r : result_nodes) v.results.push_back(s.shape_of(r));
  v.fuser.fuse_lone_ops(options.device.is_cpu());
  v.body.compile(e.trace().store(), e.trace().ready(), arg_nodes, result_nodes, options.fuse, v.fuser, &e.functions());
  e.freeze_body();  // its nodes are steps now: recording or running on them is the user's mistake
}

}  // namespace sheaf::detail
