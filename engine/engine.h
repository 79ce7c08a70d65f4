// The engine behind a Graph: the trace, the scheduler, the executor's state,
// the control-flow waiters and the forward loop. Library-internal (the DSL and
// the checker use it; model code uses Graph).
//
//   Engine::forward, per round:
//     Scheduler::schedule   pending nodes -> RoundDag -> Batches -> Plan
//     Executor::run         Plan -> batch outputs (node values are rows)
//     deliver_waiters       awaited values -> host, one copy; branches, loop
//                           bodies and coroutines continue and record more
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sheaf/backend/executor.h>
#include <sheaf/backend/lazy.h>
#include <sheaf/scheduler/scheduler.h>
#include <sheaf/tracer/trace.h>

#include "expr.h"
#include "functions.h"
#include "graph.h"
#include "handles.h"
#include "host_value.h"
#include "turns.h"

namespace sheaf::detail {

// A registered waiter, to cancel it (a coroutine destroyed while it waits).
struct WaiterId {
  uint32_t index = kNone32;
  uint32_t generation = 0;
};

class Engine {
 public:
  using Loc = std::source_location;
  Engine(Graph& graph, GraphOptions options);
  ~Engine();

  Graph& graph() const { return graph_; }
  // ---- Its Graph destroyed by a callback of this engine's own forward(), or
  // by a kernel of one of its rounds: the engine keeps itself until that
  // forward ends, then frees itself as it throws a UserError (before, the
  // rest of the forward ran on freed memory).
  bool delivering_now() const { return delivering_ != nullptr; }
  bool executing_now() const { return (closed_ & kExecuting) != 0; }
  void orphan(std::unique_ptr<Engine> self) {
    orphaned_in_kernel_ = executing_now();
    orphan_ = std::move(self);
  }
  Trace& trace() { return trace_; }
  const Trace& trace() const { return trace_; }
  const NodeStore& store() const { return trace_.store(); }

  // ---- Handles.
  Expr expr(NodeId n) const { return Expr(slot_, generation_, n); }
  uint32_t slot() const { return slot_; }
  uint32_t generation() const { return generation_; }  // the slot's now (clear() and retirement bump it)
  // The node of an Expr of this graph; throws UserError naming `op` and `loc`
  // otherwise. In line: every argument of every op recorded passes here.
  NodeId node_of(const Expr& e, std::string_view op, Loc loc) const {
    if (e.defined() && e.slot_ == slot_ && e.gen_ == generation_) [[likely]]
      return e.node_;
    bad_expr(e, op, loc);
  }
  // The same, or kNoNode where node_of would throw.
  NodeId node_or_none(const Expr& e) const {
    return e.defined() && e.slot_ == slot_ && e.gen_ == generation_ ? e.node_ : kNoNode;
  }
  // The engine of a live Expr; nullptr if the handle is empty or stale.
  static Engine* find(const Expr& e) { return e.defined() ? engine_at(e.slot_, e.gen_) : nullptr; }
  // The same, or a UserError naming the caller's line.
  static Engine& of(const Expr& e, Loc loc);
  // Why an Expr that find() did not find is unusable, as a message about
  // `subject` ("an argument", "the predicate"): empty, or its graph destroyed
  // or cleared since it was made.
  static std::string unusable(const Expr& e, std::string_view subject);
  // A record function's results (a Prefetcher's, an Overlap part's) before
  // they are prepared or run: a UserError naming `who` and its `unit` number
  // `index` ("sheaf::Prefetcher's record function (batch 3)"), the result's
  // index and what is wrong with it, at `loc` (where the user made the
  // Prefetcher, or called run()). The name is put together only for the
  // message: the check runs every batch.
  void expect_results(std::span<const Expr> results, std::string_view who, std::string_view unit, size_t index,
                      Loc loc) const;

  // ---- Recording (the clock of Stats::trace_ms starts at the first node).
  // A frozen function body refuses `what` (engine/functions.h); before
  // anything is added for it (a shared node for a tensor operand included),
  // so that it leaves no node behind.
  // Also refused while one of its rounds runs (from a kernel: a user op's run()).
  void expect_open(OpCode op, Loc loc) const {
    if (closed_ != 0) [[unlikely]] throw_closed(op_info(op).name, loc);
  }
  void expect_open(std::string_view what, Loc loc) const {
    if (closed_ != 0) [[unlikely]] throw_closed(what, loc);
  }
  Expr record(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload, Loc loc) {
    expect_open(op, loc);
    if (!recording_) start_trace_clock();
    return expr(trace_.record(op, args, attrs, payload, loc));
  }
  // The same checks for a node made outside record(): expect_open, and the clock.
  void note_recording(std::string_view what, Loc loc) {
    expect_open(what, loc);
    if (!recording_) start_trace_clock();
  }
  // This graph holds a compiled function body (engine/functions.h): until its
  // next clear(), recording on it or running it is a UserError.
  void freeze_body() { closed_ |= kFrozen; }
  // While a sheaf::Function's body records on this graph (on stand-ins for
  // its arguments, once per argument shapes): nothing of it may be computed.
  void set_recording_body(bool on) { recording_body_ = on; }
  // A call of a sheaf::Function: one node (its body recorded once per argument
  // signature, engine/functions.h). Its results (slices of that node when
  // there are several) replace the contents of `results`, at the very end: a
  // caller may reuse one vector for every call (no allocation per call).
  // `expected`: how many results the caller takes (0: any). A call on values
  // whose shapes wait on a dsl::cond is recorded once they are known (its
  // results are placeholders until then, Trace::when_shapes_known): it needs
  // `expected` to make them.
  void call(const std::shared_ptr<const FunctionDef>& def, std::span<const NodeId> args, size_t expected,
            std::vector<Expr>& results, Loc loc);
  // The usual call, the one a call site makes over and over (the body this
  // function found last, the same signature and verdict: Trace::call_again),
  // with results.size() results: they are written there. False, with
  // nothing recorded, for any other call: call() then does what it needs.
  bool call_usual(const FunctionDef& def, std::span<const NodeId> args, std::span<Expr> results, Loc loc);
  FunctionCache& functions() { return functions_; }

  // ---- Control flow.
  WaiterId when_computed(NodeId node, ValueCallback&& callback);
  // A coroutine may wait for a node of this graph: not a function body's
  // (recording or frozen: its values are never computed, the task would never resume).
  void expect_awaitable(Loc loc) const {
    expect_open("co_await", loc);
    if (recording_body_) throw_in_body("co_await", loc);
  }
  void cancel(WaiterId id);  // no-op if already delivered
  // A failure of user code inside forward (a branch, a loop body, a coroutine):
  // the example stops, the others go on, and forward throws at the end.
  void report_failure(int64_t example, std::exception_ptr error);
  // The engine delivering values on this thread, if any (coroutines report their failures to it).
  static Engine* delivering();

  // ---- Execution.
  void forward(std::span<const Expr> targets, const ForwardOptions& options, Loc loc);
  void prepare(std::span<const Expr> targets, const ForwardOptions& options, Loc loc);
  at::Tensor value(NodeId n, Loc loc);  // a computed node's value, connected to autograd (made now if a fused kernel kept it)
  void clear();  // unchecked: the library's own clears (a body recorded again)
  void expect_can_clear(Loc loc) const;  // the user's clear(): not while its nodes are being read
  // Its parameters, and those of the function bodies it recorded (and theirs,
  // a body that calls a function), have the sizes, dtype and device recorded.
  void expect_params_unchanged() const;
  // Makes every Expr of this graph stale now (a UserError when used), leaving
  // the work of clear() to whichever thread calls it next (Prefetcher: the
  // worker frees the last batch; the caller's kept Exprs fail, not race).
  void retire();
  // A Prefetcher lends its next batch's graph to its worker (the thread
  // numbered `thread`, handles.h) until its next take(), an Overlap each
  // part's graph to the thread that runs it during run(); 0: not lent.
  // Meanwhile forward, prepare, clear and value() from another thread (a
  // Batch kept past the next take(), another part's control flow) are a
  // UserError, not a race.
  void lend(uint64_t thread) { lent_to_.store(thread, std::memory_order_release); }
  // Graphs run on several threads at once (an Overlap's parts) run their
  // rounds' kernels one at a time, under `turns`; null: no turns.
  void take_turns(ExecutionTurns* turns) { turns_ = turns; }

  // ---- State for Graph's accessors.
  GraphOptions& options() { return options_; }
  const GraphOptions& options() const { return options_; }
  const Stats& stats() const { return stats_; }
  const Plan* last_plan() const;  // nullptr before the first round that launched or placed something
  // Fused batches run again since clear() for a value their kernel kept
  // inside (backend/lazy.h): read by a fetch, value() or a later round.
  uint64_t remade() const { return lazy_.remade(); }

 private:
  struct Waiter {
    NodeId node = kNoNode;
    uint32_t generation = 0;
    uint64_t order = 0;  // registration order: waiters run in it
    ValueCallback callback;
  };
  struct Failure {
    int64_t example;
    std::exception_ptr error;
  };

  const Strategy& strategy_for(const ForwardOptions& options) const;
  bool validating(const ForwardOptions& options, const Strategy& strategy) const;
  bool schedule_round(const Strategy& strategy, bool validate, bool defer);
  void execute_round();
  void execute_in_turn();  // execute_round, holding turns_ if set
  std::unique_lock<ExecutionTurns> take_turn();  // held: turns_ (if set) is this thread's
  // A batch's value for a fetch or value(), made now if its fused kernel kept
  // it inside (a launch): the caller holds the turn (checked).
  const at::Tensor& fetched_value(NodeStore& s, uint32_t batch);
  // The same, taking the turn first where the value has to be made (fetches
  // on the CPU, value()).
  const at::Tensor& value_in_turn(NodeStore& s, uint32_t batch);
  void finish_aliases();
  bool deliver_waiters();
  // The usual call's node and its body (call_usual), or kNoNode.
  NodeId usual_call(const FunctionDef& def, std::span<const NodeId> args, size_t expected,
                    const FunctionCache::Variant*& variant, Loc loc);
  void write_results(const FunctionCache::Variant& variant, NodeId node, std::span<Expr> out, Loc loc);
  void call_results(const FunctionCache::Variant& variant, NodeId node, std::vector<Expr>& out, Loc loc);
  void call_inline(const FunctionDef& def, std::span<const NodeId> args, std::vector<Expr>& results, const Site& site);
  void call_later(const std::shared_ptr<const FunctionDef>& def, std::span<const NodeId> args, size_t expected,
                  std::vector<Expr>& results, const Site& site);
  // The nodes' values on the host, into `host` (cleared first).
  void fetch_to_host(std::span<const NodeId> nodes, std::vector<HostValue>& host);
  void check_targets(std::span<const Expr> targets, Loc loc) const;
  [[noreturn]] void throw_runaway(int max_rounds, Loc loc) const;
  [[noreturn]] void throw_stuck(Loc loc) const;
  [[noreturn]] void throw_orphaned(Loc loc);
  void describe_waiters(std::ostream& os) const;
  void throw_failures(Loc loc);
  void start_trace_clock();
  void stop_trace_clock();

  Graph& graph_;
  std::unique_ptr<Engine> orphan_;  // this engine, once its Graph is gone (orphan)
  bool orphaned_in_kernel_ = false;  // by a kernel, not a callback (the message says which)
  GraphOptions options_;
  Trace trace_;
  Scheduler scheduler_;
  LazyValues lazy_;  // values fused batches left in their kernels
  FunctionCache functions_;
  ExecConfig exec_config_;
  TransposedWeights transposed_;  // W^T of the shared weights this graph applies repeatedly, until clear()
  at::Tensor index_buffer_;       // the rounds' ids on the CPU, reused while nothing else holds it (ExecConfig)
  RowGathers row_gathers_;        // one gradient hub per batch for all rounds, until clear() (ExecConfig)
  std::unique_ptr<Executor> executor_;  // every round's, made at the first (it reads the members above)
  // Why `e` is not an Expr of this graph, as a UserError naming `op` and `loc`.
  [[noreturn]] void bad_expr(const Expr& e, std::string_view op, Loc loc) const;
  uint32_t slot_;
  uint32_t generation_;
  Stats stats_;
  std::vector<Waiter> waiters_;           // slots; callback empty = free
  std::vector<uint32_t> free_waiters_;
  size_t live_waiters_ = 0;
  // Waiters by node, so that a delivery looks at the nodes just computed, not
  // at every live waiter (with many conds recorded up front, a scan of them
  // all per round grew with conds x rounds). Entries are linked per node from
  // watch_head_; one names a waiter slot and its generation (a cancelled or
  // reused slot is skipped).
  struct Watch {
    uint32_t waiter, generation, next;
    NodeId node;
  };
  std::vector<uint32_t> watch_head_;  // per node: its first entry, or kNone32
  std::vector<Watch> watches_;        // until clear(), or until no waiter is live
  std::vector<NodeId> due_;           // watched nodes computed since the last delivery
  void note_computed(NodeId n) {
    if (n < watch_head_.size() && watch_head_[n] != kNone32) due_.push_back(n);
  }
  // Waiters registered since a round last marked what they need: "needed"
  // marks last (tracer/ready.h), so a round walks from these only.
  std::vector<WaiterId> unmarked_;
  std::vector<NodeId> awaited_;  // scratch: the nodes of unmarked_'s live waiters
  NodeId defer_from_ = 0;        // the first node control flow recorded in this forward()
  uint64_t next_order_ = 0;
  uint64_t stuck_reported_ = 0;  // waiters below this order were reported as stuck (forward's end)
  std::atomic<uint64_t> lent_to_{0};  // lend()
  ExecutionTurns* turns_ = nullptr;   // take_turns()
  bool retired_ = false;         // retire() bumped the generation: the next clear() does not
  std::vector<Failure> failures_;
  std::vector<at::Tensor> fetched_;  // what the current delivery's HostValues point into
  // Scratch of deliver_waiters, used before it calls back (a callback's own
  // delivery may reuse them): the due waiters as (order, slot), their nodes.
  std::vector<std::pair<uint64_t, uint32_t>> ready_;
  std::vector<NodeId> ready_nodes_;
  std::vector<uint64_t> order_bits_;  // sort_by_order's scratch: a bit per order, and each order's slot
  std::vector<uint32_t> order_slot_;
  void sort_by_order(std::vector<std::pair<uint64_t, uint32_t>>& due);
  // A delivery's callbacks, taken from their waiters, while they are called in
  // turn (cancel() marks one that has not run yet).
  struct Delivery {
    ValueCallback callback;
    NodeId node;
    WaiterId id;
    bool cancelled = false;
  };
  std::vector<Delivery>* delivering_ = nullptr;
  // Buffers a delivery takes out while in use and puts back (deliver_waiters),
  // and fetch_to_host's list of the batches it has read.
  std::vector<HostValue> host_scratch_;
  std::vector<Delivery> calls_scratch_;
  std::vector<std::pair<uint32_t, const float*>> fetch_seen_;
  bool prepared_ = false;  // the scheduler holds a planned round that forward() runs first
  bool recording_ = false; // a node was recorded since the last forward()/prepare()/clear()
  // Why recording is refused (one byte: recording's check is one test).
  // kFrozen: a compiled function body (freeze_body). kExecuting: a round's
  // kernels run (execute_round): what a kernel (a user op's run()) would do
  // to this graph, record, run it or read its values, is a UserError.
  // Recording would grow the store the round reads; a forward would wait
  // for its own turn at an Overlap's kernels, or plan over the round that runs.
  enum : uint8_t { kFrozen = 1, kExecuting = 2 };
  uint8_t closed_ = 0;
  bool recording_body_ = false;  // a function body being recorded (set_recording_body)
  [[noreturn]] void throw_closed(std::string_view what, Loc loc) const;  // closed_'s reason
  [[noreturn]] void throw_frozen(std::string_view what, Loc loc) const;
  [[noreturn]] void throw_in_kernel(std::string_view what, Loc loc) const;
  [[noreturn]] void throw_in_body(std::string_view what, Loc loc) const;
  [[noreturn]] void throw_in_delivery(std::string_view what, Loc loc) const;
  // Not while this graph's nodes are being read: lent to another thread, a
  // frozen body, one of its rounds running (from a kernel), a body
  // recording, or inside a delivery of this graph's own forward.
  void expect_not_reading(std::string_view what, Loc loc) const;
  void expect_not_lent(std::string_view what, Loc loc) const;  // lent to another thread: a UserError
  // forward/prepare (`what`) may run: not while reading, and no parameter
  // changed since it was recorded.
  void expect_can_run(std::string_view what, Loc loc) const;
  std::chrono::steady_clock::time_point trace_start_;
  // Calls whose arguments' shapes wait on a dsl::cond (call_later), kept here
  // rather than in their callbacks: a watcher is then two words, and a
  // control-flow-heavy batch does not allocate per call.
  struct PendingCall {
    std::shared_ptr<const FunctionDef> def;
    c10::SmallVector<NodeId, 4> args, holders;
    int64_t example = 0;
    std::source_location loc;
  };
  void run_pending_call(uint32_t index);
  std::vector<PendingCall> pending_calls_;  // until clear()
  std::vector<Expr> call_results_;          // run_pending_call's results (a nested one uses its own)
  bool call_results_busy_ = false;
};

}  // namespace sheaf::detail
