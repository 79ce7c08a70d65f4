// The LibTorch runtime under the library: threads and BLAS. Debian's LibTorch
// uses whatever BLAS the system selects, and OpenBLAS keeps its own thread
// pool that at::set_num_threads does not reach, so both are set here.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <string>

namespace sheaf {

// n threads for the CPU math. LibTorch's intra-op loops and the BLAS both get
// n where they share one pool (MKL, or OpenBLAS built for OpenMP: LibTorch's
// own pool). OpenBLAS's pthread build (Debian's libopenblas0-pthread) keeps a
// pool of its own, and two pools of n threads on n cores, each spinning while
// the other works, ran hand-batched training 3-4x and inference up to 8x
// slower than one thread on a 2-core machine (docs/benchmarks.md, "Threads"):
// there the n threads go to OpenBLAS (LibTorch's products) and LibTorch's own
// loops run on one thread, and so do Sheaf's kernels (its packed product,
// fused kernels, row products), which use LibTorch's pool; the packed product
// then leaves its larger products to OpenBLAS's threads (ops/packed_gemm.h,
// packed_gemm_serves). Measured on two cores only: set_threads(blas,
// libtorch) sets both counts as given.
// runtime_info() says what was set. A count below 1 is a UserError.
void set_threads(int n);
void set_threads(int blas, int libtorch);

// Keeps memory that LibTorch frees on the CPU inside the process (glibc's
// malloc: blocks up to 32 MiB come from the heap, and up to `keep_bytes` of
// free heap is kept instead of being handed back to the system). With glibc's
// defaults a training step that frees a few MB at its end returns them to the
// system, and the next step takes page faults to get them back: a BiLSTM
// tagger took ~1,500 faults a batch (Sheaf; 137 hand-batched) and trained 8%
// (character tagger: 20%) slower for it. Process-wide, like set_threads: call
// it once at start-up (the examples and sheaf-bench do; a program that links
// jemalloc or tcmalloc does not need it). The resident size then stays at its
// peak. Returns false where the C library has no such settings (not glibc).
bool retain_host_memory(std::size_t keep_bytes = std::size_t{1} << 30);

// One line: LibTorch version, BLAS in use (e.g. "OpenBLAS 0.3.21 ... MAX_THREADS=64"),
// LibTorch threads, BLAS threads, CUDA availability.
std::string runtime_info();

// The device a graph runs on, with its index: "cuda" means the current CUDA
// device, and tensors there report "cuda:0". Throws UserError for a device this
// LibTorch cannot use.
c10::Device concrete_device(c10::Device device);

// Waits until the device has finished the work queued so far (nothing on the
// CPU). For timing: CUDA launches return before their kernels run.
void synchronize(c10::Device device);

}  // namespace sheaf
