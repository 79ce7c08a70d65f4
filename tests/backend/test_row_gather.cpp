// Row gathers on their own, on the CPU and (tagged [cuda]) with the CUDA row
// kernels: values equal index_select, gradients equal those of plain reads,
// and every gather of a round from one source shares ONE gradient buffer (the
// hub) that reaches the source once.
#include <sheaf/backend/row_copies.h>
#include <sheaf/backend/row_gather.h>
#include <sheaf/ops/matvec.h>

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include "../support.h"

using namespace sheaf;

namespace {

const Site kSite{"matmul", kSharedExample, {}};  // the op that reads rows in place (its errors name it)

at::Tensor rows_of(const at::Tensor& src, std::vector<int64_t> rows) {
  return src.index_select(0, at::tensor(rows, at::kLong).to(src.device()));
}

void check_shared_sources(const c10::Device& device) {
  at::manual_seed(5);
  auto randn = [&](std::vector<int64_t> sizes) { return at::randn(sizes).to(device); };
  const at::Tensor a0 = randn({6, 2, 3}), b0 = randn({4, 2, 3});
  const at::Tensor wx = randn({5, 2, 3}), wy = randn({3, 2, 3});

  at::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  // Non-leaf sources, as batch outputs are: their gradient goes through a node.
  const at::Tensor sa = a * 1.0, sb = b * 1.0;
  RowGathers gathers;
  const std::vector<const at::Tensor*> both{&sa, &sb};
  const std::vector<uint32_t> batches{10, 11};
  // x: rows a5, b0, a1, a5 (a repeat accumulates), b3; y: rows b1, a0, a2.
  const std::vector<RowPick> px{{0, 5}, {1, 0}, {0, 1}, {0, 5}, {1, 3}};
  const std::vector<const at::Tensor*> ba{&sb, &sa};
  const std::vector<uint32_t> batches_ba{11, 10};
  const std::vector<RowPick> py{{0, 1}, {1, 0}, {1, 2}};
  const at::Tensor x = gathers.gather(both, batches, px);
  const at::Tensor y = gathers.gather(ba, batches_ba, py);
  REQUIRE(x.sizes() == at::IntArrayRef({5, 2, 3}));
  CHECK(at::equal(x.detach(), at::stack({sa[5], sb[0], sa[1], sa[5], sb[3]}).detach()));
  CHECK(at::equal(y.detach(), at::stack({sb[1], sa[0], sa[2]}).detach()));
  ((x * wx).sum() + (y * wy).sum()).backward();

  at::Tensor a2 = a0.clone().requires_grad_(), b2 = b0.clone().requires_grad_();
  const at::Tensor xr = at::stack({a2[5], b2[0], a2[1], a2[5], b2[3]});
  const at::Tensor yr = at::cat({rows_of(b2, {1}), rows_of(a2, {0, 2})});
  ((xr * wx).sum() + (yr * wy).sum()).backward();
  CHECK(at::allclose(a.grad(), a2.grad(), 1e-6, 1e-6));
  CHECK(at::allclose(b.grad(), b2.grad(), 1e-6, 1e-6));

  // Both gathers reach source a through the same node: one gradient for a.
  auto hub_of = [](const at::Tensor& g, size_t k) { return g.grad_fn()->next_edges()[k].function.get(); };
  CHECK(hub_of(x, 0) == hub_of(y, 1));
  CHECK(hub_of(x, 1) == hub_of(y, 0));
  CHECK(hub_of(x, 0)->name() == "sheaf::GatherHub");
}

void check_side_by_side(const c10::Device& device) {
  at::manual_seed(9);
  const at::Tensor a0 = at::randn({4, 3}).to(device), b0 = at::randn({3, 2}).to(device);
  at::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  const at::Tensor sa = a * 1.0, sb = b * 1.0;
  RowGathers gathers;
  const std::vector<const at::Tensor*> srcs{&sa, &sb};
  const std::vector<uint32_t> batches{1, 2};
  // Rows [a3 | b0 | a1], [a0 | b2 | a1]: three segments of two rows.
  const std::vector<RowPick> picks{{0, 3}, {0, 0}, {1, 0}, {1, 2}, {0, 1}, {0, 1}};
  const std::vector<int64_t> sizes{2, 8};
  const at::Tensor y = gathers.gather(srcs, batches, picks, 3, sizes);
  const at::Tensor w = at::randn({2, 8}).to(device);
  (y * w).sum().backward();

  at::Tensor a2 = a0.clone().requires_grad_(), b2 = b0.clone().requires_grad_();
  const at::Tensor ref = at::stack({at::cat({a2[3], b2[0], a2[1]}), at::cat({a2[0], b2[2], a2[1]})});
  CHECK(at::equal(y.detach(), ref.detach()));
  (ref * w).sum().backward();
  CHECK(at::allclose(a.grad(), a2.grad(), 1e-6, 1e-6));
  CHECK(at::allclose(b.grad(), b2.grad(), 1e-6, 1e-6));
}

}  // namespace

TEST_CASE("row gathers: values and gradients equal index_select reads, sources shared across gathers",
          "[backend][gather]") {
  check_shared_sources(c10::kCPU);
}

TEST_CASE("row gathers: no autograd node without a gradient, strided rows, backward twice", "[backend][gather]") {
  RowGathers gathers;
  const at::Tensor src = at::arange(24, at::kFloat).view({4, 6});
  const at::Tensor strided = src.narrow(1, 2, 3);  // rows of 3 contiguous floats, 6 apart
  REQUIRE(RowGathers::readable(strided));
  CHECK_FALSE(RowGathers::readable(src.t()));
  const std::vector<const at::Tensor*> one{&strided};
  const std::vector<uint32_t> batch{0};
  const at::Tensor x = gathers.gather(one, batch, std::vector<RowPick>{{0, 3}, {0, 0}});
  CHECK_FALSE(x.requires_grad());
  CHECK(at::equal(x, at::stack({strided[3], strided[0]})));

  const at::Tensor leaf = at::randn({3, 2}).requires_grad_();
  const std::vector<const at::Tensor*> l{&leaf};
  RowGathers round;
  const at::Tensor y = round.gather(l, batch, std::vector<RowPick>{{0, 2}, {0, 2}});
  const at::Tensor loss = y.sum();
  loss.backward({}, /*retain_graph=*/true);
  loss.backward();
  CHECK(at::equal(leaf.grad(), at::tensor({0.f, 0.f, 0.f, 0.f, 4.f, 4.f}).view({3, 2})));
}

TEST_CASE("row gathers side by side: a concat of gathered rows, values and gradients", "[backend][gather]") {
  check_side_by_side(c10::kCPU);
}

TEST_CASE("CUDA: row gathers run as one kernel each way, with the CPU's values and gradients", "[backend][gather][cuda]") {
  SHEAF_SKIP_WITHOUT_CUDA();
  const c10::Device cuda(c10::kCUDA);
  REQUIRE(row_copies_on(cuda));  // NVRTC and the driver are there wherever CUDA is
  check_shared_sources(cuda);
  check_side_by_side(cuda);
}

// dot_rows and weighted_row_sums (ops/matvec.h) over rows read in place: the
// same values as over the gathered tensors, and the gradients reach the
// sources through their hubs, a repeated row (an encoder row read by every
// step) accumulating, two operands sharing one source, an empty segment, a
// source that needs no gradient, and a backward that asks for one source only.
TEST_CASE("row products over rows read in place: values and gradients equal those of gathered tensors",
          "[backend][gather][ops]") {
  at::manual_seed(13);
  const int64_t k = 11;  // the loops' 8-wide body and a tail
  const at::Tensor a0 = at::randn({6, k}), b0 = at::randn({3, k}), x0 = at::randn({5, k}), w0 = at::randn({7});
  const at::Tensor g_dot = at::randn({5}), g_sum = at::randn({3, k});
  // Rows a5 b0 a1 a5 b2 and b1 b1 a0 a2 a5; segments of 2, 0 and 3 rows;
  // weights w4 w0 w4 w6 w1.
  const std::vector<RowPick> pa{{0, 5}, {1, 0}, {0, 1}, {0, 5}, {1, 2}}, px{{1, 1}, {1, 1}, {0, 0}, {0, 2}, {0, 5}};
  const std::vector<RowPick> pw{{0, 4}, {0, 0}, {0, 4}, {0, 6}, {0, 1}};
  const std::vector<int64_t> counts{2, 0, 3};
  auto gathered = [](const at::Tensor& a, const at::Tensor& b, const std::vector<RowPick>& picks) {
    std::vector<at::Tensor> rows;
    for (const RowPick& p : picks) rows.push_back((p.source == 0 ? a : b)[p.row]);
    return at::stack(rows);
  };
  for (const bool in_place : {true, false}) {  // x and w read in place too, or tensors
    for (const bool b_grad : {true, false}) {
      for (const bool only_a : {false, true}) {  // a backward that asks for a's gradient alone
        INFO("x and w in place " << in_place << ", b needs a gradient " << b_grad << ", only a " << only_a);
        at::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_(b_grad);
        at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
        const at::Tensor sa = a * 1.0, sb = b * 1.0, sw = w * 1.0;  // batch outputs: non-leaf sources
        RowGathers gathers;
        const std::vector<const at::Tensor*> srcs{&sa, &sb}, wsrc{&sw};
        const std::vector<uint32_t> batches{3, 4}, wbatch{5};
        const std::shared_ptr<const InPlaceRows> ra = gathers.in_place(srcs, batches, pa, kSite);
        const std::shared_ptr<const InPlaceRows> rx = gathers.in_place(srcs, batches, px, kSite);
        const std::shared_ptr<const InPlaceRows> rw = gathers.in_place(wsrc, wbatch, pw, kSite);
        REQUIRE(ra->needs_grad());
        const at::Tensor xs = in_place ? at::Tensor() : x, ws = in_place ? at::Tensor() : rows_of(sw, {4, 0, 4, 6, 1});
        const at::Tensor dot = dot_rows(RowOperand{{}, ra.get()}, RowOperand{xs, in_place ? rx.get() : nullptr});
        const at::Tensor sum = weighted_row_sums(RowOperand{ws, in_place ? rw.get() : nullptr}, RowOperand{{}, ra.get()}, counts);
        const at::Tensor loss = (dot * g_dot).sum() + (sum * g_sum).sum();

        at::Tensor a2 = a0.clone().requires_grad_(), b2 = b0.clone().requires_grad_(b_grad);
        at::Tensor x2 = x0.clone().requires_grad_(), w2 = w0.clone().requires_grad_();
        const at::Tensor A = gathered(a2, b2, pa), X = in_place ? gathered(a2, b2, px) : x2;
        const at::Tensor dot2 = (A * X).sum(1);
        const auto parts = (rows_of(w2, {4, 0, 4, 6, 1}).unsqueeze(1) * A).split_with_sizes(counts);
        std::vector<at::Tensor> sums;
        for (const at::Tensor& part : parts) sums.push_back(part.sum(0));
        const at::Tensor sum2 = at::stack(sums);
        CHECK(at::allclose(dot.detach(), dot2.detach(), 1e-5, 1e-5));
        CHECK(at::allclose(sum.detach(), sum2.detach(), 1e-5, 1e-5));
        const at::Tensor loss2 = (dot2 * g_dot).sum() + (sum2 * g_sum).sum();
        if (only_a) {
          CHECK(at::allclose(torch::autograd::grad({loss}, {a})[0], torch::autograd::grad({loss2}, {a2})[0], 1e-5, 1e-5));
          continue;
        }
        loss.backward();
        loss2.backward();
        CHECK(at::allclose(a.grad(), a2.grad(), 1e-5, 1e-5));
        CHECK(at::allclose(w.grad(), w2.grad(), 1e-5, 1e-5));
        if (b_grad) CHECK(at::allclose(b.grad(), b2.grad(), 1e-5, 1e-5));
        if (!in_place) CHECK(at::allclose(x.grad(), x2.grad(), 1e-5, 1e-5));
      }
    }
  }
  // The products' nodes free the rows they read after a backward without
  // retain_graph: a second one is refused, as for any saved tensor.
  const at::Tensor a = a0.clone().requires_grad_(), sa = a * 1.0;
  RowGathers gathers;
  const std::vector<const at::Tensor*> src{&sa};
  const std::shared_ptr<const InPlaceRows> ra = gathers.in_place(src, std::vector<uint32_t>{0}, std::vector<RowPick>{{0, 5}, {0, 1}}, kSite);
  const at::Tensor dot = dot_rows(RowOperand{{}, ra.get()}, RowOperand{x0.narrow(0, 0, 2)});
  dot.sum().backward({}, /*retain_graph=*/true);
  dot.sum().backward();
  CHECK_THROWS_WITH(dot.sum().backward(), Catch::Contains("rows read in place were freed"));
  // A source changed in place after the rows were read: refused, not read again.
  {
    const at::Tensor sb = a * 1.0;
    const std::vector<const at::Tensor*> srcb{&sb};
    const std::shared_ptr<const InPlaceRows> rb =
        gathers.in_place(srcb, std::vector<uint32_t>{1}, std::vector<RowPick>{{0, 2}}, Site{"matmul", 4, {}});
    const at::Tensor d = dot_rows(RowOperand{{}, rb.get()}, RowOperand{x0.narrow(0, 0, 1).clone().requires_grad_()});
    sb.mul_(2.0);
    CHECK_THROWS_AS(d.sum().backward({}, /*retain_graph=*/true), UserError);
    CHECK_THROWS_WITH(d.sum().backward(), Catch::Contains("op 'matmul' (example 4)") &&
                                              Catch::Contains("its backward reads again") && Catch::Contains("changed in place since"));
  }
  // A source whose storage was replaced (a frozen table given new data:
  // set_data bumps no version): refused, its old rows are not read.
  {
    at::Tensor table = a0.clone();
    const std::vector<const at::Tensor*> srcd{&table};
    const std::shared_ptr<const InPlaceRows> rd =
        gathers.in_place(srcd, std::vector<uint32_t>{7}, std::vector<RowPick>{{0, 2}}, Site{"matmul", 3, {}});
    const at::Tensor x1 = x0.narrow(0, 0, 1).clone().requires_grad_();
    const at::Tensor d = dot_rows(RowOperand{{}, rd.get()}, RowOperand{x1});
    const int64_t version = table._version();
    table.set_data(at::randn({6, k}));
    REQUIRE(table._version() == version);  // what the version check alone would miss
    CHECK_THROWS_WITH(d.sum().backward(), Catch::Contains("op 'matmul' (example 3)") &&
                                              Catch::Contains("storage was replaced since"));
  }
  // Only what the gradients asked for is read again, and so checked, as
  // LibTorch's own nodes do: dA = g x reads x's rows, dx = g A reads A's.
  {
    const at::Tensor a1 = a0.clone().requires_grad_(), sc = a1 * 1.0;
    const std::vector<const at::Tensor*> srcc{&sc};
    const std::shared_ptr<const InPlaceRows> rc =
        gathers.in_place(srcc, std::vector<uint32_t>{2}, std::vector<RowPick>{{0, 3}, {0, 1}}, Site{"matmul", 5, {}});
    const at::Tensor x1 = x0.narrow(0, 0, 2).clone().requires_grad_(), sx = x1 * 1.0;
    const at::Tensor d = dot_rows(RowOperand{{}, rc.get()}, RowOperand{sx});
    const at::Tensor want_a = sx.detach().clone(), want_x = at::stack({a0[3], a0[1]});
    {
      c10::NoGradGuard no_grad;
      sc.mul_(2.0);  // A's source: its gradient needs x's rows only
    }
    CHECK(at::allclose(torch::autograd::grad({d.sum()}, {a1}, {}, /*retain_graph=*/true)[0].index_select(0, at::tensor(std::vector<int64_t>{3, 1})), want_a));
    CHECK_THROWS_AS(torch::autograd::grad({d.sum()}, {x1}, {}, /*retain_graph=*/true), UserError);
    const std::shared_ptr<const InPlaceRows> rc2 =  // sc's rows as they are now
        gathers.in_place(srcc, std::vector<uint32_t>{2}, std::vector<RowPick>{{0, 3}, {0, 1}}, Site{"matmul", 5, {}});
    const at::Tensor d2 = dot_rows(RowOperand{{}, rc2.get()}, RowOperand{sx});
    {
      c10::NoGradGuard no_grad;
      sx.mul_(3.0);  // x, a tensor: its gradient needs A's rows only
    }
    CHECK(at::allclose(torch::autograd::grad({d2.sum()}, {x1}, {}, /*retain_graph=*/true)[0], want_x * 2.0));
    CHECK_THROWS(torch::autograd::grad({d2.sum()}, {a1}));  // LibTorch's own check of the saved x
    // weighted_row_sums: dw = g . B reads B's rows, dB = w g reads w's.
    const at::Tensor w1 = at::randn({2}).requires_grad_(), sw = w1 * 1.0;
    const std::shared_ptr<const InPlaceRows> rb =
        gathers.in_place(srcc, std::vector<uint32_t>{2}, std::vector<RowPick>{{0, 3}, {0, 1}}, Site{"matmul", 6, {}});
    const at::Tensor s3 = weighted_row_sums(RowOperand{sw}, RowOperand{{}, rb.get()}, std::vector<int64_t>{2});
    {
      c10::NoGradGuard no_grad;
      sc.add_(1.0);  // B's source
    }
    const at::Tensor da = torch::autograd::grad({s3.sum()}, {a1}, {}, /*retain_graph=*/true)[0];
    CHECK(at::allclose(da[3], w1.detach()[0].expand({k})));
    CHECK(at::allclose(da[1], w1.detach()[1].expand({k})));
    CHECK_THROWS_AS(torch::autograd::grad({s3.sum()}, {w1}), UserError);
  }
  // Without a gradient: no node, the same values.
  c10::NoGradGuard no_grad;
  const std::vector<const at::Tensor*> srcs{&a0, &b0};
  const std::shared_ptr<const InPlaceRows> rows = gathers.in_place(srcs, std::vector<uint32_t>{1, 2}, pa, kSite);
  const at::Tensor y = dot_rows(RowOperand{{}, rows.get()}, RowOperand{x0});
  CHECK_FALSE(y.requires_grad());
  CHECK(at::allclose(y, (gathered(a0, b0, pa) * x0).sum(1), 1e-5, 1e-5));
}
