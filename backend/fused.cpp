#include "fused.h"

#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstdio>

#include <sheaf/core/error.h>
#include <sheaf/ops/op.h>

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

std::vector<int64_t> batched_sizes(int64_t n, const Shape& s) {
  std::vector<int64_t> sizes{n};
  sizes.insert(sizes.end(), s.dims().begin(), s.dims().end());
  return sizes;
}

// Inputs as the kernels read them: contiguous, the per-example ones [n, numel].
std::vector<at::Tensor> kernel_inputs(const FusedProgram& p, std::span<const at::Tensor> inputs, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (uint32_t e = 0; e < p.inputs; ++e) {
    at::Tensor x = inputs[e].is_contiguous() ? inputs[e] : inputs[e].contiguous();
    SHEAF_ASSERT(x.numel() == (p.input_shared[e] ? 1 : n) * p.input_numel[e], "fused input ", e, " has ",
                 x.numel(), " elements");
    out.push_back(std::move(x));
  }
  return out;
}

// The device's kernels; nullptr where this device has none (the ops run instead).
struct Kernels {
  void (*forward)(const FusedProgram&, std::span<const at::Tensor>, std::span<const at::Tensor>, int64_t);
  void (*backward)(const FusedProgram&, std::span<const at::Tensor>, std::span<const at::Tensor>,
                   std::span<at::Tensor>, int64_t);
};
const Kernels* kernels_for(const c10::Device& device) {
  static const Kernels cpu{&fused_cpu::forward, &fused_cpu::backward};
  static const Kernels cuda{&fused_cuda::forward, &fused_cuda::backward};
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
// saved inputs, then writes the gradient of every input that needs one.
struct FusedBackward : torch::autograd::Node {
  std::shared_ptr<const FusedProgram> program;
  const Kernels* kernels = nullptr;
  int64_t n = 0;
  std::vector<SavedVariable> inputs;
  std::vector<int> member_of_output;  // this node's outputs are the kept members

  std::string name() const override { return "sheaf::FusedBackward"; }
  void release_variables() override {
    for (SavedVariable& v : inputs) v.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    RECORD_FUNCTION("sheaf::fused", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)
    const FusedProgram& p = *program;
    std::vector<at::Tensor> in;
    for (SavedVariable& v : inputs) in.push_back(v.unpack());
    std::vector<at::Tensor> g_out(static_cast<size_t>(members_of(p)));
    for (size_t j = 0; j < grads.size(); ++j)
      if (grads[j].defined()) g_out[static_cast<size_t>(member_of_output[j])] = grads[j].contiguous();
    std::vector<at::Tensor> g_in(p.inputs);
    for (uint32_t e = 0; e < p.inputs; ++e)
      if (should_compute_output(e)) g_in[e] = at::zeros(in[e].sizes(), in[e].options());
    const std::vector<at::Tensor> flat = kernel_inputs(p, in, n);
    c10::AutoGradMode no_grad(false);
    kernels->backward(p, flat, g_out, g_in, n);
    return g_in;
  }
};

}  // namespace

std::vector<at::Tensor> run_fused(const std::shared_ptr<const FusedProgram>& program,
                                  std::span<const at::Tensor> inputs, int64_t n, std::span<const uint8_t> keep) {
  const FusedProgram& p = *program;
  SHEAF_ASSERT(inputs.size() == p.inputs, "fused program with ", p.inputs, " inputs got ", inputs.size());
  SHEAF_ASSERT(keep.empty() || keep.size() == p.code.size(), "fused keep mask of ", keep.size(), " members");
  const Kernels* kernels = kernels_for(inputs.empty() ? c10::Device(c10::kCPU) : inputs[0].device());
  if (kernels == nullptr) return run_fused_by_ops(p, inputs, n);
  RECORD_FUNCTION("sheaf::fused", std::vector<c10::IValue>());  // one kernel (bench/launches.h counts it)

  const at::TensorOptions opts = inputs.empty() ? at::TensorOptions(at::kFloat) : inputs[0].options();
  std::vector<at::Tensor> outputs;  // per non-slice member: written, or undefined (scratch only)
  for (size_t k = 0; k < p.code.size(); ++k)
    if (!p.code[k].slice)
      outputs.push_back(keep.empty() || keep[k] ? at::empty({n, p.numel}, opts.requires_grad(false)) : at::Tensor());
  {
    c10::AutoGradMode no_grad(false);
    kernels->forward(p, kernel_inputs(p, inputs, n), outputs, n);
  }

  bool requires_grad = false;
  for (const at::Tensor& x : inputs) requires_grad = requires_grad || x.requires_grad();
  if (requires_grad && c10::GradMode::is_enabled()) {
    auto node = detail::make_node<FusedBackward>();
    node->program = program;
    node->kernels = kernels;
    node->n = n;
    torch::autograd::edge_list edges;
    for (const at::Tensor& x : inputs) {
      edges.push_back(torch::autograd::impl::gradient_edge(x));
      node->inputs.emplace_back(x, /*is_output=*/false);
    }
    node->set_next_edges(std::move(edges));
    for (size_t m = 0; m < outputs.size(); ++m) {
      if (!outputs[m].defined()) continue;
      torch::autograd::set_history(outputs[m], node);
      node->member_of_output.push_back(static_cast<int>(m));
    }
  }

  // Member values in program order; a slice is a view of its operand's rows.
  std::vector<at::Tensor> regs(inputs.begin(), inputs.end());
  std::vector<at::Tensor> values;
  size_t next = 0;
  const std::vector<int64_t> sizes = batched_sizes(n, p.shape);
  for (size_t k = 0; k < p.code.size(); ++k) {
    const FusedInstr& in = p.code[k];
    at::Tensor v;
    if (in.slice) {  // a view, made only when wanted (views cost a dispatch each)
      const at::Tensor& src = regs[in.a];
      if (src.defined() && (keep.empty() || keep[k])) v = src.reshape({n, -1}).narrow(1, in.offset, p.numel).view(sizes);
    } else {
      const at::Tensor& out = outputs[next++];
      if (out.defined()) v = out.view(sizes);
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
