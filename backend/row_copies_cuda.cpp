// The row gathers' kernels on CUDA (row_copies.h), compiled once per device
// with NVRTC. Built when LibTorch has CUDA.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "nvrtc.h"
#include "row_copies.h"

namespace sheaf::row_copies_cuda {

namespace {

struct Kernels {
  nvrtc::CUfunction copy = nullptr, add = nullptr;
};

Kernels kernels() {  // by value: the cache may grow on another thread
  static std::mutex mu;
  static std::map<int, Kernels> cache;
  const int device = c10::cuda::current_device();
  std::lock_guard lock(mu);
  auto found = cache.find(device);
  if (found != cache.end()) return found->second;
  const std::string names[] = {"sheaf_rows_copy", "sheaf_rows_add"};
  const auto f = nvrtc::compile(row_copies_cuda_source(), "sheaf_rows.cu", names, "the row gathers");
  return cache[device] = Kernels{f[0], f[1]};
}

}  // namespace

bool available() {
  static const bool ok = [] {
    // A diagnostic switch, for measuring the LibTorch-op gathers side by side.
    if (const char* off = std::getenv("SHEAF_NO_CUDA_ROW_GATHERS"); off && *off && *off != '0') return false;
    std::string why;
    if (nvrtc::available(&why)) return true;
    std::fprintf(stderr, "sheaf: CUDA row gathers unavailable (%s): gathers run as LibTorch ops\n", why.c_str());
    return false;
  }();
  return ok;
}

void run(std::span<const RowCopy> pieces, bool add, const c10::Device& device) {
  if (pieces.empty()) return;
  static_assert(sizeof(RowCopy) == 3 * sizeof(int64_t));
  const c10::cuda::CUDAGuard guard(device);
  const auto n = static_cast<int64_t>(pieces.size());
  // The table travels from pinned memory without waiting; the caching host
  // allocator keeps the buffer until the copy has run.
  at::Tensor host = at::empty({3 * n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::memcpy(host.data_ptr<int64_t>(), pieces.data(), pieces.size() * sizeof(RowCopy));
  const at::Tensor table = host.to(device, /*non_blocking=*/true);
  const Kernels k = kernels();
  long long count = n;
  void* table_ptr = table.data_ptr();
  void* args[] = {&count, &table_ptr};
  int64_t longest = 1;
  for (const RowCopy& p : pieces) longest = std::max(longest, p.len);
  const unsigned threads = longest >= 256 ? 256 : longest >= 128 ? 128 : 64;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(n, 65535));
  nvrtc::launch(add ? k.add : k.copy, blocks, threads, args, "a row gather");
}

}  // namespace sheaf::row_copies_cuda
