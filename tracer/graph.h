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
// graphs may be recorded and scheduled on different threads at once.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "../dsl/expr.h"
#include "error.h"
#include "node_store.h"

namespace sheaf {

class Strategy;
struct Plan;
struct StrategyMemo;
struct RoundBuffers;

struct GraphOptions {
  c10::Device device = c10::kCPU;
  uint64_t seed = 0x5EAF5EAFull;  // dropout masks depend on (seed, example, node ordinal)
  bool train = true;              // dropout is the identity when false
  // Waits for the device around every batch's gathers and launch, to split
  // execute time into gather_ms and op_ms (Stats). Slows execution: profiling only.
  bool profile = false;
};

struct ForwardOptions {
  const Strategy* strategy = nullptr;  // nullptr: the graph's default (see set_strategy)
  int max_rounds = 1000000;            // guards runaway control flow
  bool validate = false;               // check the strategy's schedule (always on with SHEAF_DEBUG=1)
};

// Counters since the last clear(). Times are wall-clock milliseconds.
struct Stats {
  uint64_t nodes = 0;             // nodes executed
  uint64_t batches = 0;           // batched op launches (one per batch)
  uint64_t rounds = 0;            // schedule+execute rounds; > 1 only with control flow
  uint64_t zero_copy_inputs = 0;  // batched inputs passed as a view of an earlier batch
  uint64_t gathered_inputs = 0;   // batched inputs that needed a gather
  uint64_t gather_launches = 0;   // index_select / cat launches those gathers took
  uint64_t gathered_bytes = 0;
  uint64_t fetches = 0;           // device->host value fetches for control flow (one per round at most)
  double trace_ms = 0;            // user code recording nodes (clear/forward to next forward)
  double schedule_ms = 0;
  double execute_ms = 0;
  double fetch_ms = 0;
  double gather_ms = 0;  // with GraphOptions::profile: inputs' gathers, device time included
  double op_ms = 0;      // with GraphOptions::profile: the batched ops, device time included
  std::string str() const;
};

// Something waiting for the computed value of a node (a dsl::cond, a dsl::loop step,
// a suspended coroutine). Called with the value on the CPU, after the round that
// computed it; it may record more nodes.
using ValueCallback = std::function<void(const at::Tensor& host_value)>;

class Graph {
 public:
  explicit Graph(GraphOptions options = {});
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // ---- Leaves. Each records a node of the current example (see example()).
  // A per-example tensor (float); batched by stacking.
  Expr input(const at::Tensor& x, std::source_location loc = std::source_location::current());
  // A shared tensor, typically a parameter: the same tensor for all examples is one node.
  Expr param(const at::Tensor& w, std::source_location loc = std::source_location::current());
  // A per-example constant filled with `value`.
  Expr constant(Shape shape, double value, std::source_location loc = std::source_location::current());
  Expr zeros(Shape shape, std::source_location loc = std::source_location::current()) {
    return constant(shape, 0.0, loc);
  }
  // Row `id` of a shared [rows, ...] table. sparse_grad gives the table a sparse
  // gradient (as torch::nn::Embedding's `sparse` option).
  Expr lookup(const at::Tensor& table, int64_t id, bool sparse_grad = false,
              std::source_location loc = std::source_location::current());

  // ---- Examples. Nodes recorded while the scope lives are tagged with `id`.
  class ExampleScope {
   public:
    ~ExampleScope();
    ExampleScope(const ExampleScope&) = delete;
    ExampleScope& operator=(const ExampleScope&) = delete;

   private:
    friend class Graph;
    ExampleScope(Graph& g, int id);
    Graph& g_;
    int previous_;
  };
  [[nodiscard]] ExampleScope example(int id);
  int current_example() const { return current_example_; }

  // ---- Execution. Runs every recorded node not yet computed, in batches, then
  // resolves control flow whose predicates became known, and repeats until
  // nothing is left. Nodes recorded after a forward run at the next forward.
  void forward(std::span<const Expr> targets = {}, const ForwardOptions& options = {});
  void forward(Expr target, const ForwardOptions& options = {}) { forward(std::span(&target, 1), options); }
  void forward(std::initializer_list<Expr> targets, const ForwardOptions& options = {}) {
    forward(std::span(targets.begin(), targets.size()), options);
  }
  // Schedules the first round of the next forward now, launching nothing: host
  // work that can run on another thread while the device is busy with another
  // graph (see sheaf::Prefetcher). The next forward() runs that round first,
  // then whatever was recorded since and any control flow, as usual.
  void prepare(std::span<const Expr> targets = {}, const ForwardOptions& options = {});

  // Forgets every node; Exprs made before become invalid (using one is a UserError).
  void clear();

  void set_strategy(const Strategy& s) { default_strategy_ = &s; }
  const GraphOptions& options() const { return options_; }
  void set_train(bool train) { options_.train = train; }
  const Stats& stats() const { return stats_; }
  size_t size() const { return store_.size(); }
  std::string dump() const;              // the graph, one node per line
  const Plan* last_plan() const;  // nullptr before the first round that ran something

  // ---- For the DSL and the runtime (not needed by model code).
  const NodeStore& store() const { return store_; }
  NodeStore& store() { return store_; }
  // Records a node after checking its arguments and inferring its shape; throws
  // UserError (and records nothing) on misuse.
  Expr record(OpCode op, std::span<const NodeId> args, std::span<const int64_t> attrs, int64_t payload,
              std::source_location loc);
  Expr expr(NodeId n) const { return Expr(slot_, generation_, n); }
  // The NodeId of an Expr of this graph; throws UserError naming `op` otherwise.
  NodeId node_of(const Expr& e, std::string_view op, std::source_location loc) const;
  // Control flow: a placeholder stands for a value decided later; resolve() binds it.
  Expr placeholder(ShapeId shape, int example, std::source_location loc);
  void resolve(NodeId placeholder, NodeId value);
  void when_computed(NodeId node, ValueCallback callback);
  // The value of a computed node, connected to autograd.
  at::Tensor value(NodeId n) const;
  static Graph& of(const Expr& e);      // validates the handle; throws UserError
  static Graph* find(const Expr& e);    // nullptr if the handle is empty or stale

 private:
  friend class Expr;
  void check_shape_now(NodeId n, std::string_view what) const;
  void infer_deferred();
  bool deliver_waiters();
  bool schedule_round(const Strategy& strategy, bool validate);
  void execute_round();
  void finish_aliases(std::vector<NodeId>& aliases);

  struct Waiter {
    NodeId node;
    ValueCallback callback;
  };

  NodeStore store_;
  GraphOptions options_;
  const Strategy* default_strategy_;
  uint32_t slot_;
  uint32_t generation_;
  int current_example_ = 0;
  std::vector<uint32_t> example_ordinal_;  // per example: nodes recorded so far (dropout keys)
  std::vector<NodeId> pending_;            // recorded, not computed
  std::vector<NodeId> unknown_shape_;      // nodes downstream of an unresolved dsl::cond
  std::vector<Waiter> waiters_;
  std::unordered_map<const void*, NodeId> param_nodes_;
  std::vector<const Shape*> arg_shapes_;  // record()'s scratch
  std::vector<uint8_t> arg_shared_;
  Stats stats_;
  const Strategy* memo_owner_ = nullptr;  // the strategy whose memo this is (kept across clear())
  std::unique_ptr<StrategyMemo> memo_;
  std::unique_ptr<Plan> last_plan_;          // the last round's plan; its buffers are reused
  std::unique_ptr<RoundBuffers> round_;     // DAG and batches of a round, reused
  std::chrono::steady_clock::time_point trace_start_;
  bool prepared_ = false;  // last_plan_ holds a scheduled round that forward() runs first
};

}  // namespace sheaf
