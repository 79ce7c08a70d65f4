// What a graph guarantees when user code throws, runs away, or uses large ids
// (docs/reliability.md): no example lost, no freed memory touched, clear errors.
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <fstream>
#include <memory>
#include <optional>
#include <set>

#include <sheaf/ops/autograd_node.h>

#include "../support.h"

using namespace sheaf;
using Catch::Contains;
using sheaf::test::data;

namespace {

// "test_reliability.cpp:<line>: ", as an error names a line of this file.
std::string at_line(int line) { return "test_reliability.cpp:" + std::to_string(line) + ":"; }

// Resident memory of this process, in MiB (Linux).
double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return static_cast<double>(resident) * 4096.0 / (1024.0 * 1024.0);
}

// Example i: x_i, then (after fetching sum(x_i)) x_i * that sum.
Task<Expr> scaled(Graph& g, int i, int fail_at = -1) {
  Expr x = g.input(data({3}, i));
  double s = co_await fetch_item(dsl::sum(x));
  if (i == fail_at) throw std::runtime_error("example " + std::to_string(i) + " failed");
  co_return x * s;
}

Task<Expr> parent(Graph& g, int i, int fail_at) {
  Expr y = co_await scaled(g, i, fail_at);
  co_return dsl::tanh(y);
}

// Waits on a task it does not own.
constexpr int kAwaitRefLine = __LINE__ + 2;  // its co_await's, which errors name
Task<Expr> await_ref(Task<Expr>& child) {
  Expr y = co_await child;
  co_return dsl::tanh(y);
}

// Waits on the same task twice.
Task<Expr> await_twice(Task<Expr>& child) {
  Expr a = co_await child;
  Expr b = co_await child;
  co_return a + b;
}

Task<std::vector<int64_t>> ids(Graph& g, int i) {
  Expr x = g.input(data({3}, i));
  const int64_t k = co_await fetch_argmax(x);
  co_return std::vector<int64_t>{k, k + 1};
}

Task<int64_t> read_ids_twice(Task<std::vector<int64_t>>& child) {
  const std::vector<int64_t> a = co_await child;
  const std::vector<int64_t> b = co_await child;  // a copy: not the moved-from vector
  co_return static_cast<int64_t>(a.size() + b.size());
}

// Moves its child's result out twice: the second is a UserError.
constexpr int kSecondMoveLine = __LINE__ + 3;
Task<int64_t> move_out_twice(Task<std::vector<int64_t>>& child) {
  const std::vector<int64_t> a = co_await std::move(child);
  const std::vector<int64_t> b = co_await std::move(child);
  co_return static_cast<int64_t>(a.size() + b.size());
}

// Results that cannot be copied: moved out of a temporary task, read in place from a named one.
Task<std::unique_ptr<int>> boxed(Graph& g) {
  Expr x = g.input(data({3}, 7));
  const double s = co_await fetch_item(dsl::sum(x * 0.0 + 1.0));
  co_return std::make_unique<int>(static_cast<int>(s));
}
Task<std::vector<std::unique_ptr<int>>> boxes(Graph& g) {
  std::vector<std::unique_ptr<int>> v;
  v.push_back(co_await boxed(g));
  co_return v;
}
Task<int> unbox(Graph& g) {
  Task<std::vector<std::unique_ptr<int>>> t = boxes(g);
  const std::vector<std::unique_ptr<int>>& v = co_await t;
  co_return *v[0];
}

}  // namespace

TEST_CASE("A: a parent destroyed while the child it awaits runs on is not resumed", "[engine][reliability][task]") {
  // The child outlives its parent: without unlinking them, the child's end
  // resumed the freed parent frame (ASan's stage sees a regression).
  Graph g;
  auto scope = g.example(1);
  Task<Expr> child = scaled(g, 1);
  std::optional<Task<Expr>> parent_task(await_ref(child));
  parent_task.reset();
  g.forward();
  REQUIRE(child.done());
  CHECK(at::allclose(child.result().value(), data({3}, 1) * data({3}, 1).sum()));
  // A child destroyed first leaves its parent waiting (as before the change);
  // what this guards, under ASan, is the parent's link to the freed child.
  std::optional<Task<Expr>> child2(scaled(g, 2));
  Task<Expr> parent2 = await_ref(*child2);
  child2.reset();
  g.forward();
  CHECK_FALSE(parent2.done());
}

TEST_CASE("A: a task awaited twice, by two tasks or after it finished, or moved from", "[engine][reliability][task]") {
  Graph g;
  auto scope = g.example(1);
  // Two tasks wait on one: the second is told, not left waiting forever.
  Task<Expr> shared = scaled(g, 1);
  Task<Expr> first = await_ref(shared);
  // (Thrown before the second task's first suspension: from the call that makes it.)
  REQUIRE_THROWS_WITH((void)await_ref(shared), Contains("another task already waits on") && Contains(at_line(kAwaitRefLine)));
  g.forward();
  REQUIRE(first.done());
  const at::Tensor y = data({3}, 1) * data({3}, 1).sum();
  CHECK(at::allclose(first.result().value(), at::tanh(y)));
  // After it finished, each co_await reads its value (a copy: the second read is not a moved-from value).
  Task<Expr> again = await_twice(shared);
  REQUIRE(again.done());
  g.forward();
  CHECK(at::allclose(again.result().value(), 2.0 * y));
  Task<std::vector<int64_t>> v = ids(g, 3);
  Task<int64_t> n = read_ids_twice(v);
  g.forward();
  REQUIRE(n.done());
  CHECK(n.result() == 4);
  // co_await std::move(task) moves the result out, once.
  Task<std::vector<int64_t>> w = ids(g, 5);
  Task<int64_t> twice = move_out_twice(w);
  REQUIRE_THROWS_WITH(g.forward(), Contains("moved out already") && Contains(at_line(kSecondMoveLine)));
  CHECK(twice.failed());
  Task<int> u = unbox(g);
  g.forward();
  REQUIRE(u.done());
  CHECK(u.result() == 3);
  // co_await of a moved-from task: a UserError in the awaiting task, not a null handle.
  Task<Expr> moved = scaled(g, 4);
  Task<Expr> owner = std::move(moved);
  REQUIRE_THROWS_WITH((void)await_ref(moved), Contains("empty task") && Contains(at_line(kAwaitRefLine)));
  g.forward();
  CHECK(owner.done());
}

TEST_CASE("clear() inside its graph's own forward or inside a function body is a UserError", "[engine][reliability]") {
  // It emptied the store that the forward (or the call being recorded) was
  // still reading: out-of-bounds reads (ASan), or freed function variants.
  Graph g;
  Expr x = g.input(at::ones({3}));
  Expr y = dsl::cond(dsl::sum(x) > 0.0, [&g, x] { g.clear(); return x; }, [x] { return x; });
  REQUIRE_THROWS_WITH(g.forward(y), Contains("op 'clear'") && Contains("this graph's own forward"));
  g.clear();  // outside forward: fine
  auto clear_in_task = [](Graph& h) -> Task<Expr> {
    Expr a = h.input(at::ones({2}));
    const double s = co_await fetch_item(dsl::sum(a));
    h.clear();
    co_return a * s;
  };
  Task<Expr> t = clear_in_task(g);
  REQUIRE_THROWS_WITH(g.forward(), Contains("op 'clear'"));
  g.clear();
  // Inside a body: the body's own graph, and the graph that calls it.
  auto own = sheaf::function("own", [](Expr a) { a.graph().clear(); return a; });
  REQUIRE_THROWS_WITH(own(g.input(at::ones({2}))), Contains("op 'clear'") && Contains("sheaf::Function's body"));
  auto caller = sheaf::function("caller", [&g](Expr a) { g.clear(); return a; });
  REQUIRE_THROWS_WITH(caller(g.input(at::ones({2}))), Contains("op 'clear'") && Contains("body records"));
  // The graph is usable after each.
  Expr z = dsl::tanh(g.input(at::ones({2})));
  g.forward(z);
  CHECK(at::allclose(z.value(), at::tanh(at::ones({2}))));
}

TEST_CASE("A: tasks destroyed before forward are withdrawn from the graph", "[engine][reliability][task]") {
  Graph g;
  {
    std::vector<Task<Expr>> tasks;
    auto record = [&] {
      for (int i = 0; i < 4; ++i) {
        auto scope = g.example(i);
        if (i == 2) throw std::runtime_error("bad data at example 2");
        tasks.push_back(scaled(g, i));
      }
    };
    REQUIRE_THROWS_WITH(record(), Contains("example 2"));
  }  // the two waiting tasks are destroyed here
  g.forward();  // must not resume freed frames (ASan checks this in CI)
  CHECK(g.stats().fetches == 0);
  // The graph is usable: a new task runs to the end.
  auto scope = g.example(9);
  Task<Expr> t = scaled(g, 9);
  g.forward();
  REQUIRE(t.done());
  CHECK(at::allclose(t.result().value(), data({3}, 9) * data({3}, 9).sum()));
}

TEST_CASE("B: a coroutine that throws during forward stops its example only", "[engine][reliability][task]") {
  Graph g;
  std::vector<Task<Expr>> tasks;
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    tasks.push_back(scaled(g, i, /*fail_at=*/1));
  }
  REQUIRE_THROWS_WITH(g.forward(), Contains("example 1 failed"));
  for (int i = 0; i < 4; ++i) {
    INFO("example " << i);
    REQUIRE(tasks[static_cast<size_t>(i)].done());
    if (i == 1) {
      CHECK(tasks[1].failed());
      REQUIRE_THROWS_WITH(tasks[1].result(), Contains("example 1 failed"));
      continue;
    }
    g.forward(tasks[static_cast<size_t>(i)].result());  // computed already: nothing to do
    CHECK(at::allclose(tasks[static_cast<size_t>(i)].result().value(), data({3}, i) * data({3}, i).sum()));
  }
  g.forward();  // a second forward has nothing left to report
}

TEST_CASE("B: several failures are listed, a failing child ends its parent", "[engine][reliability][task]") {
  Graph g;
  std::vector<Task<Expr>> tasks;
  for (int i = 0; i < 5; ++i) {
    auto scope = g.example(i);
    tasks.push_back(parent(g, i, /*fail_at=*/i % 2 ? i : -1));
  }
  REQUIRE_THROWS_WITH(g.forward(), Contains("2 examples failed") && Contains("example 1 failed") &&
                                       Contains("example 3 failed") && Contains("other examples completed"));
  for (int i = 0; i < 5; ++i) {
    REQUIRE(tasks[static_cast<size_t>(i)].done());
    CHECK(tasks[static_cast<size_t>(i)].failed() == (i % 2 == 1));
  }
  CHECK(at::allclose(tasks[4].result().value(), at::tanh(data({3}, 4) * data({3}, 4).sum())));
}

TEST_CASE("B: an exception in one example's cond branch leaves the others resolved", "[engine][reliability]") {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    Expr x = g.input(at::full({2}, static_cast<double>(i + 1)));
    ys.push_back(dsl::cond(dsl::sum(x) > 0.0, [=]() -> Expr {
      if (i == 2) throw std::runtime_error("branch of example 2");
      return x * 2.0;
    }, [=] { return x; }));
  }
  REQUIRE_THROWS_WITH(g.forward(ys), Contains("branch of example 2"));
  for (int i : {0, 1, 3}) CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), at::full({2}, 2.0 * (i + 1))));
  REQUIRE_THROWS_WITH(g.forward(ys[2]), Contains("could not be computed"));
  g.clear();  // and after clear() the graph is as new
  Expr z = g.input(at::ones({2})) * 3.0;
  g.forward(z);
  CHECK(at::allclose(z.value(), at::full({2}, 3.0)));
}

TEST_CASE("B: an exception in one example's loop body or condition leaves the others resolved",
          "[engine][reliability]") {
  const bool in_condition = GENERATE(false, true);
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    Expr x = g.input(at::full({2}, static_cast<double>(i + 2)));
    auto calls = std::make_shared<int>(0);  // the first condition is recorded by dsl::loop itself
    ys.push_back(dsl::loop(
        x,
        [=](Expr v) {
          if (in_condition && i == 1 && ++*calls == 2) throw std::runtime_error("condition of example 1");
          return dsl::sum(v) > 1.0;
        },
        [=](Expr v) {
          if (!in_condition && i == 1) throw std::runtime_error("body of example 1");
          return v * 0.5;
        }));
  }
  REQUIRE_THROWS_WITH(g.forward(ys), Contains(in_condition ? "condition of example 1" : "body of example 1"));
  for (int i : {0, 2, 3}) {
    INFO("example " << i);
    const at::Tensor v = ys[static_cast<size_t>(i)].value();
    CHECK(v.sum().item<double>() <= 1.0);  // ran to its own end
    CHECK(v.sum().item<double>() > 0.5);
  }
  REQUIRE_THROWS_WITH(g.forward(ys[1]), Contains("could not be computed"));
  g.clear();
  Expr z = g.input(at::ones({2})) * 3.0;
  g.forward(z);
  CHECK(at::allclose(z.value(), at::full({2}, 3.0)));
}

TEST_CASE("C: a runaway coroutine stops at max_rounds, naming the example and line", "[engine][reliability]") {
  Graph g;
  auto forever = [](Graph& g) -> Task<Expr> {
    Expr x = g.input(at::ones({1}));
    for (;;) x = x + co_await fetch_item(dsl::sum(x));  // never finishes
  };
  auto scope = g.example(5);
  Task<Expr> t = forever(g);
  REQUIRE_THROWS_WITH(g.forward({}, {.max_rounds = 300}),
                      Contains("300 rounds") && Contains("example 5") && Contains("op 'sum'") &&
                          Contains("test_reliability.cpp"));
  CHECK(ForwardOptions{}.max_rounds <= 100000);  // the default bounds a runaway to seconds, not hours
}

TEST_CASE("C: a runaway dsl::loop stops at max_iterations, naming the example", "[engine][reliability]") {
  Graph g;
  auto scope = g.example(4);
  Expr x = g.input(at::ones({1}));
  Expr y = dsl::loop(x, [](Expr s) { return dsl::sum(s) > 0.0; }, [](Expr s) { return s + 1.0; }, 50);
  REQUIRE_THROWS_WITH(g.forward(y), Contains("max_iterations = 50") && Contains("example 4") && Contains("op 'loop'"));
}

TEST_CASE("D: example ids are any int64, memory follows the examples, not the largest id", "[engine][reliability]") {
  Graph g;
  const double before = rss_mib();
  for (int64_t id : {int64_t{250'000'000}, int64_t{1} << 40, int64_t{7}}) {
    auto scope = g.example(id);
    Expr y = dsl::dropout(g.input(at::ones({4})), 0.5);  // dropout keys are per example
    CHECK(y.example() == id);
  }
  g.forward();
  CHECK(rss_mib() - before < 64.0);
  g.clear();
  CHECK(rss_mib() - before < 64.0);
  // The same example gets the same mask whatever its id's neighbours.
  auto mask_of = [](int64_t id, int64_t other) {
    Graph h;
    Expr kept;
    for (int64_t e : {other, id}) {
      auto scope = h.example(e);
      kept = dsl::dropout(h.input(at::ones({16})), 0.5);
    }
    h.forward(kept);
    return kept.value();
  };
  CHECK(at::equal(mask_of(int64_t{1} << 40, 3), mask_of(int64_t{1} << 40, 250'000'000)));
}

namespace {

// Stats of 8 examples that apply `model` to their input and a shared tensor
// `w`: the same tensor for all, or a copy made per example (no batching).
Stats split_stats(const at::Tensor& w, bool per_example_copy, Expr (*model)(const at::Tensor&, Expr)) {
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 8; ++i) {
    auto scope = g.example(i);
    ys.push_back(model(per_example_copy ? w * 1.0 : w, g.input(data({3}, i))));
  }
  g.forward(ys);
  return g.stats();
}

}  // namespace

TEST_CASE("F: a shared operand made per example is counted as a split batch", "[engine][reliability]") {
  auto model = [](const at::Tensor& w, Expr x) { return dsl::matmul(w, x); };
  const at::Tensor W = at::randn({3, 3});
  const Stats same = split_stats(W, false, model), copies = split_stats(W, true, model);
  CHECK(same.split_shared == 0);
  CHECK(copies.split_shared == 8);
  CHECK(copies.batches == same.batches + 7);
  CHECK_THAT(copies.str(), Contains("8 batches split by distinct shared operands"));
}

TEST_CASE("F: a shared operand made per example inside fused elementwise work is counted too",
          "[engine][reliability]") {
  auto model = [](const at::Tensor& v, Expr x) { return dsl::tanh(x * v); };  // mul and tanh: one fused region
  const at::Tensor V = at::randn({3});
  const Stats same = split_stats(V, false, model), copies = split_stats(V, true, model);
  CHECK(same.split_shared == 0);
  CHECK(copies.split_shared == 8);
  CHECK(copies.batches == same.batches + 7);
}

TEST_CASE("control flow costs host work in proportion to the nodes recorded, not nodes x rounds",
          "[engine][control][linear]") {
  // Each example: a chain of 20 conds, each deciding on the previous one's result.
  auto work_for = [](int examples) {
    Graph g;
    std::vector<Expr> outs;
    for (int i = 0; i < examples; ++i) {
      auto scope = g.example(i);
      Expr x = g.input(data({4}, i));
      for (int k = 0; k < 20; ++k)
        x = dsl::cond(dsl::sum(x) > 0.0, [=] { return x * 0.9 - 0.05; }, [=] { return x * 1.1 + 0.05; });
      outs.push_back(dsl::sum(x));
    }
    g.forward(outs);
    CHECK(g.stats().rounds >= 20);
    return static_cast<double>(g.stats().round_visits + g.stats().deferred_inferences + g.stats().waiter_visits);
  };
  const double small = work_for(32), large = work_for(256);
  INFO("counted work: 32 examples " << small << ", 256 examples " << large);
  CHECK(large <= 12 * small);  // 8x the examples: linear is 8x; a rescan per round was ~64x
  CHECK(large >= 6 * small);   // and the counters do count
}

TEST_CASE("conds with declared shapes, all recorded up front, cost host work in proportion to the conds",
          "[engine][control][linear]") {
  // Each example: a chain of `length` declared conds. Every cond is registered
  // before forward, so a delivery that scanned every live waiter per round
  // would cost conds x rounds (~length^2 per example).
  auto work_for = [](int length) {
    Graph g;
    std::vector<Expr> outs;
    for (int i = 0; i < 16; ++i) {
      auto scope = g.example(i);
      Expr x = g.input(data({4}, i));
      for (int k = 0; k < length; ++k)
        x = dsl::cond(dsl::sum(x) > 0.0, [=] { return x * 0.9 - 0.05; }, [=] { return x * 1.1 + 0.05; }, Shape{4});
      outs.push_back(dsl::sum(x));
    }
    g.forward(outs);
    CHECK(g.stats().rounds >= static_cast<uint64_t>(length));
    CHECK(g.stats().waiter_visits >= static_cast<uint64_t>(16 * length));  // each cond's waiter, once at least
    return static_cast<double>(g.stats().round_visits + g.stats().deferred_inferences + g.stats().waiter_visits);
  };
  const double short_chain = work_for(10), long_chain = work_for(80);
  INFO("counted work: 10 conds " << short_chain << ", 80 conds " << long_chain);
  CHECK(long_chain <= 12 * short_chain);  // 8x the conds: linear is 8x; a scan per round ~64x
  CHECK(long_chain >= 6 * short_chain);
}

// After a runaway forward the graph stays usable: a cond it resolved on the
// way, a round prepared over what waited on it, and nodes recorded on those
// afterwards all run. (A node found ready by prepare() runs without waking
// what waits on it: a change that parked new nodes on such a node at their
// recording left them never computed.)
TEST_CASE("C: after a runaway, prepare() and nodes recorded on its round still run", "[engine][reliability][control]") {
  Graph g;
  Expr x = g.input(data({4}, 3));
  Expr h = dsl::cond(dsl::sum(x) > 0.0, [=] { return x * 0.5; }, [=] { return x * 2.0; }, Shape{4});
  Expr w = dsl::tanh(h);
  REQUIRE_THROWS_WITH(g.forward({w}, {.max_rounds = 1}), Contains("max_rounds"));
  g.prepare(std::vector<Expr>{w});
  Expr z = w * 2.0;
  g.forward({z});
  const at::Tensor x0 = data({4}, 3);
  const at::Tensor want = 2.0 * at::tanh(x0.sum().item<double>() > 0 ? x0 * 0.5 : x0 * 2.0);
  CHECK(at::allclose(z.value(), want, 1e-5, 1e-6));
  CHECK(at::allclose(w.value(), want / 2.0, 1e-5, 1e-6));
}

TEST_CASE("A2: a task destroyed by another task's resumption in the same round is not resumed",
          "[engine][reliability][task]") {
  Graph g;
  std::optional<Task<Expr>> victim;
  int victim_resumed = 0;
  // Both wait on values of the same round; the first to resume destroys the other.
  auto killer = [&](Graph& gr) -> Task<Expr> {
    Expr x = gr.input(data({3}, 0));
    double s = co_await fetch_item(dsl::sum(x));
    victim.reset();
    co_return x * s;
  };
  auto waiting = [&](Graph& gr) -> Task<Expr> {
    Expr x = gr.input(data({3}, 1));
    double s = co_await fetch_item(dsl::sum(x));
    ++victim_resumed;
    co_return x * s;
  };
  std::optional<Task<Expr>> first;
  {
    auto scope = g.example(0);
    first.emplace(killer(g));
  }
  {
    auto scope = g.example(1);
    victim.emplace(waiting(g));
  }
  g.forward();  // must not resume the destroyed task's frame (ASan checks this in CI)
  CHECK(victim_resumed == 0);
  CHECK(!victim.has_value());
  REQUIRE(first->done());
  CHECK(at::allclose(first->result().value(), data({3}, 0) * data({3}, 0).sum()));
}

// A kernel that read rows where they lie (here one fused kernel reading
// rows from the affine batches of each example's depth) reads them again in
// its backward. A write into a value() between forward() and backward()
// would make those gradients wrong,
// without a word: it is a UserError naming the op, as a saved tensor's version
// check makes it for LibTorch's own ops.
TEST_CASE("a tensor read in place and changed before backward is a UserError and not wrong gradients",
          "[engine][reliability][gather]") {
  for (const bool write : {false, true}) {
    INFO("a write into a value between forward and backward: " << write);
    at::manual_seed(3);
    const at::Tensor W0 = at::randn({4, 4}) * 0.5, b0 = at::randn({4});
    at::Tensor W = W0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Graph g;
    std::vector<Expr> xs, tanhs, losses;
    for (int i = 0; i < 4; ++i) {
      auto scope = g.example(i);
      Expr x = g.input(data({4}, i));
      for (int d = 0; d <= i; ++d) x = dsl::affine(W, x, b);  // example i's x: from the affine batch of depth i
      xs.push_back(x);
      tanhs.push_back(dsl::tanh(x));  // kept inside the kernel: computed again when read
      losses.push_back(dsl::sum(tanhs.back() * dsl::sigmoid(x)));  // one fused kernel over rows of 4 batches
    }
    const Expr loss = dsl::sum(losses);
    g.forward(loss);
    REQUIRE(g.stats().in_place_inputs > 0);
    if (write) {
      {
        c10::NoGradGuard no_grad;
        xs[2].value().mul_(2.0);
      }
      REQUIRE_THROWS_WITH(tanhs[0].value(), Contains("test_reliability.cpp:") && Contains("computed when read") &&
                                                Contains("changed in place since"));
      REQUIRE_THROWS_AS(loss.value().backward({}, /*retain_graph=*/true), UserError);
      // The batch's first node: the tanh's op and line.
      REQUIRE_THROWS_WITH(loss.value().backward(), Contains("op 'tanh'") && Contains("test_reliability.cpp:") &&
                                                       Contains("its backward reads again") &&
                                                       Contains("changed in place since") && Contains("version is"));
      continue;
    }
    loss.value().backward();
    at::Tensor W2 = W0.clone().requires_grad_(), b2 = b0.clone().requires_grad_();
    at::Tensor ref = at::zeros({}, at::kFloat);
    for (int i = 0; i < 4; ++i) {
      at::Tensor x = data({4}, i);
      for (int d = 0; d <= i; ++d) x = at::addmv(b2, W2, x);
      ref = ref + (at::tanh(x) * at::sigmoid(x)).sum();
    }
    ref.backward();
    CHECK(at::allclose(W.grad(), W2.grad(), 1e-5, 1e-5));
    CHECK(at::allclose(b.grad(), b2.grad(), 1e-5, 1e-5));
    at::Tensor x = data({4}, 0);
    x = at::addmv(b0, W0, x);
    CHECK(at::allclose(tanhs[0].value(), at::tanh(x), 1e-5, 1e-5));
  }
}

// A fused value left inside its kernel is computed when read from the inputs
// forward read: where an input was a tensor (here the affine batch itself,
// read as a view) changed in place since, the read is refused too.
TEST_CASE("a fused value computed when read refuses an input tensor changed since forward",
          "[engine][reliability][fusion]") {
  at::manual_seed(4);
  const at::Tensor W = at::randn({4, 4}), b = at::randn({4});
  Graph g;
  std::vector<Expr> ys, tanhs, outs;
  for (int i = 0; i < 3; ++i) {
    auto scope = g.example(i);
    ys.push_back(dsl::affine(W, g.input(data({4}, i)), b));
    tanhs.push_back(dsl::tanh(ys.back()));
    outs.push_back(dsl::sum(tanhs.back() * dsl::sigmoid(ys.back())));
  }
  g.forward(outs);
  REQUIRE(g.stats().in_place_inputs == 0);  // the affine batch in row order: a view, not rows in place
  ys[0].value().mul_(2.0);
  REQUIRE_THROWS_AS(tanhs[2].value(), UserError);
  REQUIRE_THROWS_WITH(tanhs[2].value(), Contains("op 'tanh'") && Contains("computed when read") &&
                                            Contains("changed in place since"));
  // Unchanged, the same read computes the values as forward would have.
  Graph g2;
  std::vector<Expr> tanhs2, outs2;
  for (int i = 0; i < 3; ++i) {
    auto scope = g2.example(i);
    const Expr y = dsl::affine(W, g2.input(data({4}, i)), b);
    tanhs2.push_back(dsl::tanh(y));
    outs2.push_back(dsl::sum(tanhs2.back() * dsl::sigmoid(y)));
  }
  g2.forward(outs2);
  CHECK(at::allclose(tanhs2[2].value(), at::tanh(at::addmv(b, W, data({4}, 2))), 1e-5, 1e-5));
}

// Inference tensors keep no version counter: read in place under
// InferenceMode (batch outputs made there) or as a table made there, they are
// not checked, and nothing fails for it.
TEST_CASE("rows read in place from inference tensors run as before", "[engine][reliability][gather]") {
  at::manual_seed(5);
  const at::Tensor W = at::randn({4, 4}) * 0.5, b = at::randn({4});
  auto expected = [&](int i) {
    at::Tensor x = data({4}, i);
    for (int d = 0; d <= i; ++d) x = at::addmv(b, W, x);
    return (at::tanh(x) * at::sigmoid(x)).sum();
  };
  {
    c10::InferenceMode inference;
    Graph g;
    std::vector<Expr> ys;
    for (int i = 0; i < 4; ++i) {
      auto scope = g.example(i);
      Expr x = g.input(data({4}, i));
      for (int d = 0; d <= i; ++d) x = dsl::affine(W, x, b);
      ys.push_back(dsl::sum(dsl::tanh(x) * dsl::sigmoid(x)));
    }
    g.forward(ys);
    REQUIRE(g.stats().in_place_inputs > 0);
    for (int i = 0; i < 4; ++i) CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), expected(i), 1e-5, 1e-5));
  }
  // A frozen table made under InferenceMode (loaded weights), read in place
  // by placed lookups in a forward without autograd.
  at::Tensor table;
  {
    c10::InferenceMode inference;
    table = at::randn({10, 4});
  }
  c10::NoGradGuard no_grad;
  Graph g;
  std::vector<Expr> ys;
  for (int i = 0; i < 4; ++i) {
    auto scope = g.example(i);
    const Expr h = g.lookup(table, (7 * i) % 10);
    ys.push_back(dsl::sum(dsl::tanh(h) * dsl::sigmoid(h)));
  }
  g.forward(ys);
  REQUIRE(g.stats().in_place_inputs > 0);
  for (int i = 0; i < 4; ++i) {
    const at::Tensor h = table[(7 * i) % 10];
    CHECK(at::allclose(ys[static_cast<size_t>(i)].value(), (at::tanh(h) * at::sigmoid(h)).sum(), 1e-5, 1e-5));
  }
}

namespace {

// Runs `nested` once, from inside a node of another backward pass (autograd
// runs it there, on this thread, before that pass goes on).
struct ReentrantPass : torch::autograd::FunctionPreHook {
  std::function<void()> nested;
  bool* ran;
  ReentrantPass(std::function<void()> n, bool* r) : nested(std::move(n)), ran(r) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (!*ran) {
      *ran = true;
      nested();
    }
    return grads;
  }
};

// Throws while `armed`: a backward pass that fails midway.
struct FailingPass : torch::autograd::FunctionPreHook {
  const bool* armed;
  explicit FailingPass(const bool* a) : armed(a) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (*armed) throw std::runtime_error("a hook failed");
    return grads;
  }
};

// A small graph whose backward goes through gather hubs and a shared weight's
// gradient node: each example's chain reads rows of other batches and W.
struct CollectingGraph {
  at::Tensor W, E;
  Graph g;
  std::vector<Expr> outs;
  CollectingGraph() {
    at::manual_seed(3);
    W = (at::randn({8, 8}) * 0.3).requires_grad_();
    E = at::randn({10, 8}).requires_grad_();
    for (int64_t i = 0; i < 12; ++i) {
      auto scope = g.example(i);
      Expr h = g.lookup(E, i % 10);
      for (int64_t t = 0; t < 1 + i % 4; ++t) h = dsl::tanh(dsl::matmul(W, h) + g.lookup(E, (i + t) % 10));
      outs.push_back(dsl::sum(h));
    }
    g.forward(outs);
  }
  std::vector<at::Tensor> grads_of(const at::Tensor& out) const {
    return torch::autograd::grad({out}, {W, E}, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
  }
  // The nodes that collect (every hub and weight-gradient node) `out`'s backward reaches.
  static std::vector<torch::autograd::Node*> collectors(const at::Tensor& out) {
    std::vector<torch::autograd::Node*> stack{out.grad_fn().get()}, found;
    std::set<torch::autograd::Node*> seen;
    while (!stack.empty()) {
      torch::autograd::Node* n = stack.back();
      stack.pop_back();
      if (n == nullptr || !seen.insert(n).second) continue;
      if (n->name() == "sheaf::GatherHub" || n->name() == "sheaf::WeightGradBackward") found.push_back(n);
      for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
    }
    REQUIRE(std::any_of(found.begin(), found.end(), [](auto* n) { return n->name() == "sheaf::GatherHub"; }));
    REQUIRE(std::any_of(found.begin(), found.end(), [](auto* n) { return n->name() == "sheaf::WeightGradBackward"; }));
    return found;
  }
};

}  // namespace

TEST_CASE("a backward pass that throws midway leaves nothing to the next pass", "[engine][reliability][autograd]") {
  // A collector keeps what a pass's nodes sent until it runs. A pass that
  // threw before it ran left those sums behind, keyed by the pass's graph
  // task, and the next pass took them as its own where its task had the same
  // address (the usual case: the allocator hands the freed task's memory to
  // the next one), adding the failed pass's gradients into its own.
  // Checked twice: no entry is left (whatever the allocator does), and the
  // next pass's gradients are exact (where it reuses the address, as glibc's does).
  CollectingGraph c;
  const at::Tensor out = c.outs[5].value();
  const std::vector<at::Tensor> want = c.grads_of(out);
  const int64_t before = sheaf::detail::g_live_pass_entries.load();
  bool armed = true;
  for (torch::autograd::Node* n : CollectingGraph::collectors(out))
    n->add_pre_hook(std::make_unique<FailingPass>(&armed));
  for (int attempt = 0; attempt < 3; ++attempt) {
    CHECK_THROWS_WITH(c.grads_of(out), Catch::Contains("a hook failed"));
    CHECK(sheaf::detail::g_live_pass_entries.load() == before);
  }
  armed = false;
  const std::vector<at::Tensor> got = c.grads_of(out);
  CHECK(sheaf::detail::g_live_pass_entries.load() == before);
  for (size_t k = 0; k < want.size(); ++k) {
    INFO("parameter " << k);
    CHECK(at::allclose(got[k], want[k], 1e-5, 1e-6));
  }
}

TEST_CASE("two backward passes at once through one graph keep their gradients apart", "[engine][reliability][autograd]") {
  // A source's hub and a shared weight's pending rows collect what several
  // nodes of a pass send and hand it on once. A second pass that runs while
  // the first is halfway (a second thread's autograd::grad; here, one run
  // from inside the first, which interleaves them the same way every time)
  // took the first's sums, and the first lost them.
  CollectingGraph c;
  // (Taken now: a value() read inside a backward, where autograd is off, has no gradient.)
  const at::Tensor out_a = c.outs[3].value(), out_b = c.outs[7].value();
  const auto want_a = c.grads_of(out_a), want_b = c.grads_of(out_b);
  std::vector<at::Tensor> got_b;
  bool ran = false;
  for (torch::autograd::Node* n : CollectingGraph::collectors(out_a))
    n->add_pre_hook(std::make_unique<ReentrantPass>([&] { got_b = c.grads_of(out_b); }, &ran));
  const auto got_a = c.grads_of(out_a);
  REQUIRE(ran);
  for (size_t k = 0; k < want_a.size(); ++k) {
    INFO("parameter " << k);
    CHECK(at::allclose(got_a[k], want_a[k], 1e-5, 1e-6));
    CHECK(at::allclose(got_b[k], want_b[k], 1e-5, 1e-6));
  }
}

// A second derivative through Sheaf's own autograd nodes (fused kernels,
// gathers' hubs, batched and packed weight gradients, row products) left
// terms out and gave a wrong number without a word (a user's double backward
// read 236.5 where LibTorch gives 387.8). Their gradients are now handed on,
// under create_graph, through a node that refuses a second backward: the
// first derivative is still right, the second a UserError.
TEST_CASE("a second derivative through Sheaf's own nodes is a UserError, the first one still right",
          "[engine][reliability][autograd]") {
  const at::Tensor W = test::param({4, 4}, 61), b = test::param({4}, 62);
  for (const bool fuse : {true, false}) {
    INFO("fuse " << fuse);
    Graph g({.fuse = fuse, .batch_weight_grads = true});
    std::vector<Expr> ys;
    for (int i = 0; i < 4; ++i) {
      auto scope = g.example(i);
      Expr h = g.input(data({4}, i));
      for (int k = 0; k <= i; ++k) h = dsl::tanh(dsl::affine(W, h, b)) + h * 0.5;
      ys.push_back(dsl::sum(h * h));
    }
    const Expr total = dsl::sum(ys);
    g.forward(total);
    // The same in eager LibTorch: the first derivative agrees.
    at::Tensor eager = at::zeros({});
    for (int i = 0; i < 4; ++i) {
      at::Tensor h = data({4}, i);
      for (int k = 0; k <= i; ++k) h = at::tanh(at::addmv(b, W, h)) + h * 0.5;
      eager = eager + (h * h).sum();
    }
    const at::Tensor want = torch::autograd::grad({eager}, {W}, {}, true, true)[0];
    const at::Tensor gw = torch::autograd::grad({total.value()}, {W}, {}, true, true)[0];
    CHECK(at::allclose(gw, want, 1e-5, 1e-6));
    CHECK_THROWS_WITH(torch::autograd::grad({gw.pow(2).sum()}, {b}), Contains("second derivative"));
  }
}
