// Runs one batch as parts, each recorded into a Graph of its own and run on
// a thread of its own, whose rounds take turns at the kernels: while one
// part's round runs, the others record, hand values to their control flow
// (dsl::cond branches, loop bodies, coroutines) and schedule their next
// round. It is for control flow that decides as it runs (a cond at every tree
// node, greedy decoding): there a Prefetcher, which records the next batch
// ahead, cannot help, as the rounds after each decision run inside forward.
//
// Each round's kernels take a turn, one part at a time (so do values made
// when control flow or Expr::value() reads them, and a device's fetch for
// control flow; control flow's callbacks do not, nor does what a record
// function computes itself with ATen): a one-thread run keeps one core of
// math and uses a second for host work, as a Prefetcher does. Each part is a smaller
// batch (each launch has fewer rows), so it pays where host work is a large
// share of the time, in inference (docs/benchmarks.md, stop 73: training's
// backward passes do not overlap). A user op whose kernel runs a forward of
// one of the same Overlap's graphs is a UserError (its own graph's, as for
// any graph; during run(), another part's, lent to that part's thread), not
// a kernel waiting for its own turn; after run(), another part's forward or
// value() from a kernel runs in the turn that kernel holds.
//
//   sheaf::Overlap overlap({.device = device});  // two parts
//   const sheaf::Parts parts = sheaf::balanced_parts(batch.size(), 2, [&](size_t i) { return batch[i].length(); });
//   const auto mine = sheaf::deal(batch, parts);
//   overlap.run([&](sheaf::Graph& g, size_t p) {  // part 1 on the Overlap's thread
//     return model.logits(g, mine[p]);
//   });
//   std::vector<std::vector<sheaf::Expr>> out;
//   for (size_t p = 0; p < overlap.parts(); ++p) out.push_back(overlap.targets(p));
//   use(sheaf::in_item_order(parts, std::move(out)));  // the batch's order again
//
// The record function runs on several threads at once, one per part: it may
// read what no part changes (the parameters, the data; sheaf::Functions, which
// several parts may record at once), and must record only into the graph it
// is given. Branches, loop bodies and coroutines that forward runs follow the
// same rule. It may run forward itself (a decoder that reads its own
// outputs): the forward after it then finds nothing left to run. As with a
// Prefetcher, a part's graph is lent to its thread during run(): its forward,
// prepare, clear and its Exprs' value() from elsewhere are a UserError; its
// recording calls, example(), set_strategy and stats() are not checked: do not.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include <sheaf/core/error.h>

#include "graph.h"

namespace sheaf {

// A batch's items dealt to parts: part p's item indices, in item order.
using Parts = std::vector<std::vector<size_t>>;

// n items in `parts` parts about equal in rounds: items by `weight` (what
// sets how many rounds an item runs: a tree's height, a sentence's length),
// heaviest first, dealt to parts 0, 1, .., P-1, P-1, .., 0, 0, 1, .. Parts
// that end far apart waste the overlap: once one part is done, the others'
// host work has no kernels to hide behind. Parts may be empty (n < parts);
// a weight that is not finite is a UserError.
Parts balanced_parts(size_t n, size_t parts, const std::function<double(size_t)>& weight);

// Each part's items, in item order.
template <class T>
std::vector<std::vector<T>> deal(const std::vector<T>& items, const Parts& parts) {
  std::vector<std::vector<T>> out(parts.size());
  for (size_t p = 0; p < parts.size(); ++p)
    for (size_t i : parts[p]) {
      if (i >= items.size())
        throw UserError(detail::cat("sheaf::deal: part ", p, " lists item ", i, ", but there are only ", items.size(),
                                    " items"));
      out[p].push_back(items[i]);
    }
  return out;
}

// The parts' outputs, one per item of each part, back in the items' order.
template <class T>
std::vector<T> in_item_order(const Parts& parts, std::vector<std::vector<T>> outputs) {
  if (outputs.size() != parts.size())
    throw UserError(detail::cat("sheaf::in_item_order: ", outputs.size(), " parts' outputs for ", parts.size(), " parts"));
  size_t n = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (outputs[p].size() != parts[p].size())
      throw UserError(detail::cat("sheaf::in_item_order: part ", p, " has ", parts[p].size(), " items but ",
                                  outputs[p].size(), " outputs"));
    n += parts[p].size();
  }
  std::vector<T> all(n);
  std::vector<bool> seen(n, false);
  for (size_t p = 0; p < parts.size(); ++p)
    for (size_t k = 0; k < parts[p].size(); ++k) {
      const size_t i = parts[p][k];
      if (i >= n)
        throw UserError(detail::cat("sheaf::in_item_order: item ", i, " of part ", p,
                                    " is out of range: the parts list ", n, " items"));
      if (seen[i]) throw UserError(detail::cat("sheaf::in_item_order: item ", i, " of part ", p, " is listed twice"));
      seen[i] = true;
      all[i] = std::move(outputs[p][k]);
    }
  return all;
}

namespace detail {
class ExecutionTurns;
class Worker;
}  // namespace detail

class Overlap {
 public:
  using Record = std::function<std::vector<Expr>(Graph&, size_t part)>;
  explicit Overlap(GraphOptions graph, size_t parts = 2);
  ~Overlap();
  Overlap(const Overlap&) = delete;
  Overlap& operator=(const Overlap&) = delete;

  // Clears each part's graph, records part p with record(graph(p), p) and runs
  // forward on what it returns: part 0 on this thread, the others on the
  // Overlap's threads, under this thread's autograd mode, InferenceMode and
  // (for a device graph) current stream. Returns once every part is done; an
  // error of a part (recording it or running it) is thrown then, the lowest
  // part's. One run at a time: another while one is under way (from a part,
  // or from another thread) is a UserError.
  // (`loc`: errors about what `record` returns name the caller's line.)
  void run(const Record& record, const ForwardOptions& forward = {},
           std::source_location loc = std::source_location::current());

  size_t parts() const { return graphs_.size(); }
  Graph& graph(size_t part);
  // What part `part`'s record returned at the last run(), computed.
  const std::vector<Expr>& targets(size_t part) const;

 private:
  void run_part(const Record& record, const ForwardOptions& forward, size_t part, std::source_location loc);
  std::vector<std::unique_ptr<Graph>> graphs_;
  std::vector<std::vector<Expr>> targets_;
  std::unique_ptr<detail::ExecutionTurns> turns_;
  std::atomic<bool> running_{false};  // a run() under way
  std::vector<std::unique_ptr<detail::Worker>> workers_;  // part p >= 1 runs on workers_[p - 1]
};

}  // namespace sheaf
