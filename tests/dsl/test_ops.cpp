// Every op, batched vs alone (values of every node and parameter gradients),
// for every strategy and batch sizes 1, 2, 7 and 64, with examples of different
// lengths mixed in one batch.
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <string>

#include <sheaf/ops/attention.h>
#include <sheaf/ops/map_rows.h>
#include <sheaf/ops/matvec.h>
#include <sheaf/ops/packed_lstm.h>
#include <sheaf/ops/segments.h>

#include "op_cases.h"

using namespace sheaf;
using namespace sheaf::test::ops;
using sheaf::test::data;

TEST_CASE("every op: batched equals alone, values and gradients", "[dsl][ops][checker]") {
  const int n = GENERATE(1, 2, 7, 64);
  Params p;
  for (const OpCase& c : cases()) {
    DYNAMIC_SECTION(c.op << ", " << n << " examples") {
      CheckReport r = check_batched(n, [&](Graph& g, int i) { return chain(g, i, p, c.step); }, {.params = p.all()});
      REQUIRE_BATCHED_EQUALS_ALONE(r);
      if (n > 1) CHECK(r.batched_launches < r.alone_launches);
    }
  }
}

TEST_CASE("the checker catches a difference", "[dsl][checker]") {
  // A program that is not the same alone and batched (it peeks at how many
  // examples the graph holds) must be reported, naming example and node.
  Params p;
  CheckReport r = check_batched(3, [&](Graph& g, int i) {
    Expr h = dsl::tanh(dsl::affine(p.W, g.input(data({kD}, i)), p.b));
    return h * static_cast<double>(g.size() > 8 ? 2.0 : 1.0);
  }, {.params = p.all()});
  REQUIRE_FALSE(r.ok);
  CHECK(r.example >= 0);
  CHECK_THAT(r.message, Catch::Contains("mul_scalar") && Catch::Contains("example"));
}

TEST_CASE("the checker leaves the user's gradients alone", "[dsl][checker]") {
  Params p;
  p.W.mutable_grad() = at::full_like(p.W, 3.0);
  check_batched(2, [&](Graph& g, int i) { return dsl::affine(p.W, g.input(data({kD}, i)), p.b); },
                {.params = p.all()});
  REQUIRE(p.W.grad().defined());
  CHECK(at::allclose(p.W.grad(), at::full_like(p.W, 3.0)));
  CHECK_FALSE(p.b.grad().defined());
}

TEST_CASE("the checker leaves parameters it was not given alone too", "[dsl][checker]") {
  Params p;
  const CheckReport r = check_batched(2, [&](Graph& g, int i) { return dsl::affine(p.W, g.input(data({kD}, i)), p.b); },
                                      {.params = {p.W}});
  REQUIRE_BATCHED_EQUALS_ALONE(r);
  CHECK_FALSE(p.W.grad().defined());
  CHECK_FALSE(p.b.grad().defined());  // (backward() added into it, once a run)
}

TEST_CASE("the checker: non-finite values, shapes, outputs only, gradients without autograd", "[dsl][checker]") {
  // Each program differs batched (where the graph already holds the earlier
  // examples' nodes: g.size() > 8) from alone.
  auto filler = [](Graph& g, int i) {
    Expr x = g.input(data({kD}, i));
    for (int k = 0; k < 5; ++k) x = dsl::tanh(x);
    return x;
  };
  for (const float special : {NAN, -INFINITY, INFINITY}) {
    INFO("special " << special);
    const CheckReport r = check_batched(3, [&](Graph& g, int i) {
      (void)filler(g, i);
      return g.input(at::tensor(std::vector<float>{special, g.size() > 8 ? 2.f : 1.f}));
    });
    CHECK_FALSE(r.ok);  // (a NaN in the tolerances hid the second element)
    CHECK_THAT(r.message, Catch::Contains("op 'input'"));
    // The same special value on both sides is equal.
    const CheckReport same = check_batched(3, [&](Graph& g, int i) {
      (void)filler(g, i);
      return g.input(at::tensor(std::vector<float>{special, 1.f}));
    });
    CHECK(same.ok);
  }
  const CheckReport shapes = check_batched(3, [&](Graph& g, int i) {
    (void)filler(g, i);
    return g.input(at::ones({g.size() > 8 ? 1 : 4}));  // [1] broadcast against [4] before
  });
  CHECK_FALSE(shapes.ok);
  CHECK_THAT(shapes.message, Catch::Contains("its shape is [1] batched but [4] alone"));
  // Outputs only: example 1's output differs in one element, where the
  // checker's weights for its gradient (sin(0.7 k + 1.3 i + 0.25)) are 0.0066:
  // the weighted sum it compared before hid it.
  const CheckReport outputs = check_batched(3, [&](Graph& g, int i) {
    (void)filler(g, i);
    at::Tensor v = at::ones({102});
    if (g.size() > 8 && i == 1) v[101] += 1e-3;
    return g.input(v);
  }, {.compare_nodes = false});
  CHECK_FALSE(outputs.ok);
  CHECK(outputs.example == 1);
  CHECK_THAT(outputs.message, Catch::Contains("the output differs by up to 0.001"));
  Params p;
  c10::NoGradGuard no_grad;
  CHECK_THROWS_WITH(check_batched(2, [&](Graph& g, int i) { return dsl::affine(p.W, g.input(data({kD}, i)), p.b); },
                                  {.params = p.all()}),
                    Catch::Contains("autograd is off here"));
}

TEST_CASE("the checker runs CUDA products in full float and restores the user's TF32 setting", "[dsl][checker]") {
  Params p;
  struct Seen {
    bool cudnn_tf32 = true, cublas_tf32 = true;
  };
  auto during = [&](bool full_float) {
    Seen seen;
    check_batched(2, [&](Graph& g, int i) {
      seen.cudnn_tf32 = seen.cudnn_tf32 && at::globalContext().allowTF32CuDNN();
      seen.cublas_tf32 = seen.cublas_tf32 && !at::NoTF32Guard::should_disable_tf32();
      return dsl::affine(p.W, g.input(data({kD}, i)), p.b);
    }, {.params = p.all(), .full_float = full_float});
    return seen;
  };
  const bool user = at::globalContext().allowTF32CuDNN();
  for (const bool setting : {true, false}) {
    at::globalContext().setAllowTF32CuDNN(setting);
    const Seen off = during(true), as_set = during(false);
    CHECK_FALSE(off.cudnn_tf32);
    CHECK_FALSE(off.cublas_tf32);
    CHECK(as_set.cudnn_tf32 == setting);
    CHECK(as_set.cublas_tf32);
    CHECK(at::globalContext().allowTF32CuDNN() == setting);
    CHECK_FALSE(at::NoTF32Guard::should_disable_tf32());
  }
  at::globalContext().setAllowTF32CuDNN(user);
}

TEST_CASE("dropout masks agree alone and batched, and differ across examples", "[dsl][ops]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::dropout(g.constant({64}, 1.0), 0.5));
  }
  g.forward(ys);
  CHECK_FALSE(at::equal(ys[0].value(), ys[1].value()));
  double kept = ys[0].value().gt(0).sum().item<double>() / 64.0;
  CHECK(kept > 0.25);
  CHECK(kept < 0.75);
  g.set_train(false);
  Expr z = dsl::dropout(g.constant({4}, 1.0), 0.5);
  g.forward(z);
  CHECK(at::equal(z.value(), at::ones({4})));
}

TEST_CASE("shape, axis-reduction, dot and layer_norm ops give LibTorch's values", "[dsl][ops]") {
  Graph g;
  const at::Tensor x = test::data({2, 3, 4}, 0), v = test::data({4}, 1), gain = test::data({4}, 2), bias = test::data({4}, 3);
  std::vector<std::pair<Expr, at::Tensor>> checks;
  for (int i = 0; i < 3; ++i) {  // three examples: the same values batched
    auto scope = g.example(i);
    const Expr X = g.input(x), V = g.input(v);
    checks.emplace_back(dsl::reshape(X, {4, -1}), x.reshape({4, 6}));
    checks.emplace_back(dsl::transpose(X, 0, 2), x.transpose(0, 2));
    checks.emplace_back(dsl::stack({V, V * 2.0}, 1), at::stack({v, v * 2}, 1));
    checks.emplace_back(dsl::sum_dim(X, 1), x.sum(1));
    checks.emplace_back(dsl::mean_dim(X, -1), x.mean(-1));
    checks.emplace_back(dsl::max_dim(X, 0), x.amax(0));
    checks.emplace_back(dsl::min_dim(X, 2), x.amin(2));
    checks.emplace_back(dsl::logsumexp_dim(X, 1), x.logsumexp(1));
    checks.emplace_back(dsl::dot(V, gain), (v * gain).sum());
    checks.emplace_back(dsl::layer_norm(X, gain, bias), at::layer_norm(x, {4}, gain, bias));
    checks.emplace_back(g.lookup(x, {1, 0, 1}), x.index_select(0, at::tensor(std::vector<int64_t>{1, 0, 1})));
  }
  std::vector<Expr> targets;
  for (const auto& [e, expected] : checks) targets.push_back(e);
  g.forward(targets);
  for (size_t k = 0; k < checks.size(); ++k) {
    INFO("check " << k % 11);
    CHECK(checks[k].first.value().sizes() == checks[k].second.sizes());
    CHECK(at::allclose(checks[k].first.value(), checks[k].second, 1e-5, 1e-6));
  }
}

// Where an untaken row or a shift is infinite (max-pooling over rows padded
// with -inf), where an exponent is 0 or a base 1, and where a weight has no
// columns: LibTorch's answers, not NaN or a LibTorch error of our own making.
TEST_CASE("axis-0 reductions, pow and weight gradients at infinities, zeros and empty axes give LibTorch's answers",
          "[dsl][ops]") {
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor padded = at::tensor({-inf, -inf, 0.5f, -2.0f, 3.0f, 1.0f}).view({3, 2});
  const at::Tensor with_inf = at::tensor({inf, 1.0f, 2.0f, 3.0f}).view({2, 2});
  const at::Tensor all_ninf = at::tensor({-inf, 1.0f, -inf, 3.0f}).view({2, 2});
  for (const bool fuse : {false, true}) {
    INFO("fuse " << fuse);
    Graph g({.fuse = fuse});
    std::vector<std::pair<Expr, at::Tensor>> checks;
    for (int i = 0; i < 3; ++i) {
      auto scope = g.example(i);
      checks.emplace_back(dsl::max_dim(g.input(padded), 0), padded.amax(0));
      checks.emplace_back(dsl::min_dim(g.input(-padded), 0), (-padded).amin(0));
      checks.emplace_back(dsl::max_dim(g.input(with_inf), 0), with_inf.amax(0));
      checks.emplace_back(dsl::min_dim(g.input(with_inf), 0), with_inf.amin(0));
      checks.emplace_back(dsl::logsumexp_dim(g.input(with_inf), 0), with_inf.logsumexp(0));
      checks.emplace_back(dsl::logsumexp_dim(g.input(all_ninf), 0), all_ninf.logsumexp(0));
      checks.emplace_back(dsl::logsumexp_dim(g.input(padded), 0), padded.logsumexp(0));
      const at::Tensor bases = at::tensor({1.0f, -1.0f, 2.0f, 0.0f});
      checks.emplace_back(dsl::pow(g.input(bases) * 1.0, std::nan("")) + 0.0, bases.pow(std::nan("")));
      checks.emplace_back(dsl::pow(g.input(bases) * 1.0, INFINITY) + 0.0, bases.pow(INFINITY));
    }
    std::vector<Expr> targets;
    for (const auto& [e, expected] : checks) targets.push_back(e);
    g.forward(targets);
    for (size_t k = 0; k < checks.size(); ++k) {
      INFO("check " << k % 9 << ": " << checks[k].first.value() << " against " << checks[k].second);
      CHECK(at::allclose(checks[k].first.value(), checks[k].second, 1e-5, 1e-6, /*equal_nan=*/true));
    }
    // Gradients: the max's to the rows taken, pow's at a zero base with exponent 0 (none).
    const at::Tensor P = padded.clone().requires_grad_(true);
    const at::Tensor w = at::tensor({0.0f, 2.0f, -1.0f}).requires_grad_(true);
    g.clear();
    std::vector<Expr> losses;
    for (int i = 0; i < 3; ++i) {
      auto scope = g.example(i);
      losses.push_back(dsl::sum(dsl::max_dim(g.input(at::ones({3, 2})) * P, 0)) +
                       dsl::sum(dsl::pow(g.input(at::ones({3})) * w, 0.0) * 2.0));
    }
    const Expr total = dsl::sum(losses);
    g.forward(total);
    const auto grads = torch::autograd::grad({total.value()}, {P, w});
    const at::Tensor P2 = padded.clone().requires_grad_(true);
    const at::Tensor w2 = w.detach().clone().requires_grad_(true);
    const at::Tensor eager = 3 * (P2.amax(0).sum() + (w2.pow(0.0) * 2.0).sum());
    const auto expected = torch::autograd::grad({eager}, {P2, w2});
    CHECK(at::allclose(grads[0], expected[0]));
    CHECK(at::allclose(grads[1], expected[1]));
  }
  // A shared weight with no columns (a product over an empty axis): its
  // gradient [4, 0] and the bias's, with the weight's gradients batched or not.
  for (const bool batched : {true, false}) {
    const at::Tensor W0 = at::randn({4, 0}).requires_grad_(true), b = at::randn({4}).requires_grad_(true);
    Graph g({.batch_weight_grads = batched});
    std::vector<Expr> ys;
    for (int i = 0; i < 3; ++i) {
      auto scope = g.example(i);
      ys.push_back(dsl::sum(dsl::tanh(dsl::affine(W0, g.input(at::zeros({0})), b))));
    }
    const Expr total = dsl::sum(ys);
    g.forward(total);
    const auto grads = torch::autograd::grad({total.value()}, {W0, b});
    CHECK(grads[0].sizes() == W0.sizes());
    CHECK(at::allclose(grads[1], 3 * (1 - b.detach().tanh().pow(2))));
    // And no rows ([0, 3]): an empty output, its gradients empty or zero.
    const at::Tensor Wn = at::randn({0, 3}).requires_grad_(true), x = at::randn({3}).requires_grad_(true);
    Graph h({.batch_weight_grads = batched});
    std::vector<Expr> zs;
    for (int i = 0; i < 2; ++i) {
      auto scope = h.example(i);
      zs.push_back(dsl::sum(dsl::affine(Wn, h.input(x) * 1.0, at::zeros({0}))) + dsl::sum(h.input(x) * 2.0));
    }
    const Expr z = dsl::sum(zs);
    h.forward(z);
    const auto zgrads = torch::autograd::grad({z.value()}, {Wn, x});
    CHECK(zgrads[0].sizes() == Wn.sizes());
    CHECK(at::allclose(zgrads[1], at::full({3}, 4.0)));
  }
}

// Where the incoming gradient is infinite or NaN, or an operand is NaN, the
// ops whose LibTorch backward masks a gradient off (relu where y <= 0, the
// loser of maximum and minimum, pow at exponent 0) give its answers fused
// too: 0 where masked (the fused kernels' g * 0 was NaN), the whole gradient
// through a NaN (relu's and maximum's gave it 0).
TEST_CASE("relu, maximum, minimum and pow at 0 mask gradients as LibTorch does, fused or not, at infinities and NaN",
          "[dsl][ops][fused]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Elements where each op masks, passes, ties (+0 and -0 too), meets a NaN
  // in one operand or both, and an infinite operand; the gradient that comes in.
  const at::Tensor pa = at::tensor({-1.0f, 2.0f, 0.0f, nan, 3.0f, -2.0f, 1.0f, nan, inf, -0.0f, -inf});
  const at::Tensor pb = at::tensor({1.0f, 1.0f, 0.0f, 1.0f, nan, -2.0f, 4.0f, nan, 1.0f, 0.0f, 2.0f});
  const at::Tensor incoming = at::tensor({inf, nan, -inf, 1.0f, 2.0f, inf, -3.0f, 1.5f, -inf, nan, 2.5f});
  struct Case {
    const char* name;
    int operands;
    std::function<Expr(Expr, Expr)> sheaf;
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> eager;
  };
  const std::vector<Case> cases{
      {"relu", 1, [](Expr a, Expr) { return dsl::relu(a); }, [](const at::Tensor& a, const at::Tensor&) { return a.relu(); }},
      {"maximum", 2, [](Expr a, Expr b) { return dsl::maximum(a, b); },
       [](const at::Tensor& a, const at::Tensor& b) { return at::maximum(a, b); }},
      {"minimum", 2, [](Expr a, Expr b) { return dsl::minimum(a, b); },
       [](const at::Tensor& a, const at::Tensor& b) { return at::minimum(a, b); }},
      {"pow 0", 1, [](Expr a, Expr) { return dsl::pow(a, 0.0); },
       [](const at::Tensor& a, const at::Tensor&) { return a.pow(0.0); }},
      {"pow 2", 1, [](Expr a, Expr) { return dsl::pow(a, 2.0); },
       [](const at::Tensor& a, const at::Tensor&) { return a.pow(2.0); }}};
  // (CUDA, where there is one: the fused kernels' masks there are NVRTC source.)
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (at::hasCUDA()) devices.emplace_back(c10::kCUDA);
  for (const c10::Device& device : devices)
  for (const bool fuse : {false, true})
    for (const Case& c : cases) {
      INFO(c.name << ", fuse " << fuse << ", " << device);
      const at::Tensor ones = at::ones({pa.size(0)});
      // (Each operand an input times a parameter: a per-example value, with a
      // gradient summed over the examples in the parameter.)
      auto run = [&](const c10::Device& on, auto&& op) {
        const at::Tensor A = pa.to(on).requires_grad_(true), B = pb.to(on).requires_grad_(true);
        std::vector<at::Tensor> outputs = op(A, B);
        std::vector<at::Tensor> params{A};
        if (c.operands == 2) params.push_back(B);
        const std::vector<at::Tensor> grads(outputs.size(), incoming.to(on));
        std::vector<at::Tensor> out = torch::autograd::grad(outputs, params, grads);
        for (at::Tensor& t : out) t = t.cpu();
        return out;
      };
      const auto got = run(device, [&](const at::Tensor& A, const at::Tensor& B) {
        Graph g({.device = device, .fuse = fuse});
        std::vector<Expr> ys;
        for (int i = 0; i < 2; ++i) {
          auto scope = g.example(i);
          ys.push_back(c.sheaf(g.input(ones) * A, g.input(ones) * B));
        }
        g.forward(ys);
        return std::vector<at::Tensor>{ys[0].value(), ys[1].value()};
      });
      const auto expected = run(c10::Device(c10::kCPU), [&](const at::Tensor& A, const at::Tensor& B) {
        return std::vector<at::Tensor>{c.eager(ones * A, ones * B), c.eager(ones * A, ones * B)};
      });
      for (size_t k = 0; k < got.size(); ++k) {
        INFO("operand " << k << ": " << got[k] << " against LibTorch's " << expected[k]);
        CHECK(at::allclose(got[k], expected[k], 1e-5, 1e-6, /*equal_nan=*/true));
      }
    }
}

// Without autograd a sum or mean of one element is the batch's elements
// themselves, read with their rows' stride (ops/common.h's rows_alias).
TEST_CASE("sum and mean of one element without autograd read each example's element", "[dsl][ops]") {
  c10::NoGradGuard no_grad;
  Graph g;
  std::vector<Expr> outs;
  for (int i = 0; i < 5; ++i) {
    auto scope = g.example(i);
    const Expr x = g.input(at::arange(4, at::kFloat) + 10.0 * i);  // [4]: rows of 4, element 2 of each summed
    outs.push_back(dsl::sum(dsl::slice(x, 2, 3)) + dsl::mean(dsl::slice(x, 1, 2)) * 0.5);
  }
  g.forward(outs);
  for (int i = 0; i < 5; ++i) {
    INFO("example " << i);
    CHECK(outs[static_cast<size_t>(i)].value().dim() == 0);
    CHECK(outs[static_cast<size_t>(i)].value().item<float>() == Approx(2.0 + 0.5 + 15.0 * i));
  }
  // The sum shares its input's version counter, as a view would: a write in
  // place through either is seen through both (Sheaf's and autograd's
  // checks that a value read later was not changed).
  Graph h;
  const at::Tensor w = test::data({1, 4}, 1), b = test::data({1}, 2);
  std::vector<Expr> ys, sums;
  for (int i = 0; i < 3; ++i) {
    auto scope = h.example(i);
    ys.push_back(dsl::affine(w, h.input(test::data({4}, 3 + i)), b));  // [1]
    sums.push_back(dsl::sum(ys.back()));
  }
  h.forward(sums);
  const int64_t before = sums[1].value()._version();
  ys[1].value().mul_(2.0);
  CHECK(sums[1].value()._version() > before);
  CHECK(sums[1].value().item<float>() == Approx(ys[1].value().item<float>()));
}

// The checker compares batched with alone, and both run batched_matvec: its
// values and gradients are compared with LibTorch's bmm here.
TEST_CASE("batched_matvec equals at::bmm, values and gradients", "[dsl][ops]") {
  for (const auto [B, m, k] : {std::array<int64_t, 3>{1, 1, 1}, {3, 5, 7}, {4, 2, 8}, {5, 20, 19}, {64, 9, 128}}) {
    for (const bool grad_A : {true, false}) {
      INFO("B " << B << " m " << m << " k " << k << " grad_A " << grad_A);
      at::manual_seed(static_cast<uint64_t>(B * 100 + m * 10 + k));
      const at::Tensor A = at::randn({B, m, k}).requires_grad_(grad_A), x = at::randn({B, k}).requires_grad_();
      const at::Tensor g = at::randn({B, m});
      const at::Tensor y = batched_matvec(A, x);
      const at::Tensor expected = at::bmm(A, x.unsqueeze(2)).squeeze(2);
      REQUIRE(at::allclose(y, expected, 1e-5, 1e-5));
      const auto ours = torch::autograd::grad({y}, grad_A ? std::vector<at::Tensor>{A, x} : std::vector<at::Tensor>{x}, {g});
      const auto theirs =
          torch::autograd::grad({expected}, grad_A ? std::vector<at::Tensor>{A, x} : std::vector<at::Tensor>{x}, {g});
      for (size_t i = 0; i < ours.size(); ++i) CHECK(at::allclose(ours[i], theirs[i], 1e-5, 1e-5));
    }
  }
  // Not float32 on the CPU: LibTorch's bmm, the same values.
  const at::Tensor A = at::randn({2, 3, 4}, at::kDouble), x = at::randn({2, 4}, at::kDouble);
  CHECK(at::allclose(batched_matvec(A, x), at::bmm(A, x.unsqueeze(2)).squeeze(2)));
}

// The checker compares batched with alone, and alone runs each segment whole
// (equal counts): the segment loops (float32 on the CPU) and their ATen
// fallback (anything else: double here) are compared with LibTorch per
// segment, values and gradients, on segments of different lengths.
TEST_CASE("segment_softmax and segment_weighted_sum equal LibTorch per segment, values and gradients", "[dsl][ops]") {
  const std::vector<int64_t> counts{3, 1, 7, 2, 5};
  std::vector<int64_t> id_list;
  for (size_t s = 0; s < counts.size(); ++s) id_list.insert(id_list.end(), counts[s], static_cast<int64_t>(s));
  const at::Tensor ids = at::tensor(id_list, at::kLong);
  const int64_t R = static_cast<int64_t>(id_list.size()), p = 11;
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    INFO("dtype " << dtype);
    at::manual_seed(7);
    const at::Tensor x = (at::randn({R}, dtype) * 30).requires_grad_(), B = at::randn({R, p}, dtype).requires_grad_();
    const at::Tensor gx = at::randn({R}, dtype), gy = at::randn({static_cast<int64_t>(counts.size()), p}, dtype);
    for (const bool log : {false, true}) {
      INFO("log " << log);
      const at::Tensor ours = segment_softmax(x, counts, ids, log);
      std::vector<at::Tensor> pieces;
      for (const at::Tensor& seg : x.split_with_sizes(counts)) pieces.push_back(log ? at::log_softmax(seg, 0) : at::softmax(seg, 0));
      const at::Tensor theirs = at::cat(pieces);
      REQUIRE(at::allclose(ours, theirs, 1e-5, 1e-6));
      const auto d_ours = torch::autograd::grad({ours}, {x}, {gx});
      const auto d_theirs = torch::autograd::grad({theirs}, {x}, {gx});
      CHECK(at::allclose(d_ours[0], d_theirs[0], 1e-4, 1e-5));
    }
    const at::Tensor ours = segment_weighted_sum(x, B, counts, ids);
    std::vector<at::Tensor> rows;
    const auto xs = x.split_with_sizes(counts), Bs = B.split_with_sizes(counts);
    for (size_t s = 0; s < counts.size(); ++s) rows.push_back(at::matmul(xs[s], Bs[s]));
    const at::Tensor theirs = at::stack(rows);
    REQUIRE(at::allclose(ours, theirs, 1e-4, 1e-4));
    const auto d_ours = torch::autograd::grad({ours}, {x, B}, {gy});
    const auto d_theirs = torch::autograd::grad({theirs}, {x, B}, {gy});
    CHECK(at::allclose(d_ours[0], d_theirs[0], 1e-4, 1e-4));
    CHECK(at::allclose(d_ours[1], d_theirs[1], 1e-4, 1e-4));
  }
}

// packed_lstm with each cell (the fused loop runs on float32 on the CPU;
// double runs the ATen form either way) against at::lstm sequence by sequence,
// values and every gradient (input, both weights, bias, h0), forward, reverse
// and from an h0, on sequences of lengths 5, 3, 3, 1 packed time-major; hidden
// sizes below and above a vector's width (the loops' tails and bodies).
TEST_CASE("packed_lstm equals at::lstm per sequence, values and gradients", "[dsl][ops]") {
  const std::vector<int64_t> lengths{5, 3, 3, 1}, sizes{4, 3, 3, 1, 1};  // longest first, time-major
  const int64_t d = 6, rows = 12;
  for (const auto dtype : {at::kFloat, at::kDouble})
    for (const op::LstmCell cell : {op::LstmCell::kAten, op::LstmCell::kFused})
      for (const int64_t h : {5, 37})
        for (const int run : {0, 1, 2}) {
          const bool reverse = run == 1, with_h0 = run == 2;
          INFO("dtype " << dtype << ", fused cell " << (cell == op::LstmCell::kFused) << ", hidden " << h
                        << ", reverse " << reverse << ", h0 " << with_h0);
          at::manual_seed(3);
          auto leaf = [&](std::vector<int64_t> s) { return (at::randn(s, dtype) * 0.5).requires_grad_(); };
          const at::Tensor x = leaf({rows, d}), ih = leaf({4 * h, d}), hh = leaf({4 * h, h}), b = leaf({4 * h});
          const at::Tensor h0 = leaf({static_cast<int64_t>(lengths.size()), h});
          const at::Tensor gy = at::randn({rows, h}, dtype);
          const at::Tensor ours = op::packed_lstm(x, ih, hh, b, sizes, reverse, with_h0 ? h0 : at::Tensor(), cell);
          // Sequence k's element t is packed row offset[t] + k.
          std::vector<at::Tensor> theirs(static_cast<size_t>(rows));
          for (size_t k = 0; k < lengths.size(); ++k) {
            std::vector<int64_t> at_rows;
            for (int64_t t = 0, off = 0; t < lengths[k]; off += sizes[static_cast<size_t>(t)], ++t)
              at_rows.push_back(off + static_cast<int64_t>(k));
            const at::Tensor idx = at::tensor(at_rows, at::kLong);
            at::Tensor seq = x.index_select(0, idx);
            if (reverse) seq = seq.flip(0);
            const at::Tensor zero = at::zeros({1, 1, h}, dtype);
            const at::Tensor start = with_h0 ? h0[static_cast<int64_t>(k)].view({1, 1, h}) : zero;
            at::Tensor out = std::get<0>(at::lstm(seq.unsqueeze(1), {start, zero},
                                                  {ih, hh, b, at::zeros({4 * h}, dtype)}, true, 1, 0.0, true, false,
                                                  false))
                                 .squeeze(1);
            if (reverse) out = out.flip(0);
            for (size_t t = 0; t < at_rows.size(); ++t)
              theirs[static_cast<size_t>(at_rows[t])] = out[static_cast<int64_t>(t)];
          }
          const at::Tensor ref = at::stack(theirs);
          REQUIRE(at::allclose(ours, ref, 1e-5, 1e-6));
          std::vector<at::Tensor> wrt{x, ih, hh, b};
          if (with_h0) wrt.push_back(h0);
          const auto d_ours = torch::autograd::grad({ours}, wrt, {gy});
          const auto d_theirs = torch::autograd::grad({ref}, wrt, {gy});
          for (size_t i = 0; i < wrt.size(); ++i) {
            INFO("gradient " << i);
            CHECK(at::allclose(d_ours[i], d_theirs[i], 1e-4, 1e-5));
          }
          // Without a gradient wanted: the same values (nothing kept for a backward).
          const c10::NoGradGuard no_grad;
          CHECK(at::allclose(op::packed_lstm(x, ih, hh, b, sizes, reverse, with_h0 ? h0 : at::Tensor(), cell), ours,
                             0, 0));
        }
}

// map_rows against index_select (and cat with a zero row): a permutation, a
// padding and its inverse; values and gradients (and the gradient of the
// gradient); a non-contiguous source; an int64 tensor; without a gradient.
TEST_CASE("map_rows moves rows as index_select does, its gradient the inverse map", "[dsl][ops]") {
  const c10::Device cpu(c10::kCPU);
  const std::vector<int64_t> perm{2, 0, 3, 1}, inverse{1, 3, 0, 2};
  // Values of 2 and 1 rows, padded to 2: slot 3 reads the zero row (row 3 of 3).
  const std::vector<int64_t> pad{0, 1, 2, 3}, keep{0, 1, 2};
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    INFO("dtype " << dtype);
    const at::Tensor x = at::randn({4, 3}, dtype).requires_grad_();
    const op::RowMap to_perm(perm, 4, cpu);
    CHECK(to_perm.inverse().host == inverse);
    const at::Tensor y = op::map_rows(x, to_perm);
    REQUIRE(at::equal(y, x.index_select(0, at::tensor(perm, at::kLong))));
    const at::Tensor gy = at::randn({4, 3}, dtype).requires_grad_();
    const at::Tensor gx = torch::autograd::grad({y}, {x}, {gy}, true, true)[0];
    CHECK(at::equal(gx, gy.index_select(0, at::tensor(inverse, at::kLong))));
    // Second order: the gradient is itself a row map of gy.
    const at::Tensor ggy = torch::autograd::grad({gx}, {gy}, {at::ones_like(gx)})[0];
    CHECK(at::equal(ggy, at::ones_like(gy)));

    const at::Tensor v = at::randn({3, 2}, dtype).requires_grad_();
    const op::RowMap to_pad(pad, 3, cpu), to_rows(keep, 4, cpu);
    CHECK(to_pad.inverse().host == keep);
    CHECK(to_rows.inverse().host == pad);
    CHECK(to_pad.zeros);
    CHECK_FALSE(to_rows.zeros);
    const at::Tensor padded = op::map_rows(v, to_pad);
    const at::Tensor expect = at::cat({v, at::zeros({1, 2}, dtype)});
    REQUIRE(at::equal(padded, expect));
    const at::Tensor g = at::randn({4, 2}, dtype);
    CHECK(at::equal(torch::autograd::grad({padded}, {v}, {g})[0], g.narrow(0, 0, 3)));
    const at::Tensor w = at::randn({4, 2}, dtype).requires_grad_();
    const at::Tensor back_out = op::map_rows(w, to_rows);
    REQUIRE(at::equal(back_out, w.narrow(0, 0, 3)));
    const at::Tensor gw = torch::autograd::grad({back_out}, {w}, {at::ones({3, 2}, dtype)})[0];
    CHECK(at::equal(gw, at::cat({at::ones({3, 2}, dtype), at::zeros({1, 2}, dtype)})));

    const at::Tensor t = at::randn({3, 4}, dtype).t();  // [4, 3], not contiguous
    CHECK(at::equal(op::map_rows(t, to_perm), t.index_select(0, at::tensor(perm, at::kLong))));
  }
  // A map built for another number of rows is refused, not read past the source.
  CHECK_THROWS(op::map_rows(at::randn({5, 3}), op::RowMap(perm, 4, cpu)));
  // A row read twice has no inverse (its gradient would need an add).
  CHECK_THROWS(op::RowMap(std::vector<int64_t>{0, 0}, 2, cpu).inverse());
  // Rows of no width.
  CHECK(op::map_rows(at::randn({4, 0}), op::RowMap(perm, 4, cpu)).sizes() ==
        at::IntArrayRef({4, 0}));
  const at::Tensor ids = at::arange(8, at::kLong).view({4, 2});
  CHECK(at::equal(op::map_rows(ids, op::RowMap(perm, 4, cpu)),
                  ids.index_select(0, at::tensor(perm, at::kLong))));
}

TEST_CASE("attention's padded path on the CPU groups values of very different lengths by like lengths", "[ops][attention]") {
  // (The grouping alone: float32 values on the CPU take ops/attention_cpu.h's
  // loop, which pads nothing, so the op table's cases no longer run the
  // groups; the padded path serves other types and GPUs.)
  const std::vector<int64_t> same(8, 20), mixed{2, 60, 3, 64, 2, 61};
  CHECK(op::Attention::buckets(same, same, 2, 16).cuts.size() == 2);  // one group
  const auto g = op::Attention::buckets(mixed, mixed, 2, 16);
  REQUIRE(g.cuts == std::vector<size_t>{0, 3, 6});  // the short ones, then the long ones
  CHECK(g.order == std::vector<int64_t>{0, 4, 2, 1, 5, 3});  // by key count, ties in order
}

// An attention decoder written step by step: every step's scores A x and
// context x B read the example's encoder rows, and the steps merge into one
// packed batch each. Those batches read the rows in place (no gathered copy
// per step, gradients added into the encoder's batch: OpTraits::
// reads_in_place); batched equals alone under every strategy, values and
// gradients, with encoders of 1-4 rows and 2-4 steps.
TEST_CASE("matmul: attention step by step reads the encoder rows in place, batched equals alone", "[dsl][ops][ragged]") {
  at::manual_seed(21);
  const int64_t k = 11;  // the loops' 8-wide body and a tail
  const at::Tensor W = (at::randn({k, k}) * 0.3).requires_grad_(), U = (at::randn({k, k}) * 0.3).requires_grad_();
  const at::Tensor b = (at::randn({k}) * 0.1).requires_grad_();
  std::vector<at::Tensor> sources;
  for (int i = 0; i < 8; ++i) sources.push_back(at::randn({1 + i % 4, k}));
  auto program = [&](Graph& g, int i) {
    const Expr H = dsl::tanh(dsl::affine(W, g.input(sources[static_cast<size_t>(i)]), b));  // [1 + i % 4, k]
    Expr s = dsl::tanh(dsl::sum_dim(H, 0));
    std::vector<Expr> losses;
    for (int t = 0; t < 2 + i % 3; ++t) {
      const Expr context = dsl::matmul(dsl::softmax(dsl::matmul(H, s)), H);  // [k]
      losses.push_back(dsl::sum(context * s));
      s = dsl::tanh(dsl::affine(U, s, b));  // the next state does not wait for the context: steps merge
    }
    return dsl::sum(losses);
  };
  REQUIRE_BATCHED_EQUALS_ALONE(check_batched(8, program, {.params = {W, U, b}}));
  // The products read the encoder rows in place: their backward nodes reach
  // the gathers' hubs (the encoder batch's one gradient) directly.
  Graph g;
  std::vector<Expr> losses;
  for (int i = 0; i < 8; ++i) {
    auto scope = g.example(i);
    losses.push_back(program(g, i));
  }
  const Expr total = dsl::sum(losses);
  g.forward(total);
  std::set<std::string> hub_readers;
  const at::Tensor value = total.value();  // (a view made here: it holds its node)
  std::vector<torch::autograd::Node*> stack{value.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const torch::autograd::Edge& e : node->next_edges()) {
      if (e.function && e.function->name() == "sheaf::GatherHub") hub_readers.insert(node->name());
      stack.push_back(e.function.get());
    }
  }
  CHECK(hub_readers.count("sheaf::DotRowsBackward") == 1);
  CHECK(hub_readers.count("sheaf::WeightedRowSumsBackward") == 1);
  CHECK(g.stats().in_place_inputs >= 3);
}

// A list of shared values (parameters) is one shared sum: its elements are
// whole tensors, not rows of a batch, and its plan reads each whole (not a
// gather of rows: scheduler/plan.cpp). Every example reads the one value.
TEST_CASE("sum of a list of shared values: one value for every example, its gradient to each element",
          "[dsl][ops][planner]") {
  const at::Tensor a = at::randn({3}).requires_grad_(true), b = at::randn({3}).requires_grad_(true);
  Graph g;
  std::vector<Expr> ys;
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    xs.push_back(at::randn({3}));
    const Expr shared = dsl::sum(std::vector<Expr>{g.param(a), g.param(b), g.param(a)});  // a twice
    ys.push_back(dsl::sum(g.input(xs.back()) * shared));
  }
  const Expr total = dsl::sum(ys);
  g.forward(total);
  const at::Tensor x_sum = xs[0] + xs[1] + xs[2] + xs[3];
  const at::Tensor want = (x_sum * (2 * a.detach() + b.detach())).sum();
  CHECK(at::allclose(total.value(), want, 1e-5, 1e-5));
  const auto grads = torch::autograd::grad({total.value()}, {a, b});
  CHECK(at::allclose(grads[0], 2 * x_sum, 1e-5, 1e-5));
  CHECK(at::allclose(grads[1], x_sum, 1e-5, 1e-5));
}
