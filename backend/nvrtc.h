// Kernels compiled at run time with NVRTC and launched with the CUDA driver,
// both loaded with dlopen (nothing needed at link time): what the generated
// fused kernels (fused_cuda.cpp) and the row gathers' kernels
// (row_copies_cuda.cpp) share. Built when LibTorch has CUDA.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace sheaf::nvrtc {

using CUfunction = void*;

// Whether NVRTC and the driver could be loaded; `why` says what is missing.
bool available(std::string* why = nullptr);

// Compiles `source` for the current device (PTX for its compute capability,
// which the driver finishes) and returns the kernels named `kernels`, in that
// order. `what` names the source in errors (InternalError, with NVRTC's log).
// Modules live as long as the process: callers cache what they compile.
std::vector<CUfunction> compile(const std::string& source, const std::string& file,
                                std::span<const std::string> kernels, const std::string& what);

// One launch of a 1-D grid on the current CUDA stream; args as cuLaunchKernel takes them.
void launch(CUfunction f, unsigned blocks, unsigned threads, void** args, const char* what);

}  // namespace sheaf::nvrtc
