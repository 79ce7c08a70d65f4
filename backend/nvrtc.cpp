#include "nvrtc.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <sheaf/core/error.h>

namespace sheaf::nvrtc {

namespace {

// The few NVRTC and driver entry points used, declared here: no CUDA headers.
using nvrtcProgram = void*;
using CUmodule = void*;
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

}  // namespace

bool available(std::string* why) {
  const Api& a = api();
  if (why) *why = a.error;
  return a.error.empty();
}

std::vector<CUfunction> compile(const std::string& source, const std::string& file,
                                std::span<const std::string> kernels, const std::string& what) {
  const Api& a = api();
  int major = 0, minor = 0;
  const int device = c10::cuda::current_device();
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const std::string arch = detail::cat("--gpu-architecture=compute_", major * 10 + minor);
  const char* opts[] = {arch.c_str(), "--std=c++17", "-default-device"};
  nvrtcProgram prog = nullptr;
  if (a.nvrtcCreateProgram(&prog, source.c_str(), file.c_str(), 0, nullptr, nullptr) != 0)
    throw_internal("NVRTC could not create a program for ", what);
  const int rc = a.nvrtcCompileProgram(prog, 3, opts);
  if (rc != 0) {
    size_t size = 0;
    a.nvrtcGetProgramLogSize(prog, &size);
    std::string log(size, '\0');
    a.nvrtcGetProgramLog(prog, log.data());
    a.nvrtcDestroyProgram(&prog);
    throw_internal("NVRTC failed on the kernel of ", what, ":\n", log, "\n", source);
  }
  size_t size = 0;
  a.nvrtcGetPTXSize(prog, &size);
  std::string ptx(size, '\0');
  a.nvrtcGetPTX(prog, ptx.data());
  a.nvrtcDestroyProgram(&prog);
  CUmodule module = nullptr;
  if (a.cuModuleLoadData(&module, ptx.c_str()) != 0)
    throw_internal("the CUDA driver could not load the kernels of ", what);
  std::vector<CUfunction> out(kernels.size(), nullptr);
  for (size_t k = 0; k < kernels.size(); ++k)
    if (a.cuModuleGetFunction(&out[k], module, kernels[k].c_str()) != 0)
      throw_internal("the CUDA driver found no kernel ", kernels[k], " in ", what);
  return out;
}

void launch(CUfunction f, unsigned blocks, unsigned threads, void** args, const char* what) {
  const CUstream stream = c10::cuda::getCurrentCUDAStream().stream();
  if (api().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr) != 0)
    throw_internal("cuLaunchKernel failed for ", what);
}

}  // namespace sheaf::nvrtc
