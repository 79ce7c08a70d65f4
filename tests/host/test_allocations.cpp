// Heap allocations while recording and scheduling, counted: after a warm-up,
// a batch must cost a bounded number of allocations, not a number that grows
// with its node count. Its own executable,
// because it replaces the global operator new.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <sheaf/core/inline_function.h>
#include <sheaf/sheaf.h>

#include <data/trees.h>
#include <gated_rvnn/model.h>
#include <tree_lstm/model.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

#include <sys/resource.h>

#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
// The nothrow forms too: every new must pair with the delete below (a sanitizer checks).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return operator new(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

using namespace sheaf;

namespace {

struct Counts {
  long record = 0, prepare = 0;
  size_t nodes = 0;
};

Counts count_batch(Graph& g, const models::TreeLSTM& model, std::span<const data::Tree> batch) {
  Counts c;
  g.clear();
  allocations = 0;
  counting = true;
  Expr loss = model.sheaf_batch_loss(g, batch);
  counting = false;
  c.record = allocations.exchange(0);
  counting = true;
  g.prepare(std::span(&loss, 1));
  counting = false;
  c.prepare = allocations.exchange(0);
  c.nodes = g.size();
  return c;
}

}  // namespace

// Page faults taken by this process so far (minor: memory the kernel maps in).
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// First in the file: glibc's own thresholds move with what the process freed
// before, and no earlier case has freed anything large yet.
TEST_CASE("retain_host_memory: a buffer freed and taken again costs no page faults", "[host][host-memory]") {
  if (!sheaf::retain_host_memory()) {
    WARN("not glibc's malloc (or a sanitizer's): nothing to check");
    return;
  }
  // 16 MiB: above glibc's default mmap threshold (each allocation its own
  // mapping, faulted in page by page) and above its default trim threshold.
  const std::size_t bytes = std::size_t{16} << 20;
  auto touch = [&] {
    auto* p = static_cast<volatile char*>(std::malloc(bytes));
    REQUIRE(p != nullptr);
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    std::free(const_cast<char*>(p));
  };
  touch();  // the first time maps it
  const long before = minor_faults();
  for (int k = 0; k < 8; ++k) touch();
  // Without the settings: 4096 faults a time (a fresh mapping, or the heap
  // trimmed and grown again).
  CHECK(minor_faults() - before < 256);
}

// A straight-line cell per example (no dsl::chunk, whose result vector is the
// caller's): after a warm-up, recording it allocates nothing at all.
TEST_CASE("Recording straight-line per-example code allocates nothing in steady state", "[host][allocations]") {
  at::NoGradGuard no_grad;
  const at::Tensor W = at::randn({16, 16}), b = at::randn({16});
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 32; ++i) xs.push_back(at::randn({16}));
  Graph g;
  auto record = [&] {
    g.clear();
    std::vector<Expr> out;
    out.reserve(xs.size());
    allocations = 0;
    counting = true;
    for (size_t i = 0; i < xs.size(); ++i) {
      auto scope = g.example(static_cast<int>(i));
      Expr h = g.input(xs[i]);
      for (int step = 0; step < 40; ++step) h = dsl::tanh(dsl::affine(W, h, b)) * h + h;
      out.push_back(dsl::sum(h));
    }
    counting = false;
    const long recorded = allocations.exchange(0);
    counting = true;
    g.prepare(out);
    counting = false;
    return std::pair{recorded, allocations.exchange(0)};
  };
  for (int i = 0; i < 3; ++i) record();
  const auto [recorded, scheduled] = record();
  INFO(g.size() << " nodes: " << recorded << " allocations recording, " << scheduled << " scheduling");
  CHECK(g.size() > 32 * 40 * 4);
  CHECK(recorded == 0);
  CHECK(scheduled == 0);
}

TEST_CASE("Recording and scheduling a TreeLSTM batch allocate a bounded number of times, not per node",
          "[host][allocations]") {
  at::NoGradGuard no_grad;  // host work only: prepare() stops before any launch
  const std::vector<data::Tree> trees =
      data::synthetic_trees({.count = 64 * 4, .min_words = 3, .max_words = 50, .vocab_size = 500, .seed = 3});
  models::TreeLSTM model({.vocab = 500, .hidden = 32}, 7);
  Graph g;
  std::span<const data::Tree> all(trees);
  // Warm-up: the graph's buffers and tables grow to the largest batch once.
  for (int i = 0; i < 4; ++i) count_batch(g, model, all.subspan(64 * i, 64));
  // 16 batches: one of them is a round where `auto` plans with both of its
  // candidates and keeps the cheaper (its second comparison, 16 rounds after
  // the first, in batch 12), which must not allocate either.
  for (int i = 0; i < 16; ++i) {
    const Counts c = count_batch(g, model, all.subspan(64 * (i % 4), 64));
    INFO("batch " << i << ": " << c.nodes << " nodes, " << c.record << " allocations recording, " << c.prepare
                  << " scheduling");
    CHECK(c.nodes > 5000);
    // Recording allocates only the vectors the model asks for (chunk's result
    // and its lists of losses: about 1 in 18 recorded nodes); scheduling
    // (rounds, fusion, strategy, plan) allocates nothing.
    CHECK(static_cast<double>(c.record) < 0.08 * static_cast<double>(c.nodes));
    CHECK(c.prepare == 0);
  }
}

TEST_CASE("Control flow allocates a bounded number of times per dsl::cond", "[host][allocations]") {
  at::NoGradGuard no_grad;
  const std::vector<data::Tree> trees =
      data::synthetic_trees({.count = 64, .min_words = 3, .max_words = 40, .vocab_size = 500, .seed = 5});
  models::GatedRvNN model({.vocab = 500, .hidden = 16}, 7);
  std::vector<const data::Tree*> batch;
  long conds = 0;
  for (const data::Tree& t : trees) {
    batch.push_back(&t);
    conds += (t.size() - 1) / 2;  // one per inner node (a binary tree of L leaves has L - 1)
  }
  Graph g;
  auto run = [&] {
    g.clear();
    allocations = 0;
    counting = true;
    std::vector<Expr> logits = model.sheaf_batch_root_logits(g, batch);
    g.forward(logits);
    counting = false;
    return allocations.exchange(0);
  };
  for (int i = 0; i < 3; ++i) run();
  const long counted = run();
  const auto launches = static_cast<double>(g.stats().batches);
  INFO(conds << " conds, " << g.stats().rounds << " rounds, " << launches << " launches: " << counted
              << " allocations recording and running");
  CHECK(conds > 500);
  // Per cond: the function calls' result lists, and a few more per round; per
  // launch, LibTorch's tensors and their storages, and the rows a call reads
  // in place (two each). The cond's callback keeps the
  // two branch lambdas in place (dsl/control.h, core/inline_function.h): as
  // std::functions they were three more allocations a cond (3,118 allocations
  // here then, ~5,660 with them). A call waiting on a cond's shape used to
  // allocate five more times (its argument and placeholder lists, its
  // callback, its results): 12.5 a cond in all then, 7.2 with the
  // std::functions, 3.7 after. Execution's own lists now live as long as the
  // graph and rows read in place are one block (backend/executor.h,
  // row_gather.h): 740 allocations here (848 conds, 49 launches, LibTorch
  // 1.13), where an executor made per round and ten allocations per rows
  // read in place made a gated batch allocate 2.5 times as often. The bound
  // per launch leaves room for LibTorch versions that allocate more per tensor.
  INFO((static_cast<double>(counted) - 0.5 * static_cast<double>(conds)) / launches << " a launch past 0.5 a cond");
  CHECK(static_cast<double>(counted) < 0.5 * static_cast<double>(conds) + 16.0 * launches);
}

namespace {

// A callable of 80 bytes that counts its live copies, its calls and its moves.
struct Probe {
  int* live;
  int* calls;
  int* moves = nullptr;
  std::array<char, 56> pad{};
  Probe(int* l, int* c, int* m = nullptr) : live(l), calls(c), moves(m) { ++*live; }
  Probe(Probe&& o) noexcept : live(o.live), calls(o.calls), moves(o.moves), pad(o.pad) {
    ++*live;
    if (moves) ++*moves;
  }
  Probe(const Probe& o) : live(o.live), calls(o.calls), moves(o.moves), pad(o.pad) { ++*live; }
  ~Probe() { --*live; }
  int operator()(int x) const { return ++*calls, x + 1; }
};

}  // namespace

TEST_CASE("InlineFunction: assigned into an empty one its callable moves once", "[host]") {
  int moves = 0, live = 0, calls = 0;
  {
    InlineFunction<int(int), 128> f = Probe(&live, &calls, &moves);
    moves = 0;
    InlineFunction<int(int), 128> g;
    g = std::move(f);  // (a waiter's empty slot taking a callback)
    CHECK(moves == 1);
    CHECK(!f);
    CHECK(g(1) == 2);
    CHECK(live == 1);
    InlineFunction<int(int), 128> h = Probe(&live, &calls, &moves);
    moves = 0;
    h = std::move(g);  // into a full one: the old callable destroyed, the new one moved in
    CHECK(live == 1);
    CHECK(!g);
    CHECK(h(2) == 3);
    auto& same = h;
    h = std::move(same);  // itself: kept
    CHECK(h(3) == 4);
    auto& empty = g;
    g = std::move(empty);  // an empty one, itself: stays empty
    CHECK(!g);
  }
  CHECK(live == 0);
}

TEST_CASE("InlineFunction keeps small callables in place, moves and destroys each once", "[host][allocations]") {
  int live = 0, calls = 0;
  {
    allocations = 0;
    counting = true;
    InlineFunction<int(int), 128> f = Probe(&live, &calls);
    InlineFunction<int(int), 128> g = std::move(f);
    counting = false;
    CHECK(allocations.exchange(0) == 0);  // 80 bytes: in place, also when moved
    CHECK(!f);
    REQUIRE(g);
    CHECK(g(41) == 42);
    CHECK(live == 1);
    g = nullptr;
    CHECK(live == 0);
  }
  {
    allocations = 0;
    counting = true;
    InlineFunction<int(int), 32> f = Probe(&live, &calls);  // too large for 32 bytes: one allocation
    InlineFunction<int(int), 32> g;
    g = std::move(f);
    counting = false;
    CHECK(allocations.exchange(0) == 1);
    CHECK(g(1) == 2);
    CHECK(live == 1);
  }
  CHECK(live == 0);
  CHECK(calls == 2);
  // A callable whose move may throw goes to the heap, so that moving the
  // wrapper never throws (the engine's waiter list relies on it).
  struct Throwing {
    std::array<char, 8> pad{};
    Throwing() = default;
    Throwing(const Throwing&) = default;
    Throwing(Throwing&&) noexcept(false) {}
    int operator()(int x) const { return x; }
  };
  allocations = 0;
  counting = true;
  InlineFunction<int(int), 128> t = Throwing{};
  counting = false;
  CHECK(allocations.exchange(0) == 1);
  CHECK(t(5) == 5);
  InlineFunction<int(int), 128> u;
  u = std::move(t);  // a heap callable moves by its pointer
  CHECK(u(6) == 6);
  // A callable returning a value stands for one returning nothing (as std::function).
  int seen = 0;
  InlineFunction<void(int), 32> v = [&seen](int x) { return seen = x; };
  v(7);
  CHECK(seen == 7);
}
