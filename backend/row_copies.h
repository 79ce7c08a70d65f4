// The data movement of the row gathers (row_gather.h): pieces of rows copied,
// or added, from one address to another. On the CPU, loops; on CUDA, two
// kernels compiled with NVRTC (row_copies_cuda.cpp, where LibTorch has CUDA),
// one launch for all of a gather's rows from all its sources. Through LibTorch
// ops the same gather on CUDA was an index_select or narrow per source, a cat
// and an index_select for the order, forward, and as many index_adds into
// zeroed gradients backward.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <span>

namespace sheaf {

// `len` floats from address `src` to address `dst` (addresses as integers:
// the table the CUDA kernels read is this struct's array).
struct RowCopy {
  int64_t src = 0, dst = 0, len = 0;
};

// Whether run_row_copies works on tensors of this device: the CPU; CUDA where
// the kernels can be compiled and launched.
bool row_copies_on(const c10::Device& device);

// dst[j] = src[j] for every piece; with `add`, dst[j] += src[j] (pieces may
// add into the same row: on CUDA the adds are atomic). On CUDA, on the
// current stream of `device`, with the table uploaded without waiting.
void run_row_copies(std::span<const RowCopy> pieces, bool add, const c10::Device& device);

// The CUDA kernels' source (tests compile it with NVRTC where there is one):
//   extern "C" __global__ void sheaf_rows_copy(long long pieces, const long long* table)
//   extern "C" __global__ void sheaf_rows_add(long long pieces, const long long* table)
// One block per piece (grid-stride), the table as RowCopy triples.
const char* row_copies_cuda_source();

namespace row_copies_cuda {
bool available();
void run(std::span<const RowCopy> pieces, bool add, const c10::Device& device);
}  // namespace row_copies_cuda

}  // namespace sheaf
