// The same programs on the GPU: every op, control flow and both example models,
// batched equal to one at a time (values and gradients) on CUDA, equal to the
// CPU run, and a forward without control flow that never synchronises the host.
// Every case skips (with a warning) where LibTorch has no CUDA device.
#include <shift_reduce/model.h>
#include <tree_lstm/model.h>

#include "../dsl/op_cases.h"

using namespace sheaf;
using sheaf::test::ops::Params;

namespace {

const c10::Device kCuda(c10::kCUDA);

std::vector<data::Tree> small_trees(int n, uint64_t seed) {
  return data::synthetic_trees({.count = n, .min_words = 1, .max_words = 14, .vocab_size = 40, .seed = seed});
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.detach().cpu() - b.detach().cpu()).abs().max().item<double>();
}

}  // namespace

TEST_CASE("CUDA: every op, batched equals alone, values and gradients", "[cuda][dsl][ops][checker]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const int n = GENERATE(1, 7, 64);
  Params p(kCuda);
  for (const test::ops::OpCase& c : test::ops::cases()) {
    DYNAMIC_SECTION(c.op << ", " << n << " examples") {
      CheckReport r = check_batched(n, [&](Graph& g, int i) { return test::ops::chain(g, i, p, c.step); },
                                    {.params = p.all(), .graph = {.device = kCuda}});
      REQUIRE_BATCHED_EQUALS_ALONE(r);
    }
  }
}

TEST_CASE("CUDA: every op gives the CPU's values", "[cuda][dsl][ops]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const int n = 7;
  Params on_cpu, on_gpu(kCuda);
  // cuDNN's LSTM rounds its products to TF32 by default (~1e-4 off): this
  // compares the math, in full float.
  const NoTf32 full_float;
  for (const test::ops::OpCase& c : test::ops::cases()) {
    DYNAMIC_SECTION(c.op) {
      auto run = [&](const Params& p) {
        Graph g({.device = p.device});
        std::vector<Expr> ys;
        for (int i = 0; i < n; ++i) {
          auto s = g.example(i);
          ys.push_back(test::ops::chain(g, i, p, c.step));
        }
        g.forward(ys);
        std::vector<at::Tensor> v;
        for (const Expr& y : ys) v.push_back(y.value().detach().cpu());
        return v;
      };
      std::vector<at::Tensor> a = run(on_cpu), b = run(on_gpu);
      for (int i = 0; i < n; ++i) {
        INFO("example " << i << " max diff " << max_diff(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]));
        CHECK(at::allclose(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)], 1e-4, 1e-5));
      }
    }
  }
}

TEST_CASE("CUDA: cond and loop, batched equals alone", "[cuda][dsl][control][checker]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  Params p(kCuda);
  CheckReport r = check_batched(24, [&](Graph& g, int i) {
    Expr x = dsl::tanh(dsl::affine(p.W, g.input(p.data({test::ops::kD}, i)), p.b));
    Expr y = dsl::cond(dsl::sum(x) > 0.0, [&, x] { return dsl::tanh(dsl::matmul(p.W, x)); },
                       [x] { return dsl::sigmoid(x) * 2.0; });
    Expr k0 = g.input(at::full({}, static_cast<double>(i % 5), p.device));
    std::vector<Expr> out = dsl::loop(
        {x, k0}, [](const std::vector<Expr>& s) { return s[1] > 0.5; },
        [&](const std::vector<Expr>& s) { return std::vector<Expr>{dsl::tanh(dsl::affine(p.W, s[0], p.b)), s[1] - 1.0}; });
    return dsl::sum(out[0] * y);
  }, {.params = p.all(), .graph = {.device = kCuda}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("CUDA: TreeLSTM batched equals alone and equals the CPU", "[cuda][examples][tree_lstm][checker]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const std::vector<data::Tree> ts = small_trees(24, 31);
  models::TreeLSTM m({.vocab = 40, .hidden = 16}, 5);
  auto loss_of = [&](const c10::Device& device) {
    Graph g({.device = device});
    Expr total = m.sheaf_batch_loss(g, ts);
    g.forward(total);
    return total.value().detach().cpu();
  };
  const at::Tensor on_cpu = loss_of(c10::kCPU);
  m.to(kCuda);
  CHECK(max_diff(loss_of(kCuda), on_cpu) < 1e-3 * (1 + on_cpu.abs().item<double>()));
  CheckReport r = check_batched(static_cast<int>(ts.size()),
                                [&](Graph& g, int i) { return m.sheaf_loss(g, ts[static_cast<size_t>(i)]); },
                                {.params = m.parameters(), .graph = {.device = kCuda}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

TEST_CASE("CUDA: shift-reduce batched equals alone, gold and predicted", "[cuda][examples][shift_reduce][checker]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const bool predict = GENERATE(false, true);
  const std::vector<data::Tree> ts = small_trees(16, 32);
  models::ShiftReduce m({.vocab = 40, .hidden = 8, .tracking = 4}, 6);
  m.to(kCuda);
  CheckReport r = check_batched(static_cast<int>(ts.size()), [&](Graph& g, int i) -> Task<Expr> {
    models::ParseResult res = co_await m.parse(g, ts[static_cast<size_t>(i)], predict);
    co_return res.loss;
  }, {.params = m.parameters(), .graph = {.device = kCuda}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}

#ifdef SHEAF_TEST_CUDA_SYNC  // set by tests/CMakeLists.txt when LibTorch has CUDA
#include <c10/cuda/CUDAFunctions.h>

namespace {
// While alive, any call that synchronises the host with the GPU (a .item(), a
// blocking copy) throws.
class SyncErrors {
 public:
  SyncErrors() : saved_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncErrors() { c10::cuda::warning_state().set_sync_debug_mode(saved_); }
  SyncErrors(const SyncErrors&) = delete;
  SyncErrors& operator=(const SyncErrors&) = delete;

 private:
  c10::cuda::SyncDebugMode saved_;
};
}  // namespace

TEST_CASE("CUDA: a forward without control flow never synchronises the host with the GPU", "[cuda][backend]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const auto trees = data::synthetic_trees({.count = 16, .max_words = 20, .vocab_size = 50, .seed = 3});
  models::TreeLSTM m({.vocab = 50, .hidden = 16}, 1);
  m.to(kCuda);
  Graph g({.device = kCuda});
  Expr total = m.sheaf_batch_loss(g, trees);
  {
    const SyncErrors no_sync;
    g.forward(total);
  }
  CHECK(g.stats().fetches == 0);
  CHECK(std::isfinite(total.item()));
}

TEST_CASE("CUDA: softmax, max and logsumexp over values of different lengths never synchronise the host",
          "[cuda][backend][ragged]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const at::Tensor W = test::param({6, 4}, 1).detach().to(kCuda);
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 8; ++i) xs.push_back(test::data({1 + (i * 5) % 7, 4}, i).to(kCuda));
  Graph g({.device = kCuda});
  std::vector<Expr> outs;
  for (int i = 0; i < 8; ++i) {
    auto scope = g.example(i);
    const Expr H = dsl::tanh(dsl::matmul(g.input(xs[static_cast<size_t>(i)]), dsl::transpose(g.param(W))));
    const Expr a = dsl::softmax(dsl::matmul(H, dsl::sum_dim(H, 0)));  // packed vectors: segment softmax
    outs.push_back(dsl::sum(dsl::matmul(a, H)) + dsl::sum(dsl::max_dim(H, 0)) + dsl::sum(dsl::logsumexp_dim(H, 0)));
  }
  {
    const SyncErrors no_sync;  // as bincount's and segment_reduce's read-backs did
    g.forward(outs);
  }
  CHECK(g.stats().fetches == 0);
  // The values, against LibTorch per example on the CPU.
  for (int i = 0; i < 8; ++i) {
    const at::Tensor H = at::tanh(at::matmul(xs[static_cast<size_t>(i)].cpu(), W.cpu().t()));
    const at::Tensor a = at::softmax(at::matmul(H, H.sum(0)), 0);
    const double want = (at::matmul(a, H).sum() + H.amax(0).sum() + H.logsumexp(0).sum()).item<double>();
    CHECK(outs[static_cast<size_t>(i)].item() == Approx(want).epsilon(1e-4).margin(1e-4));
  }
}
#endif

TEST_CASE("CUDA: packed batches of different lengths, batched equals alone, host reads of packed values",
          "[cuda][scheduler][ragged][checker]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  auto on_gpu = [](std::vector<int64_t> shape, uint64_t seed) {
    return test::param(shape, seed).detach().to(kCuda).requires_grad_();
  };
  const at::Tensor W = on_gpu({6, 4}, 1), b = on_gpu({6}, 2), gain = on_gpu({6}, 3);
  auto program = [&](Graph& g, int i) -> Task<Expr> {
    const int64_t len = 1 + (i * 5) % 7;
    const at::Tensor x = test::data({len, 4}, i).to(kCuda);
    const Expr X = g.input(x);
    const Expr H = dsl::relu(dsl::affine(W, X, b)) + dsl::affine(W, X * 0.5, b);  // packed
    const std::vector<float> h = co_await fetch_values(H);  // a packed value's rows, fetched from the GPU
    const at::Tensor want = (at::relu(at::linear(x, W, b)) + at::linear(x * 0.5, W, b)).detach().cpu().reshape({-1});
    CHECK(static_cast<int64_t>(h.size()) == want.numel());
    for (int64_t k = 0; k < want.numel() && k < static_cast<int64_t>(h.size()); ++k)
      CHECK(h[static_cast<size_t>(k)] == Approx(want[k].item<float>()).margin(1e-4));
    const Expr N = dsl::layer_norm(dsl::slice(dsl::concat({H, dsl::tanh(H)}, 1), 3, 9, 1), gain, b);
    const Expr A = dsl::softmax(dsl::matmul(N, dsl::transpose(H)));  // [len, len]: by length
    // Packed vectors (the ATen forms of the segment ops on the GPU): scores, softmax, context.
    const Expr a = dsl::softmax(dsl::matmul(H, dsl::sum_dim(H, 0)) * 0.1);
    const Expr context = dsl::matmul(a, N) + dsl::matmul(dsl::exp(dsl::log_softmax(a)), H);
    co_return dsl::sum(dsl::matmul(A, N)) + dsl::sum(dsl::sum_dim(N * 2.0, 0)) + dsl::sum(context);
  };
  CheckReport r = check_batched(10, TaskProgram(program), {.params = {W, b, gain}, .graph = {.device = kCuda}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
}
