// The pool that Sheaf's CPU kernels take their outputs from (ops/output_pool.h):
// blocks come back to the releasing thread and are handed out again, aligned
// as LibTorch aligns; what the pool does not take falls back to at::empty.
// Each check of the cache runs on a thread of its own: its cache starts
// empty, whatever other tests left in the main thread's.
#include <sheaf/ops/output_pool.h>

#include <thread>

#include "../support.h"

using namespace sheaf;

namespace {

const at::TensorOptions kFloatCpu = at::TensorOptions().dtype(at::kFloat);

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// Runs f on a fresh thread (Catch's checks are not thread-safe: f returns
// what to check, and the caller checks it).
template <class F>
auto on_fresh_thread(F f) {
  decltype(f()) result{};
  std::thread([&] { result = f(); }).join();
  return result;
}

bool pool_on() {
  if (output_pool_stats().enabled) return true;
  WARN("the output pool is off in this build (AddressSanitizer): at::empty serves every tensor");
  return false;
}

}  // namespace

TEST_CASE("output pool: a released block is handed out again, aligned and sized") {
  at::Tensor t = empty_output({37, 129}, kFloatCpu);
  CHECK(t.sizes() == at::IntArrayRef({37, 129}));
  CHECK(t.scalar_type() == at::kFloat);
  CHECK(t.is_cpu());
  CHECK_FALSE(t.requires_grad());
  CHECK(address(t) % 64 == 0);
  t.fill_(2.5f);  // every byte is writable
  CHECK(t.sum().item<float>() == Approx(2.5 * 37 * 129));
  if (!pool_on()) return;
  struct Seen {
    size_t after_release = 0, after_reuse = 0, view_alive = 0, view_gone = 0;
    bool same_block = false;
  };
  const Seen s = on_fresh_thread([] {
    Seen r;
    at::Tensor a = empty_output({37, 129}, kFloatCpu);
    const uintptr_t first = address(a);
    a.reset();
    r.after_release = output_pool_stats().free_blocks;
    // Slightly smaller is the same size class: the same block.
    at::Tensor again = empty_output({37, 128}, kFloatCpu);
    r.same_block = address(again) == first;
    r.after_reuse = output_pool_stats().free_blocks;
    // A view keeps the block alive: it goes back only with the last reference.
    at::Tensor view = again.narrow(0, 1, 3);
    again.reset();
    r.view_alive = output_pool_stats().free_blocks;
    view.reset();
    r.view_gone = output_pool_stats().free_blocks;
    return r;
  });
  CHECK(s.after_release == 1);
  CHECK(s.same_block);
  CHECK(s.after_reuse == 0);
  CHECK(s.view_alive == 0);
  CHECK(s.view_gone == 1);
}

TEST_CASE("output pool: other dtypes, empty tensors, and what it leaves to at::empty") {
  at::Tensor ids = empty_output({5}, at::TensorOptions().dtype(at::kLong));
  CHECK(ids.scalar_type() == at::kLong);
  CHECK(address(ids) % 64 == 0);
  ids.copy_(at::arange(5));
  CHECK(ids.sum().item<int64_t>() == 10);
  at::Tensor none = empty_output({0, 16}, kFloatCpu);
  CHECK(none.numel() == 0);
  CHECK(none.sizes() == at::IntArrayRef({0, 16}));
  // Options at::empty refuses are refused alike.
  CHECK_THROWS(empty_output({3, 4}, kFloatCpu.requires_grad(true)));
  if (!pool_on()) return;
  // Too large: LibTorch's allocator, and nothing comes back to the pool.
  const auto rows = static_cast<int64_t>(kPoolMaxBlock / (16 * sizeof(float))) + 1;
  const size_t kept = on_fresh_thread([rows] {
    at::Tensor big = empty_output({rows, 16}, kFloatCpu);
    big.fill_(1.0f);
    big.reset();
    return output_pool_stats().free_blocks;
  });
  CHECK(kept == 0);
}

TEST_CASE("output pool: a pooled tensor grows past the largest block") {
  // LibTorch grows a storage through the allocator that made it: past
  // kPoolMaxBlock the pool gives a block it does not keep.
  at::Tensor t = empty_output({4}, kFloatCpu);
  t.fill_(7.0f);
  const auto rows = static_cast<int64_t>(kPoolMaxBlock / sizeof(float)) + 5;
  t.resize_({rows});
  t.fill_(1.0f);
  CHECK(t.size(0) == rows);
  CHECK(t.sum().item<double>() == Approx(static_cast<double>(rows)));
  if (!pool_on()) return;
  const OutputPoolStats kept = on_fresh_thread([rows] {
    at::Tensor u = empty_output({4}, kFloatCpu);
    u.resize_({rows});  // the first block (16 bytes, in the 64-byte class) goes back here
    u.reset();          // the grown one does not
    return output_pool_stats();
  });
  CHECK(kept.free_blocks == 1);
  CHECK(kept.free_bytes == 64);
}

TEST_CASE("output pool: tensors released on other threads, and after their thread ended") {
  if (!pool_on()) return;
  // Made on one thread, released on a thread that never allocated: freed
  // there, not kept (that thread has no cache).
  at::Tensor here = empty_output({64, 32}, kFloatCpu);
  here.fill_(1.0f);
  const OutputPoolStats there = on_fresh_thread([t = std::move(here)]() mutable {
    t.reset();
    return output_pool_stats();
  });
  CHECK(there.free_blocks == 0);
  CHECK(there.free_bytes == 0);

  // Made on a thread that ends before its tensor is released: the tensor
  // stays valid, and its block goes to the cache of the thread releasing it.
  struct Result {
    bool valid = false;
    size_t kept = 0;
  };
  const Result r = on_fresh_thread([] {
    at::Tensor made_there;
    std::thread([&] {
      made_there = empty_output({8, 8}, kFloatCpu);
      made_there.fill_(3.0f);
    }).join();
    Result out;
    out.valid = made_there.sum().item<float>() == 3.0f * 64;
    (void)empty_output({1}, kFloatCpu);  // this thread's cache now exists (one block kept)
    made_there.reset();
    out.kept = output_pool_stats().free_blocks;
    return out;
  });
  CHECK(r.valid);
  CHECK(r.kept == 2);
}

TEST_CASE("output pool: a thread keeps at most 256 blocks a class and 64 MiB") {
  if (!pool_on()) return;
  const OutputPoolStats by_count = on_fresh_thread([] {
    std::vector<at::Tensor> many;
    for (int i = 0; i < 600; ++i) many.push_back(empty_output({100}, kFloatCpu));
    many.clear();
    return output_pool_stats();
  });
  CHECK(by_count.free_blocks == 256);
  const OutputPoolStats by_bytes = on_fresh_thread([] {
    std::vector<at::Tensor> large;
    for (int i = 0; i < 20; ++i)  // 4 MiB each: 80 MiB
      large.push_back(empty_output({static_cast<int64_t>(kPoolMaxBlock / sizeof(float))}, kFloatCpu));
    large.clear();
    return output_pool_stats();
  });
  CHECK(by_bytes.free_bytes == kPoolBytesPerThread);
  CHECK(by_bytes.free_blocks == kPoolBytesPerThread / kPoolMaxBlock);
}
