// Fused elementwise programs on CUDA: the program's kernels (fused_cuda_source.h)
// compiled at run time with NVRTC (nvrtc.h), cached per program and device,
// and launched on the current stream. Built when LibTorch has CUDA; a machine
// without NVRTC or the driver falls back to the ops' own launches (fused.cpp
// asks available()).
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <sheaf/core/error.h>

#include "fused.h"
#include "fused_cuda_source.h"
#include "nvrtc.h"

namespace sheaf::fused_cuda {

namespace {

using nvrtc::CUfunction;

struct Kernels {
  CUfunction fwd = nullptr, bwd = nullptr;
};

Kernels compile(const FusedProgram& p) {
  const std::string name = detail::cat("sheaf_", p.hash);
  const std::string names[] = {name + "_fwd", name + "_bwd"};
  const auto f = nvrtc::compile(fused_cuda_source(p, name), name + ".cu", names, p.str());
  return Kernels{f[0], f[1]};  // modules live as long as the process: programs are few and reused
}

// By the program's key (its hash first): one compilation per program and
// device for the process, whichever graph made the program.
Kernels kernels_for(const FusedProgram& p) {  // by value: the cache may grow on another thread
  static std::mutex mu;
  static std::map<std::pair<uint64_t, int>, std::vector<std::pair<std::vector<int64_t>, Kernels>>> cache;
  const int device = c10::cuda::current_device();
  std::lock_guard lock(mu);
  auto& bucket = cache[{p.hash, device}];
  for (const auto& [key, kernels] : bucket)
    if (key == p.key) return kernels;
  bucket.emplace_back(p.key, compile(p));
  return bucket.back().second;
}

void launch(CUfunction f, int64_t n, int64_t numel, std::vector<void*>& args) {
  const int64_t total = n * numel;
  const unsigned threads = 256;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + threads - 1) / threads, 65535));
  if (total == 0) return;
  nvrtc::launch(f, blocks, threads, args.data(), "a fused kernel");
}

// Kernel arguments: pointers to n and to each tensor's data pointer (null when undefined).
struct Args {
  std::vector<void*> ptrs;  // the data pointers
  std::vector<void*> args;  // what cuLaunchKernel reads: addresses of the above
  long long n;
  Args(int64_t rows, std::initializer_list<std::span<const at::Tensor>> groups) : n(rows) {
    for (auto g : groups)
      for (const at::Tensor& t : g) ptrs.push_back(t.defined() ? t.data_ptr() : nullptr);
    args.push_back(&n);
    for (void*& p : ptrs) args.push_back(&p);
  }
};

// The device the launch runs on: that of the first defined tensor (an output
// the program only uses as scratch, or a gradient nobody needs, is undefined).
c10::Device device_of(std::initializer_list<std::span<const at::Tensor>> groups) {
  for (auto g : groups)
    for (const at::Tensor& t : g)
      if (t.defined()) return t.device();
  throw_internal("a fused CUDA launch without a defined tensor");
}

}  // namespace

bool available(std::string* why) { return nvrtc::available(why); }

void forward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> outputs, int64_t n) {
  const c10::cuda::CUDAGuard guard(device_of({outputs, inputs}));
  const Kernels k = kernels_for(p);
  Args args(n, {inputs, outputs});
  launch(k.fwd, n, p.numel, args.args);
}

void backward(const FusedProgram& p, std::span<const at::Tensor> inputs, std::span<const at::Tensor> grads_out,
              std::span<at::Tensor> grads_in, int64_t n) {
  const c10::cuda::CUDAGuard guard(device_of({inputs, grads_out}));
  const Kernels k = kernels_for(p);
  std::vector<at::Tensor> gin(grads_in.begin(), grads_in.end());
  Args args(n, {inputs, grads_out, gin});
  launch(k.bwd, n, p.numel, args.args);
}

}  // namespace sheaf::fused_cuda
