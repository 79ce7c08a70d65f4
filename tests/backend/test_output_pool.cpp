// The pool that Sheaf's CPU kernels take their outputs from (ops/output_pool.h):
// blocks come back to the releasing thread and are handed out again, aligned
// as LibTorch aligns; what the pool does not take falls back to at::empty.
#include <sheaf/ops/output_pool.h>

#include <thread>

#include "../support.h"

using namespace sheaf;

namespace {

const at::TensorOptions kFloatCpu = at::TensorOptions().dtype(at::kFloat);

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

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
  if (!output_pool_stats().enabled) {
    WARN("the output pool is off in this build (AddressSanitizer): at::empty serves every tensor");
    return;
  }
  const uintptr_t first = address(t);
  const OutputPoolStats before = output_pool_stats();
  t.reset();
  const OutputPoolStats after = output_pool_stats();
  CHECK(after.free_blocks == before.free_blocks + 1);
  CHECK(after.free_bytes >= before.free_bytes + 37 * 129 * sizeof(float));
  // Slightly smaller is the same size class: the same block.
  at::Tensor again = empty_output({37, 128}, kFloatCpu);
  CHECK(address(again) == first);
  CHECK(output_pool_stats().free_blocks == before.free_blocks);
  // A view keeps the block alive: it goes back only with the last reference.
  at::Tensor view = again.narrow(0, 1, 3);
  again.reset();
  CHECK(output_pool_stats().free_blocks == before.free_blocks);
  view.reset();
  CHECK(output_pool_stats().free_blocks == before.free_blocks + 1);
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

  const OutputPoolStats before = output_pool_stats();
  // Too large: LibTorch's allocator, as before.
  const auto rows = static_cast<int64_t>(kPoolMaxBlock / (16 * sizeof(float))) + 1;
  at::Tensor big = empty_output({rows, 16}, kFloatCpu);
  CHECK(big.size(0) == rows);
  big.fill_(1.0f);
  big.reset();
  // Options at::empty refuses are refused alike.
  CHECK_THROWS(empty_output({3, 4}, kFloatCpu.requires_grad(true)));
  CHECK(output_pool_stats().free_blocks == before.free_blocks);
  CHECK(output_pool_stats().free_bytes == before.free_bytes);
}

TEST_CASE("output pool: tensors released on other threads, and after their thread ended") {
  // Made here, released on a thread that never allocated: freed there, not kept.
  at::Tensor here = empty_output({64, 32}, kFloatCpu);
  here.fill_(1.0f);
  std::thread([t = std::move(here)]() mutable { t.reset(); }).join();

  // Made on a thread that ends before its tensor is released: the tensor
  // stays valid, and its block comes back to this thread's cache.
  at::Tensor made_there;
  std::thread([&] {
    made_there = empty_output({8, 8}, kFloatCpu);
    made_there.fill_(3.0f);
  }).join();
  CHECK(made_there.sum().item<float>() == Approx(3.0 * 64));
  if (!output_pool_stats().enabled) return;
  const size_t blocks = output_pool_stats().free_blocks;
  made_there.reset();
  CHECK(output_pool_stats().free_blocks == blocks + 1);
}

TEST_CASE("output pool: a thread keeps a bounded number of free blocks") {
  if (!output_pool_stats().enabled) return;
  std::vector<at::Tensor> many;
  for (int i = 0; i < 600; ++i) many.push_back(empty_output({100}, kFloatCpu));
  many.clear();
  const OutputPoolStats s = output_pool_stats();
  CHECK(s.free_bytes <= kPoolBytesPerThread);
  // One size class holds at most 256 blocks; the rest went back to the C library.
  CHECK(s.free_blocks < 600);
}
