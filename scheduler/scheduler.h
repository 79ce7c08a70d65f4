// The scheduler: turns the runnable part of a trace into one round's plan.
//
//   pending nodes --build_round--> RoundDag --Strategy--> Batches --make_plan--> Plan
//
// It keeps its buffers between rounds and clears (a graph cleared per batch does
// not reallocate), and what the strategy remembers of the graph's past rounds.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include <sheaf/tracer/trace.h>

#include "batches.h"
#include "cost.h"
#include "fusion.h"
#include "plan.h"
#include "round.h"
#include "strategy.h"

namespace sheaf {

class Scheduler {
 public:
  // Milliseconds spent in each step, accumulated over calls.
  struct Times {
    double round_ms = 0, fuse_ms = 0, strategy_ms = 0, plan_ms = 0;
    uint64_t visits = 0;  // nodes build_round looked at
  };

  // Takes the nodes of `trace` that can run now (its ready queue), fuses
  // elementwise regions (if `fuse`: scheduler/fusion.h) and plans them with
  // `strategy` (checking the strategy's batches if `validate`; a strategy with
  // candidates: the cheapest by `cost`). Returns false when the round has
  // nothing to launch (it only resolved placeholders: see aliases()).
  // With `awaited` (the nodes control flow waits for), the round runs only
  // what they need and defers the rest (scheduler/round.h).
  bool schedule(Trace& trace, const Strategy& strategy, bool validate, bool fuse, const CostModel& cost,
                const Awaited* awaited = nullptr);

  const Plan& plan() const { return plan_; }
  // Whether the last plan still holds for running now. A prepared round
  // (Graph::prepare, the Prefetcher) may run later: under another autograd
  // mode, with a placed lookup's table no longer frozen (Plan::grad,
  // Plan::placed), or after parameters recorded since took batch slots
  // (Plan::base). Else replan: the round's batches planned again.
  bool plan_holds(const Trace& trace) const;
  void replan(Trace& trace);
  const Times& times() const { return times_; }
  // The schedule the last round used (auto: the strategy it picked).
  // (Kept as a name when the round is planned: a prepared round may run after
  // the user's strategy object is gone.)
  std::string_view chosen() const { return chosen_; }
  // A strategy with candidates, in a round that compared them: what each
  // cost, in candidates() order; else empty.
  std::span<const PlanCost> compared() const { return compared_; }
  const RoundDag& dag() const { return dag_; }
  // Resolved placeholders whose values this round makes ready.
  std::vector<NodeId>& aliases() { return aliases_; }
  // Batches of the last round that would have batched together but for a
  // "shared" operand that is a different tensor in each (read by that one node
  // only: made per example, like W * 1.0). Nodes of the first of them, for a warning.
  uint32_t split_shared() const { return split_shared_; }
  NodeId split_shared_example() const { return split_shared_node_; }
  void fuse_lone_ops(bool on) { fuser_.fuse_lone_ops(on); }  // Fuser::fuse_lone_ops
  // Forgets the last plan (the graph was cleared); keeps buffers and the memo.
  void reset() {
    plan_.batches.clear();
    plan_.placed.clear();
    times_ = {};
  }

 private:
  RoundDag dag_;
  Fuser fuser_;
  Batches batches_;
  std::vector<NodeId> aliases_;
  Plan plan_;
  bool fused_ = false;  // the last round was fused (replan plans it so again)
  const Strategy* memo_owner_ = nullptr;  // the strategy whose memo this is (kept across clears)
  std::string chosen_;
  StrategyMemo memo_;
  Times times_;
  uint32_t split_shared_ = 0;
  NodeId split_shared_node_ = kNoNode;
  std::vector<std::pair<uint64_t, NodeId>> loose_;  // scratch: (key without shared identities, node)
  std::vector<int64_t> key_;                         // scratch: one such key

  std::vector<PlanCost> compared_;

  // schedule()'s work once the round is built: fusion, the strategy, the plan.
  void plan_round(Trace& trace, const Strategy& strategy, bool validate, bool fuse, const CostModel& cost,
                  std::chrono::steady_clock::time_point& t);
  // A round whose planning threw: its nodes (a region's members, a call's
  // results) and its resolved placeholders back to the queue.
  void return_round(Trace& trace) const;
  void plan_with(Trace& trace, const Strategy& strategy, StrategyMemo* memo, std::string_view label, bool validate,
                 const Fuser* fuser);
  void compare(Trace& trace, const Strategy& strategy, bool validate, const Fuser* fuser, const CostModel& cost);
  void count_split_shared(const Trace& trace);
  void count_split_region(const Trace& trace, const Region& region);
};

}  // namespace sheaf
