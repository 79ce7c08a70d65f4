// The core guarantee, as a tool: running examples batched (every strategy,
// fused and unfused) gives the same values and the same parameter gradients as
// running each example alone, op by op (each node as soon as it can run:
// GraphOptions::defer_unawaited off).
//
//   auto report = sheaf::check_batched(n, [&](sheaf::Graph& g, int i) {
//     return model(g, data[i]);           // the per-example program
//   }, {.params = model.parameters()});
//   if (!report) std::cerr << report.message;
//
// Every node an example records is compared (not only its output), so a report
// names the first node that differs and the line that recorded it. A program
// that calls sheaf::Functions is also compared, on outputs and gradients, with
// itself run alone with every function's body written inline, op by op
// (GraphOptions::inline_functions). Values of different shapes differ; NaN
// equals NaN and an infinity the same infinity, any other non-finite value
// differs. Gradients come from autograd::grad over `params` (with autograd on:
// a UserError otherwise): no tensor's .grad is touched.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sheaf/engine/graph.h>
#include <sheaf/scheduler/strategy.h>

#include "task.h"

namespace at {
struct NoTF32Guard;
}

namespace sheaf {

// Which batched runs the checker makes: with elementwise fusion, without, or both.
enum class Fusion { kBoth, kOn, kOff };

struct CheckOptions {
  std::vector<at::Tensor> params;          // gradients of these are compared
  std::vector<const Strategy*> strategies; // empty: every strategy
  // kBoth: every strategy with fusion and without, against each example alone
  // without fusion (op by op, plain autograd); kOn / kOff: only that (and alone the same).
  Fusion fusion = Fusion::kBoth;
  GraphOptions graph;                      // device, seed, train mode
  double atol = 1e-5;                      // |batched - alone| <= atol + rtol * |alone|
  double rtol = 1e-4;
  bool compare_nodes = true;               // every node of every example, else outputs only
  // Runs with TF32 off (NoTf32 below): cuDNN's LSTM otherwise rounds its
  // float products to TF32, by an amount (~1e-4) that depends on the batch
  // size, beyond the tolerances above.
  bool full_float = true;
};

// For its scope, CUDA float products are computed in float: LibTorch's
// allowTF32CuDNN off (it is on by default) and, on this thread, cuBLAS's TF32
// off (at::NoTF32Guard; off by default). The cuDNN flag is process-wide: other
// threads' cuDNN calls run in float too meanwhile, and two scopes on two
// threads at once may restore it in the wrong order. Where LibTorch (2.9 and
// later) holds different settings for cuDNN's convolutions and RNNs (its
// fp32_precision API), it has no one flag to read: cuDNN's is left as set.
class NoTf32 {
 public:
  NoTf32();
  ~NoTf32();
  NoTf32(const NoTf32&) = delete;
  NoTf32& operator=(const NoTf32&) = delete;

 private:
  std::unique_ptr<at::NoTF32Guard> cublas_;
  std::optional<bool> cudnn_was_;
};

struct CheckReport {
  bool ok = true;
  std::string message;       // the first difference, when not ok
  int example = -1;          // where it was
  std::string strategy;
  double max_abs_diff = 0;   // largest difference seen over all comparisons
  size_t values_compared = 0;
  size_t batched_launches = 0;   // launches of the batched run (the most over strategies)
  size_t alone_launches = 0;     // launches of the one-at-a-time runs, summed
  explicit operator bool() const { return ok; }
};

// Records example i's program and returns its output (any shape).
using Program = std::function<Expr(Graph& g, int example)>;
// The same as a coroutine (control flow that follows computed values, dsl/task.h).
using TaskProgram = std::function<Task<Expr>(Graph& g, int example)>;

CheckReport check_batched(int num_examples, const Program& program, const CheckOptions& options = {});
CheckReport check_batched(int num_examples, const TaskProgram& program, const CheckOptions& options = {});

}  // namespace sheaf
