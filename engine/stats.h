// Counters a graph keeps since its last clear(), for users to read after forward.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <sheaf/backend/counters.h>
#include <sheaf/scheduler/cost.h>

namespace sheaf {

// ExecCounters' fields (nodes, batches, zero_copy_inputs, gathered_inputs,
// gather_launches, gathered_bytes, in_place_inputs, gather_ms, op_ms) are
// counted by the executor.
struct Stats : ExecCounters {
  uint64_t rounds = 0;   // schedule+execute rounds; > 1 only with control flow
  uint64_t fetches = 0;  // device->host copies of values awaited by control flow (one per round at most)
  uint64_t split_shared = 0;  // batches split only because a "shared" operand was a different tensor (see docs)
  // Host work that control flow costs, counted (not timed): nodes the rounds
  // looked at, and shapes inferred once a dsl::cond resolved. Both grow with
  // the nodes recorded, not with nodes x rounds.
  uint64_t round_visits = 0;
  uint64_t deferred_inferences = 0;
  // Waiters (conds, loop steps, coroutines) looked at: when a value they wait
  // for is computed, and once to mark what they need. Grows with the waiters
  // registered, not with waiters x rounds.
  uint64_t waiter_visits = 0;
  // Times a node that could run waited for a later round because nothing
  // awaited needed it yet (GraphOptions::defer_unawaited).
  uint64_t deferred = 0;
  // Prepared rounds (Graph::prepare, a Prefetcher's worker) that forward() had
  // to plan again: autograd's mode, a looked-up table's requires_grad, or the
  // graph's batches changed since prepare() (Scheduler::plan_holds). Each
  // costs a second plan of the round; 0 where prepare() ran as forward() does.
  uint64_t replans = 0;
  // The schedule of the last round: the strategy's name, or the one `auto` picked
  // (a copy: the user's strategy object may be gone by the time it is read).
  std::string strategy_used;
  // A strategy that compares schedules (auto), in the last round that compared
  // them (16 rounds apart, up to 128 while the same one wins): each
  // candidate's plan, costed by GraphOptions::cost.
  using Candidate = PlanCost;
  std::vector<Candidate> compared;
  // Wall-clock milliseconds:
  double trace_ms = 0;     // recording: from the first node recorded after clear()/forward() to the next
                           // forward()/prepare(), plus control-flow callbacks (branches, loop bodies, coroutines)
  double schedule_ms = 0;  // building rounds, running the strategy, planning rows and gathers; of which:
  double round_ms = 0;     //   finding what can run (scheduler/round.h)
  double fuse_ms = 0;      //   finding fused regions (scheduler/fusion.h)
  double strategy_ms = 0;  //   grouping into batches (the strategy, with merging)
  double plan_ms = 0;      //   row orders, views and gathers (scheduler/plan.h)
  double execute_ms = 0;   // launching the batches (on a GPU, mostly queueing: kernels run later)
  double fetch_ms = 0;     // copying awaited values to the host (waits for the device)
  std::string str() const;
};

}  // namespace sheaf
