#include "output_pool.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define SHEAF_POOL_ENABLED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHEAF_POOL_ENABLED 0
#endif
#endif
#ifndef SHEAF_POOL_ENABLED
#define SHEAF_POOL_ENABLED 1
#endif

namespace sheaf {

namespace {

// A block is a 64-byte header (its size class) followed by the data, 64-byte
// aligned as LibTorch's allocator aligns it (vector loads assume no less).
constexpr std::size_t kHeader = 64;

// Size classes: up to 64 bytes, then four per power of two (a block is at
// most 25% larger than asked for), up to kPoolMaxBlock.
constexpr uint32_t class_of(std::size_t n) {
  if (n <= 64) return 0;
  const int b = 63 - __builtin_clzll(static_cast<unsigned long long>(n - 1));  // 2^b < n <= 2^(b+1)
  const auto sub = static_cast<uint32_t>(((n - 1) >> (b - 2)) - 4);
  return 1 + static_cast<uint32_t>(b - 6) * 4 + sub;
}
constexpr std::size_t capacity_of(uint32_t c) {
  if (c == 0) return 64;
  const uint32_t b = 6 + (c - 1) / 4, sub = (c - 1) % 4;
  return std::size_t{sub + 5} << (b - 2);
}
constexpr uint32_t kClasses = class_of(kPoolMaxBlock) + 1;
// The header's mark for a block the pool does not keep: one larger than
// kPoolMaxBlock, which only a resize of a pooled tensor asks for (LibTorch
// grows a storage through the allocator that made it).
constexpr uint32_t kUnpooled = ~uint32_t{0};
static_assert(capacity_of(class_of(65)) >= 65 && capacity_of(class_of(128)) == 128 &&
              capacity_of(class_of(129)) >= 129 && capacity_of(class_of(kPoolMaxBlock)) == kPoolMaxBlock);
// (A class never holds more blocks than this: a pattern of many small
// tensors alive at once does not pin them all.)
constexpr std::size_t kMaxPerClass = 256;

struct Cache {
  std::array<std::vector<void*>, kClasses> free;  // block starts (headers)
  std::size_t bytes = 0;
};

// The calling thread's cache; null before its first allocation and after the
// thread's teardown began (a plain pointer: still readable then, where the
// cache itself is gone).
thread_local Cache* t_cache = nullptr;

struct Owner {
  Cache cache;
  Owner() { t_cache = &cache; }
  ~Owner() {
    t_cache = nullptr;
    for (auto& blocks : cache.free)
      for (void* p : blocks) std::free(p);
  }
};

Cache* cache() {
  if (t_cache == nullptr) {
    static thread_local Owner owner;  // constructed once; after its destruction t_cache stays null
    (void)owner;
  }
  return t_cache;
}

void release(void* data) {
  if (data == nullptr) return;
  void* block = static_cast<char*>(data) - kHeader;
  uint32_t c = 0;
  std::memcpy(&c, block, sizeof c);
  Cache* cache = t_cache;  // a thread that never allocated keeps nothing
  if (c != kUnpooled && cache != nullptr && cache->free[c].size() < kMaxPerClass &&
      cache->bytes + capacity_of(c) <= kPoolBytesPerThread) {
    try {  // (a deleter must not throw: a list that cannot grow keeps nothing)
      cache->free[c].push_back(block);
      cache->bytes += capacity_of(c);
      return;
    } catch (...) {
    }
  }
  std::free(block);
}

// The allocator LibTorch's storages call. Its virtual functions differ
// between LibTorch 1.x and 2.x (allocate const or not; copy_data only in
// 2.x): both forms are defined, none marked override, so each version finds
// its own.
class OutputPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const { return take(n); }
  c10::DataPtr allocate(std::size_t n) { return take(n); }
  c10::DeleterFnPtr raw_deleter() const { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

 private:
  static c10::DataPtr take(std::size_t n) {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &release, cpu};
    const uint32_t c = n <= kPoolMaxBlock ? class_of(n) : kUnpooled;
    void* block = nullptr;
    Cache* cache = c == kUnpooled ? nullptr : sheaf::cache();
    if (cache != nullptr && !cache->free[c].empty()) {
      block = cache->free[c].back();
      cache->free[c].pop_back();
      cache->bytes -= capacity_of(c);
    } else if (posix_memalign(&block, kHeader, kHeader + (c == kUnpooled ? n : capacity_of(c))) != 0) {
      throw std::bad_alloc();
    } else {
      std::memcpy(block, &c, sizeof c);
    }
    void* data = static_cast<char*>(block) + kHeader;
    return {data, data, &release, cpu};
  }
};

OutputPool& pool() {
  static OutputPool p;
  return p;
}

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  if (!SHEAF_POOL_ENABLED || options.device().type() != c10::DeviceType::CPU || options.layout() != c10::kStrided ||
      options.requires_grad() || options.pinned_memory())
    return at::empty(sizes, options);
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  std::size_t bytes = c10::elementSize(dtype);
  for (int64_t d : sizes) {  // (checked before each product: no overflow)
    if (d < 0 || (d > 0 && bytes > kPoolMaxBlock / static_cast<std::size_t>(d))) return at::empty(sizes, options);
    bytes *= static_cast<std::size_t>(d);
  }
  return at::detail::empty_generic(sizes, &pool(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype, {});
}

OutputPoolStats output_pool_stats() {
  OutputPoolStats s;
  s.enabled = SHEAF_POOL_ENABLED;
  if (const Cache* c = t_cache) {
    for (const auto& blocks : c->free) s.free_blocks += blocks.size();
    s.free_bytes = c->bytes;
  }
  return s;
}

}  // namespace sheaf
