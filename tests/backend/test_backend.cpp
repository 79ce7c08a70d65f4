// The executor: views instead of copies, one output tensor per batch, devices.
#include <torch/csrc/autograd/autograd.h>

#include <c10/core/InferenceMode.h>
#include <c10/core/GradMode.h>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include <sheaf/backend/runtime.h>
#include <sheaf/engine/engine.h>
#include <sheaf/ops/blas_threads.h>
#include <sheaf/ops/matvec.h>
#include <sheaf/ops/packed_gemm.h>
#include <sheaf/ops/weight_grad.h>

#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;
using sheaf::test::param;

TEST_CASE("node values are rows of one batch tensor", "[backend]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::tanh(g.input(data({3}, i))));
  }
  g.forward(ys);
  const void* base = ys[0].value().data_ptr();
  for (int i = 1; i < 4; ++i)
    CHECK(static_cast<const char*>(ys[static_cast<size_t>(i)].value().data_ptr()) ==
          static_cast<const char*>(base) + i * 3 * sizeof(float));
}

TEST_CASE("inputs already in order are used as views, others gathered", "[backend]") {
  Graph g;
  std::vector<Expr> ys;
  std::vector<Expr> xs;
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    xs.push_back(g.input(data({3}, i)));
  }
  // Reversed pairing: example i adds x_i and x_{5-i}; the second operand must be gathered.
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    ys.push_back(xs[static_cast<size_t>(i)] + xs[static_cast<size_t>(5 - i)]);
  }
  g.forward(ys);
  CHECK(g.stats().zero_copy_inputs == 1);
  CHECK(g.stats().gathered_inputs == 1);
  CHECK(g.stats().gather_launches == 1);  // one index_select
  for (int i = 0; i < 6; ++i)
    CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), data({3}, i) + data({3}, 5 - i)));
}

// Example i runs a chain of i % 3 + 1 cells, so the last cells' inputs come from
// three earlier batches in example order: a gather, which a fused kernel on the
// CPU reads in place. One slice of the gathered input is also summed outside
// the kernel (a copy of its rows is made for it).
Expr chain_then_gates(Graph& g, int i, const at::Tensor& W, const at::Tensor& b) {
  Expr x = g.input(data({4}, i));
  for (int k = 0; k <= i % 3; ++k) x = dsl::affine(W, x, b);
  std::vector<Expr> gates = dsl::chunk(x, 2);
  return dsl::sigmoid(gates[0]) * dsl::tanh(gates[1]) + dsl::sum(gates[1]);
}

TEST_CASE("fused kernels read gathered rows in place: values and gradients as one at a time", "[backend][fusion]") {
  at::Tensor W = param({4, 4}, 3), b = param({4}, 4);
  {
    Graph g;
    std::vector<Expr> ys;
    for (int i = 0; i < 9; ++i) {
      auto s = g.example(i);
      ys.push_back(dsl::sum(chain_then_gates(g, i, W, b)));
    }
    Expr loss = dsl::sum(ys);
    g.forward(loss);
    CHECK(g.stats().in_place_inputs > 0);
    loss.value().backward();
    CHECK(W.grad().defined());
  }
  REQUIRE_BATCHED_EQUALS_ALONE(
      check_batched(9, [&](Graph& g, int i) { return chain_then_gates(g, i, W, b); }, {.params = {W, b}}));
}

// W's gradient from a full backward of the loss `forward` computes (in the
// graph it is given) is the same whether or not a partial backward, for
// `partial` only, ran before it on the same graph.
void check_w_grad_after_partial(at::Tensor W, const at::Tensor& partial, const std::function<Expr(Graph&)>& forward) {
  auto run = [&](bool partial_first) {
    Graph g;
    const Expr loss = forward(g);
    if (partial_first) torch::autograd::grad({loss.value()}, {partial}, {}, /*retain_graph=*/true);
    W.mutable_grad() = at::Tensor();
    loss.value().backward();
    return W.grad().clone();
  };
  const at::Tensor once = run(false), after_partial = run(true);
  CHECK(at::allclose(once, after_partial, 1e-5, 1e-6));
}

TEST_CASE("a partial backward leaves the rows read in place alone: a later full backward is exact", "[backend][fusion]") {
  // torch::autograd::grad for v only runs the fused backward (v is its input)
  // but not the sources' gradient hubs: nothing may be left in them for the
  // full backward after.
  at::Tensor W = param({4, 4}, 3), b = param({4}, 4), v = param({2}, 5);
  check_w_grad_after_partial(W, v, [&](Graph& g) {
    std::vector<Expr> ys;
    for (int i = 0; i < 9; ++i) {
      auto s = g.example(i);
      Expr x = g.input(data({4}, i));
      for (int k = 0; k <= i % 3; ++k) x = dsl::affine(W, x, b);
      std::vector<Expr> gates = dsl::chunk(x, 2);
      ys.push_back(dsl::sum(dsl::sigmoid(gates[0]) * dsl::tanh(gates[1]) * g.param(v)));
    }
    Expr loss = dsl::sum(ys);
    g.forward(loss);
    CHECK(g.stats().in_place_inputs > 0);
    return loss;
  });
}

TEST_CASE("a value a fused kernel kept inside, read later, from rows it read in place", "[backend][fusion]") {
  Graph g;
  std::vector<Expr> xs, sig, ys;
  for (int i = 0; i < 6; ++i) {
    auto s = g.example(i);
    xs.push_back(g.input(data({3}, i)));
  }
  for (int i = 0; i < 6; ++i) {  // reversed pairing: a gather of x's rows
    auto s = g.example(i);
    sig.push_back(dsl::sigmoid(xs[static_cast<size_t>(5 - i)]));
    ys.push_back(dsl::tanh(sig.back() * xs[static_cast<size_t>(i)]));
  }
  g.forward(ys);
  CHECK(g.stats().in_place_inputs > 0);
  for (int i = 0; i < 6; ++i) {
    const at::Tensor s = at::sigmoid(data({3}, 5 - i));
    CHECK(at::allclose(sig[static_cast<size_t>(i)].value(), s));  // computed now, from the rows
    CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), at::tanh(s * data({3}, i))));
  }
}

TEST_CASE("gradients reach parameters through batched launches", "[backend]") {
  at::Tensor W = param({3, 3}, 9);
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 5; ++i) {
    auto s = g.example(i);
    ys.push_back(dsl::sum(dsl::affine(W, g.input(data({3}, i)), at::zeros({3}))));
  }
  Expr loss = dsl::sum(ys);
  g.forward(loss);
  loss.value().backward();
  at::Tensor expected = at::zeros({3, 3});
  for (int i = 0; i < 5; ++i) expected += at::ones({3, 1}) * data({3}, i).unsqueeze(0);
  CHECK(at::allclose(W.grad(), expected, 1e-5, 1e-5));
}

TEST_CASE("TransposedWeights: W^T from a weight's second use, a fresh one after an update in place", "[backend]") {
  TransposedWeights cache;
  at::Tensor W = param({6, 10}, 21);
  CHECK(cache.get(W) == nullptr);  // first use: the plain layout
  const at::Tensor* wt = cache.get(W);
  REQUIRE(wt != nullptr);
  CHECK(wt->is_contiguous());
  CHECK(at::equal(*wt, W.detach().t()));
  {
    c10::NoGradGuard no_grad;
    W.add_(1.0);
  }
  CHECK(cache.get(W) == nullptr);  // the version moved: not the stale copy
  wt = cache.get(W);
  REQUIRE(wt != nullptr);
  CHECK(at::equal(*wt, W.detach().t()));
  const at::Tensor big = param({384, 384}, 22);  // k a multiple of 128, > 64Ki entries: W^T no faster
  CHECK(cache.get(big) == nullptr);
  CHECK(cache.get(big) == nullptr);
  const at::Tensor small = param({256, 256}, 22);  // 64Ki entries: small enough to pay
  CHECK(cache.get(small) == nullptr);
  CHECK(cache.get(small) != nullptr);
  W.set_data(W.detach().t());  // the same memory and version counter, another shape: not the stale W^T
  CHECK(cache.get(W) == nullptr);
  wt = cache.get(W);
  REQUIRE(wt != nullptr);
  CHECK(at::equal(*wt, W.detach().t()));
  cache.clear();
  CHECK(cache.get(W) == nullptr);
  {
    c10::InferenceMode inference;  // no version counter to tell an update by: never cached
    const at::Tensor frozen = at::randn({6, 10});
    CHECK(cache.get(frozen) == nullptr);
    CHECK(cache.get(frozen) == nullptr);
  }
}

TEST_CASE("linear_rows: a bias per row, and a [1, m] bias broadcast, with and without padding or W^T", "[backend]") {
  const at::Tensor W = at::randn({640, 288}), wt = W.t().contiguous();
  for (int64_t m : {1, 3, 5, 8}) {
    INFO(m << " rows");
    const at::Tensor x = at::randn({m, 288}), rows = at::randn({m, 640}), one = at::randn({1, 640});
    const at::Tensor expected = at::matmul(x, W.t());
    CHECK(at::allclose(linear_rows(x, W, rows), expected + rows, 1e-4, 1e-4));
    CHECK(at::allclose(linear_rows(x, W, rows, &wt), expected + rows, 1e-4, 1e-4));
    CHECK(at::allclose(linear_rows(x, W, one), expected + one, 1e-4, 1e-4));
    CHECK(at::allclose(linear_rows(x, W, one, &wt), expected + one, 1e-4, 1e-4));
  }
}

TEST_CASE("linear_rows: a few output columns (narrow_product's case) with every kind of bias, and its gradients",
          "[backend]") {
  for (int64_t c : {0, 2, 5, 8}) {
    for (int64_t m : {1, 3, 64}) {
      INFO(c << " outputs, " << m << " rows");
      const at::Tensor W = at::randn({c, 40}), x = at::randn({m, 40});
      const at::Tensor b = at::randn({c}), rows = at::randn({m, c}), one = at::randn({1, c});
      const at::Tensor expected = at::matmul(x, W.t());
      // Without a gradient: a 1-D bias takes narrow_product; a bias per row,
      // or [1, c], takes the general path. Each equals the plain product.
      c10::NoGradGuard no_grad;
      CHECK(at::allclose(linear_rows(x, W, b), expected + b, 1e-4, 1e-4));
      CHECK(at::allclose(linear_rows(x, W, {}), expected, 1e-4, 1e-4));
      CHECK(at::allclose(linear_rows(x, W, rows), expected + rows, 1e-4, 1e-4));
      CHECK(at::allclose(linear_rows(x, W, one), expected + one, 1e-4, 1e-4));
    }
  }
  // With a gradient wanted: not narrow_product (it records none); autograd's.
  const at::Tensor W = at::randn({5, 40}).requires_grad_(), x = at::randn({7, 40}).requires_grad_();
  const at::Tensor b = at::randn({5}).requires_grad_();
  const at::Tensor y = linear_rows(x, W, b);
  REQUIRE(y.requires_grad());
  y.sum().backward();
  CHECK(at::allclose(W.grad(), x.detach().sum(0).unsqueeze(0).expand({5, 40}), 1e-4, 1e-4));
  CHECK(at::allclose(x.grad(), W.detach().sum(0).unsqueeze(0).expand({7, 40}), 1e-4, 1e-4));
  CHECK(at::allclose(b.grad(), at::full({5}, 7.0f), 1e-4, 1e-4));
}

TEST_CASE("linear_rows: one output column (a GEMV) with every kind of bias, and its gradients", "[backend]") {
  const at::Tensor A = at::randn({1, 40}).requires_grad_();
  const at::Tensor a_t = A.detach().t().contiguous();
  for (int64_t m : {1, 2, 7}) {
    const at::Tensor x = at::randn({m, 40}).requires_grad_();
    const at::Tensor biases[] = {at::Tensor(), at::randn({1}).requires_grad_(), at::randn({1, 1}).requires_grad_(),
                                 at::randn({m, 1}).requires_grad_()};
    const char* names[] = {"none", "[1]", "[1, 1]", "[m, 1]"};
    for (size_t k = 0; k < 4; ++k) {
      const at::Tensor& b = biases[k];
      for (const at::Tensor* wt : {static_cast<const at::Tensor*>(nullptr), &a_t}) {
        INFO(m << " rows, bias " << names[k] << (wt ? ", W^T given" : ""));
        const at::Tensor y = linear_rows(x, A, b, wt);
        const at::Tensor want = b.defined() ? at::matmul(x, A.t()) + b : at::matmul(x, A.t());
        CHECK(y.sizes() == want.sizes());
        CHECK(at::allclose(y, want, 1e-5, 1e-5));
        std::vector<at::Tensor> wrt{x, A};
        if (b.defined()) wrt.push_back(b);
        const at::Tensor dy = at::randn(want.sizes());
        const auto got = torch::autograd::grad({y}, wrt, {dy});
        const auto expected = torch::autograd::grad({want}, wrt, {dy});
        for (size_t q = 0; q < got.size(); ++q) CHECK(at::allclose(got[q], expected[q], 1e-5, 1e-5));
      }
    }
  }
}

TEST_CASE("rows_dot: one output per row, with no bias, one bias or a bias per row, equals addmv", "[backend]") {
  // (Rows four at a time and the last 1-3 alone; vectors of 16 or 8 and a
  // short tail: sizes on each side of those.)
  for (int64_t m : {1, 2, 3, 4, 5, 7, 64}) {
    for (int64_t k : {1, 9, 16, 17, 33, 256}) {
      INFO("m " << m << ", k " << k);
      const at::Tensor x = data({m, k}, 1), v = data({k}, 2), b = data({1}, 3), rows = data({m}, 4);
      const at::Tensor want = at::mv(x, v);
      CHECK(at::allclose(rows_dot(x, v, {}), want.unsqueeze(1), 1e-5, 1e-5));
      CHECK(at::allclose(rows_dot(x, v, b), (want + b).unsqueeze(1), 1e-5, 1e-5));
      CHECK(at::allclose(rows_dot(x, v, rows), (want + rows).unsqueeze(1), 1e-5, 1e-5));
      // Rows that are not contiguous (a slice of wider rows) read as the same values.
      const at::Tensor wide = data({m, k + 3}, 5).narrow(1, 1, k);
      CHECK(at::allclose(rows_dot(wide, v, b), (at::mv(wide, v) + b).unsqueeze(1), 1e-5, 1e-5));
    }
  }
}

TEST_CASE("narrow_product: a weight of 1-8 rows times any rows, with or without a bias, equals at::linear", "[backend]") {
  // (k = 1500: a long dot with a tail past its last 8.)
  for (int64_t c : {1, 2, 5, 8}) {
    for (int64_t k : {1, 9, 128, 1500}) {
      for (int64_t m : {1, 3, 64}) {
        INFO("c " << c << ", k " << k << ", m " << m);
        const at::Tensor x = data({m, k}, 1), w = data({c, k}, 2), b = data({c}, 3);
        const at::Tensor y = narrow_product(x, w, b);
        CHECK(y.sizes() == at::IntArrayRef({m, c}));
        CHECK(at::allclose(y, at::linear(x, w, b), 1e-4, 1e-4));
        CHECK(at::allclose(narrow_product(x, w, {}), at::linear(x, w), 1e-4, 1e-4));
        // Rows that are not contiguous read as the same values.
        const at::Tensor wide = data({m, k + 3}, 5).narrow(1, 1, k);
        CHECK(at::allclose(narrow_product(wide, w, b), at::linear(wide, w, b), 1e-4, 1e-4));
      }
    }
  }
  CHECK_THROWS(narrow_product(data({2, 4}, 1), data({9, 4}, 2), {}));  // wider than 8: not its job
}

TEST_CASE("packed_mm: the product of any rows, with no bias, one bias or a bias per row, equals OpenBLAS's",
          "[backend][packed]") {
  if (!packed_gemm_available()) {
    WARN("no AVX2+FMA on this CPU: the packed product is not used here, nothing to check");
    return;
  }
  // Column counts on and off the 32-column panels; rows through every block
  // remainder; k past a multiple of 4 by 0-3 (blocks of 1-3 rows split k
  // over 4 or 2 chains: the steps left over).
  for (auto [k, n] : {std::pair<int64_t, int64_t>{288, 640}, {416, 128}, {37, 45}, {8, 8}, {100, 17}, {42, 70},
                      {39, 33}}) {
    const at::Tensor W = at::randn({n, k});
    const PackedMatrix p = pack_matrix(W.t());
    REQUIRE(p.panels.size(0) == (n + 31) / 32);
    for (int64_t m : {1, 2, 5, 6, 7, 12, 13, 45, 64}) {
      INFO("k " << k << " n " << n << " rows " << m);
      const at::Tensor x = at::randn({m, k}), b = at::randn({n}), rows = at::randn({m, n});
      const at::Tensor expected = at::mm(x, W.t());
      CHECK(at::allclose(packed_mm(x, p), expected, 1e-4, 1e-4));
      CHECK(at::allclose(packed_mm(x, p, b), expected + b, 1e-4, 1e-4));
      CHECK(at::allclose(packed_mm(x, p, rows), expected + rows, 1e-4, 1e-4));
      CHECK(at::allclose(packed_mm(x, p, b.unsqueeze(0)), expected + b, 1e-4, 1e-4));
      // Rows of a wider tensor (a row stride past k) are read in place; other strides are copied first.
      const at::Tensor wide = at::randn({m, k + 3}).narrow(1, 1, k);
      CHECK(at::allclose(packed_mm(wide, p), at::mm(wide, W.t()), 1e-4, 1e-4));
      const at::Tensor cols = at::randn({k, m}).t();
      CHECK(at::allclose(packed_mm(cols, p), at::mm(cols, W.t()), 1e-4, 1e-4));
      // Rows anywhere (packed_mm_rows): every other row of a wider tensor, last first.
      const at::Tensor pool = at::randn({2 * m + 1, k + 5});
      std::vector<const float*> at_rows;
      std::vector<int64_t> picked;
      for (int64_t i = 0; i < m; ++i) {
        picked.push_back(2 * (m - 1 - i) + 1);
        at_rows.push_back(pool.data_ptr<float>() + picked.back() * (k + 5) + 2);
      }
      const at::Tensor gathered = pool.index_select(0, at::tensor(picked)).narrow(1, 2, k);
      CHECK(at::allclose(packed_mm_rows(at_rows, p, b, x.options()), at::mm(gathered, W.t()) + b, 1e-4, 1e-4));
      CHECK(at::allclose(packed_mm_rows(at_rows, p, {}, x.options()), at::mm(gathered, W.t()), 1e-4, 1e-4));
      // W's own rows laid out (the backward's dX = dY W): panels cut from rows, k columns.
      const at::Tensor dy = at::randn({m, n});
      CHECK(at::allclose(packed_mm(dy, pack_matrix(W)), at::mm(dy, W), 1e-4, 1e-4));
    }
    CHECK(packed_mm(at::randn({0, k}), p, at::randn({0, n})).sizes() == at::IntArrayRef{0, n});  // no rows
  }
  const at::Tensor x = at::randn({3, 5});
  CHECK_THROWS_AS(packed_mm(x, pack_matrix(at::randn({8, 8}))), InternalError);  // k does not match
  CHECK_THROWS_AS(pack_matrix(at::randn({8, 8}, at::kDouble)), InternalError);
  CHECK_THROWS_AS(packed_mm(at::randn({3, 8}, at::kDouble), pack_matrix(at::randn({8, 8}))), InternalError);
  CHECK_FALSE(packed_product_takes(at::randn({3, 8}), at::randn({8}, at::kDouble)));
}

// Without autograd an affine whose x is gathered (rows of two batches, in
// another order) reads those rows where they lie: in a batch of its own and in
// a function's body. Batched equals alone (values; with autograd on, gradients,
// where x comes as a tensor), and the rows are not copied first.
TEST_CASE("an affine reads a gathered x in place without autograd, in a batch and in a function's body",
          "[backend][packed]") {
  const at::Tensor W = at::randn({12, 8}).requires_grad_(), b = at::randn({12}).requires_grad_();
  const at::Tensor V = at::randn({12, 8}).requires_grad_();
  Fn<Expr(Expr, Expr)> cell("rows_cell", [&](Expr x, Expr h) { return dsl::tanh(dsl::affine(V, x, b)) + h; });
  auto program = [&](Graph& g, int i) {
    const Expr u = g.input(data({8}, i));
    const Expr x = i % 3 == 0 ? dsl::tanh(u) : dsl::sigmoid(u) * 2.0;  // two batches
    const Expr y = dsl::affine(W, x, b);
    return cell(x, y) * 1.5;
  };
  for (const int n : {1, 7, 20}) {
    INFO(n << " examples");
    {
      c10::NoGradGuard no_grad;
      REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, program));
    }
    REQUIRE_BATCHED_EQUALS_ALONE(check_batched(n, program, {.params = {W, b, V}}));
  }
  c10::NoGradGuard no_grad;
  Graph g;
  test::forward_examples(g, 20, program);
  // The affine's x and the call's x: read in place, never gathered into a
  // tensor (where this CPU has the packed product; else gathered as before).
  if (packed_gemm_available()) {
    CHECK(g.stats().gathered_inputs == 0);
    CHECK(g.stats().in_place_inputs >= 2);
  } else {
    CHECK(g.stats().gathered_inputs >= 2);
  }
}

TEST_CASE("TransposedWeights::packed: made at a weight's first use, again after an update, off when asked",
          "[backend][packed]") {
  TransposedWeights cache;
  at::Tensor W = param({64, 48}, 23);
  if (!packed_gemm_available()) {
    CHECK(cache.packed(W, true) == nullptr);
    return;
  }
  std::shared_ptr<const PackedWeight> p = cache.packed(W, false);
  REQUIRE(p != nullptr);
  CHECK_FALSE(p->backward.defined());
  CHECK(cache.packed(W, false) == p);  // the same layout while W stays as it is
  const at::Tensor x = at::randn({9, 48});
  CHECK(at::allclose(linear_packed(x, *p, {}), at::mm(x, W.detach().t()), 1e-4, 1e-4));
  std::shared_ptr<const PackedWeight> both = cache.packed(W, true);  // the backward form joins it
  REQUIRE(both != nullptr);
  REQUIRE(both->backward.defined());
  CHECK(both->forward.panels.is_same(p->forward.panels));
  const at::Tensor dy = at::randn({9, 64});
  CHECK(at::allclose(packed_mm(dy, both->backward), at::mm(dy, W.detach()), 1e-4, 1e-4));
  {
    c10::NoGradGuard no_grad;
    W.add_(1.0);
  }
  p = cache.packed(W, true);  // the version moved: a new layout, not the stale one
  REQUIRE(p != nullptr);
  CHECK(p != both);
  CHECK(at::allclose(linear_packed(x, *p, {}), at::mm(x, W.detach().t()), 1e-4, 1e-4));
  CHECK(at::allclose(packed_mm(dy, p->backward), at::mm(dy, W.detach()), 1e-4, 1e-4));
  // An old layout a backward still holds stays what it was.
  CHECK(at::allclose(packed_mm(x, both->forward), at::mm(x, (W.detach() - 1.0).t()), 1e-4, 1e-4));
  // Re-seated (new memory, same version), then given another shape: laid out again each time.
  W.set_data(param({64, 48}, 25).detach());
  p = cache.packed(W, false);
  REQUIRE(p != nullptr);
  CHECK(at::allclose(linear_packed(x, *p, {}), at::mm(x, W.detach().t()), 1e-4, 1e-4));
  W.set_data(param({32, 48}, 26).detach());
  p = cache.packed(W, false);
  REQUIRE(p != nullptr);
  CHECK(at::allclose(linear_packed(x, *p, {}), at::mm(x, W.detach().t()), 1e-4, 1e-4));
  // Transposed in place of itself: the same memory and version counter, another
  // shape and strides; laid out again, not the layout of the old shape.
  W.set_data(W.detach().t());
  p = cache.packed(W, false);
  REQUIRE(p != nullptr);
  const at::Tensor x32 = at::randn({9, 32});
  CHECK(at::allclose(linear_packed(x32, *p, {}), at::mm(x32, W.detach().t()), 1e-4, 1e-4));
  // A weight that does not suit is answered again from what was decided (no layout).
  const at::Tensor row = param({1, 48}, 27);
  CHECK(cache.packed(row, false) == nullptr);
  CHECK(cache.packed(row, false) == nullptr);
  cache.set_packing(false);
  CHECK(cache.packed(W, false) == nullptr);
  cache.set_packing(true);
  CHECK(cache.packed(at::randn({8, 6000}).requires_grad_(), false) == nullptr);  // k past what was measured
  CHECK(cache.packed(at::randn({2, 2}).requires_grad_(), false) == nullptr);     // too small to pay
  const at::Tensor once = param({64, 48}, 24);
  CHECK(cache.packed(once, false, 1) == nullptr);  // a new layout for one row: a GEMV instead
  CHECK(cache.packed(once, false, 4) != nullptr);
  CHECK(cache.packed(once, false, 1) != nullptr);  // laid out already: one row reads it too
  {
    c10::InferenceMode inference;  // no version counter to tell an update by: never packed
    CHECK(cache.packed(at::randn({64, 48}), false) == nullptr);
  }
}

TEST_CASE("TransposedWeights::packed: an inference layout outlives clear() while W's bytes stay the same",
          "[backend][packed]") {
  if (!packed_gemm_available()) return;
  TransposedWeights cache;
  at::Tensor W = param({64, 48}, 31);
  const at::Tensor x = at::randn({9, 48});
  auto right = [&](const std::shared_ptr<const PackedWeight>& p) {
    return p && at::allclose(linear_packed(x, *p, {}), at::mm(x, W.detach().t()), 1e-4, 1e-4);
  };
  // Laid out with autograd on (training, its input wanting no gradient): no copy, not kept.
  std::shared_ptr<const PackedWeight> t = cache.packed(W, false);
  REQUIRE(right(t));
  cache.clear();
  CHECK(cache.packed(W, false) != t);
  cache.clear();
  cache.clear();
  c10::NoGradGuard inference;
  std::shared_ptr<const PackedWeight> p = cache.packed(W, false);
  REQUIRE(right(p));
  cache.clear();
  CHECK(cache.packed(W, false) == p);  // unchanged: the same layout, not made again
  // Written through W.data(): the version counter does not move, the bytes do.
  cache.clear();
  W.data().select(0, 5).fill_(2.5);
  std::shared_ptr<const PackedWeight> q = cache.packed(W, false);
  CHECK(q != p);
  CHECK(right(q));
  // A graph that did not use it drops it: the next one lays it out again.
  cache.clear();
  cache.clear();
  CHECK(cache.packed(W, false) != q);
  // A layout with its backward form (training: W moves every step) keeps no copy.
  std::shared_ptr<const PackedWeight> both = cache.packed(W, true);
  REQUIRE(both != nullptr);
  cache.clear();
  CHECK(cache.packed(W, true) != both);
  // Updated in place between graphs, its bytes as they were: the version
  // counter alone tells, before any comparison.
  cache.clear();
  cache.clear();
  std::shared_ptr<const PackedWeight> f = cache.packed(W, false);
  cache.clear();
  CHECK(cache.packed(W, false) == f);
  cache.clear();
  W.add_(0.0);
  CHECK(cache.packed(W, false) != f);
  CHECK(right(cache.packed(W, false)));
}

TEST_CASE("Inference reads a shared weight written through W.data() between batches", "[backend][packed]") {
  // A Graph reused batch after batch keeps its inference layouts (ops/weight_grad.h);
  // a weight changed behind the version counter's back must not be read stale.
  at::Tensor W = param({40, 40}, 32);
  const at::Tensor b = at::zeros({40});
  Graph g;
  auto run = [&] {
    c10::NoGradGuard no_grad;
    std::vector<Expr> ys;
    std::vector<at::Tensor> xs;
    for (int i = 0; i < 6; ++i) {
      auto s = g.example(i);
      xs.push_back(data({40}, i));
      ys.push_back(dsl::tanh(dsl::affine(W, g.input(xs.back()), b)));
    }
    g.forward(ys);
    for (size_t i = 0; i < xs.size(); ++i)
      CHECK(at::allclose(ys[i].value(), at::tanh(at::mv(W.detach(), xs[i]) + b), 1e-5, 1e-5));
    g.clear();
  };
  run();
  run();
  W.data().mul_(-1.5);
  run();
}

namespace {

// Seven examples, each a chain of `steps` applications of `step` to its own
// input, summed squares as the loss, with weight packing on or off: the loss,
// then the gradients of `params` and of each example's input.
std::vector<at::Tensor> chain_results(bool pack, const std::vector<at::Tensor>& params,
                                      const std::function<Expr(Expr)>& step, int steps) {
  Graph g(GraphOptions{.pack_weights = pack});
  std::vector<Expr> losses;
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 7; ++i) {
    auto s = g.example(i);
    xs.push_back(data({40}, i).requires_grad_());
    Expr h = g.input(xs.back());
    for (int t = 0; t < steps; ++t) h = step(h);
    losses.push_back(dsl::sum(h * h));
  }
  Expr loss = dsl::sum(losses);
  g.forward(loss);
  loss.value().backward();
  std::vector<at::Tensor> out{loss.value().detach()};
  for (const at::Tensor& p : params) out.push_back(p.grad());
  for (const at::Tensor& x : xs) out.push_back(x.grad());
  return out;
}

// The packed products (packed_mm calls) that `f` runs.
int packed_products_in(const std::function<void()>& f) {
  static std::atomic<int> products{0};  // (a callback takes no captures)
  products = 0;
  const at::CallbackHandle counter = at::addGlobalCallback(at::RecordFunctionCallback(
      [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (std::strcmp(fn.name(), "sheaf::packed_mm") == 0) ++products;
        return nullptr;
      }));
  struct Remove {
    at::CallbackHandle h;
    ~Remove() { at::removeCallback(h); }
  } remove{counter};
  f();
  return products.load();
}

void check_same(const std::vector<at::Tensor>& packed, const std::vector<at::Tensor>& plain) {
  REQUIRE(packed.size() == plain.size());
  for (size_t i = 0; i < packed.size(); ++i) {
    INFO("tensor " << i);
    REQUIRE(packed[i].defined());
    REQUIRE(plain[i].defined());
    INFO("max |diff| " << (packed[i] - plain[i]).abs().max().item<double>() << " of max "
                       << plain[i].abs().max().item<double>());
    CHECK(at::allclose(packed[i], plain[i], 1e-4, 1e-5));
  }
}

}  // namespace

TEST_CASE("pack_weights: a recurrence's values and gradients are the same with the packed product and OpenBLAS",
          "[backend][packed]") {
  // A chain of 6 steps over 7 examples: every product is packed (forward, and
  // dX in backward).
  auto run = [](bool pack) {
    // Small enough that tanh does not saturate (whose derivative there would
    // magnify any rounding).
    const at::Tensor W = param({40, 40}, 31, 0.05), b = param({40}, 32);
    return chain_results(pack, {W, b}, [&](Expr h) { return dsl::tanh(dsl::affine(W, h, b)); }, 6);
  };
  std::vector<at::Tensor> packed, plain;
  const int packed_products = packed_products_in([&] { packed = run(true); });
  const int plain_products = packed_products_in([&] { plain = run(false); });
  // Every step forward, and dX in backward.
  if (packed_gemm_available()) CHECK(packed_products >= 12);
  CHECK(plain_products == 0);
  check_same(packed, plain);
}

TEST_CASE("pack_weights: a frozen weight still passes gradients to its input and bias", "[backend][packed]") {
  // The packed product records no autograd of its own: a frozen W with
  // autograd on must take the path that does (at::linear).
  auto run = [](bool pack) {
    const at::Tensor W = param({40, 40}, 33, 0.05).requires_grad_(false), b = param({40}, 34);
    return chain_results(
        pack, {b}, [&](Expr h) { return dsl::tanh(dsl::affine(W, h, b) + dsl::matmul(W, h)); }, 3);
  };
  check_same(run(true), run(false));
}

TEST_CASE("a partial backward through a product's per-example bias leaves its weight's gradient exact", "[backend]") {
  // grad() for r runs each product's node (r feeds the bias) but not the
  // weight's node: nothing may be left for the full backward after.
  at::Tensor W = param({5, 5}, 25), r = param({5}, 26);
  check_w_grad_after_partial(W, r, [&](Graph& g) {
    std::vector<Expr> ys;
    for (int i = 0; i < 4; ++i) {
      auto s = g.example(i);
      const Expr x = g.input(data({5}, i));
      ys.push_back(dsl::sum(dsl::tanh(dsl::affine(W, x, dsl::tanh(x * g.param(r))))));
    }
    Expr loss = dsl::sum(ys);
    g.forward(loss);
    return loss;
  });
}

TEST_CASE("a weight updated in place between rounds of one graph: later rounds read the new values", "[backend]") {
  at::Tensor W = param({5, 5}, 23), b = param({5}, 24);
  Graph g;
  auto apply = [&](Expr x) { return dsl::affine(W, dsl::affine(W, x, b), b); };  // two uses a round: W^T kept
  std::vector<Expr> xs, first, second;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    xs.push_back(g.input(data({5}, i)));
    first.push_back(apply(xs.back()));
  }
  g.forward(first);
  {
    c10::NoGradGuard no_grad;
    W.mul_(-0.5);
  }
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    second.push_back(apply(xs[static_cast<size_t>(i)]));
  }
  g.forward(second);
  c10::NoGradGuard no_grad;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = data({5}, i);
    const at::Tensor expected = at::addmv(b, W, at::addmv(b, W, x));
    CHECK(at::allclose(second[static_cast<size_t>(i)].value(), expected, 1e-5, 1e-5));
  }
}

TEST_CASE("parameters on another device are refused with a clear error", "[backend][errors]") {
  if (!test::cuda_available()) {
    // Here the graph itself cannot be on CUDA; the process stays usable.
    REQUIRE_THROWS_WITH(Graph({.device = c10::kCUDA}), Contains("graph on cuda") && Contains("no CUDA"));
    Graph g;
    CHECK(g.options().device == c10::Device(c10::kCPU));
    return;
  }
  Graph g;
  REQUIRE_THROWS_WITH(g.param(at::randn({2}, at::kCUDA)), Contains("graph runs on cpu"));
  Graph gpu({.device = c10::kCUDA});
  REQUIRE_THROWS_WITH(gpu.param(at::randn({2})), Contains("op 'param'") && Contains("graph runs on cuda:0"));
  CHECK_NOTHROW(gpu.param(at::randn({2}, at::kCUDA)));  // "cuda" is the current device, cuda:0
}

namespace {

// Examples of different lengths, each a chain of affine+tanh with a countdown
// loop on the side: structure that batches and a round of control flow.
std::vector<Expr> record_batch(Graph& g, const at::Tensor& W, const at::Tensor& b, size_t batch, int examples) {
  std::vector<Expr> out;
  for (int i = 0; i < examples; ++i) {
    auto scope = g.example(i);
    const int ex = static_cast<int>(batch) * 100 + i;
    Expr h = g.input(data({3}, ex));
    for (int t = 0; t < 1 + (ex % 4); ++t) h = dsl::tanh(dsl::affine(W, h, b));
    out.push_back(dsl::sum(h));
    out.push_back(dsl::loop(g.input(at::full({}, static_cast<double>(ex % 3))), [](Expr x) { return x > 0.0; },
                            [](Expr x) { return x - 1.0; }));
  }
  return out;
}

}  // namespace

TEST_CASE("prepare schedules the first round, forward then runs it, later records and control flow", "[backend]") {
  const at::Tensor W = param({3, 3}, 3), b = param({3}, 4);
  Graph plain, prepared;
  std::vector<Expr> a = record_batch(plain, W, b, 0, 7);
  std::vector<Expr> p = record_batch(prepared, W, b, 0, 7);
  plain.forward(a);
  prepared.prepare(p);
  CHECK(prepared.stats().batches == 0);  // nothing launched yet
  CHECK(prepared.stats().schedule_ms > 0);
  Expr late = dsl::tanh(p[0]);  // recorded after prepare: runs in the loop's next round
  prepared.forward(p);
  for (size_t k = 0; k < a.size(); ++k) CHECK(at::equal(a[k].value(), p[k].value()));
  CHECK(at::allclose(late.value(), at::tanh(a[0].value())));
  CHECK(prepared.stats().batches == plain.stats().batches + 1);
  CHECK(prepared.stats().rounds == plain.stats().rounds);
  CHECK(prepared.stats().replans == 0);  // the prepared round ran as planned
}

TEST_CASE("Prefetcher: each batch's values and gradients as one graph per batch gives, errors reach take", "[backend]") {
  const at::Tensor W = param({3, 3}, 5), b = param({3}, 6);
  const size_t n = 6;
  std::vector<at::Tensor> want_values, want_grads;
  for (size_t k = 0; k < n; ++k) {
    Graph g;
    std::vector<Expr> out = record_batch(g, W, b, k, 2 + static_cast<int>(k));
    g.forward(out);
    out[0].value().backward();
    want_values.push_back(out[1].value().clone());
    want_grads.push_back(W.grad().clone());
    W.mutable_grad() = at::Tensor();
  }

  Prefetcher pf({}, [&](Graph& g, size_t k) {
    if (k == 4) (void)dsl::affine(W, g.input(at::ones({2})), b);  // a shape mismatch, on the worker
    return record_batch(g, W, b, k, 2 + static_cast<int>(k));
  });
  for (size_t k = 0; k < n; ++k) {
    const std::optional<size_t> next = k + 1 < n ? std::optional(k + 1) : std::nullopt;
    if (k == 4) {
      REQUIRE_THROWS_WITH(pf.take(k, next), Contains("op 'affine'"));
      continue;
    }
    if (k == 3) {  // batch 4 fails on the worker, which take(3) does not report; take(4) does
      CHECK_NOTHROW(pf.take(k, next));
      continue;
    }
    Prefetcher::Batch batch = pf.take(k, next);
    batch.graph.forward(batch.targets);
    batch.targets[0].value().backward();
    CHECK(at::equal(batch.targets[1].value(), want_values[k]));
    CHECK(at::allclose(W.grad(), want_grads[k]));
    W.mutable_grad() = at::Tensor();
  }
  // Skipping ahead: batch 4 fails on the worker, and take(5) drops it, error
  // and all, and records batch 5 itself.
  (void)pf.take(3, 4);
  Prefetcher::Batch batch = pf.take(5);
  batch.graph.forward(batch.targets);
  CHECK(at::equal(batch.targets[1].value(), want_values[5]));
}

TEST_CASE("Prefetcher: the worker records under the mode of the take that posted its batch", "[backend]") {
  const at::Tensor W = param({3, 3}, 5), b = param({3}, 6);
  std::vector<std::pair<bool, bool>> modes(4);  // per batch: (grad, inference) while it recorded
  Prefetcher pf({}, [&](Graph& g, size_t k) {
    modes[k] = {c10::GradMode::is_enabled(), c10::InferenceMode::is_enabled()};
    return record_batch(g, W, b, k, 2);
  });
  {
    c10::InferenceMode inference;
    Prefetcher::Batch batch = pf.take(0, 1);  // 0 here, 1 on the worker: both under InferenceMode
    batch.graph.forward(batch.targets);
    CHECK(batch.targets[1].value().is_inference());
  }
  {
    c10::NoGradGuard no_grad;
    Prefetcher::Batch batch = pf.take(1, 2);  // 2 on the worker: without autograd, not InferenceMode
    batch.graph.forward(batch.targets);
  }
  Prefetcher::Batch batch = pf.take(2, 3);  // 3 on the worker: autograd on
  batch.graph.forward(batch.targets);
  (void)pf.take(3);
  CHECK(modes[0] == std::pair(false, true));
  CHECK(modes[1] == std::pair(false, true));
  CHECK(modes[2] == std::pair(false, false));
  CHECK(modes[3] == std::pair(true, false));
}

TEST_CASE("Prefetcher: take from its own record function is a UserError and not a hang", "[backend]") {
  const at::Tensor W = param({3, 3}, 5), b = param({3}, 6);
  Prefetcher* self = nullptr;
  Prefetcher pf({}, [&](Graph& g, size_t k) {
    if (k == 1) (void)self->take(0);  // on the worker: it would wait for itself
    return record_batch(g, W, b, k, 2);
  });
  self = &pf;
  (void)pf.take(0, 1);  // batch 1 on the worker
  REQUIRE_THROWS_WITH(pf.take(1), Contains("from its own record function"));
  Prefetcher::Batch batch = pf.take(2);  // and the Prefetcher goes on
  batch.graph.forward(batch.targets);
  CHECK(batch.targets[1].value().defined());
}

TEST_CASE("Prefetcher: a take from a second thread is a UserError, not another thread's batch", "[backend]") {
  const at::Tensor W = param({3, 3}, 5), b = param({3}, 6);
  Prefetcher pf({}, [&](Graph& g, size_t k) { return record_batch(g, W, b, k, 2); });
  (void)pf.take(0, 1);
  std::string error;
  std::thread([&] {
    try {
      (void)pf.take(1);
    } catch (const UserError& e) {
      error = e.what();
    }
  }).join();
  CHECK_THAT(error, Contains("from a second thread"));
  Prefetcher::Batch batch = pf.take(1);  // the first thread's takes go on
  batch.graph.forward(batch.targets);
  CHECK(batch.targets[1].value().defined());
}

TEST_CASE("Prefetcher: a batch's graph used after the next take is a UserError and not a race", "[backend]") {
  const at::Tensor W = param({3, 3}, 5), b = param({3}, 6);
  Prefetcher pf({}, [&](Graph& g, size_t k) { return record_batch(g, W, b, k, 2); });
  Prefetcher::Batch first = pf.take(0, 1);
  Graph& kept = first.graph;
  kept.forward(first.targets);
  Prefetcher::Batch second = pf.take(1, 2);  // batch 2 goes to the worker, into `kept`
  REQUIRE(&second.graph != &kept);
  // (Catch's combined matchers hold their parts by address: one per check.)
  CHECK_THROWS_WITH(kept.forward(first.targets), Contains("sheaf::Prefetcher's") && Contains("until the next take()"));
  CHECK_THROWS_WITH(kept.prepare(second.targets), Contains("sheaf::Prefetcher's") && Contains("until the next take()"));
  CHECK_THROWS_WITH(kept.clear(), Contains("sheaf::Prefetcher's") && Contains("until the next take()"));
  second.graph.forward(second.targets);  // the batch take() returned last is the caller's
  Prefetcher::Batch third = pf.take(2);
  REQUIRE(&third.graph == &kept);  // handed out again: the caller's once more
  third.graph.forward(third.targets);
  Graph alone;
  const std::vector<Expr> expected = record_batch(alone, W, b, 2, 2);
  alone.forward(expected);
  for (size_t k = 0; k < expected.size(); ++k) CHECK(at::equal(third.targets[k].value(), expected[k].value()));
}

// A fused batch keeps inside its kernel a value nothing read when it ran; a
// branch recorded later reads two of its rows, by two different ops, in one
// round. The plan splits the batch into pieces for those reads: it needs the
// batch's row count while the value is still unmade (backend/lazy.h).
TEST_CASE("a later round reads parts of a value a fused kernel kept inside", "[backend][fusion][control]") {
  Graph g;
  std::vector<Expr> ts, ys;
  for (int i = 0; i < 4; ++i) {
    auto s = g.example(i);
    ts.push_back(dsl::tanh(g.input(data({3}, i))));
    ys.push_back(ts.back() * 2.0);
  }
  for (int i = 0; i < 2; ++i) {
    auto s = g.example(i);
    const Expr t = ts[static_cast<size_t>(i)];
    ys[static_cast<size_t>(i)] = dsl::cond(dsl::sum(ys[static_cast<size_t>(i)]) > -100.0,
                                           i == 0 ? std::function<Expr()>([=] { return t * 3.0; })
                                                  : std::function<Expr()>([=] { return dsl::sigmoid(t); }),
                                           [=] { return t; });
  }
  g.forward(ys);
  // The branches' round read two parts of the kept-inside value: one split.
  REQUIRE(sheaf::detail::engine_of(g).last_plan() != nullptr);
  CHECK(sheaf::detail::engine_of(g).last_plan()->splits.size() == 1);
  CHECK(at::allclose(ys[0].value(), at::tanh(data({3}, 0)) * 3.0));
  CHECK(at::allclose(ys[1].value(), at::sigmoid(at::tanh(data({3}, 1)))));
  for (int i = 2; i < 4; ++i) CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), at::tanh(data({3}, i)) * 2.0));
}

namespace {

// OpenBLAS's entry points, looked up here apart from the code under test.
struct OpenBlasEntries {
  int (*threads)() = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  int (*parallel)() = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  char* (*config)() = reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  void (*set_threads)(int) = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
};

// The thread counts as the other tests found them, put back whatever fails
// (the BLAS first: an OpenMP OpenBLAS sets LibTorch's OpenMP count too).
struct ThreadsAsFound {
  OpenBlasEntries openblas;
  int torch = at::get_num_threads();
  int blas = openblas.threads ? openblas.threads() : 0;
  ~ThreadsAsFound() {
    if (openblas.set_threads && blas > 0) openblas.set_threads(blas);
    at::set_num_threads(torch);
  }
};

}  // namespace

// OpenBLAS's pthread build keeps a pool of its own beside LibTorch's: two
// pools of n threads on n cores spin against each other (hand-batched
// training ran 3-4x slower). set_threads gives the n threads to the BLAS
// there, and to both where they share one pool (MKL, OpenBLAS's OpenMP build).
TEST_CASE("set_threads gives the threads to one pool and not to two that spin against each other",
          "[backend][threads]") {
  const ThreadsAsFound restore;
  const auto [blas_threads, parallel, config, set_blas] = restore.openblas;
  INFO(runtime_info());
  const bool openblas = blas_threads && parallel && set_blas && !at::hasMKL();
  if (openblas && config) {  // the build's own word, apart from the code under test
    const bool openmp = std::string(config()).find("USE_OPENMP") != std::string::npos;
    CHECK(parallel() == (openmp ? 2 : parallel() == 0 ? 0 : 1));
  }
  const bool own_pool = openblas && parallel() == 1;
  // What OpenBLAS makes of 3 (a serial build, or one built for fewer cores, caps it).
  int blas3 = 0;
  if (set_blas) {
    set_blas(3);
    blas3 = blas_threads ? blas_threads() : 0;
  }
  set_threads(3);
  CHECK(at::get_num_threads() == (own_pool ? 1 : 3));
  if (blas_threads) CHECK(blas_threads() == blas3);
  set_threads(2, 2);  // both as given
  CHECK(at::get_num_threads() == 2);
  set_threads(1);
  CHECK(at::get_num_threads() == 1);
  if (blas_threads) CHECK(blas_threads() == 1);
  CHECK_THROWS_AS(set_threads(0), UserError);
  CHECK_THROWS_AS(set_threads(1, 0), UserError);
}

// Where OpenBLAS keeps a pool of its own with more threads than LibTorch's
// (set_threads(n) there), a large product runs faster on OpenBLAS's threads
// than the packed kernel on LibTorch's one; small ones stay packed.
TEST_CASE("the packed product leaves large products to a BLAS with more threads of its own",
          "[backend][threads][packed]") {
  // The rule, given the thread counts (BLAS's own pool, LibTorch's).
  CHECK_FALSE(packed_gemm_serves(64, 128, 1024, 2, 1));
  CHECK_FALSE(packed_gemm_serves(4096, 512, 2048, 8, 2));
  CHECK(packed_gemm_serves(64, 128, 1024, 2, 2));  // as many threads on LibTorch's side
  CHECK(packed_gemm_serves(64, 128, 1024, 0, 1));  // no pool of its own
  CHECK(packed_gemm_serves(63, 512, 2048, 2, 1));  // below the sizes measured (ops/packed_gemm.h)
  CHECK(packed_gemm_serves(4096, 64, 4096, 2, 1));
  CHECK(packed_gemm_serves(4096, 256, 64, 2, 1));
  CHECK(packed_gemm_serves(4096, 416, 128, 2, 1));

  // The thread counts as set_threads leaves them.
  const ThreadsAsFound restore;
  const OpenBlasEntries& openblas = restore.openblas;
  set_threads(2, 1);
  // A pthread OpenBLAS that took the 2 threads (one built with MAX_THREADS=1
  // keeps one), told apart from the code under test.
  const bool wider = !at::hasMKL() && openblas.parallel && openblas.parallel() == 1 && openblas.threads &&
                     openblas.threads() > 1;
  INFO(runtime_info());
  CHECK(packed_gemm_serves(64, 128, 1024) == !wider);
  CHECK(packed_gemm_serves(63, 128, 1024));
  set_threads(2, 2);
  CHECK(packed_gemm_serves(64, 128, 1024));
  set_threads(1, 1);
  CHECK(packed_gemm_serves(64, 128, 1024));
  if (!wider) WARN("no BLAS with a pool of its own here: the graph below takes the packed path throughout");

  // One affine of W [1024, 128] over 64 examples, after a small one (which
  // stays packed), in training and in inference (where the packed kernel
  // would read the large product's rows in place: the BLAS gets them gathered).
  const at::Tensor W1 = param({128, 16}, 41, 0.2), b1 = param({128}, 42);
  const at::Tensor W = param({1024, 128}, 43, 0.1), b = param({1024}, 44);
  auto run = [&](bool pack, bool train) {
    for (const at::Tensor& p : {W1, b1, W, b}) p.mutable_grad() = at::Tensor();
    c10::AutoGradMode grad(train);
    Graph g(GraphOptions{.pack_weights = pack});
    std::vector<Expr> ys;
    std::vector<at::Tensor> xs;
    for (int i = 0; i < 64; ++i) {
      auto s = g.example(i);
      xs.push_back(data({16}, i));
      const Expr h = dsl::tanh(dsl::affine(W1, g.input(xs.back()), b1));
      ys.push_back(dsl::tanh(dsl::affine(W, h, b)));
    }
    std::vector<at::Tensor> out;
    if (!train) {
      g.forward(ys);
      for (const Expr& y : ys) out.push_back(y.value());
      return out;
    }
    Expr loss = dsl::sum(ys[0] * ys[0]);
    for (size_t i = 1; i < ys.size(); ++i) loss = loss + dsl::sum(ys[i] * ys[i]);
    g.forward(loss);
    loss.value().backward();
    return std::vector<at::Tensor>{loss.value().detach(), W1.grad(), b1.grad(), W.grad(), b.grad()};
  };
  for (const bool train : {true, false}) {
    INFO((train ? "training" : "inference"));
    set_threads(1, 1);
    std::vector<at::Tensor> one, two, plain;
    const int one_thread = packed_products_in([&] { one = run(true, train); });
    set_threads(2, 1);
    const int two_threads = packed_products_in([&] { two = run(true, train); });
    const int unpacked = packed_products_in([&] { plain = run(false, train); });
    CHECK(unpacked == 0);
    if (packed_gemm_available()) {
      // Training: both products forward, and dX of the large one in backward.
      CHECK(one_thread == (train ? 3 : 2));
      CHECK(two_threads == (wider ? 1 : one_thread));
    }
    // Sums over 64 rows of 1024: rounding to the tensor's scale, not each element's.
    auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("tensor " << i);
        const double scale = b[i].abs().max().item<double>();
        CHECK((a[i] - b[i]).abs().max().item<double>() <= 1e-5 * scale);
      }
    };
    same(one, plain);
    same(two, plain);
  }
}
