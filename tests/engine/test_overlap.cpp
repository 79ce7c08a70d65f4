// sheaf::Overlap: a batch run as parts on threads of their own, whose rounds
// take turns at the kernels. Each part's values and gradients are one
// graph's; kernels never run on two threads at once, and one part's host work
// runs while another's kernel does; a part's error is thrown
// by run() once every part is done; misuse is a UserError.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>

#include <sheaf/engine/engine.h>
#include <sheaf/ops/user_op.h>
#include <sheaf/scheduler/strategy.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "../support.h"

using namespace sheaf;
using Catch::Matchers::Contains;
using sheaf::test::data;
using sheaf::test::param;

namespace {

constexpr int64_t kD = 6;
constexpr int kExamples = 8;

// Inputs made up front: data() seeds LibTorch's one generator, which record
// functions on several threads would race for.
const std::vector<at::Tensor>& inputs() {
  static const std::vector<at::Tensor> x = [] {
    std::vector<at::Tensor> v;
    for (int i = 0; i < kExamples; ++i) v.push_back(data({kD}, i));
    return v;
  }();
  return x;
}

// A chain of conds per example: each round waits for the last decision.
Expr chain(Graph& g, int i, const at::Tensor& W) {
  auto scope = g.example(i);
  Expr h = g.input(inputs()[static_cast<size_t>(i)]);
  for (int k = 0; k < 2 + i % 3; ++k)
    h = dsl::cond(dsl::sum(h) > 0.0, [=] { return dsl::tanh(dsl::matmul(W, h)); },
                  [=] { return dsl::sigmoid(h) - 0.4; });
  return h;
}

// Part p of two: examples [p * 4, p * 4 + 4).
std::vector<Expr> half(Graph& g, size_t p, const at::Tensor& W) {
  std::vector<Expr> out;
  for (int i = static_cast<int>(p) * kExamples / 2; i < static_cast<int>(p + 1) * kExamples / 2; ++i)
    out.push_back(chain(g, i, W));
  return out;
}

// Elementwise identity that notes how many of its launches run at once, and
// on which threads.
std::atomic<int> g_running{0}, g_most{0};
std::mutex g_threads_mu;
std::set<std::thread::id> g_threads;
struct Probe {
  static constexpr std::string_view name = "test_overlap_probe";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    const int now = ++g_running;
    int most = g_most.load();
    while (now > most && !g_most.compare_exchange_weak(most, now)) {}
    {
      std::lock_guard lock(g_threads_mu);
      g_threads.insert(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // long enough for another to come in
    --g_running;
    return c.in(0) * 1.0;
  }
};

// Waits up to 5 s for `flag`: a test that finds the parts serialised fails
// instead of hanging.
bool wait_for(const std::atomic<bool>& flag) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

// An identity whose launch stays in its turn until part 0's host work (a
// branch being recorded) has seen it running.
std::atomic<bool> g_branch_started{false}, g_holder_running{false}, g_host_seen{false};
struct Holder {
  static constexpr std::string_view name = "test_overlap_holder";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    g_holder_running = true;
    (void)wait_for(g_host_seen);
    return c.in(0) * 1.0;
  }
};

// A kernel that runs a forward of the graph that launched it.
Graph* g_run_from_kernel = nullptr;
struct RunsItsGraph {
  static constexpr std::string_view name = "test_overlap_runs_its_graph";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    if (g_run_from_kernel != nullptr) g_run_from_kernel->forward();
    return c.in(0) * 1.0;
  }
};

}  // namespace

TEST_CASE("overlap: each part's values are those of one graph of the whole batch, under every strategy",
          "[engine][overlap]") {
  const at::Tensor W = param({kD, kD}, 3);
  (void)inputs();
  c10::NoGradGuard no_grad;
  Graph whole;
  std::vector<Expr> all;
  for (int i = 0; i < kExamples; ++i) all.push_back(chain(whole, i, W));
  whole.forward(all);
  for (const Strategy* strategy : all_strategies()) {
    INFO("strategy " << strategy->name());
    Overlap parts({}, 2);
    for (int pass = 0; pass < 2; ++pass) {  // a second run clears and reuses the parts' graphs
      parts.run([&](Graph& g, size_t p) { return half(g, p, W); }, {.strategy = strategy});
      for (size_t p = 0; p < 2; ++p) {
        REQUIRE(parts.targets(p).size() == kExamples / 2);
        for (size_t k = 0; k < kExamples / 2; ++k) {
          const Expr& e = parts.targets(p)[k];
          CHECK(e.example() == static_cast<int64_t>(p * kExamples / 2 + k));
          CHECK(at::allclose(e.value(), all[p * kExamples / 2 + k].value(), 1e-5, 1e-6));
        }
      }
    }
  }
}

TEST_CASE("overlap: gradients through both parts are one graph's", "[engine][overlap]") {
  const at::Tensor W = param({kD, kD}, 4);
  auto loss_of = [&](std::span<const Expr> outs) {
    at::Tensor l = at::zeros({});
    for (const Expr& e : outs) l = l + e.value().square().sum();
    return l;
  };
  const std::vector<at::Tensor> want = test::gradients_of({W}, [&] {
    Graph g;
    std::vector<Expr> all;
    for (int i = 0; i < kExamples; ++i) all.push_back(chain(g, i, W));
    g.forward(all);
    return loss_of(all);
  });
  Overlap parts({}, 2);
  const std::vector<at::Tensor> got = test::gradients_of({W}, [&] {
    parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
    return loss_of(parts.targets(0)) + loss_of(parts.targets(1));
  });
  test::require_all_close(got, want);
}

TEST_CASE("overlap: the parts' kernels take turns, their host work does not wait", "[engine][overlap]") {
  g_running = 0;
  g_most = 0;
  g_threads.clear();
  const at::Tensor W = param({kD, kD}, 5);
  c10::NoGradGuard no_grad;
  Overlap parts({.fuse = false}, 3);
  parts.run([&](Graph& g, size_t p) {
    std::vector<Expr> out;
    for (int i = 0; i < 3; ++i) {
      auto scope = g.example(i);
      Expr h = g.input(inputs()[p * 2 + static_cast<size_t>(i)]);
      for (int k = 0; k < 4; ++k)  // a round a step, each with a probe launch
        h = dsl::cond(dsl::sum(h) > 0.0, [=] { return dsl::call(user_op<Probe>(), {dsl::tanh(dsl::matmul(W, h))}); },
                      [=] { return dsl::call(user_op<Probe>(), {h * 0.5}); });
      out.push_back(h);
    }
    return out;
  });
  CHECK(g_threads.size() == 3);  // every part ran its own kernels, on its own thread
  CHECK(g_most.load() == 1);     // never two at once
}

TEST_CASE("overlap: a part's error is thrown by run() once every part is done", "[engine][overlap][errors]") {
  const at::Tensor W = param({kD, kD}, 6);
  Overlap parts({}, 2);
  parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
  REQUIRE(parts.targets(1).size() == kExamples / 2);
  REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
    std::vector<Expr> out = half(g, p, W);
    if (p == 1) out.push_back(dsl::matmul(W, g.input(at::ones({kD + 1}))));  // a shape mistake on the worker
    return out;
  }),
                      Contains("op 'matmul'") && Contains("test_overlap.cpp"));
  // Part 0 ran to the end meanwhile; the failed part shows no targets (not
  // the last run's); the Overlap works on.
  REQUIRE(parts.targets(0).size() == kExamples / 2);
  CHECK(parts.targets(0)[0].value().defined());
  CHECK(parts.targets(1).empty());
  parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
  CHECK(parts.targets(1).size() == kExamples / 2);
}

TEST_CASE("overlap: misuse is a UserError", "[engine][overlap][errors]") {
  const at::Tensor W = param({kD, kD}, 7);
  REQUIRE_THROWS_WITH(Overlap({}, 0), Contains("parts must be >= 1"));
  Overlap parts({}, 2);
  REQUIRE_THROWS_WITH(parts.graph(2), Contains("part 2 is out of range") && Contains("2 parts (0..1)"));
  REQUIRE_THROWS_WITH(parts.targets(5), Contains("part 5 is out of range"));
  // From a part's own record function, on either thread: one run at a time
  // (it would clear graphs in use, and wait for itself).
  for (size_t from : {0, 1}) {
    INFO("run from part " << from);
    REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
      if (p == from) parts.run([&](Graph& h, size_t q) { return half(h, q, W); });
      return half(g, p, W);
    }),
                        Contains("while a run of it is under way"));
  }
  // From another thread while a run is under way.
  std::string other_error;
  parts.run([&](Graph& g, size_t p) {
    if (p == 0) {
      std::thread other([&] {
        try {
          parts.run([&](Graph& h, size_t q) { return half(h, q, W); });
        } catch (const UserError& e) {
          other_error = e.what();
        }
      });
      other.join();
    }
    return half(g, p, W);
  });
  CHECK_THAT(other_error, Contains("while a run of it is under way"));
  // Each part's graph belongs to its thread while run() runs.
  for (size_t from : {0, 1}) {
    INFO("part " << from << " uses the other's graph");
    REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
      if (p == from) parts.graph(1 - from).clear();
      return half(g, p, W);
    }),
                        Contains("lent to another thread") && Contains("sheaf::Overlap"));
  }
  // A part's kernel that runs its own graph: it waited for its own turn
  // forever; now a UserError (the other part's graph: lent, as above).
  REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
    std::vector<Expr> out = half(g, p, W);
    if (p == 0) {
      g_run_from_kernel = &g;
      out.push_back(dsl::call(user_op<RunsItsGraph>(), {dsl::tanh(out[0])}));
    }
    return out;
  }),
                      Contains("op 'forward'") && Contains("from inside one of its own kernels"));
  g_run_from_kernel = nullptr;
  // A value of the other part's graph, computed, read while its thread may
  // be running that graph (making a value changes the graph).
  {
    std::atomic<bool> computed{false}, read{false};
    Expr theirs;
    REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
      std::vector<Expr> out = half(g, p, W);
      if (p == 1) {
        theirs = out[0];
        g.forward(out);
        computed = true;
        (void)wait_for(read);  // the graph stays lent while part 0 reads
        return out;
      }
      struct Done {
        std::atomic<bool>& read;
        ~Done() { read = true; }
      } done{read};
      REQUIRE(wait_for(computed));
      (void)theirs.value();
      return out;
    }),
                        Contains("op 'value'") && Contains("lent to another thread"));
  }
  // What a part's record function returns must be its own graph's: an
  // empty Expr, or another graph's, is named with the part, the result and
  // the line of run() (engine/overlap.cpp was named before).
  {
    Graph elsewhere;
    const Expr foreign = elsewhere.param(W);
    REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
      std::vector<Expr> out = half(g, p, W);
      if (p == 1) out.push_back(foreign);
      return out;
    }),
                        Contains("sheaf::Overlap's record function (part 1)'s result " +
                                 std::to_string(kExamples / 2)) &&
                            Contains("belongs to another sheaf::Graph") && Contains("test_overlap.cpp") &&
                            !Contains("engine/overlap.cpp"));
    REQUIRE_THROWS_WITH(parts.run([&](Graph& g, size_t p) {
      std::vector<Expr> out = half(g, p, W);
      if (p == 0) out[0] = Expr();
      return out;
    }),
                        Contains("(part 0)'s result 0 is an empty Expr") && Contains("test_overlap.cpp"));
  }
  // After those errors it runs as before.
  parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
  CHECK(parts.targets(1).size() == kExamples / 2);
  // One part: run on this thread alone.
  Overlap one({}, 1);
  one.run([&](Graph& g, size_t) { return half(g, 0, W); });
  CHECK(one.targets(0).size() == kExamples / 2);
}

TEST_CASE("overlap: every part runs under the caller's autograd and inference modes", "[engine][overlap]") {
  const at::Tensor W = param({kD, kD}, 8);
  Overlap parts({}, 2);
  {
    c10::InferenceMode inference;
    parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
    for (size_t p = 0; p < 2; ++p) CHECK(parts.targets(p)[0].value().is_inference());
  }
  {
    c10::NoGradGuard no_grad;
    parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
    for (size_t p = 0; p < 2; ++p) CHECK_FALSE(parts.targets(p)[0].value().requires_grad());
  }
  parts.run([&](Graph& g, size_t p) { return half(g, p, W); });
  for (size_t p = 0; p < 2; ++p) {
    CHECK(parts.targets(p)[0].value().requires_grad());
    CHECK_FALSE(parts.targets(p)[0].value().is_inference());
  }
}

// What Overlap is for: one part's host work between rounds (here, recording a
// cond's branch) runs while the other part's kernel holds the turn. If host
// work waited for the turn (or a part held it for its whole forward), part
// 0's branch would never see the holder running, and the holder would time
// out waiting for it.
TEST_CASE("overlap: one part's host work runs while the other part's kernel runs", "[engine][overlap]") {
  g_branch_started = false;
  g_holder_running = false;
  g_host_seen = false;
  const at::Tensor W = param({kD, kD}, 9);
  c10::NoGradGuard no_grad;
  Overlap parts({.fuse = false}, 2);
  bool saw_holder = false;
  parts.run([&](Graph& g, size_t p) {
    auto scope = g.example(static_cast<int64_t>(p));
    Expr h = g.input(inputs()[p]);
    if (p == 0) {
      // Part 0's predicate is computed in its first round; its branch is
      // recorded on its thread after that, between rounds.
      h = dsl::cond(
          dsl::sum(h) > -1e9,
          [&, h] {
            g_branch_started = true;
            saw_holder = wait_for(g_holder_running);
            g_host_seen = saw_holder;
            return dsl::tanh(dsl::matmul(W, h));
          },
          [=] { return h; });
    } else {
      // Part 1 launches the holder only once part 0 is in its branch (so
      // part 0's first round never waits behind it).
      (void)wait_for(g_branch_started);
      h = dsl::call(user_op<Holder>(), {dsl::tanh(h)});
    }
    return std::vector<Expr>{h};
  });
  CHECK(g_branch_started.load());
  CHECK(saw_holder);
  CHECK(g_host_seen.load());
  CHECK(at::allclose(parts.targets(0)[0].value(), at::tanh(at::mv(W, inputs()[0])), 1e-5, 1e-6));
  CHECK(at::allclose(parts.targets(1)[0].value(), at::tanh(inputs()[1])));
}

// A cond's predicate that its fused kernel kept inside (read in the graph
// only by the next member of its region) is made when its part fetches it:
// a launch, so in that part's turn (engine.cpp checks it there: an
// InternalError otherwise). The values are those of one graph of the batch.
TEST_CASE("overlap: a predicate its fused kernel kept inside is made at fetch, in the part's turn", "[engine][overlap]") {
  c10::NoGradGuard no_grad;
  Overlap parts({}, 2);
  auto record = [](Graph& g, int first, int count) {
    std::vector<Expr> out;
    for (int i = first; i < first + count; ++i) {
      auto scope = g.example(i);
      const Expr h = g.input(inputs()[static_cast<size_t>(i)]);
      // One region: the product, the sum, the comparison and the value that
      // leaves the kernel (a target), which reads the comparison inside it.
      const Expr open = dsl::sum(h) * 2.0 + 0.5 > 0.0;
      out.push_back(open * 4.0 + 1.0);
      out.push_back(dsl::cond(open, [=] { return h * 3.0; }, [=] { return h - 1.0; }));
    }
    return out;
  };
  parts.run([&](Graph& g, size_t p) { return record(g, static_cast<int>(p) * 2, 2); });
  uint64_t remade = 0;
  for (size_t p = 0; p < parts.parts(); ++p) remade += sheaf::detail::engine_of(parts.graph(p)).remade();
  CHECK(remade == parts.parts());  // the path this case is for ran: once a part (the batch holds both its predicates)
  Graph whole;
  const std::vector<Expr> want = record(whole, 0, 4);
  whole.forward(want);
  for (size_t p = 0; p < parts.parts(); ++p)
    for (size_t k = 0; k < 4; ++k) CHECK(at::allclose(parts.targets(p)[k].value(), want[p * 4 + k].value()));
}

// The same for value() in a record function that runs its own forward (a
// decoder reading its outputs): a value its fused kernel kept inside is made
// in the part's turn.
TEST_CASE("overlap: value() of a value its fused kernel kept inside is made in the part's turn", "[engine][overlap]") {
  c10::NoGradGuard no_grad;
  Overlap parts({}, 2);
  std::vector<at::Tensor> read(parts.parts());
  parts.run([&](Graph& g, size_t p) {
    auto scope = g.example(static_cast<int64_t>(p));
    const Expr h = g.input(inputs()[p]);
    const Expr inside = dsl::tanh(h) * 2.0;  // read only by the next member of its region
    const Expr out = inside + 1.0;
    g.forward({out});
    read[p] = inside.value();
    return std::vector<Expr>{out};
  });
  for (size_t p = 0; p < parts.parts(); ++p) {
    CHECK(sheaf::detail::engine_of(parts.graph(p)).remade() == 1);  // the path this case is for ran
    CHECK(at::allclose(read[p], at::tanh(inputs()[p]) * 2.0));
    CHECK(at::allclose(parts.targets(p)[0].value(), at::tanh(inputs()[p]) * 2.0 + 1.0));
  }
}

// After run(), nothing is lent: a kernel of one part's graph may read a value
// of another part's graph that its fused kernel kept inside, and run that
// graph's forward. Both want the turn the kernel's round holds: they run in
// it (before, each waited for it forever).
Graph* g_sibling = nullptr;
Expr g_sibling_inside;
at::Tensor g_sibling_read;
struct ReadsSibling {
  static constexpr std::string_view name = "test_overlap_reads_sibling";
  static constexpr OpTraits traits{.arity = 1};
  static Shape infer(const InferCtx& c) { return c.shape(0); }
  static at::Tensor run(RunCtx& c) {
    g_sibling_read = g_sibling_inside.value();
    g_sibling->forward();
    return c.in(0) * 1.0;
  }
};

TEST_CASE("overlap: after run(), a kernel of one part runs and reads another part's graph", "[engine][overlap]") {
  c10::NoGradGuard no_grad;
  Overlap parts({}, 2);
  parts.run([&](Graph& g, size_t p) {
    auto scope = g.example(static_cast<int64_t>(p));
    const Expr h = g.input(inputs()[p]);
    const Expr inside = dsl::tanh(h) * 2.0;  // read only by the next member of its region
    if (p == 1) g_sibling_inside = inside;
    return std::vector<Expr>{inside + 1.0};
  });
  Graph& one = parts.graph(1);
  const Expr later = dsl::tanh(g_sibling_inside) * 0.5;  // recorded on part 1's graph, run by part 0's kernel
  g_sibling = &one;
  Graph& zero = parts.graph(0);
  const Expr x = zero.input(inputs()[2]);
  const Expr y = dsl::call(user_op<ReadsSibling>(), {x});
  zero.forward(y);
  g_sibling = nullptr;
  CHECK(at::allclose(y.value(), inputs()[2]));
  CHECK(at::allclose(g_sibling_read, at::tanh(inputs()[1]) * 2.0));
  CHECK(sheaf::detail::engine_of(one).remade() == 1);  // the kept-inside value was made, in the kernel's turn
  CHECK(at::allclose(later.value(), at::tanh(at::tanh(inputs()[1]) * 2.0) * 0.5));
  g_sibling_inside = Expr();
  g_sibling_read = at::Tensor();
}

TEST_CASE("overlap: balanced_parts deals heaviest first, there and back, and deal and in_item_order undo each other",
          "[engine][overlap]") {
  // Weights 9..0 of items 0..9 (item i weighs 9 - i): dealt 0 1 2 2 1 0 0 1 2 2.
  const Parts three = balanced_parts(10, 3, [](size_t i) { return 9.0 - static_cast<double>(i); });
  CHECK(three == Parts{{0, 5, 6}, {1, 4, 7}, {2, 3, 8, 9}});
  // Two parts: 0 1 1 0 0 1 ..., each part in item order; ties keep item order.
  const Parts two = balanced_parts(5, 2, [](size_t i) { return i == 3 ? 10.0 : 1.0; });
  CHECK(two == Parts{{2, 3, 4}, {0, 1}});  // by weight: 3, then 0, 1, 2, 4
  // Fewer items than parts: the rest are empty.
  CHECK(balanced_parts(1, 3, [](size_t) { return 1.0; }) == Parts{{0}, {}, {}});
  REQUIRE_THROWS_WITH(balanced_parts(4, 0, [](size_t) { return 1.0; }), Contains("parts must be >= 1"));

  const std::vector<std::string> items{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  const std::vector<std::vector<std::string>> dealt = deal(items, three);
  CHECK(dealt[2] == std::vector<std::string>{"c", "d", "i", "j"});
  CHECK(in_item_order(three, dealt) == items);
  // Mistakes: outputs that do not match the parts, parts that are not a deal.
  std::vector<std::vector<std::string>> short_part = dealt;
  short_part[1].pop_back();
  REQUIRE_THROWS_WITH(in_item_order(three, short_part), Contains("part 1 has 3 items but 2 outputs"));
  REQUIRE_THROWS_WITH(in_item_order(three, std::vector<std::vector<std::string>>(2)),
                      Contains("2 parts' outputs for 3 parts"));
  REQUIRE_THROWS_WITH(in_item_order(Parts{{0, 1}, {1}}, std::vector<std::vector<int>>{{1, 2}, {3}}),
                      Contains("item 1 of part 1 is listed twice"));
  REQUIRE_THROWS_WITH(in_item_order(Parts{{0, 5}, {1}}, std::vector<std::vector<int>>{{1, 2}, {3}}),
                      Contains("item 5 of part 0 is out of range: the parts list 3 items"));
  REQUIRE_THROWS_WITH(deal(items, Parts{{0, 12}}), Contains("part 0 lists item 12, but there are only 10 items"));
  REQUIRE_THROWS_WITH(balanced_parts(3, 2, [](size_t i) { return i == 1 ? std::nan("") : 1.0; }),
                      Contains("item 1's weight is nan, not a finite number"));
}

TEST_CASE("overlap: a part with no items runs nothing and shows no targets", "[engine][overlap]") {
  const at::Tensor W = param({kD, kD}, 10);
  c10::NoGradGuard no_grad;
  const Parts parts = balanced_parts(1, 2, [](size_t) { return 1.0; });
  Overlap overlap({}, 2);
  overlap.run([&](Graph& g, size_t p) {
    std::vector<Expr> out;
    for (size_t i : parts[p]) out.push_back(chain(g, static_cast<int>(i), W));
    return out;
  });
  CHECK(overlap.targets(0).size() == 1);
  CHECK(overlap.targets(1).empty());
  Graph alone;
  const Expr want = chain(alone, 0, W);
  alone.forward({want});
  CHECK(at::allclose(overlap.targets(0)[0].value(), want.value(), 1e-5, 1e-6));
}
