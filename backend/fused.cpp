#include "fused.h"

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <cstdio>
#include <stdexcept>

#include <sheaf/core/error.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/output_pool.h>

#include <sheaf/ops/autograd_node.h>

namespace sheaf {

namespace {

using torch::autograd::SavedVariable;

size_t members_of(const FusedProgram& p) {
  size_t m = 0;
  for (const FusedInstr& in : p.code) m += in.slice ? 0 : 1;
  return m;
}
using torch::autograd::variable_list;

// Inputs as the kernels read them: tensors contiguous, the per-example ones
// [n, numel]; rows read in place as they are.
using KernelInputs = c10::SmallVector<FusedInput, 4>;

KernelInputs kernel_inputs(const FusedProgram& p, std::span<const FusedInput> inputs, int64_t n) {
  KernelInputs out;
  for (uint32_t e = 0; e < p.inputs; ++e) {
    if (inputs[e].rows) {
      SHEAF_ASSERT(!p.input_shared[e] && inputs[e].rows->width() == p.input_numel[e] &&
                       static_cast<int64_t>(inputs[e].rows->data().size()) == n,
                   "fused input ", e, " read in place has ", inputs[e].rows->data().size(), " rows of ",
                   inputs[e].rows->width());
      out.push_back(inputs[e]);
      continue;
    }
    const at::Tensor& t = inputs[e].tensor;
    at::Tensor x = t.is_contiguous() ? t : t.contiguous();
    SHEAF_ASSERT(x.numel() == (p.input_shared[e] ? 1 : n) * p.input_numel[e], "fused input ", e, " has ",
                 x.numel(), " elements");
    out.push_back(FusedInput{std::move(x), nullptr});
  }
  return out;
}

std::vector<at::Tensor> tensors_of(std::span<const FusedInput> inputs) {
  std::vector<at::Tensor> out;
  for (const FusedInput& in : inputs) {
    SHEAF_ASSERT(!in.rows, "rows read in place reached a device without in-place reads");
    out.push_back(in.tensor);
  }
  return out;
}

c10::Device device_of(std::span<const FusedInput> inputs) {
  for (const FusedInput& in : inputs)
    if (in.tensor.defined()) return in.tensor.device();
  return c10::kCPU;  // rows are read in place on the CPU only
}

// The device's kernels; nullptr where this device has none (the ops run instead).
// The CPU's read rows in place; CUDA's read tensors. A batch of values of length
// 0 has nothing to compute (and its rows' data pointers may be null: no copy of
// zero floats from them); input gradients are already zeros.
struct Kernels {
  bool cpu;
  void forward(const FusedProgram& p, std::span<const FusedInput> in, std::span<const at::Tensor> out,
               int64_t n) const {
    if (n * p.numel == 0) return;
    if (cpu) return fused_cpu::forward(p, in, out, n);
    fused_cuda::forward(p, tensors_of(in), out, n);
  }
  void backward(const FusedProgram& p, std::span<const FusedInput> in, std::span<const at::Tensor> g_out,
                std::span<at::Tensor> g_in, std::span<float* const* const> g_rows, int64_t n) const {
    if (n * p.numel == 0) return;
    if (cpu) return fused_cpu::backward(p, in, g_out, g_in, g_rows, n);
    fused_cuda::backward(p, tensors_of(in), g_out, g_in, n);
  }
};
const Kernels* kernels_for(const c10::Device& device) {
  static const Kernels cpu{true};
  static const Kernels cuda{false};
  if (device.is_cpu()) return &cpu;
  if (!device.is_cuda()) return nullptr;
  static const bool ok = [] {
    std::string why;
    if (fused_cuda::available(&why)) return true;
    std::fprintf(stderr, "sheaf: fused CUDA kernels unavailable (%s): fused groups run op by op\n", why.c_str());
    return false;
  }();
  return ok ? &cuda : nullptr;
}

// The backward of one fused batch: the kernel recomputes the members from the
// saved inputs, then writes the gradient of every input that needs one (an
// input read in place: into its sources' hubs, reached through its edges).
struct FusedBackward : torch::autograd::Node {
  std::shared_ptr<const FusedProgram> program;
  const Kernels* kernels = nullptr;
  int64_t n = 0;
  std::vector<SavedVariable> inputs;  // per input; rows read in place: in `rows`
  std::vector<std::shared_ptr<const InPlaceRows>> rows;
  std::vector<uint32_t> first_edge;  // per input; an in-place input has one edge per hub
  std::vector<int> member_of_output;  // this node's outputs are the kept members

  std::string name() const override { return "sheaf::FusedBackward"; }
  void release_variables() override {
    for (SavedVariable& v : inputs) v.reset_data();
    for (auto& r : rows) released = released || r != nullptr;
    for (auto& r : rows) r.reset();
  }
  bool released = false;
  variable_list apply(variable_list&& grads) override {
    RECORD_FUNCTION("sheaf::fused", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)
    const FusedProgram& p = *program;
    // As SavedVariable::unpack says it for the other inputs.
    if (released) throw std::runtime_error("Trying to backward through the graph a second time (a fused batch's "
                                           "rows read in place were freed): use retain_graph=true");
    for (const auto& r : rows)
      if (r) r->check_unchanged("its backward");  // as SavedVariable::unpack checks the others
    std::vector<FusedInput> in(p.inputs);
    std::vector<const RowReads*> in_place;
    std::vector<uint32_t> in_place_edge;  // each one's first edge
    for (uint32_t e = 0; e < p.inputs; ++e) {
      if (rows[e]) {
        in[e].rows = rows[e];
        if (rows[e]->needs_grad()) {
          in_place.push_back(rows[e].get());
          in_place_edge.push_back(first_edge[e]);
        }
      } else {
        in[e].tensor = inputs[e].unpack();
      }
    }
    std::vector<at::Tensor> g_out(static_cast<size_t>(members_of(p)));
    for (size_t j = 0; j < grads.size(); ++j)
      if (grads[j].defined()) g_out[static_cast<size_t>(member_of_output[j])] = grads[j].contiguous();
    std::vector<at::Tensor> g_in(p.inputs);
    for (uint32_t e = 0; e < p.inputs; ++e)
      if (!rows[e] && should_compute_output(first_edge[e])) g_in[e] = at::zeros(in[e].tensor.sizes(), in[e].tensor.options());
    // Hubs locked until the kernel is done; only those autograd asked for.
    RowReads::GradRows hub_rows = RowReads::grad_rows(
        in_place, [&](size_t q, size_t k) { return task_should_compute_output(in_place_edge[q] + k); });
    std::vector<float* const*> g_rows(p.inputs, nullptr);
    for (uint32_t e = 0, k = 0; e < p.inputs; ++e)
      if (rows[e] && rows[e]->needs_grad()) g_rows[e] = hub_rows.rows[k++].data();
    const KernelInputs flat = kernel_inputs(p, in, n);
    {
      c10::AutoGradMode no_grad(false);
      kernels->backward(p, std::span(flat.data(), flat.size()), g_out, g_in, g_rows, n);
    }
    variable_list out(num_outputs());
    for (uint32_t e = 0; e < p.inputs; ++e)
      if (!rows[e]) out[first_edge[e]] = std::move(g_in[e]);  // in place: written into the hubs
    detail::once_differentiable(*this, grads, out, "sheaf::FusedBackward");
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> run_fused(const std::shared_ptr<const FusedProgram>& program,
                                  std::span<const at::Tensor> inputs, int64_t n, std::span<const uint8_t> keep) {
  std::vector<FusedInput> in;
  in.reserve(inputs.size());
  for (const at::Tensor& t : inputs) in.push_back(FusedInput{t, nullptr});
  return run_fused(program, in, n, keep);
}

std::vector<at::Tensor> run_fused(const std::shared_ptr<const FusedProgram>& program,
                                  std::span<const FusedInput> inputs, int64_t n, std::span<const uint8_t> keep) {
  const FusedProgram& p = *program;
  SHEAF_ASSERT(inputs.size() == p.inputs, "fused program with ", p.inputs, " inputs got ", inputs.size());
  SHEAF_ASSERT(keep.empty() || keep.size() == p.code.size(), "fused keep mask of ", keep.size(), " members");
  const Kernels* kernels = kernels_for(device_of(inputs));
  if (kernels == nullptr) return run_fused_by_ops(p, tensors_of(inputs), n);
  RECORD_FUNCTION("sheaf::fused", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)

  at::TensorOptions opts = at::TensorOptions(at::kFloat).device(device_of(inputs));
  for (const FusedInput& in : inputs)
    if (in.tensor.defined()) opts = in.tensor.options();
  // Made in the members' batched shape: the kernels read only data pointers,
  // and a view per member afterwards cost a dispatch each (~1.5% of gated
  // inference). (Sizes and outputs on the stack: this runs per launch.)
  c10::SmallVector<int64_t, kMaxRank + 1> sizes{n};
  sizes.append(p.shape.dims().begin(), p.shape.dims().end());
  c10::SmallVector<at::Tensor, 8> outputs;  // per non-slice member: written, or undefined (scratch only)
  for (size_t k = 0; k < p.code.size(); ++k)
    if (!p.code[k].slice)
      outputs.push_back(keep.empty() || keep[k] ? empty_output(sizes, opts.requires_grad(false)) : at::Tensor());
  {
    c10::AutoGradMode no_grad(false);
    const KernelInputs flat = kernel_inputs(p, inputs, n);
    kernels->forward(p, std::span(flat.data(), flat.size()), outputs, n);
  }

  // A region of comparisons alone (a gate's lone `x > 0`) gives no gradient:
  // no node, as LibTorch's comparison records none (a slice passes its rows'
  // gradient on, so a region with one keeps its node).
  bool requires_grad = false;
  for (const FusedInput& x : inputs)
    requires_grad = requires_grad || (x.rows ? x.rows->needs_grad() : x.tensor.requires_grad());
  auto differentiable = [&p] {
    for (const FusedInstr& in : p.code)
      if (in.slice || op_info(in.op).pointwise->differentiable) return true;
    return false;
  };
  if (requires_grad && c10::GradMode::is_enabled() && differentiable()) {
    auto node = detail::make_node<FusedBackward>();
    node->program = program;
    node->kernels = kernels;
    node->n = n;
    torch::autograd::edge_list edges;
    for (const FusedInput& x : inputs) {
      node->first_edge.push_back(static_cast<uint32_t>(edges.size()));
      node->rows.push_back(x.rows);
      if (x.rows) {
        x.rows->append_edges(edges);
        node->inputs.emplace_back();
      } else {
        edges.push_back(torch::autograd::impl::gradient_edge(x.tensor));
        node->inputs.emplace_back(x.tensor, /*is_output=*/false);
      }
    }
    node->set_next_edges(std::move(edges));
    for (size_t m = 0; m < outputs.size(); ++m) {
      if (!outputs[m].defined()) continue;
      torch::autograd::set_history(outputs[m], node);
      node->member_of_output.push_back(static_cast<int>(m));
    }
  }

  // Member values in program order; a slice is a view of its operand's rows
  // (of an input read in place: of a copy of them, made when wanted).
  c10::SmallVector<at::Tensor, 16> regs;
  for (const FusedInput& x : inputs) regs.push_back(x.tensor);
  std::vector<at::Tensor> values;
  values.reserve(p.code.size());
  size_t next = 0;
  for (size_t k = 0; k < p.code.size(); ++k) {
    const FusedInstr& in = p.code[k];
    at::Tensor v;
    if (in.slice) {  // a view, made only when wanted (views cost a dispatch each)
      if (keep.empty() || keep[k]) {
        if (in.a < p.inputs && !regs[in.a].defined() && inputs[in.a].rows) {
          const std::array<int64_t, 2> rows_sizes{n, p.input_numel[in.a]};
          regs[in.a] = inputs[in.a].rows->materialize(rows_sizes);
        }
        const at::Tensor& src = regs[in.a];
        if (src.defined()) v = src.reshape({n, -1}).narrow(1, in.offset, p.numel).view(sizes);
      }
    } else {
      v = std::move(outputs[next++]);  // with the node set_history gave it above
    }
    regs.push_back(v);
    values.push_back(std::move(v));
  }
  return values;
}

std::vector<at::Tensor> run_fused_by_ops(const FusedProgram& p, std::span<const at::Tensor> inputs, int64_t n) {
  const std::vector<int64_t> sizes = batched_sizes(n, p.shape);
  std::vector<at::Tensor> regs;
  std::vector<uint8_t> shared;
  for (uint32_t e = 0; e < p.inputs; ++e) {
    shared.push_back(p.input_shared[e]);
    if (p.input_shared[e]) regs.push_back(inputs[e]);
    else if (p.input_numel[e] == p.numel) regs.push_back(inputs[e].reshape(sizes));
    else regs.push_back(inputs[e].reshape({n, -1}));  // a per-example scalar, or a slice's source
  }
  std::vector<at::Tensor> values;
  for (const FusedInstr& in : p.code) {
    at::Tensor v;
    if (in.slice) {
      v = regs[in.a].reshape({n, -1}).narrow(1, in.offset, p.numel).view(sizes);
    } else {
      const std::array<at::Tensor, 2> args{regs[in.a], regs[in.b]};
      const std::array<uint8_t, 2> args_shared{shared[in.a], shared[in.b]};
      LaunchArgs a;
      a.n = n;
      a.arity = static_cast<size_t>(op_info(in.op).pointwise->operands);
      a.inputs = std::span(args.data(), a.arity);
      a.shared = std::span(args_shared.data(), a.arity);
      a.attrs = std::span(&in.attr, 1);
      a.out_shape = &p.shape;
      a.options = inputs.empty() ? at::TensorOptions(at::kFloat) : inputs[0].options();
      RunCtx ctx(a);
      v = op_info(in.op).run(ctx);
    }
    regs.push_back(v);
    shared.push_back(0);
    values.push_back(std::move(v));
  }
  return values;
}

#ifndef SHEAF_CUDA_FUSION
// LibTorch without CUDA: nothing to compile kernels for.
namespace fused_cuda {
bool available(std::string* why) {
  if (why) *why = "this LibTorch has no CUDA";
  return false;
}
void forward(const FusedProgram&, std::span<const at::Tensor>, std::span<const at::Tensor>, int64_t) {
  throw_internal("fused_cuda::forward without CUDA");
}
void backward(const FusedProgram&, std::span<const at::Tensor>, std::span<const at::Tensor>, std::span<at::Tensor>,
              int64_t) {
  throw_internal("fused_cuda::backward without CUDA");
}
}  // namespace fused_cuda
#endif

}  // namespace sheaf
