// The bodies of sheaf::Function calls, per graph (dsl/function.h is the user's
// side). A function's body is recorded once per argument signature (shapes,
// and which arguments are shared) into a private graph, compiled to batched
// steps (backend/function_body.h), and named by a call node's attribute.
//
// Bodies are recorded again after each clear() of the graph, as any recording
// is: the parameters a body reads are the tensors the model holds now (an
// optimizer's in-place updates and a model moved with .to(device) are both seen).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include <sheaf/backend/function_body.h>
#include <sheaf/core/error.h>
#include <sheaf/core/shape.h>
#include <sheaf/tracer/trace.h>

#include "expr.h"
#include "graph.h"

namespace sheaf::detail {

// What a sheaf::Function is; immutable, shared by every graph (and thread) that calls it.
struct FunctionDef {
  uint64_t id = 0;  // unique per Function object
  std::string name;
  size_t arity = 0;
  std::function<std::vector<Expr>(std::span<const Expr>)> body;
  std::source_location defined_at;
};

class Engine;

// What a body returned, checked: some results, each a value of `graph` (where
// the body recorded). UserError naming the call's site otherwise.
void check_results(const FunctionDef& def, std::span<const Expr> results, const Engine& graph, const Site& site);

// One more body recorded (or, with GraphOptions::inline_functions, run) on
// this thread inside the ones already running, for its lifetime: past 32 a
// UserError naming `def` at `site` (a Function that calls itself; inline, it
// recursed until the stack overflowed).
class BodyNesting {
 public:
  BodyNesting(const FunctionDef& def, const Site& site);
  ~BodyNesting();
  BodyNesting(const BodyNesting&) = delete;
  BodyNesting& operator=(const BodyNesting&) = delete;
};

class FunctionCache final : public FunctionTable {
 public:
  // A function's body for one argument signature.
  struct Variant {
    uint64_t def_id = 0;
    std::vector<uint32_t> key;  // per argument: signature_word()
    std::unique_ptr<Graph> graph;  // where the body is recorded
    std::vector<at::Tensor> stand_ins;  // the arguments the body is recorded on (shapes only)
    Fuser fuser;                   // its regions' programs, kept across recordings
    FunctionBody body;
    std::vector<Shape> results;
    // The attributes of a call's nodes (ops/call.h), made when the body is
    // recorded: result 0's (the Call: index, result count, rank, dims), then
    // each further result's (the CallResult: k, rank, dims). result_attrs(k).
    std::vector<int64_t> attrs;
    std::vector<uint32_t> attrs_begin;
    std::span<const int64_t> result_attrs(size_t k) const {
      return {attrs.data() + attrs_begin[k], attrs.data() + attrs_begin[k + 1]};
    }
    // Each result's shape in the calling graph's table (result_ids(): made on
    // first use after the body is recorded).
    std::vector<ShapeId> result_ids;
    Trace::CallVerdict verdict;  // its calls' signature (Trace::call)
    // The graph generation it was recorded for, once `recorded` (a flag, not
    // a sentinel epoch: generations wrap and may take any value).
    uint32_t epoch = 0;
    bool recorded = false;
    bool recording = false;        // its body is being recorded (a call now would be recursion)
  };

  // An argument's part of a signature: its shape's id in the calling graph's
  // shape table (which outlives clear(): ids name the same shape batch after
  // batch), and whether it is shared.
  static uint32_t signature_word(ShapeId shape, bool shared) { return Trace::call_word(shape, shared); }

  // The index of def's variant for the arguments whose signature_word()s are
  // `signature`, recorded for this generation of the calling graph (`epoch`).
  // Throws UserError (naming `site`, the call) when the body fails to record
  // or does what a function cannot.
  uint32_t variant_for(const FunctionDef& def, std::span<const uint32_t> signature, uint32_t epoch,
                       const GraphOptions& options, const Site& site, const Trace& caller) {
    // A call site calls one variant over and over: the body this function
    // found last, in line.
    if (const uint32_t last = last_of(def, epoch); last != kNone32 && matches(*variants_[last], def, signature))
      return last;
    return find_or_record(def, signature, epoch, options, site, caller);
  }
  // The variant def found last, if it is recorded for generation `epoch`;
  // else nullptr. (Whether it fits a call's arguments is Trace::call_again's.)
  Variant* last_recorded(const FunctionDef& def, uint32_t epoch) {
    const uint32_t last = last_of(def, epoch);
    return last != kNone32 ? variants_[last].get() : nullptr;
  }
  const Variant& variant(uint32_t index) const { return *variants_[index]; }
  Variant& variant(uint32_t index) { return *variants_[index]; }
  // Variant `index`'s result shapes interned in the calling graph's table,
  // which outlives clear() (as signature_word()'s ids do): a call's further
  // results are recorded with them, without inference (Trace::call_result).
  std::span<const ShapeId> result_ids(uint32_t index, ShapeTable& shapes) {
    Variant& v = *variants_[index];
    if (v.result_ids.size() != v.results.size()) {
      v.result_ids.clear();
      for (const Shape& r : v.results) v.result_ids.push_back(shapes.intern(r));
    }
    return v.result_ids;
  }
  // After a clear() of the calling graph (now at `epoch`): forgets the variants
  // no batch recorded in the last few (a model whose argument shapes change
  // from batch to batch keeps only the recent ones). Call nodes name variants
  // by index: only between batches.
  void trim(uint32_t epoch);
  // Whether a body is being recorded (for a call on the calling graph now).
  bool recording() const {
    for (const std::unique_ptr<Variant>& v : variants_)
      if (v->recording) return true;
    return false;
  }
  // Engine::expect_params_unchanged for the bodies recorded for generation
  // `epoch` (and so for the bodies they call): a body's steps read the
  // parameters it recorded, as a graph does.
  void expect_params_unchanged(uint32_t epoch) const;
  const FunctionBody& body(int64_t index) const override { return variants_[static_cast<size_t>(index)]->body; }
  size_t size() const { return variants_.size(); }

 private:
  // Whether v is def's body for these arguments. A hand loop: the hit path
  // above stays free of calls.
  static bool matches(const Variant& v, const FunctionDef& def, std::span<const uint32_t> signature) {
    if (v.def_id != def.id || v.key.size() != signature.size()) return false;
    for (size_t i = 0; i < signature.size(); ++i)
      if (v.key[i] != signature[i]) return false;
    return true;
  }
  // The index of the variant def found last (a hint per function: models
  // alternate functions, a gated net's gate and its two cells), if it is
  // recorded for generation `epoch`; else kNone32.
  uint32_t last_of(const FunctionDef& def, uint32_t epoch) const {
    const uint32_t last = last_[def.id % last_.size()];
    if (last >= variants_.size()) return kNone32;
    const Variant& v = *variants_[last];
    return v.recorded && v.epoch == epoch && v.def_id == def.id ? last : kNone32;
  }
  uint32_t find_or_record(const FunctionDef& def, std::span<const uint32_t> signature, uint32_t epoch,
                          const GraphOptions& options, const Site& site, const Trace& caller);
  void record(Variant& v, const FunctionDef& def, std::span<const uint32_t> signature, const GraphOptions& options,
              const Site& site, const Trace& caller);
  std::vector<std::unique_ptr<Variant>> variants_;
  // Per function (by its id, modulo), the variant it found last.
  std::array<uint32_t, 8> last_{kNone32, kNone32, kNone32, kNone32, kNone32, kNone32, kNone32, kNone32};
};

}  // namespace sheaf::detail
