// CUDA C source of a fused program's kernels (backend/fused_cuda.cpp compiles
// it with NVRTC at run time, cached by program). Plain string building: it is
// compiled and tested everywhere, GPU or not (tests/backend/test_fused_cuda.cpp
// compiles the source with the toolkit's NVRTC where there is one).
//
//   extern "C" __global__ void <name>_fwd(long long n, const float* in0, ..., float* out0, ...)
//   extern "C" __global__ void <name>_bwd(long long n, const float* in0, ..., const float* gout0, ...,
//                                         float* gin0, ...)
//
// One thread per element of the n x numel members (a grid-stride loop). Inputs
// are read with their broadcast (per row, per element, or both); members live
// in registers; out_k (a non-slice member) is written when not null. The
// backward recomputes the members, then adds each input's gradient: plain adds
// for elementwise inputs (one thread per element), atomicAdd for broadcast ones.
// gin_e may be null (not needed); gout_k may be null (zero).
#pragma once

#include <string>
#include <string_view>

#include <sheaf/scheduler/fusion.h>

namespace sheaf {

std::string fused_cuda_source(const FusedProgram& program, std::string_view name);

}  // namespace sheaf
