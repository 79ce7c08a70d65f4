// Runs one batch as parts, each recorded into a Graph of its own and run on
// a thread of its own, whose rounds take turns at the kernels: while one
// part's round runs, the others record, hand values to their control flow
// (dsl::cond branches, loop bodies, coroutines) and schedule their next
// round. It is for control flow that decides as it runs (a cond at every tree
// node, greedy decoding): there a Prefetcher, which records the next batch
// ahead, cannot help, as the rounds after each decision run inside forward.
//
// Each round's kernels take a turn, one part at a time (so do values made
// when control flow reads them, and a device's fetch for it; control flow's
// callbacks do not, nor does what a record function computes itself, such as
// Expr::value()): a one-thread run keeps one core of math and uses a second
// for host work, as a Prefetcher does. Each part is a smaller
// batch (each launch has fewer rows), so it pays where host work is a large
// share of the time, in inference (docs/benchmarks.md, stop 73: training's
// backward passes do not overlap). A user op whose kernel runs a forward of
// one of the same Overlap's graphs would wait for its own turn: do not.
//
//   sheaf::Overlap parts({.device = device});  // two parts
//   parts.run([&](sheaf::Graph& g, size_t p) {  // part 1 on the Overlap's thread
//     return model.logits(g, half_of_the_batch[p]);
//   });
//   for (size_t p = 0; p < parts.parts(); ++p) use(parts.targets(p));
//
// The record function runs on several threads at once, one per part: it may
// read what no part changes (the parameters, the data; sheaf::Functions, which
// several parts may record at once), and must record only into the graph it
// is given. Branches, loop bodies and coroutines that forward runs follow the
// same rule. It may run forward itself (a decoder that reads its own
// outputs): the forward after it then finds nothing left to run. As with a
// Prefetcher, a part's graph is lent to its thread during run(): its forward,
// prepare and clear from elsewhere are a UserError; its recording calls,
// example(), set_strategy and stats() are not checked: do not.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "graph.h"

namespace sheaf {

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
  void run(const Record& record, const ForwardOptions& forward = {});

  size_t parts() const { return graphs_.size(); }
  Graph& graph(size_t part);
  // What part `part`'s record returned at the last run(), computed.
  const std::vector<Expr>& targets(size_t part) const;

 private:
  void run_part(const Record& record, const ForwardOptions& forward, size_t part);
  std::vector<std::unique_ptr<Graph>> graphs_;
  std::vector<std::vector<Expr>> targets_;
  std::unique_ptr<detail::ExecutionTurns> turns_;
  std::atomic<bool> running_{false};  // a run() under way
  std::vector<std::unique_ptr<detail::Worker>> workers_;  // part p >= 1 runs on workers_[p - 1]
};

}  // namespace sheaf
