// Scheduling strategies: how a round's nodes are grouped into batched launches
// and in what order. Interchangeable objects; every strategy must give the same
// values (tests check this with the batched-vs-alone checker).
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "round.h"

namespace sheaf {

// Batches as lists of local node ids (see RoundDag), in execution order.
struct Batches {
  std::vector<uint32_t> nodes;
  std::vector<uint32_t> begin{0};
  size_t size() const { return begin.size() - 1; }
  std::span<const uint32_t> operator[](size_t b) const { return {nodes.data() + begin[b], nodes.data() + begin[b + 1]}; }
  void close() { begin.push_back(static_cast<uint32_t>(nodes.size())); }  // ends the batch being filled
  void clear() {
    nodes.clear();
    begin.assign(1, 0);
  }
};

// What a strategy may remember about a graph between rounds (a graph is usually
// cleared and refilled with similar work batch after batch). It may change how
// many launches a round takes, never the values.
struct StrategyMemo {
  int choice = -1;
  int rounds_left = 0;
};

class Strategy {
 public:
  using Memo = StrategyMemo;
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;
  // Must put every node in exactly one batch, all nodes of a batch of one
  // signature (kNoSig nodes alone), and each batch after its nodes' arguments.
  virtual void schedule(const RoundDag& dag, Batches& out) const = 0;
  virtual void schedule(const RoundDag& dag, Batches& out, Memo&) const { schedule(dag, out); }
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
// Ours, the default: lazy, and the agenda with the same merging; the one with
// fewer launches.
const Strategy& auto_strategy();
const Strategy& default_strategy();

std::span<const Strategy* const> all_strategies();
// Throws UserError listing the known names.
const Strategy& strategy_named(std::string_view name);

// Internal check used by the scheduler in debug runs and by tests.
void validate_batches(const RoundDag& dag, const Batches& b, std::string_view strategy);

}  // namespace sheaf
