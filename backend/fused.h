// Runs a fused elementwise program (scheduler/fusion.h) over the n rows of a
// batch: ONE kernel forward and, with autograd, ONE node backward whose kernel
// reads the members' values and writes every input's gradient.
//
// On the CPU the kernel walks row blocks and runs each instruction over a
// block as one vectorised loop (backend/fused_cpu.cpp; AVX2+FMA where the CPU
// has them). On CUDA it is generated per program and compiled with NVRTC
// (backend/fused_cuda.cpp) where LibTorch has CUDA; elsewhere, or when asked,
// the program runs op by op with the ops' own batched calls (run_fused_by_ops):
// the same values, one launch per member.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sheaf/scheduler/fusion.h>

#include "row_gather.h"

namespace sheaf {

// A fused program's input: a tensor (batched: [n, S...] rows; shared: the
// tensor itself), or, on the CPU, rows read where they lie (`rows`, `tensor`
// undefined): the kernel reads each row from its source and its backward adds
// each row's gradient into the source's hub, so no gathered copy is made
// either way.
struct FusedInput {
  at::Tensor tensor;
  std::shared_ptr<const InPlaceRows> rows;
};

// inputs[i]: the program's input i. Returns member k's value as [n, shape...] (a
// slice's is a view of its operand); members with keep[k] == 0 are computed
// only inside the kernel and come back undefined (empty keep: keep all). The
// backward recomputes the members from the inputs instead of saving them.
std::vector<at::Tensor> run_fused(const std::shared_ptr<const FusedProgram>& program,
                                  std::span<const FusedInput> inputs, int64_t n,
                                  std::span<const uint8_t> keep = {});
std::vector<at::Tensor> run_fused(const std::shared_ptr<const FusedProgram>& program,
                                  std::span<const at::Tensor> inputs, int64_t n,
                                  std::span<const uint8_t> keep = {});

// The reference: each member with its op's batched LibTorch call (ATen autograd).
std::vector<at::Tensor> run_fused_by_ops(const FusedProgram& program, std::span<const at::Tensor> inputs, int64_t n);

namespace fused_cpu {
// The CPU kernels (backend/fused_cpu.cpp). outputs: per non-slice member, its
// [n, numel] tensor to write, or undefined (computed in scratch only).
// grads_out: per non-slice member, its gradient (undefined: zero); grads_in:
// zero-filled gradients of the tensor inputs that need one (undefined: not
// needed); grad_rows: for inputs read in place, per row where its gradient is
// added (null: not needed). Tensor inputs are contiguous.
void forward(const FusedProgram& p, std::span<const FusedInput> inputs, std::span<const at::Tensor> outputs,
             int64_t n);
void backward(const FusedProgram& p, std::span<const FusedInput> inputs, std::span<const at::Tensor> grads_out,
              std::span<at::Tensor> grads_in, std::span<float* const* const> grad_rows, int64_t n);
// Which instruction set the kernels use here ("avx512", "avx2+fma" or "baseline").
const char* isa();
}  // namespace fused_cpu

namespace fused_cuda {
// Whether fused programs can run as generated CUDA kernels here: LibTorch with
// CUDA, NVRTC and the CUDA driver loadable; `why` says what is missing.
bool available(std::string* why = nullptr);
// As fused_cpu's, on the current CUDA stream (backend/fused_cuda.cpp).
void forward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> outputs, int64_t n);
void backward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> grads_out,
              std::span<at::Tensor> grads_in, int64_t n);
}  // namespace fused_cuda

}  // namespace sheaf
