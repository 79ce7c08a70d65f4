// The forward loop as straight-line code, repeated per round:
//
//   recorded nodes --Scheduler--> Plan --Executor--> values --deliver_waiters--> more nodes
//
// Control flow: values awaited by cond/loop/coroutines and computed in this
// round are fetched to the host in one copy for all examples, their branches
// are recorded, and the next round runs.
#include "engine.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <sheaf/backend/runtime.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

#include "handles.h"
#include "scopes.h"

namespace sheaf::detail {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool debug_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SHEAF_DEBUG");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

thread_local Engine* t_delivering = nullptr;

// The options with the device made concrete and the cost model set (the
// device's unless given), checked.
GraphOptions checked_options(GraphOptions o) {
  o.device = concrete_device(o.device);
  if (!o.cost) o.cost = CostModel::for_device(o.device);
  const CostModel& c = *o.cost;
  const double figures[] = {c.launch_us, c.gather_us, c.gather_us_per_mb};
  if (std::any_of(std::begin(figures), std::end(figures), [](double v) { return !std::isfinite(v) || v < 0; }))
    throw UserError(detail::cat("sheaf: GraphOptions::cost needs finite, non-negative figures; got launch_us = ",
                                c.launch_us, ", gather_us = ", c.gather_us, ", gather_us_per_mb = ",
                                c.gather_us_per_mb));
  return o;
}

}  // namespace

Engine::Engine(Graph& graph, GraphOptions options)
    : graph_(graph),
      options_(checked_options(options)),
      trace_(options_.device),
      slot_(acquire_slot(this)),
      generation_(generation_of(slot_)) {
  transposed_.set_packing(options_.pack_weights);
  scheduler_.fuse_lone_ops(options_.device.is_cpu());
}

Engine::~Engine() {
  forget_scopes(*this);
  release_slot(slot_);
}

// ---------------------------------------------------------------------------
// Handles.

Engine& Engine::of(const Expr& e, Loc loc) {
  Engine* g = find(e);
  if (g == nullptr) throw_user_at(loc, unusable(e, "this Expr"));
  return *g;
}

namespace {

std::string unusable_message(std::string_view subject, bool defined, bool gone) {
  if (!defined) return cat(subject, " is an empty Expr (default-constructed, never assigned)");
  return cat(subject, " is an Expr whose graph ",
             gone ? "was destroyed since it was made (an Expr does not outlive its sheaf::Graph)"
                  : "was cleared since it was made (Exprs do not survive clear())");
}

}  // namespace

std::string Engine::unusable(const Expr& e, std::string_view subject) {
  return unusable_message(subject, e.defined(), e.defined() && owner_gone(e.slot_, e.gen_));
}

void Engine::expect_results(std::span<const Expr> results, std::string_view who, std::string_view unit, size_t index,
                            Loc loc) const {
  for (size_t k = 0; k < results.size(); ++k) {
    const Expr& e = results[k];
    if (node_or_none(e) != kNoNode) continue;
    const std::string subject = cat(who, " (", unit, " ", index, ")'s result ", k);
    if (const Engine* other = find(e); other != nullptr && other != this)
      throw_user_at(loc, subject, " belongs to another sheaf::Graph: return Exprs recorded on the Graph the "
                                  "function is given");
    throw_user_at(loc, unusable(e, subject));
  }
}

void Engine::bad_expr(const Expr& e, std::string_view op, Loc loc) const {
  const Site site{op, trace_.current_example(), loc};
  // (Before the slot test: a graph made after the Expr's was destroyed may have its slot, this one included.)
  const bool gone = e.defined() && owner_gone(e.slot_, e.gen_);
  if (!e.defined() || gone) throw_user(site, unusable_message("an argument", e.defined(), gone));
  if (e.slot_ != slot_) {
    // A function body's Expr kept past the call: its graph is the body's, which says so.
    if (const Engine* other = find(e); other != nullptr && (other->closed_ & kFrozen) != 0) other->throw_frozen(op, loc);
    throw_user(site, "an argument belongs to a different sheaf::Graph; all Exprs of one op must come from "
                     "the same graph");
  }
  SHEAF_ASSERT(e.gen_ != generation_, "bad_expr called for an Expr of this graph");
  throw_user(site, unusable_message("an argument", true, false));
}

// ---------------------------------------------------------------------------
// Recording time: from the first node recorded to the next forward/prepare.

void Engine::start_trace_clock() {
  recording_ = true;
  trace_start_ = Clock::now();
}

void Engine::stop_trace_clock() {
  if (!recording_) return;
  stats_.trace_ms += ms_since(trace_start_);
  recording_ = false;
}

// ---------------------------------------------------------------------------
// Execution.

const Strategy& Engine::strategy_for(const ForwardOptions& options) const {
  if (options.strategy) return *options.strategy;
  return options_.strategy ? *options_.strategy : default_strategy();
}

// Every round's schedule is checked when asked for, under SHEAF_DEBUG=1, and
// always for a strategy of the user's own: the planner relies on
// Strategy::schedule's contract without checking it, and a broken schedule
// would plan reads of batches that have not run.
bool Engine::validating(const ForwardOptions& options, const Strategy& strategy) const {
  return options.validate || debug_enabled() || !built_in(strategy);
}

void Engine::throw_frozen(std::string_view what, Loc loc) const {
  throw_user(Site{what, kSharedExample, loc},
             "this graph holds a sheaf::Function's body, recorded once and run by its calls: an Expr of the body "
             "was used after the call (keep only the results the function returns)");
}

void Engine::throw_closed(std::string_view what, Loc loc) const {
  if (closed_ & kExecuting) throw_in_kernel(what, loc);
  throw_frozen(what, loc);
}

void Engine::throw_in_kernel(std::string_view what, Loc loc) const {
  throw_user(Site{what, kSharedExample, loc},
             "called while one of this graph's rounds runs, from inside one of its own kernels (a user op's "
             "run()) or from another thread: a kernel may not record into, run, clear or read the values of the "
             "graph that launched it; do that work outside the user op (pass what it needs as arguments), or on "
             "another graph");
}

void Engine::throw_in_body(std::string_view what, Loc loc) const {
  throw_user(Site{what, kSharedExample, loc},
             "called inside a sheaf::Function's body: a body is recorded once, on stand-ins for its arguments, "
             "and replayed by every call, so its values are not computed while it records; compute and branch on "
             "values outside the function (or pass them in as arguments)");
}

void Engine::throw_in_delivery(std::string_view what, Loc loc) const {
  throw_user(Site{what, kSharedExample, loc},
             "called inside a dsl::cond branch, a dsl::loop step or a coroutine of this graph's own forward(): "
             "that forward is still running, and the values it handed over are read from its current round; "
             "await what you need instead (co_await sheaf::fetch_values(e), or a dsl::cond on it)");
}

void Engine::expect_not_reading(std::string_view what, Loc loc) const {
  expect_not_lent(what, loc);
  expect_open(what, loc);
  if (recording_body_) throw_in_body(what, loc);
  // (Its own flag, not the thread's innermost delivery: another graph's
  // forward inside this one's delivery may call back into this graph.)
  if (delivering_ != nullptr) throw_in_delivery(what, loc);
}

void Engine::expect_not_lent(std::string_view what, Loc loc) const {
  if (const uint64_t t = lent_to_.load(std::memory_order_acquire); t != 0 && t != this_thread_tag()) [[unlikely]]
    throw_user(Site{what, kSharedExample, loc},
               "this graph is lent to another thread: a sheaf::Prefetcher's worker recording the next batch "
               "into it (a Prefetcher::Batch's graph is valid until the next take(): use the graph of the batch "
               "take() returned last), or a sheaf::Overlap's thread running its part (the parts' graphs are "
               "the caller's again when run() returns)");
}

void Engine::expect_can_run(std::string_view what, Loc loc) const {
  expect_not_reading(what, loc);
  expect_params_unchanged();
}

void Engine::expect_params_unchanged() const {
  trace_.expect_params_unchanged();
  functions_.expect_params_unchanged(generation_);
}

void Engine::retire() {
  if (retired_) return;
  generation_ = bump_generation(slot_);
  retired_ = true;
}

void Engine::expect_can_clear(Loc loc) const {
  expect_not_reading("clear", loc);
  if (functions_.recording())
    throw_user(Site{"clear", kSharedExample, loc},
               "called while a sheaf::Function's body records for a call on this graph (from inside the body): "
               "the call is still being recorded on it");
}

void Engine::forward(std::span<const Expr> targets, const ForwardOptions& options, Loc loc) {
  expect_can_run("forward", loc);
  if (options.max_rounds < 1)
    throw_user(Site{"forward", kSharedExample, loc}, "ForwardOptions::max_rounds must be >= 1, got ",
               options.max_rounds);
  for (const Expr& t : targets) node_of(t, "forward", loc);
  const Strategy& strategy = strategy_for(options);
  const bool validate = validating(options, strategy);
  stop_trace_clock();
  if (debug_enabled()) std::cerr << "[sheaf] graph before forward:\n" << trace_.dump();

  bool defer = options_.defer_unawaited;
  defer_from_ = static_cast<NodeId>(trace_.size());
  for (int round = 0;; ++round) {
    if (round >= options.max_rounds) throw_runaway(options.max_rounds, loc);
    const bool was_prepared = prepared_;
    if (prepared_) {
      prepared_ = false;
      if (!scheduler_.plan_holds(trace_)) {
        scheduler_.replan(trace_);
        ++stats_.replans;
      }
      execute_in_turn();
    } else if (schedule_round(strategy, validate, defer)) {
      execute_in_turn();
    }
    if (orphan_) throw_orphaned(loc);  // a kernel destroyed the graph: no callback runs on it
    bool delivered = false;
    try {
      delivered = deliver_waiters();
    } catch (...) {
      // (Only report_failure throws here, out of memory.) A graph its
      // callback destroyed is freed on the way out, not kept by itself forever.
      if (orphan_) {
        const std::unique_ptr<Engine> self = std::move(orphan_);
      }
      throw;
    }
    if (orphan_) throw_orphaned(loc);
    if (delivered) {
      defer = options_.defer_unawaited;
      continue;
    }
    if (was_prepared) continue;  // then what was recorded since prepare() (graph.h)
    // Nothing awaited could be served: what waited runs too (then control
    // flow may go on, or the forward ends with everything computed).
    if (!defer || !trace_.ready().any_deferred()) break;
    defer = false;
  }
  if (!failures_.empty()) throw_failures(loc);
  check_targets(targets, loc);
  // Nothing more can run, and a cond, loop or coroutine still waits: its
  // value depends on a launch that failed in an earlier forward (never
  // retried), or on control flow that never resolves. Said now, not as a
  // task that "has not finished" or a cond result that is never computed.
  // Each wait is reported once: a later forward of other work runs.
  if (live_waiters_ > 0) {
    uint64_t newest = 0;
    for (const Waiter& w : waiters_)
      if (w.callback) newest = std::max(newest, w.order + 1);
    if (newest > stuck_reported_) {
      stuck_reported_ = newest;
      throw_stuck(loc);
    }
  }
}

// The engine is freed as this unwinds (its Graph is gone): nothing of it is
// touched after `self` goes.
void Engine::throw_orphaned(Loc loc) {
  std::unique_ptr<Engine> self = std::move(orphan_);
  throw_user(Site{"forward", kSharedExample, loc}, "the graph was destroyed by ",
             orphaned_in_kernel_ ? "a kernel of one of its own rounds (a user op's run())"
                                 : "a callback of its own forward() (a dsl::cond branch, a dsl::loop body or a task it "
                                   "resumed)",
             ": the rest of that forward is dropped; destroy a graph after its forward() returns");
}

void Engine::prepare(std::span<const Expr> targets, const ForwardOptions& options, Loc loc) {
  expect_can_run("prepare", loc);
  for (const Expr& t : targets) node_of(t, "prepare", loc);
  if (prepared_) return;  // nothing recorded since can join that round
  stop_trace_clock();
  const Strategy& strategy = strategy_for(options);
  prepared_ = schedule_round(strategy, validating(options, strategy), /*defer=*/false);
}

// Plans the pending nodes that can run. Returns false when there is nothing to
// launch (the round only resolved placeholders).
bool Engine::schedule_round(const Strategy& strategy, bool validate, bool defer) {
  const auto t0 = Clock::now();
  // While control flow waits, a round runs what the awaited values need; the
  // rest (a step's loss) batches with its kind in a later round.
  // Only nodes control flow recorded can be deferred: until there are some,
  // no walk (a training step that awaits once before its first round).
  awaited_.clear();
  const bool awaiting = defer && trace_.size() > defer_from_ && live_waiters_ > 0;
  if (awaiting) {
    for (const WaiterId& id : unmarked_) {
      const Waiter& w = waiters_[id.index];
      if (w.generation == id.generation && w.callback) awaited_.push_back(w.node);
    }
    stats_.waiter_visits += unmarked_.size();
    unmarked_.clear();
  }
  const Awaited awaited{awaited_, defer_from_};
  const bool launch = scheduler_.schedule(trace_, strategy, validate, options_.fuse, *options_.cost,
                                          awaiting ? &awaited : nullptr);
  if (!launch) finish_aliases();
  stats_.schedule_ms += ms_since(t0);
  const Scheduler::Times& parts = scheduler_.times();
  stats_.round_ms = parts.round_ms;
  stats_.fuse_ms = parts.fuse_ms;
  stats_.strategy_ms = parts.strategy_ms;
  stats_.plan_ms = parts.plan_ms;
  stats_.round_visits = parts.visits;
  if (launch) stats_.strategy_used = scheduler_.chosen();
  if (!scheduler_.compared().empty()) stats_.compared.assign(scheduler_.compared().begin(), scheduler_.compared().end());
  stats_.deferred_inferences = trace_.deferred_inferences();
  stats_.deferred = trace_.ready().deferred_count();
  if (!launch) return false;
  stats_.split_shared += scheduler_.split_shared();
  if (debug_enabled()) {
    if (!scheduler_.compared().empty())
      std::cerr << "[sheaf] " << strategy.name() << " compared: " << describe(scheduler_.compared()) << "; picked "
                << scheduler_.chosen() << "\n";
    std::cerr << "[sheaf] " << scheduler_.plan().str();
    if (scheduler_.split_shared() > 0) {
      const Site site = trace_.site_of(scheduler_.split_shared_example());
      std::cerr << "[sheaf] warning: " << scheduler_.split_shared() << " launches of op '" << site.op
                << "' (e.g. at " << format_loc(site.loc)
                << ") did not batch because each reads its own \"shared\" tensor, made per example (W * 1.0, "
                   "W.t(), W.narrow(...) inside the model?): use one tensor for all examples\n";
    }
  }
  return true;
}

std::unique_lock<ExecutionTurns> Engine::take_turn() {
  // Held by this thread already: a kernel of another graph of the same
  // turns (an Overlap's, used after run()) reads a value of this one or runs
  // it. That work is in turn as it is; waiting would be for itself.
  if (turns_ == nullptr || turns_->held_here()) return {};
  return std::unique_lock(*turns_);
}

void Engine::execute_in_turn() {
  try {
    const std::unique_lock<ExecutionTurns> turn = take_turn();
    execute_round();
  } catch (...) {
    // A kernel destroyed the graph, then a launch of the round threw: the
    // engine, which kept itself for this forward, is freed on the way out.
    if (orphan_) {
      const std::unique_ptr<Engine> self = std::move(orphan_);
    }
    throw;
  }
}

const at::Tensor& Engine::fetched_value(NodeStore& s, uint32_t batch) {
  SHEAF_ASSERT(turns_ == nullptr || turns_->held_here(), "batch ", batch,
               "'s value read outside this graph's execution turn (it may launch a kernel)");
  return lazy_.get(s, batch);
}

const at::Tensor& Engine::value_in_turn(NodeStore& s, uint32_t batch) {
  if (s.batch_out[batch].defined()) return s.batch_out[batch];  // at hand: read without waiting
  const std::unique_lock<ExecutionTurns> turn = take_turn();
  return fetched_value(s, batch);
}

void Engine::execute_round() {
  const auto t0 = Clock::now();
  struct Executing {
    uint8_t& closed;
    explicit Executing(uint8_t& c) : closed(c) { closed |= kExecuting; }
    ~Executing() { closed &= static_cast<uint8_t>(~kExecuting); }
  } executing{closed_};
  exec_config_ = ExecConfig{options_.device, options_.seed, options_.train, options_.profile,
                            options_.batch_weight_grads, &functions_, &transposed_, &index_buffer_,
                            &row_gathers_};
  if (!executor_) executor_ = std::make_unique<Executor>(trace_.store(), lazy_, exec_config_, stats_);
  try {
    executor_->run(scheduler_.plan());
  } catch (...) {
    // The failed batch is marked failed (never retried); nodes that did not run
    // are looked at again next round, so the rest of the graph stays usable.
    NodeStore& s = trace_.store();
    for (NodeId n : scheduler_.plan().placed) {
      if (s.has(n, NodeStore::kComputed)) note_computed(n);
      else trace_.ready().add(n);  // the run failed before it got to them: placed again next round
    }
    bool first_uncomputed = true;
    for (const PlannedBatch& b : scheduler_.plan().batches) {
      if (s.has(scheduler_.plan().nodes[b.nodes_begin], NodeStore::kComputed)) {
        // Ran before the failure: what waits on it (a cond's predicate) is served.
        for (uint32_t i = 0; i < b.n * b.outputs; ++i) note_computed(scheduler_.plan().nodes[b.nodes_begin + i]);
        continue;
      }
      for (uint32_t i = 0; i < b.n * b.outputs; ++i) {
        const NodeId n = scheduler_.plan().nodes[b.nodes_begin + i];
        if (first_uncomputed) s.flags[n] |= NodeStore::kFailed;
        trace_.ready().add(n);
      }
      first_uncomputed = false;
    }
    for (NodeId p : scheduler_.aliases()) trace_.ready().add(p);
    stats_.execute_ms += ms_since(t0);
    throw;
  }
  stats_.execute_ms += ms_since(t0);
  ++stats_.rounds;
  if (!watches_.empty()) {
    for (NodeId n : scheduler_.plan().placed) note_computed(n);
    for (NodeId n : scheduler_.plan().nodes) note_computed(n);
  }
  finish_aliases();
}

// A resolved placeholder's value is its branch's value: same batch, same row.
void Engine::finish_aliases() {
  NodeStore& s = trace_.store();
  for (NodeId p : scheduler_.aliases()) {
    const NodeId r = s.resolve(p);
    SHEAF_ASSERT(s.has(r, NodeStore::kComputed), "alias target %", r, " of %", p, " not computed");
    s.value_at[p] = s.value_at[r];
    s.flags[p] |= static_cast<uint8_t>(NodeStore::kComputed | (s.flags[r] & NodeStore::kPacked));
    note_computed(p);
  }
}

at::Tensor Engine::value(NodeId n, Loc loc) {
  // (A value is made on first read, and its thread may be running the graph.)
  expect_not_lent("value", loc);
  if (recording_body_) throw_in_body("value", loc);
  if (closed_ & kExecuting) throw_in_kernel("value", loc);
  if (closed_ & kFrozen) throw_frozen("value", loc);  // (no forward computes a body's nodes)
  NodeStore& s = trace_.store();
  const NodeId r = s.resolve(n);
  if (!s.has(r, NodeStore::kComputed)) {
    // Inside control flow only what is awaited has run (the rest may be deferred).
    const char* hint = t_delivering == this
                           ? ": inside a branch, loop body or coroutine only awaited values have run; await it "
                             "(co_await sheaf::fetch_values(e)), or set GraphOptions::defer_unawaited = false to "
                             "run every recorded node as soon as it can"
                           : "; call forward() after recording it";
    throw_user_at(loc, "value() of a node that has not been computed (op '", trace_.site_of(n).op, "' recorded at ",
                  format_loc(s.loc[n]), ")", hint);
  }
  // A value its fused kernel kept inside is made now, a launch: in this
  // graph's turn when it has one (an Overlap part's record function reading
  // what its own forward computed). Held here already only by a kernel of
  // another graph of the same turns (this graph's own kernels were refused
  // above): take_turn() then takes nothing.
  const at::Tensor& t = value_in_turn(s, s.value_at[r].batch);
  const uint32_t row = s.value_at[r].row;
  if (s.has(r, NodeStore::kPacked)) return t.narrow(0, row, s.shape_of(r)[0]);  // its rows of a packed batch
  if (row == kWholeRow) return t;
  // A lookup read from its table (scheduler/plan.h's `placed`): a copy, not a
  // view of the user's parameter that a later update in place would change
  // (the copy is of the table as it is now: docs/reliability.md).
  if (s.op[r] == code_of<op::Lookup> && s.value_at[s.resolve(s.args_of(r)[0])].batch == s.value_at[r].batch)
    return t.select(0, row).clone();
  return t.select(0, row);
}

const Plan* Engine::last_plan() const {
  const Plan& p = scheduler_.plan();
  return p.batches.empty() && p.placed.empty() ? nullptr : &p;
}

void Engine::clear() {
  trace_.clear();
  lazy_.clear();
  scheduler_.reset();
  waiters_.clear();
  free_waiters_.clear();
  live_waiters_ = 0;
  stuck_reported_ = 0;
  watch_head_.clear();
  watches_.clear();
  due_.clear();
  unmarked_.clear();
  failures_.clear();
  std::vector<Stats::Candidate> compared = std::move(stats_.compared);  // its buffer: no allocation per batch
  compared.clear();
  stats_ = Stats();
  stats_.compared = std::move(compared);
  prepared_ = false;
  recording_ = false;
  closed_ &= static_cast<uint8_t>(~kFrozen);
  if (!retired_) generation_ = bump_generation(slot_);
  retired_ = false;
  functions_.trim(generation_);
  transposed_.clear();
  row_gathers_.clear();
  pending_calls_.clear();
}

// ---------------------------------------------------------------------------
// Function calls.

// The call's value is its first result; each further result is a CallResult
// node recorded right after it, computed by the same batch (ops/call.h).
// `out`: one per result (the variant's result_ids, interned). In line: the
// usual call's tail (an out-of-line call here cost 25 instructions a call).
[[gnu::always_inline]] inline void Engine::write_results(const FunctionCache::Variant& variant, NodeId node, std::span<Expr> out, Loc loc) {
  out[0] = expr(node);
  for (size_t k = 1; k < out.size(); ++k)
    out[k] = expr(trace_.call_result(node, variant.result_attrs(k), variant.result_ids[k], loc));
}

// A call site calls one body over and over: the variant this function found
// last, its arguments' signature and the verdict checked in one pass.
// (In line into both callers: the usual call's path stays one call deep.)
[[gnu::always_inline]] inline NodeId Engine::usual_call(const FunctionDef& def, std::span<const NodeId> args,
                                                        size_t expected, const FunctionCache::Variant*& variant,
                                                        Loc loc) {
  const FunctionCache::Variant* v = functions_.last_recorded(def, generation_);
  if (v == nullptr || v->result_ids.size() != v->results.size() || (expected != 0 && v->results.size() != expected))
    return kNoNode;
  variant = v;
  return trace_.call_again(args, v->key, v->result_attrs(0), v->result_ids[0], v->verdict, loc);
}

void Engine::call(const std::shared_ptr<const FunctionDef>& function, std::span<const NodeId> args, size_t expected,
                  std::vector<Expr>& out, Loc loc) {
  const FunctionDef& def = *function;
  note_recording(def.name, loc);
  const Site site{def.name, trace_.current_example(), loc};
  if (args.size() != def.arity)
    throw_user(site, "function '", def.name, "' takes ", def.arity, " argument(s), got ", args.size());
  if (options_.inline_functions) return call_inline(def, args, out, site);
  const FunctionCache::Variant* usual = nullptr;
  if (const NodeId node = usual_call(def, args, expected, usual, loc); node != kNoNode)
    return call_results(*usual, node, out, loc);
  const NodeStore& s = trace_.store();
  for (NodeId a : args)
    if (s.shape[a] == kUnknownShape) return call_later(function, args, expected, out, site);
  // On the stack for the usual few (a body being recorded may call back into this graph: no member scratch).
  c10::SmallVector<uint32_t, 8> signature(args.size());
  for (size_t i = 0; i < args.size(); ++i)
    signature[i] = FunctionCache::signature_word(s.shape[args[i]], s.has(args[i], NodeStore::kShared));
  const uint32_t index = functions_.variant_for(def, signature, generation_, options_, site, trace_);
  FunctionCache::Variant& variant = functions_.variant(index);
  const size_t results = variant.results.size();
  if (expected != 0 && results != expected)
    throw_user(site, "function '", def.name, "' returned ", results, " results where the call takes ", expected);
  const std::span<const ShapeId> ids = functions_.result_ids(index, trace_.store().shapes);
  call_results(variant, trace_.call(args, signature, variant.result_attrs(0), ids[0], variant.verdict, loc), out, loc);
}

bool Engine::call_usual(const FunctionDef& def, std::span<const NodeId> args, std::span<Expr> results, Loc loc) {
  if (closed_ != 0 || args.size() != def.arity || options_.inline_functions || results.empty()) return false;
  if (!recording_) start_trace_clock();
  const FunctionCache::Variant* v = nullptr;
  const NodeId node = usual_call(def, args, results.size(), v, loc);
  if (node == kNoNode) return false;
  write_results(*v, node, results, loc);
  return true;
}

void Engine::call_results(const FunctionCache::Variant& variant, NodeId node, std::vector<Expr>& out, Loc loc) {
  out.resize(variant.result_ids.size());
  write_results(variant, node, out, loc);
}

// Arguments downstream of a dsl::cond: the body's signature is not known yet.
// The results are placeholders, bound to the call's results when it is
// recorded, right after the last argument's shape becomes known (in the same
// delivery of values: the call runs in the same round as its arguments' branches).
void Engine::call_later(const std::shared_ptr<const FunctionDef>& def, std::span<const NodeId> args,
                        size_t expected, std::vector<Expr>& out, const Site& site) {
  if (expected == 0)
    throw_user(site, "function '", def->name, "' returns a std::vector and an argument's shape waits on a dsl::cond: "
               "return a fixed number of results (Expr, std::array, std::pair, std::tuple) to call it there");
  const NodeStore& s = trace_.store();
  int64_t example = trace_.current_example();
  for (NodeId a : args)
    if (!s.has(a, NodeStore::kShared)) {
      example = s.example[a];
      break;
    }
  const auto index = static_cast<uint32_t>(pending_calls_.size());
  PendingCall& pending = pending_calls_.emplace_back();
  pending.def = def;
  pending.args.assign(args.begin(), args.end());
  pending.example = example;
  pending.loc = site.loc;
  out.clear();
  for (size_t k = 0; k < expected; ++k) {
    pending.holders.push_back(trace_.placeholder(kUnknownShape, example, def->name, site.loc));
    out.push_back(expr(pending.holders.back()));
  }
  trace_.when_shapes_known(args, [this, index] { run_pending_call(index); });
}

void Engine::run_pending_call(uint32_t index) {
  // Moved out: the call may record calls that wait in turn (pending_calls_ grows).
  const PendingCall p = std::move(pending_calls_[index]);
  ListedExample in_example(*this, p.example);
  c10::SmallVector<NodeId, 4> values;
  {
    std::vector<Expr> own;
    const bool scratch = !call_results_busy_;
    std::vector<Expr>& results = scratch ? call_results_ : own;
    struct Busy {
      bool& flag;
      bool set;
      ~Busy() {
        if (set) flag = false;
      }
    } busy{call_results_busy_, scratch};
    call_results_busy_ = true;
    call(p.def, p.args, 0, results, p.loc);
    if (results.size() != p.holders.size())
      throw_user(Site{p.def->name, p.example, p.loc}, "function '", p.def->name, "' returned ", results.size(),
                 " results where the call takes ", p.holders.size());
    for (const Expr& r : results) values.push_back(r.id());
  }
  // (Resolving runs the watchers it wakes, which may run pending calls too.)
  for (size_t k = 0; k < p.holders.size(); ++k) trace_.resolve(p.holders[k], values[k]);
}

// The body recorded here, op by op, on the arguments themselves.
void Engine::call_inline(const FunctionDef& def, std::span<const NodeId> args, std::vector<Expr>& out,
                         const Site& site) {
  std::vector<Expr> in;
  for (NodeId a : args) in.push_back(expr(a));
  const BodyNesting nest(def, site);
  std::vector<Expr> results = def.body(in);
  check_results(def, results, *this, site);
  out = std::move(results);
}

// ---------------------------------------------------------------------------
// Errors at the end of forward.

void Engine::check_targets(std::span<const Expr> targets, Loc loc) const {
  const NodeStore& s = trace_.store();
  for (const Expr& t : targets) {
    if (s.has(s.resolve(t.id()), NodeStore::kComputed)) continue;
    throw_user(Site{"forward", s.example[t.id()], loc}, "a target (op '", trace_.site_of(t.id()).op,
               "' recorded at ", format_loc(s.loc[t.id()]),
               ") could not be computed: it depends on a dsl::cond or dsl::loop that never resolved, or on a "
               "launch that failed earlier");
  }
}

// The first few nodes still awaited.
void Engine::describe_waiters(std::ostream& os) const {
  const NodeStore& s = trace_.store();
  int shown = 0;
  for (const Waiter& w : waiters_) {
    if (!w.callback || shown == 3) continue;
    os << (shown++ ? "; " : " Still waiting: ") << "example " << s.example[w.node] << " on op '"
       << trace_.site_of(w.node).op << "' recorded at " << format_loc(s.loc[w.node]);
  }
}

// The runaway's culprits: the nodes still awaited when the limit struck.
void Engine::throw_runaway(int max_rounds, Loc loc) const {
  std::ostringstream os;
  os << "forward stopped after " << max_rounds
     << " rounds of control flow (ForwardOptions::max_rounds): a dsl::loop or coroutine may never finish.";
  describe_waiters(os);
  throw_user_at(loc, os.str());
}

void Engine::throw_stuck(Loc loc) const {
  std::ostringstream os;
  os << "forward ended with " << live_waiters_ << " awaited value(s) that could not be computed: each depends "
     << "on a launch that failed earlier (never retried) or on a dsl::cond or dsl::loop that never resolved; "
     << "the conds, loops and coroutines waiting on them cannot go on (clear() starts afresh).";
  describe_waiters(os);
  throw_user_at(loc, os.str());
}

void Engine::report_failure(int64_t example, std::exception_ptr error) {
  failures_.push_back(Failure{example, std::move(error)});
}

Engine* Engine::delivering() { return t_delivering; }

// One example's error is rethrown as it was (the user's own exception type)
// when it is the only one; several become one UserError that lists them.
void Engine::throw_failures(Loc loc) {
  std::vector<Failure> failures = std::move(failures_);
  failures_.clear();
  if (failures.size() == 1) std::rethrow_exception(failures[0].error);
  std::ostringstream os;
  os << failures.size() << " examples failed during forward; the other examples completed.";
  for (size_t i = 0; i < failures.size() && i < 5; ++i) {
    os << "\n  example " << failures[i].example << ": ";
    try {
      std::rethrow_exception(failures[i].error);
    } catch (const std::exception& e) {
      os << e.what();
    } catch (...) {
      os << "(an exception that is not a std::exception)";
    }
  }
  if (failures.size() > 5) os << "\n  ...";
  throw_user_at(loc, os.str());
}

// ---------------------------------------------------------------------------
// Waiters.

WaiterId Engine::when_computed(NodeId node, ValueCallback&& callback) {
  if (live_waiters_ == 0 && !watches_.empty()) {
    // Every entry is spent: start the lists again, so that a graph used for
    // many forwards without clear() does not keep one entry per waiter ever made.
    for (const Watch& x : watches_) watch_head_[x.node] = kNone32;  // (not the whole list: rounds x nodes)
    watches_.clear();
    due_.clear();
    unmarked_.clear();
  }
  uint32_t i;
  if (!free_waiters_.empty()) {
    i = free_waiters_.back();
    free_waiters_.pop_back();
  } else {
    i = static_cast<uint32_t>(waiters_.size());
    waiters_.emplace_back();
  }
  Waiter& w = waiters_[i];
  w.node = node;
  ++w.generation;
  w.order = next_order_++;
  w.callback = std::move(callback);
  ++live_waiters_;
  const NodeStore& s = trace_.store();
  // Grown twofold at least: nodes come in recording order, and a resize per
  // new node watched was an out-of-line fill per cond.
  if (watch_head_.size() <= node) watch_head_.resize(std::max<size_t>({node + 1, s.size(), 2 * watch_head_.size()}), kNone32);
  watches_.push_back(Watch{i, w.generation, watch_head_[node], node});
  watch_head_[node] = static_cast<uint32_t>(watches_.size() - 1);
  if (s.has(s.resolve(node), NodeStore::kComputed)) due_.push_back(node);  // served at the next delivery
  unmarked_.push_back(WaiterId{i, w.generation});
  return WaiterId{i, w.generation};
}

void Engine::cancel(WaiterId id) {
  // Taken out for the delivery under way but not called yet (a task that
  // another task's resumption destroys): skipped when its turn comes, not
  // resumed on a freed frame.
  if (delivering_ != nullptr)
    for (Delivery& d : *delivering_)
      if (d.id.index == id.index && d.id.generation == id.generation) d.cancelled = true;
  if (id.index >= waiters_.size()) return;
  Waiter& w = waiters_[id.index];
  if (w.generation != id.generation || !w.callback) return;
  w.callback = nullptr;
  free_waiters_.push_back(id.index);
  --live_waiters_;
}

// Due waiters in registration order, each once (sorted by value: the keys side
// by side, not looked up in waiters_ per comparison). By order alone: a live
// waiter's order is its own (equal orders are one waiter, listed twice: its
// node due twice, when two waiters registered on it after it was computed),
// and pair's <=> cost a gated net's delivery a fifth of its time. A round's
// waiters were mostly registered close together (a level's conds): where
// their orders span few words, a bit per order and a scan of the words put
// them in order, where a comparison sort was 1% of a gated net's inference.
void Engine::sort_by_order(std::vector<std::pair<uint64_t, uint32_t>>& due) {
  if (due.size() < 2) return;
  uint64_t lo = due[0].first, hi = lo;
  for (const auto& [order, slot] : due) {
    lo = std::min(lo, order);
    hi = std::max(hi, order);
  }
  const uint64_t words = (hi - lo) / 64 + 1;
  if (due.size() < 16 || words > due.size()) {
    std::sort(due.begin(), due.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    due.erase(std::unique(due.begin(), due.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
              due.end());
    return;
  }
  order_bits_.assign(words, 0);
  order_slot_.resize(words * 64);
  for (const auto& [order, slot] : due) {
    const uint64_t k = order - lo;
    order_bits_[k >> 6] |= uint64_t{1} << (k & 63);
    order_slot_[k] = slot;
  }
  due.clear();
  for (uint64_t w = 0; w < words; ++w)
    for (uint64_t b = order_bits_[w]; b != 0; b &= b - 1) {
      const uint64_t k = w * 64 + static_cast<uint64_t>(__builtin_ctzll(b));
      due.emplace_back(lo + k, order_slot_[k]);
    }
}

// Hands computed values to whoever waits for them: one device->host copy for all
// of them, then the callbacks in registration order. A callback that throws
// (user code in a branch, a loop body, a coroutine) stops its own example only.
// Returns whether anyone was served.
bool Engine::deliver_waiters() {
  if (live_waiters_ == 0) {
    due_.clear();
    return false;
  }
  // The waiters of the nodes computed since the last delivery. The lists are
  // taken (emptied) only once the values are fetched: a fetch that throws
  // leaves them for the next delivery.
  ready_.clear();
  for (NodeId n : due_) {
    for (uint32_t e = watch_head_[n]; e != kNone32; e = watches_[e].next) {
      ++stats_.waiter_visits;
      const Watch& x = watches_[e];
      const Waiter& w = waiters_[x.waiter];
      if (w.generation == x.generation && w.callback) ready_.emplace_back(w.order, x.waiter);
    }
  }
  sort_by_order(ready_);
  if (ready_.empty()) {
    for (NodeId n : due_) watch_head_[n] = kNone32;
    due_.clear();
    return false;
  }

  const auto t0 = Clock::now();
  ready_nodes_.clear();
  for (const auto& [order, i] : ready_) ready_nodes_.push_back(waiters_[i].node);
  // The values and the callbacks live in buffers kept between deliveries
  // (an allocation each, per round, before), taken out while in use. (A
  // delivery on this graph from a callback is refused, expect_not_reading;
  // were one allowed, it would find none here and make its own.)
  std::vector<HostValue> host = std::exchange(host_scratch_, {});
  fetch_to_host(ready_nodes_, host);
  stats_.fetch_ms += ms_since(t0);
  for (NodeId n : due_) watch_head_[n] = kNone32;
  due_.clear();

  // Take the callbacks out first: they register new waiters (slots get reused).
  std::vector<Delivery> calls = std::exchange(calls_scratch_, {});
  calls.clear();
  calls.reserve(ready_.size());
  for (const auto& [order, i] : ready_) {
    // (Built in place: a Delivery made and then pushed moved each callback
    // twice, an indirect call each.)
    calls.emplace_back(std::move(waiters_[i].callback), waiters_[i].node, WaiterId{i, waiters_[i].generation});
    waiters_[i].callback = nullptr;
    free_waiters_.push_back(i);
    --live_waiters_;
  }
  const auto t1 = Clock::now();
  {
    // Both restored on the way out, also if report_failure throws: no pointer to
    // a gone vector, and no engine named as delivering after its delivery.
    struct Restore {
      Engine& e;
      Engine* outer_engine;
      std::vector<Delivery>* outer_calls;
      ~Restore() {
        t_delivering = outer_engine;
        e.delivering_ = outer_calls;
      }
    } restore{*this, std::exchange(t_delivering, this), std::exchange(delivering_, &calls)};
    for (size_t k = 0; k < calls.size(); ++k) {
      if (calls[k].cancelled) continue;
      try {
        calls[k].callback(host[k]);
      } catch (...) {
        report_failure(trace_.store().example[calls[k].node], std::current_exception());
      }
      if (orphan_) break;  // the callback destroyed the graph: nothing more runs (forward() says so)
    }
  }
  calls.clear();  // (destroys the callbacks, as the end of a local vector did)
  calls_scratch_ = std::move(calls);
  host_scratch_ = std::move(host);
  fetched_.clear();
  stats_.trace_ms += ms_since(t1);
  recording_ = false;  // what the callbacks recorded is timed above, not until the next forward()
  return true;
}

// On the CPU the values are read where they are (a batch made contiguous at
// most once). On a device, rows are grouped by the batch that holds them: one
// index_select per batch, one cat, one copy to the host for the whole round.
void Engine::fetch_to_host(std::span<const NodeId> nodes, std::vector<HostValue>& host) {
  NodeStore& s = trace_.store();
  c10::NoGradGuard no_grad;
  ++stats_.fetches;
  host.clear();
  fetched_.clear();
  if (options_.device.is_cpu()) {
    host.reserve(nodes.size());  // (filled in order below: no value-initialised entries to overwrite)
    // Batch -> its contiguous tensor's data (kept alive in fetched_).
    std::vector<std::pair<uint32_t, const float*>> seen = std::exchange(fetch_seen_, {});
    seen.clear();
    for (size_t i = 0; i < nodes.size(); ++i) {
      const NodeId r = s.resolve(nodes[i]);
      const uint32_t b = s.value_at[r].batch;
      auto it = std::find_if(seen.begin(), seen.end(), [b](const auto& x) { return x.first == b; });
      if (it == seen.end()) {
        // A value its fused kernel kept inside is made now: a kernel, run in
        // turn (an Overlap's parts); a value at hand is read without waiting.
        const at::Tensor& t = value_in_turn(s, b);
        // Only its data is read (under no_grad: a copy records no history); a
        // detach() per batch cost a dispatch and a TensorImpl for nothing.
        it = seen.emplace(seen.end(), b, fetched_.emplace_back(t.is_contiguous() ? t : t.contiguous()).data_ptr<float>());
      }
      const float* data = it->second;
      const Shape& shape = s.shape_of(r);
      const uint32_t row = s.value_at[r].row;
      // A packed value starts at row `row` of rows of its shape less the first axis.
      const int64_t per_row = s.has(r, NodeStore::kPacked) ? shape.numel() / std::max<int64_t>(shape[0], 1) : shape.numel();
      host.push_back(HostValue{data + (row == kWholeRow ? 0 : row * per_row), shape, trace_.site_of(nodes[i])});
    }
    fetch_seen_ = std::move(seen);
    return;
  }
  host.resize(nodes.size());  // (filled in batch order below)
  // On a device: gathers, a copy to the host, all in turn (an Overlap's parts).
  const std::unique_lock<ExecutionTurns> turn = take_turn();
  // (batch, whole), position in nodes: a parameter's batch holds both the
  // tensor itself (a whole value) and rows of it (lookups read from their
  // table), fetched apart.
  std::vector<std::pair<uint64_t, size_t>> by_batch;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeStore::Place at = s.value_at[s.resolve(nodes[i])];
    by_batch.emplace_back(uint64_t{at.batch} << 1 | (at.row == kWholeRow ? 1 : 0), i);
  }
  std::stable_sort(by_batch.begin(), by_batch.end());
  std::vector<at::Tensor> flat;
  std::vector<size_t> order;
  for (size_t k = 0; k < by_batch.size();) {
    const uint64_t key = by_batch[k].first;
    const auto b = static_cast<uint32_t>(key >> 1);
    std::vector<int64_t> rows;
    size_t j = k;
    for (; j < by_batch.size() && by_batch[j].first == key; ++j) {
      const NodeId r = s.resolve(nodes[by_batch[j].second]);
      if (s.has(r, NodeStore::kPacked)) {  // its rows of a packed batch
        for (int64_t q = 0; q < s.shape_of(r)[0]; ++q) rows.push_back(s.value_at[r].row + q);
      } else {
        rows.push_back(s.value_at[r].row == kWholeRow ? -1 : s.value_at[r].row);
      }
      order.push_back(by_batch[j].second);
    }
    const at::Tensor& t = fetched_value(s, b);
    if (rows[0] < 0) {
      for (size_t q = k; q < j; ++q) flat.push_back(t.detach().reshape({-1}));
    } else {
      at::Tensor idx = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).pin_memory();
      flat.push_back(t.detach().index_select(0, idx.to(t.device(), /*non_blocking=*/true)).reshape({-1}));
    }
    k = j;
  }
  fetched_.push_back((flat.size() == 1 ? flat[0] : at::cat(flat)).to(at::kCPU).contiguous());
  const float* all = fetched_.back().data_ptr<float>();
  int64_t off = 0;
  for (size_t q = 0; q < order.size(); ++q) {
    const Shape& shape = s.shape_of(s.resolve(nodes[order[q]]));
    host[order[q]] = HostValue{all + off, shape, trace_.site_of(nodes[order[q]])};
    off += shape.numel();
  }
}

}  // namespace sheaf::detail
