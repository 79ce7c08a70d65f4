#include "runtime.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <algorithm>
#include <limits>
#include <sstream>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <sheaf/core/error.h>
#include <sheaf/ops/blas_threads.h>

namespace sheaf {

void set_threads(int n) {
  if (n < 1) throw UserError(detail::cat("sheaf: set_threads needs at least one thread, got ", n));
  set_threads(n, blas_has_own_pool() ? 1 : n);
}

void set_threads(int blas, int libtorch) {
  if (blas < 1 || libtorch < 1)
    throw UserError(detail::cat("sheaf: set_threads needs at least one thread each, got ", blas, " for the BLAS and ",
                                libtorch, " for LibTorch"));
  at::set_num_threads(libtorch);  // (first: OpenBLAS's OpenMP build sets the same OpenMP count, to `blas`)
  set_openblas_threads(blas);
}

bool retain_host_memory(std::size_t keep_bytes) {
#ifdef __GLIBC__
  // Setting either turns off glibc's own adjustment of both, so both are set:
  // the mmap threshold to its ceiling (HEAP_MAX_SIZE / 2: 32 MiB on 64-bit).
  const int keep = static_cast<int>(std::min<std::size_t>(keep_bytes, std::numeric_limits<int>::max()));
  return mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 && mallopt(M_TRIM_THRESHOLD, keep) == 1;
#else
  (void)keep_bytes;
  return false;
#endif
}

std::string runtime_info() {
  std::ostringstream os;
  os << "LibTorch " << TORCH_VERSION << ", ";
  if (const char* config = openblas_config()) {
    os << "BLAS " << config;
    if (const int threads = openblas_threads(); threads >= 0)
      os << " (" << threads << " BLAS threads" << (blas_has_own_pool() ? ", a pool of its own" : "") << ")";
  } else if (at::hasMKL()) {
    os << "BLAS: MKL (in LibTorch)";
  } else {
    os << "BLAS: not OpenBLAS (reference BLAS is ~40x slower; install libopenblas0-pthread)";
  }
  os << ", " << at::get_num_threads() << " LibTorch threads, CUDA " << (at::hasCUDA() ? "available" : "not available");
  return os.str();
}

c10::Device concrete_device(c10::Device device) {
  if (device.is_cuda() && !at::hasCUDA())
    throw UserError("sheaf: a graph on " + device.str() + ", but this LibTorch has no CUDA or sees no GPU");
  if (device.is_cpu() || device.has_index()) return device;
  try {
    return c10::impl::getDeviceGuardImpl(device.type())->getDevice();
  } catch (const c10::Error& e) {
    throw UserError("sheaf: a graph on " + device.str() + ": " + e.what_without_backtrace());
  }
}

void synchronize(c10::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace sheaf
