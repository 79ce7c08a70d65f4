// Graph: records many examples' per-example programs, then runs them batched.
//
//   sheaf::Graph g;
//   for (int i = 0; i < n; ++i) {
//     auto scope = g.example(i);           // tags nodes for errors, dropout and the checker
//     losses.push_back(model(g, data[i])); // ordinary per-example code, only records
//   }
//   sheaf::Expr loss = sheaf::dsl::sum(losses);
//   g.forward(loss);                       // batched launches happen here
//   loss.value().backward();
//
// Threads: a Graph and its Exprs belong to one thread at a time; different
// graphs may be recorded and run on different threads at once.
//
// Inputs are not copied when recorded: a tensor given to input() or param() is
// read when forward() runs (change its values in place in between and the
// result sees the change, as LibTorch's own ops would; its sizes, dtype or
// device changed since recording are a UserError).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include <sheaf/core/shape.h>
#include <sheaf/scheduler/cost.h>
#include "expr.h"
#include "stats.h"

namespace sheaf {

class Strategy;
class Graph;
namespace detail {
Engine& engine_of(Graph& g);  // the machinery behind a Graph (engine/engine.h): for the DSL
}

struct GraphOptions {
  c10::Device device = c10::kCPU;
  uint64_t seed = 0x5EAF5EAFull;  // dropout masks depend on (seed, example, node ordinal)
  bool train = true;              // dropout is the identity when false
  // Waits for the device around every batch's gathers and launch, to split
  // execute time into gather_ms and op_ms (Stats). Slows execution: profiling only.
  bool profile = false;
  const Strategy* strategy = nullptr;  // nullptr: sheaf::default_strategy()
  // Fuse each round's connected elementwise work (the glue of an LSTM or
  // Tree-LSTM cell) into one kernel per batch, forward and backward.
  bool fuse = true;
  // Compute each shared weight's gradient once per round, as one product over
  // the rows of every batch that used it (ops/weight_grad.h), not batch by batch.
  bool batch_weight_grads = true;
  // On CPUs with AVX-512 or AVX2+FMA: each shared weight applied to several rows is laid
  // out once a graph (again after each update) for a product kernel that reads
  // it as it is, instead of OpenBLAS copying it in every call
  // (ops/packed_gemm.h). A layout made for inference is kept across clear()
  // while the weight's bytes stay the same (ops/weight_grad.h). Off: OpenBLAS
  // for every product.
  bool pack_weights = true;
  // While control flow waits for values (dsl::cond, loops, co_await), run
  // only what those values need; the rest (a parser step's loss, a decoder
  // step's log-probabilities nobody branches on) waits for a later round and
  // batches there with its kind from the other steps: fewer, larger launches.
  // Inside a callback, value() of a node nothing awaited is then an error
  // (await it instead); after forward() every node has run.
  bool defer_unawaited = true;
  // Record a sheaf::Function's body at every call, as if it were written inline
  // (one node per op): the checker's reference for function calls.
  bool inline_functions = false;
  // What a launch and a gathered byte cost, for strategies that compare
  // schedules (auto). Unset: CostModel::for_device(device) (scheduler/cost.h),
  // which the graph's options() then hold.
  std::optional<CostModel> cost;
};

struct ForwardOptions {
  const Strategy* strategy = nullptr;  // nullptr: the graph's (GraphOptions::strategy, set_strategy)
  // Guards runaway control flow (a loop or coroutine that never finishes): each
  // round is one round trip of every example's control flow.
  int max_rounds = 100000;
  bool validate = false;  // check the strategy's schedule (always on with SHEAF_DEBUG=1, and for a strategy of your own)
};

class Graph {
 public:
  using Loc = std::source_location;
  explicit Graph(GraphOptions options = {});
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // ---- Leaves. Each records a node of the current example (see example()).
  // A per-example tensor (float, on the CPU or the graph's device); batched by stacking.
  Expr input(const at::Tensor& x, Loc loc = Loc::current());
  // A shared tensor, typically a parameter: the same tensor for all examples is one node.
  Expr param(const at::Tensor& w, Loc loc = Loc::current());
  // A per-example constant filled with `value`.
  Expr constant(Shape shape, double value, Loc loc = Loc::current());
  Expr zeros(Shape shape, Loc loc = Loc::current()) { return constant(shape, 0.0, loc); }
  // Row `id` of a shared [rows, ...] table. sparse_grad gives the table a sparse
  // gradient (as torch::nn::Embedding's `sparse` option; the table must then be 2-D).
  Expr lookup(const at::Tensor& table, int64_t id, bool sparse_grad = false, Loc loc = Loc::current());
  // The rows of a list of ids, as one per-example value [ids.size(), ...] (a
  // sentence's embeddings): one launch for the whole batch. The ids are copied.
  Expr lookup(const at::Tensor& table, std::span<const int64_t> ids, bool sparse_grad = false,
              Loc loc = Loc::current());
  Expr lookup(const at::Tensor& table, std::initializer_list<int64_t> ids, bool sparse_grad = false,
              Loc loc = Loc::current()) {
    return lookup(table, std::span(ids.begin(), ids.size()), sparse_grad, loc);
  }
  Expr lookup(const at::Tensor& table, const std::vector<int64_t>& ids, bool sparse_grad = false,
              Loc loc = Loc::current()) {
    return lookup(table, std::span(ids), sparse_grad, loc);
  }

  // ---- Examples. Nodes recorded while the scope lives are tagged with `id`, any
  // int64 >= 0 (a dataset index is fine: memory follows the examples recorded).
  class ExampleScope {
   public:
    ~ExampleScope();
    ExampleScope(const ExampleScope&) = delete;
    ExampleScope& operator=(const ExampleScope&) = delete;

   private:
    friend class Graph;
    ExampleScope(Graph& g, int64_t id);
    // Listed on this thread by a token (engine/scopes.h), not tied to the
    // Graph: one kept in a task's frame may end after its graph, or out of
    // order with the scope it began in. One that ends on another thread does
    // nothing there (its listing is on the thread it began on).
    uint64_t thread_;
    uint64_t token_;
  };
  [[nodiscard]] ExampleScope example(int64_t id, Loc loc = Loc::current());
  int64_t current_example() const;

  // ---- Execution. Runs every recorded node not yet computed, in batches, then
  // resolves control flow whose predicates became known, and repeats until
  // nothing is left. Nodes recorded after a forward run at the next forward.
  // If user code fails during forward (a branch, a loop body, a coroutine), the
  // other examples still complete; then a UserError names the failures. A
  // forward that ends while control flow waits on a value that can never be
  // computed (a launch failed earlier) says so once, naming the waits.
  void forward(std::span<const Expr> targets = {}, const ForwardOptions& options = {}, Loc loc = Loc::current());
  void forward(Expr target, const ForwardOptions& options = {}, Loc loc = Loc::current()) {
    forward(std::span(&target, 1), options, loc);
  }
  void forward(std::initializer_list<Expr> targets, const ForwardOptions& options = {}, Loc loc = Loc::current()) {
    forward(std::span(targets.begin(), targets.size()), options, loc);
  }
  // Schedules the first round of the next forward now, launching nothing: host
  // work that can run on another thread while the device is busy with another
  // graph (see sheaf::Prefetcher). The next forward() runs that round first,
  // then whatever was recorded since and any control flow, as usual. Run it
  // in the autograd mode forward() will run in: a round prepared in the other
  // is planned again (Stats::replans counts those).
  void prepare(std::span<const Expr> targets = {}, const ForwardOptions& options = {}, Loc loc = Loc::current());

  // Forgets every node; Exprs made before become invalid (using one is a UserError).
  // Weights laid out for inference by the graph just cleared stay held, with a
  // copy of each (GraphOptions::pack_weights), until a graph that does not use
  // them is cleared. Refused (a UserError) inside this graph's own forward
  // (a cond branch, a loop step, a coroutine it resumes), inside a
  // sheaf::Function's body while it records, and on a body's own graph: all
  // still read the nodes.
  void clear(Loc loc = Loc::current());

  void set_strategy(const Strategy& s);
  const GraphOptions& options() const;
  void set_train(bool train);
  const Stats& stats() const;
  size_t size() const;            // nodes recorded since the last clear()
  std::string dump() const;       // the graph, one node per line
  std::string plan_str() const;   // the last round's plan (empty before the first launch)

 private:
  friend detail::Engine& detail::engine_of(Graph& g);
  std::unique_ptr<detail::Engine> engine_;
};

}  // namespace sheaf
