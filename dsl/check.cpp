#include "check.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/max.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <memory>
#include <optional>
#include <sstream>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>

#include "dsl.h"

namespace sheaf {

namespace {

// d t / d params, dense (zeros for a parameter t does not reach). Through
// autograd::grad, not backward(): no other leaf's .grad is touched (a
// parameter not listed, an input that needs a gradient).
std::vector<at::Tensor> gradients(const at::Tensor& t, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out(params.size()), wanted;
  std::vector<size_t> at;
  for (size_t p = 0; p < params.size(); ++p)
    if (params[p].requires_grad()) {
      wanted.push_back(params[p]);
      at.push_back(p);
    }
  if (!wanted.empty() && t.requires_grad()) {
    const std::vector<at::Tensor> g = torch::autograd::grad({t}, wanted, {}, /*retain_graph=*/false,
                                                            /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < g.size(); ++k)
      if (g[k].defined()) out[at[k]] = g[k].is_sparse() ? g[k].to_dense() : g[k].clone();
  }
  for (size_t p = 0; p < params.size(); ++p)
    if (!out[p].defined()) out[p] = at::zeros_like(params[p]);
  return out;
}

// One run: a graph, each example's output, and its per-example nodes in order.
struct Run {
  std::unique_ptr<Graph> graph;
  std::vector<Expr> outputs;
  std::vector<at::Tensor> grads;
  NodeId total = kNoNode;  // the sum over examples: not any one example's node
};

// A fixed, example-dependent weighting of the output, so that the gradient of
// sum_i <w_i, y_i> checks every example's contribution separately.
at::Tensor output_weights(const Shape& s, int example, const at::TensorOptions& opts) {
  std::vector<int64_t> dims(s.dims().begin(), s.dims().end());
  at::Tensor k = at::arange(s.numel(), opts).view(dims);
  return at::sin(k * 0.7 + (example * 1.3 + 0.25));
}

// Records example i and returns how to get its output once the graph has run
// (a coroutine's output exists only after forward).
using Recorder = std::function<std::function<Expr()>(Graph&, int)>;

// Records `examples` into a fresh graph, forwards, then backpropagates the weighted outputs.
Run run_examples(const std::vector<int>& examples, const Recorder& record, const CheckOptions& o,
                 const Strategy& strategy, bool fuse, bool reference = false,
                 bool inline_functions = false) {
  Run run;
  GraphOptions go = o.graph;
  go.fuse = fuse;
  go.inline_functions = inline_functions;
  if (reference) {
    go.batch_weight_grads = false;  // plain autograd, batch by batch
    go.defer_unawaited = false;     // every node as soon as it can run
  }
  run.graph = std::make_unique<Graph>(go);
  Graph& g = *run.graph;
  std::vector<std::function<Expr()>> outputs;
  for (int i : examples) {
    auto scope = g.example(i);
    outputs.push_back(record(g, i));
  }
  ForwardOptions fo{.strategy = &strategy, .validate = true};
  g.forward({}, fo);
  for (size_t k = 0; k < outputs.size(); ++k) {
    run.outputs.push_back(outputs[k]());
    // Checked here, by example: the weighting below would report it as its
    // own op's mistake, at this file's line.
    const Expr& y = run.outputs.back();
    if (detail::engine_of(g).node_or_none(y) != kNoNode) continue;
    const detail::Engine* owner = detail::Engine::find(y);  // (null: empty, or its graph cleared or gone)
    const bool foreign = owner != nullptr && owner != &detail::engine_of(g);
    throw UserError(detail::cat("sheaf::check_batched: the program's result for example ", examples[k], ": ",
                                foreign ? "it belongs to another sheaf::Graph than the one the program was given"
                                        : detail::Engine::unusable(y, "it"),
                                "; return an Expr recorded on the program's graph"));
  }
  // Shapes downstream of a dsl::cond are known only now: weight the outputs after forward.
  std::vector<Expr> losses;
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kFloat).device(o.graph.device);
  for (size_t k = 0; k < examples.size(); ++k) {
    auto scope = g.example(examples[k]);
    const Expr& y = run.outputs[k];
    losses.push_back(dsl::sum(y * g.input(output_weights(y.shape(), examples[k], opts))));
  }
  Expr total = dsl::sum(losses);
  run.total = total.id();
  g.forward(total, fo);
  run.grads = gradients(total.value(), o.params);
  return run;
}

const NodeStore& store_of(const Run& run) { return detail::engine_of(*run.graph).store(); }
at::Tensor value_of(const Run& run, NodeId n) {
  return detail::engine_of(*run.graph).value(n, std::source_location::current());
}

std::vector<NodeId> nodes_of_example(const Run& run, int example) {
  const NodeStore& s = store_of(run);
  std::vector<NodeId> nodes;
  for (NodeId n = 0; n < s.size(); ++n)
    if (n != run.total && s.example[n] == example && s.has(s.resolve(n), NodeStore::kComputed)) nodes.push_back(n);
  return nodes;
}

// Max |a - b| where the tolerance is exceeded (NaN in both places counts as equal),
// and the overall max |a - b|.
struct Diff {
  double worst_excess, max_abs;
};
Diff compare(const at::Tensor& batched, const at::Tensor& alone, double atol, double rtol) {
  const at::Tensor a = batched.detach(), b = alone.detach();
  // Where either side is not finite: equal if both are NaN or both the same
  // infinity, else an unbounded difference. (A NaN left in the differences
  // or the tolerances made the whole tensor's max NaN, which passed.)
  const at::Tensor finite = at::logical_and(at::isfinite(a), at::isfinite(b));
  const at::Tensor same = at::logical_or(at::logical_and(at::isnan(a), at::isnan(b)), a == b);
  const at::Tensor d = at::where(finite, at::abs(a - b), at::where(same, at::zeros_like(b), at::full_like(b, INFINITY)));
  const at::Tensor excess = d - (atol + rtol * at::where(finite, at::abs(b), at::zeros_like(b)));
  return {excess.numel() ? excess.max().item<double>() : 0.0, d.numel() ? d.max().item<double>() : 0.0};
}

// (From the trace: a placeholder is named for the cond, loop or function that made it.)
std::string where(const Run& run, NodeId n) {
  const Site site = detail::engine_of(*run.graph).trace().site_of(n);
  std::ostringstream os;
  os << "op '" << site.op << "' recorded at " << site.loc.file_name() << ":" << site.loc.line();
  return os.str();
}

CheckReport check(int num_examples, const Recorder& program, const CheckOptions& o) {
  if (num_examples < 1)
    throw UserError(detail::cat("sheaf::check_batched: needs at least one example, got ", num_examples));
  std::optional<NoTf32> full_float;
  if (o.full_float) full_float.emplace();
  if (!o.params.empty() && !c10::GradMode::is_enabled())
    throw UserError("sheaf::check_batched: parameters to check gradients of, but autograd is off here (a "
                    "NoGradGuard or InferenceMode): their gradients would all be compared as zeros. Call it with "
                    "autograd on, or give no params to compare values only");
  CheckReport report;
  std::vector<const Strategy*> strategies = o.strategies;
  if (strategies.empty()) strategies.assign(all_strategies().begin(), all_strategies().end());

  // Each example alone, in a graph of its own (the reference: op by op, no
  // fusion, unless only fused runs are asked for), and the parameters'
  // gradients summed over the examples.
  auto each_alone = [&](bool inline_functions, std::vector<Run>& runs, std::vector<at::Tensor>& summed) {
    for (int i = 0; i < num_examples; ++i) {
      runs.push_back(run_examples({i}, program, o, default_strategy(), o.fusion == Fusion::kOn, true,
                                  inline_functions));
      if (summed.empty()) {
        summed = runs.back().grads;
      } else {
        for (size_t p = 0; p < summed.size(); ++p) summed[p] = summed[p] + runs.back().grads[p];
      }
    }
  };
  std::vector<Run> alone;
  std::vector<at::Tensor> alone_grads;
  each_alone(false, alone, alone_grads);
  for (const Run& r : alone) report.alone_launches += r.graph->stats().batches;

  // Programs that call sheaf::Functions: also each example alone with the
  // bodies written out op by op, compared on outputs and gradients (the node
  // lists differ: a call is one node).
  bool calls = false;
  for (const Run& r : alone) {
    const NodeStore& s = detail::engine_of(*r.graph).store();
    for (NodeId n = 0; n < s.size() && !calls; ++n) calls = s.op[n] == code_of<op::Call>;
  }
  std::vector<Run> inlined;
  std::vector<at::Tensor> inlined_grads;
  if (calls) each_alone(true, inlined, inlined_grads);

  auto fail = [&](int example, const std::string& strategy, const std::string& what) {
    if (!report.ok) return;
    report.ok = false;
    report.example = example;
    report.strategy = strategy;
    std::ostringstream os;
    os << "batched != alone (strategy '" << strategy << "'";
    if (example >= 0) os << ", example " << example;
    os << "): " << what << " [atol " << o.atol << ", rtol " << o.rtol << "]";
    report.message = os.str();
  };

  // Counts a comparison; past the tolerance, fails with what(the largest difference).
  auto expect_close = [&](const at::Tensor& batched, const at::Tensor& reference, int example,
                          const std::string& strategy, const auto& what) {
    ++report.values_compared;
    if (batched.sizes() != reference.sizes()) {  // (a - b would broadcast)
      fail(example, strategy, detail::cat(what(INFINITY), ": its shape is ", batched.sizes(), " batched but ",
                                          reference.sizes(), " alone"));
      return;
    }
    const Diff d = compare(batched, reference, o.atol, o.rtol);
    report.max_abs_diff = std::max(report.max_abs_diff, d.max_abs);
    if (d.worst_excess > 0) fail(example, strategy, what(d.max_abs));
  };

  std::vector<int> all(static_cast<size_t>(num_examples));
  for (int i = 0; i < num_examples; ++i) all[static_cast<size_t>(i)] = i;
  std::vector<bool> fusions;
  if (o.fusion != Fusion::kOff) fusions.push_back(true);
  if (o.fusion != Fusion::kOn) fusions.push_back(false);
  for (const Strategy* strategy : strategies)
  for (const bool fuse : fusions) {
    const std::string name = std::string(strategy->name()) + (fuse ? ", fused" : ", unfused");
    Run batched = run_examples(all, program, o, *strategy, fuse);
    report.batched_launches = std::max<size_t>(report.batched_launches, batched.graph->stats().batches);
    const NodeStore& bs = store_of(batched);

    for (int i = 0; i < num_examples; ++i) {
      const NodeStore& as = store_of(alone[static_cast<size_t>(i)]);
      std::vector<NodeId> bn = nodes_of_example(batched, i), an = nodes_of_example(alone[static_cast<size_t>(i)], i);
      if (bn.size() != an.size()) {
        fail(i, name, detail::cat("the example recorded ", bn.size(), " nodes batched but ", an.size(),
                                  " alone; is the program deterministic?"));
        continue;
      }
      if (!o.compare_nodes) {  // the output itself (not its weighted sum: a small weight hid an error)
        expect_close(batched.outputs[static_cast<size_t>(i)].value(), alone[static_cast<size_t>(i)].outputs[0].value(),
                     i, name, [](double d) { return detail::cat("the output differs by up to ", d); });
        continue;
      }
      for (size_t k = 0; k < bn.size(); ++k) {
        if (bs.op[bn[k]] != as.op[an[k]]) {
          fail(i, name, detail::cat("node ", k, " of the example is ", where(batched, bn[k]), " batched but ",
                                    where(alone[static_cast<size_t>(i)], an[k]), " alone"));
          break;
        }
        expect_close(value_of(batched, bn[k]), value_of(alone[static_cast<size_t>(i)], an[k]), i, name, [&](double d) {
          return detail::cat("node ", k, " of the example (", where(batched, bn[k]), ") differs by up to ", d);
        });
      }
    }
    for (size_t i = 0; i < inlined.size(); ++i)
      expect_close(batched.outputs[i].value(), inlined[i].outputs[0].value(), static_cast<int>(i), name, [](double d) {
        return detail::cat("the output differs by up to ", d, " from the same program with its functions written inline");
      });
    for (size_t p = 0; p < inlined_grads.size(); ++p)
      expect_close(batched.grads[p], inlined_grads[p], -1, name, [&](double d) {
        return detail::cat("the gradient of params[", p, "] differs by up to ", d,
                           " from the same program with its functions written inline");
      });
    for (size_t p = 0; p < o.params.size(); ++p)
      expect_close(batched.grads[p], alone_grads[p], -1, name, [&](double d) {
        return detail::cat("the gradient of params[", p, "] (shape ", o.params[p].sizes(), ") differs by up to ", d);
      });
  }
  return report;
}

}  // namespace

NoTf32::NoTf32() : cublas_(std::make_unique<at::NoTF32Guard>()) {
  try {
    cudnn_was_ = at::globalContext().allowTF32CuDNN();
  } catch (const c10::Error&) {
    return;  // convolutions and RNNs set apart (see check.h): left as the user set them
  }
  at::globalContext().setAllowTF32CuDNN(false);
}

NoTf32::~NoTf32() {
  if (cudnn_was_) at::globalContext().setAllowTF32CuDNN(*cudnn_was_);
}

CheckReport check_batched(int num_examples, const Program& program, const CheckOptions& o) {
  return check(num_examples, [&](Graph& g, int i) {
    Expr out = program(g, i);
    return std::function<Expr()>([out] { return out; });
  }, o);
}

CheckReport check_batched(int num_examples, const TaskProgram& program, const CheckOptions& o) {
  return check(num_examples, [&](Graph& g, int i) {
    auto task = std::make_shared<Task<Expr>>(program(g, i));
    return std::function<Expr()>([task] { return task->result(); });
  }, o);
}

}  // namespace sheaf
