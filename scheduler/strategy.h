// Scheduling strategies: how a round's nodes are grouped into batched launches
// and in what order. Interchangeable objects; every strategy gives the same
// values (the tests check this with the batched-vs-alone checker).
//
//   g.forward(loss, {.strategy = &sheaf::strategy_named("agenda")});
#pragma once

#include <span>
#include <string_view>

namespace sheaf {

struct RoundDag;
struct Batches;
struct StrategyMemo;

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  // Must put every node in exactly one batch, all nodes of a batch of one
  // signature (kNoSig nodes alone), and each batch after its nodes' arguments.
  virtual void schedule(const RoundDag& dag, Batches& out) const = 0;
  // The same, with what this strategy remembered of the graph's earlier rounds.
  virtual void schedule(const RoundDag& dag, Batches& out, StrategyMemo&) const { schedule(dag, out); }
  // The schedule used in the last round scheduled with this memo: the name, or,
  // for a strategy that picks among others (auto), the one it picked.
  virtual std::string_view chosen(const StrategyMemo&) const { return name(); }
  // A strategy that picks among others: them. The scheduler plans the round
  // with each, keeps the cheapest by its CostModel (scheduler/cost.h), and
  // uses that one alone for the next rounds (the memo's choice) until the
  // next comparison. schedule() without a scheduler picks by launches.
  virtual std::span<const Strategy* const> candidates() const { return {}; }
};

// TensorFlow Fold: nodes at the same depth (longest path from the inputs) with the
// same signature form one batch; depths run in order.
const Strategy& depth_strategy();
// DyNet's agenda: repeatedly run every ready node of the signature whose nodes
// are, on average, shallowest. Lets nodes of one signature at different depths
// wait for each other (e.g. losses of trees of different heights).
const Strategy& agenda_strategy();
// Ours: the depth schedule, then every batch that can move into another batch of
// its signature (later, its consumers permitting, or earlier, its arguments
// permitting) does. Never more launches than depth; batches what depth cannot.
const Strategy& lazy_strategy();
// Ours, the default: lazy, and the agenda with the same merging; the cheaper
// by the graph's CostModel (launches, gathers and their bytes: not timed),
// compared 16 rounds apart, up to 128 while the same one keeps winning.
const Strategy& auto_strategy();
const Strategy& default_strategy();

std::span<const Strategy* const> all_strategies();
// Whether s is one of all_strategies() (Sheaf's own; any other is the user's,
// whose schedules are always checked: the planner trusts the contract above).
bool built_in(const Strategy& s);
// Throws UserError listing the known names.
const Strategy& strategy_named(std::string_view name);

}  // namespace sheaf
