#include "row_copies.h"

#include <cstring>

#include <sheaf/core/error.h>

namespace sheaf {

bool row_copies_on(const c10::Device& device) {
  return device.is_cpu() || (device.is_cuda() && row_copies_cuda::available());
}

void run_row_copies(std::span<const RowCopy> pieces, bool add, const c10::Device& device) {
  if (!device.is_cpu()) return row_copies_cuda::run(pieces, add, device);
  for (const RowCopy& p : pieces) {
    if (p.len == 0) continue;  // rows of values of length 0: their addresses may be null
    const auto* __restrict x = reinterpret_cast<const float*>(p.src);
    auto* __restrict y = reinterpret_cast<float*>(p.dst);
    if (add) {
      for (int64_t j = 0; j < p.len; ++j) y[j] += x[j];
    } else {
      std::memcpy(y, x, static_cast<size_t>(p.len) * sizeof(float));
    }
  }
}

const char* row_copies_cuda_source() {
  return R"(
extern "C" __global__ void sheaf_rows_copy(long long pieces, const long long* table) {
  for (long long p = blockIdx.x; p < pieces; p += gridDim.x) {
    const float* src = (const float*)table[3 * p];
    float* dst = (float*)table[3 * p + 1];
    const long long len = table[3 * p + 2];
    for (long long j = threadIdx.x; j < len; j += blockDim.x) dst[j] = src[j];
  }
}
extern "C" __global__ void sheaf_rows_add(long long pieces, const long long* table) {
  for (long long p = blockIdx.x; p < pieces; p += gridDim.x) {
    const float* src = (const float*)table[3 * p];
    float* dst = (float*)table[3 * p + 1];
    const long long len = table[3 * p + 2];
    for (long long j = threadIdx.x; j < len; j += blockDim.x) atomicAdd(dst + j, src[j]);
  }
}
)";
}

#ifndef SHEAF_CUDA_FUSION
// LibTorch without CUDA: gathers off the CPU are LibTorch ops (executor.cpp).
namespace row_copies_cuda {
bool available() { return false; }
void run(std::span<const RowCopy>, bool, const c10::Device&) { throw_internal("row copies on CUDA without CUDA"); }
}  // namespace row_copies_cuda
#endif

}  // namespace sheaf
