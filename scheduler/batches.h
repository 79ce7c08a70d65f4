// A strategy's output: a round's nodes grouped into batches, in execution order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <sheaf/core/column.h>

namespace sheaf {

// Batches as lists of local node ids (see RoundDag).
struct Batches {
  Column<uint32_t> nodes;  // a Column: growth need not zero-fill, as every writer fills each entry it adds
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
  int interval = 0;  // rounds from one comparison to the next (Scheduler::compare)
};

}  // namespace sheaf
