// Memory for the outputs of Sheaf's own CPU kernels (fused regions, packed
// products, row gathers, table reads): blocks kept per thread and handed out
// again, instead of LibTorch's CPU allocator. That allocator asks glibc for
// 64-byte-aligned memory, which glibc 2.36 serves outside its per-thread
// cache: at::empty and the tensor's release cost ~420-480 ns on a Zen 4
// core, against ~150 ns from here. A gated net's inference makes ~5 such
// tensors a launch, 60 launches a batch.
//
// A released block goes back to the cache of the thread that releases it (a
// tensor may die on any thread); each thread keeps at most
// kPoolBytesPerThread of free blocks, sizes up to kPoolMaxBlock, and hands
// the rest back to the C library (as it does a block a resize grew past
// kPoolMaxBlock). Built with AddressSanitizer, every tensor takes LibTorch's
// own allocator: a pool would hide use-after-free. Unlike at::empty, a
// pooled tensor is not filled under LibTorch 2.x's deterministic mode: every
// kernel that takes one writes all of it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstddef>
#include <cstdint>

namespace sheaf {

inline constexpr std::size_t kPoolMaxBlock = std::size_t{4} << 20;
inline constexpr std::size_t kPoolBytesPerThread = std::size_t{64} << 20;

// An uninitialised tensor as at::empty(sizes, options) makes it: from the
// pool where `options` asks for a strided CPU tensor, not pinned, of at most
// kPoolMaxBlock bytes; from at::empty otherwise (which also refuses what it
// refuses: options that ask for a gradient).
at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options);

// This thread's cache, for tests and tools: free blocks and their bytes, and
// whether tensors come from the pool at all in this build.
struct OutputPoolStats {
  std::size_t free_blocks = 0;
  std::size_t free_bytes = 0;
  bool enabled = false;
};
OutputPoolStats output_pool_stats();

}  // namespace sheaf
