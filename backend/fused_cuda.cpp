// Fused elementwise programs on CUDA: the program's kernels (fused_cuda_source.h)
// compiled at run time with NVRTC, loaded with the CUDA driver, cached per
// program and device, and launched on the current stream. Built when LibTorch
// has CUDA. NVRTC and the driver are loaded with dlopen, so nothing here is
// needed at link time, and a machine without them falls back to the ops'
// own launches (fused.cpp asks available()).
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <sheaf/core/error.h>

#include "fused.h"
#include "fused_cuda_source.h"

namespace sheaf::fused_cuda {

namespace {

// The few NVRTC and driver entry points used, declared here: no CUDA headers.
using nvrtcProgram = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;

struct Api {
  int (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*);
  int (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  int (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
  int (*nvrtcGetPTX)(nvrtcProgram, char*);
  int (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  int (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  int (*nvrtcDestroyProgram)(nvrtcProgram*);
  int (*cuModuleLoadData)(CUmodule*, const void*);
  int (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  int (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void**, void**);
  std::string error;  // why it cannot be used (empty: it can)
};

void* open_first(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return h;
  return nullptr;
}

template <class F>
bool bind(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (f == nullptr && error.empty()) error = std::string("missing ") + name;
  return f != nullptr;
}

const Api& api() {
  static const Api a = [] {
    Api x{};
    void* nvrtc = open_first({"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"});
    void* cuda = open_first({"libcuda.so.1", "libcuda.so"});
    if (nvrtc == nullptr) x.error = "NVRTC (libnvrtc.so) not found";
    else if (cuda == nullptr) x.error = "the CUDA driver (libcuda.so.1) not found";
    if (!x.error.empty()) return x;
    bind(nvrtc, "nvrtcCreateProgram", x.nvrtcCreateProgram, x.error);
    bind(nvrtc, "nvrtcCompileProgram", x.nvrtcCompileProgram, x.error);
    bind(nvrtc, "nvrtcGetPTXSize", x.nvrtcGetPTXSize, x.error);
    bind(nvrtc, "nvrtcGetPTX", x.nvrtcGetPTX, x.error);
    bind(nvrtc, "nvrtcGetProgramLogSize", x.nvrtcGetProgramLogSize, x.error);
    bind(nvrtc, "nvrtcGetProgramLog", x.nvrtcGetProgramLog, x.error);
    bind(nvrtc, "nvrtcDestroyProgram", x.nvrtcDestroyProgram, x.error);
    bind(cuda, "cuModuleLoadData", x.cuModuleLoadData, x.error);
    bind(cuda, "cuModuleGetFunction", x.cuModuleGetFunction, x.error);
    bind(cuda, "cuLaunchKernel", x.cuLaunchKernel, x.error);
    return x;
  }();
  return a;
}

struct Kernels {
  CUfunction fwd = nullptr, bwd = nullptr;
};

// Compiles the program for the current device (PTX for its compute capability,
// which the driver finishes) and loads both kernels.
Kernels compile(const FusedProgram& p) {
  const Api& a = api();
  const std::string name = detail::cat("sheaf_", p.hash);
  const std::string src = fused_cuda_source(p, name);
  int major = 0, minor = 0;
  const int device = c10::cuda::current_device();
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const std::string arch = detail::cat("--gpu-architecture=compute_", major * 10 + minor);
  const char* opts[] = {arch.c_str(), "--std=c++17", "-default-device"};
  nvrtcProgram prog = nullptr;
  if (a.nvrtcCreateProgram(&prog, src.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr) != 0)
    throw_internal("NVRTC could not create a program for ", p.str());
  const int rc = a.nvrtcCompileProgram(prog, 3, opts);
  if (rc != 0) {
    size_t size = 0;
    a.nvrtcGetProgramLogSize(prog, &size);
    std::string log(size, '\0');
    a.nvrtcGetProgramLog(prog, log.data());
    a.nvrtcDestroyProgram(&prog);
    throw_internal("NVRTC failed on the kernel of ", p.str(), ":\n", log, "\n", src);
  }
  size_t size = 0;
  a.nvrtcGetPTXSize(prog, &size);
  std::string ptx(size, '\0');
  a.nvrtcGetPTX(prog, ptx.data());
  a.nvrtcDestroyProgram(&prog);
  CUmodule module = nullptr;
  Kernels k;
  if (a.cuModuleLoadData(&module, ptx.c_str()) != 0 || a.cuModuleGetFunction(&k.fwd, module, (name + "_fwd").c_str()) != 0 ||
      a.cuModuleGetFunction(&k.bwd, module, (name + "_bwd").c_str()) != 0)
    throw_internal("the CUDA driver could not load the kernel of ", p.str());
  return k;  // modules live as long as the process: programs are few and reused
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
  const CUstream stream = c10::cuda::getCurrentCUDAStream().stream();
  if (api().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args.data(), nullptr) != 0)
    throw_internal("cuLaunchKernel failed for a fused kernel");
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

bool available(std::string* why) {
  const Api& a = api();
  if (why) *why = a.error;
  return a.error.empty();
}

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
