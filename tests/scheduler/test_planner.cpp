// The planner on hand-built batches: row order, views vs gathers, one split per
// chunked batch or per batch read in disjoint ranges, one gather node per batch
// read partially otherwise. Nodes come from a
// Trace (the layer below); nothing is launched.
#include <span>

#include <c10/core/GradMode.h>
#include <sheaf/ops/op.h>
#include <sheaf/ops/op_list.h>
#include <sheaf/scheduler/plan.h>
#include <sheaf/scheduler/round.h>
#include <sheaf/tracer/trace.h>
#include <sheaf/engine/engine.h>
#include <data/trees.h>
#include <tree_lstm/model.h>

#include "../support.h"

using namespace sheaf;

namespace {

struct Fixture {
  Trace t{c10::kCPU};
  std::vector<NodeId> xs;  // one input [4] per example
  explicit Fixture(int n) {
    for (int i = 0; i < n; ++i) {
      t.set_current_example(i);
      xs.push_back(t.input(at::randn({4}), std::source_location::current()));
    }
  }
  NodeId unary(OpCode op, NodeId x) { return t.record(op, std::span(&x, 1), {}, 0, std::source_location::current()); }
  NodeId binary(OpCode op, NodeId a, NodeId b) {
    const std::array<NodeId, 2> args{a, b};
    return t.record(op, args, {}, 0, std::source_location::current());
  }
  // op(xs[i]) for each listed i, in that order.
  std::vector<NodeId> of_inputs(OpCode op, std::initializer_list<size_t> rows) {
    std::vector<NodeId> out;
    for (size_t i : rows) out.push_back(unary(op, xs[i]));
    return out;
  }
  NodeId slice(NodeId x, int64_t begin, int64_t end) {
    const std::array<int64_t, 3> attrs{0, begin, end};
    return t.record(code_of<op::Slice>, std::span(&x, 1), attrs, 0, std::source_location::current());
  }
  // Plans the pending nodes with the given batches (lists of graph nodes).
  Plan plan(const std::vector<std::vector<NodeId>>& batches) {
    RoundDag dag;
    std::vector<NodeId> aliases;
    uint64_t visits = 0;
    build_round(t.store(), t.ready(), aliases, dag, visits);
    Batches b;
    for (const auto& batch : batches) {
      for (NodeId n : batch) b.nodes.push_back(dag.local(n));
      b.close();
    }
    validate_batches_ok(dag, b);
    Plan p;
    make_plan(t.store(), dag, b, "by hand", p);
    return p;
  }
  static void validate_batches_ok(const RoundDag& dag, const Batches& b) {
    size_t total = 0;
    for (size_t k = 0; k < b.size(); ++k) total += b[k].size();
    REQUIRE(total == dag.size());
  }
};

}  // namespace

TEST_CASE("planner: rows follow their first argument, so a chain reads views", "[scheduler][planner]") {
  Fixture f(4);
  std::vector<NodeId> ys;
  for (int i = 3; i >= 0; --i) ys.push_back(f.unary(code_of<op::Tanh>, f.xs[static_cast<size_t>(i)]));
  const Plan p = f.plan({f.xs, ys});  // tanh batch listed in reverse: the planner reorders it
  REQUIRE(p.batches.size() == 2);
  const PlannedBatch& tanh = p.batches[1];
  CHECK(p.args[tanh.args_begin].kind == BatchArg::kView);
  for (uint32_t i = 0; i < 4; ++i) CHECK(f.t.store().value_at[p.nodes[tanh.nodes_begin + i]].row == i);
  CHECK(p.nodes[tanh.nodes_begin] == ys[3]);  // example 0's tanh is row 0
}

TEST_CASE("planner: payloads in row order for the ops that read them, none for the others", "[scheduler][planner]") {
  Fixture f(3);
  std::vector<NodeId> ys, picks;
  for (size_t i = 3; i-- > 0;) ys.push_back(f.unary(code_of<op::Tanh>, f.xs[i]));  // listed in reverse: reordered
  for (size_t i = 0; i < 3; ++i) {
    const NodeId y = ys[2 - i];  // example i's
    picks.push_back(f.t.record(code_of<op::Pick>, std::span(&y, 1), {}, static_cast<int64_t>(3 - i),
                               std::source_location::current()));
  }
  const Plan p = f.plan({f.xs, ys, picks});
  REQUIRE(p.batches.size() == 3);
  CHECK(p.batches[0].payload >= 0);  // inputs: a slot each
  CHECK(p.batches[1].payload == -1);  // tanh reads none: nothing copied
  const PlannedBatch& pick = p.batches[2];
  REQUIRE(pick.payload >= 0);
  for (uint32_t i = 0; i < pick.n; ++i)
    CHECK(p.indices[static_cast<size_t>(pick.payload) + i] == f.t.store().payload[p.nodes[pick.nodes_begin + i]]);
  CHECK(std::vector<int64_t>(p.indices.begin() + pick.payload, p.indices.begin() + pick.payload + 3) ==
        std::vector<int64_t>{3, 2, 1});  // rows in example order, as their argument's
  CHECK_FALSE(reads_payload(code_of<op::Tanh>));
  CHECK(reads_payload(code_of<op::Dropout>));  // its keys
}

TEST_CASE("planner: an input in another order is gathered with indices", "[scheduler][planner]") {
  Fixture f(4);
  std::vector<NodeId> ys;
  for (size_t i = 0; i < 4; ++i) ys.push_back(f.binary(code_of<op::Add>, f.xs[i], f.xs[3 - i]));
  const Plan p = f.plan({f.xs, ys});
  const PlannedBatch& add = p.batches[1];
  CHECK(p.args[add.args_begin].kind == BatchArg::kView);
  const BatchArg& second = p.args[add.args_begin + 1];
  REQUIRE(second.kind == BatchArg::kGather);
  REQUIRE(second.reads_end - second.reads_begin == 1);
  const Read& r = p.reads[second.reads_begin];
  REQUIRE(r.index >= 0);
  CHECK(std::vector<int64_t>(p.indices.begin() + r.index, p.indices.begin() + r.index + r.len) ==
        std::vector<int64_t>{3, 2, 1, 0});
}

TEST_CASE("planner: rows of two batches, interleaved, are gathered per batch and permuted", "[scheduler][planner]") {
  Fixture f(4);
  const std::vector<NodeId> as = f.of_inputs(code_of<op::Tanh>, {0, 1, 2, 3});
  const std::vector<NodeId> bs = f.of_inputs(code_of<op::Sigmoid>, {0, 1, 2, 3});
  // (Every input read by a chain as long, so that rows keep the inputs' order.)
  const std::vector<NodeId> zs = f.of_inputs(code_of<op::Neg>, {0, 1, 2, 3});
  // Each row's second argument from A or B in turn, A's rows out of order.
  const NodeId second[] = {as[3], bs[1], as[1], bs[3]};
  std::vector<NodeId> ys;
  for (size_t i = 0; i < 4; ++i) ys.push_back(f.binary(code_of<op::Add>, zs[i], second[i]));
  const Plan p = f.plan({f.xs, as, bs, zs, ys});
  INFO(p.str());
  REQUIRE(p.batches.size() == 5);
  const PlannedBatch& add = p.batches[4];
  for (uint32_t i = 0; i < 4; ++i) REQUIRE(p.nodes[add.nodes_begin + i] == ys[i]);
  CHECK(p.args[add.args_begin].kind == BatchArg::kView);  // (rows in their first argument's order)
  const BatchArg& arg = p.args[add.args_begin + 1];
  REQUIRE(arg.kind == BatchArg::kGather);
  REQUIRE(arg.reads_end - arg.reads_begin == 2);  // one read per source
  CHECK(arg.perm >= 0);                           // interleaved: permuted after
  // The reads end to end, then the permutation: row i's value is where its node's second argument lives.
  std::vector<NodeStore::Place> read_rows;
  bool an_index = false;
  for (uint32_t r = arg.reads_begin; r < arg.reads_end; ++r) {
    const Read& read = p.reads[r];
    an_index = an_index || read.index >= 0;
    for (uint32_t k = 0; k < read.len; ++k)
      read_rows.push_back({read.batch, read.index >= 0 ? static_cast<uint32_t>(p.indices[read.index + k]) : read.start + k});
  }
  CHECK(an_index);  // A's rows 3 and 1: not a range
  REQUIRE(read_rows.size() == 4);
  for (uint32_t i = 0; i < 4; ++i) {
    const NodeId y = p.nodes[add.nodes_begin + i];
    const NodeStore::Place want = f.t.store().value_at[f.t.store().args_of(y)[1]];
    const NodeStore::Place got = read_rows[static_cast<size_t>(arg.perm >= 0 ? p.indices[arg.perm + i] : i)];
    CHECK(got.batch == want.batch);
    CHECK(got.row == want.row);
  }
}

TEST_CASE("planner: disjoint slices of one batch become one split", "[scheduler][planner]") {
  Fixture f(3);
  std::vector<NodeId> lo, hi;
  for (NodeId x : f.xs) {
    lo.push_back(f.slice(x, 0, 2));
    hi.push_back(f.slice(x, 2, 4));
  }
  const Plan p = f.plan({f.xs, lo, hi});
  REQUIRE(p.splits.size() == 1);
  const std::span<const int64_t> sizes = p.sizes_of(p.splits[0]);
  CHECK(std::vector<int64_t>(sizes.begin(), sizes.end()) == std::vector<int64_t>{2, 2});
  CHECK(p.batches[1].split == 0);
  CHECK(p.batches[2].split == 0);
  CHECK(p.batches[2].piece == 1);
}

TEST_CASE("planner: reads of disjoint row ranges of one batch are views of one split", "[scheduler][planner]") {
  Fixture f(4);
  // One batch reads rows 0..1 of the inputs, another rows 2..3: two ranges.
  const Plan p = f.plan({f.xs, f.of_inputs(code_of<op::Tanh>, {1, 0}), f.of_inputs(code_of<op::Sigmoid>, {2, 3})});
  CHECK(p.groups.size() == 0);
  REQUIRE(p.splits.size() == 1);
  const std::span<const int64_t> sizes = p.sizes_of(p.splits[0]);
  CHECK(std::vector<int64_t>(sizes.begin(), sizes.end()) == std::vector<int64_t>{2, 2});
  for (int k : {1, 2}) {
    const BatchArg& arg = p.args[p.batches[k].args_begin];
    CHECK(arg.kind == BatchArg::kView);
    CHECK(p.reads[arg.reads_begin].split == 0);
    CHECK(p.reads[arg.reads_begin].slot == static_cast<uint32_t>(k - 1));
  }
}

TEST_CASE("planner: partial reads that are not disjoint ranges share one gather group", "[scheduler][planner]") {
  Fixture f(4);
  // Rows 0 and 2 of the inputs, then rows 1 and 3: index lists, not ranges.
  const Plan p = f.plan({f.xs, f.of_inputs(code_of<op::Tanh>, {0, 2}), f.of_inputs(code_of<op::Sigmoid>, {1, 3})});
  CHECK(p.splits.size() == 0);
  REQUIRE(p.groups.size() == 1);
  CHECK(p.groups[0].size() == 2);
  CHECK(p.str().find("#0") != std::string::npos);
}

TEST_CASE("planner: rows read by three batches or more are grouped by reader, each reading a range", "[scheduler][planner]") {
  // As the steps of a recurrence read one batch that projected every step's
  // input at once: reader k reads rows k and k + 3 of p.
  Fixture f(6);
  std::vector<NodeId> p;
  for (NodeId x : f.xs) p.push_back(f.unary(code_of<op::Tanh>, x));
  std::vector<std::vector<NodeId>> readers(3);
  for (size_t k = 0; k < 3; ++k)
    for (size_t i : {k, k + 3}) readers[k].push_back(f.unary(code_of<op::Sigmoid>, p[i]));
  const Plan plan = f.plan({f.xs, p, readers[0], readers[1], readers[2]});
  REQUIRE(plan.splits.size() == 1);
  CHECK(plan.splits[0].batch == plan.batches[1].out);
  for (int k = 2; k <= 4; ++k) {
    const BatchArg& arg = plan.args[plan.batches[k].args_begin];
    CHECK(arg.kind == BatchArg::kView);
    CHECK(plan.reads[arg.reads_begin].len == 2);
  }
}

TEST_CASE("planner: rows whose chain goes on come first, so the next step reads a prefix", "[scheduler][planner]") {
  // Examples 0 and 2 take two steps, example 1 one: in input order the second
  // step would read rows 0 and 2 (a gather); longest path first, rows 0..1.
  Fixture f(3);
  std::vector<NodeId> s1, s2;
  for (NodeId x : f.xs) s1.push_back(f.unary(code_of<op::Tanh>, x));
  for (size_t i : {0, 2}) s2.push_back(f.unary(code_of<op::Tanh>, s1[i]));
  const Plan p = f.plan({f.xs, s1, s2});
  const BatchArg& arg = p.args[p.batches[2].args_begin];
  CHECK(arg.kind == BatchArg::kView);
  CHECK(p.reads[arg.reads_begin].start == 0);
  CHECK(p.reads[arg.reads_begin].len == 2);
  CHECK(p.nodes[p.batches[1].nodes_begin + 2] == s1[1]);  // the chain that ends, last
}

TEST_CASE("planner: row ranges are one split even when a list op also reads the batch by index", "[scheduler][planner]") {
  // As a tagger's steps read their rows of the last step while the output layer
  // concatenates every token's states: the ranges stay views.
  Fixture f(4);
  const std::array<NodeId, 2> parts{f.xs[3], f.xs[0]};
  const std::array<int64_t, 1> axis{0};
  const NodeId cat = f.t.record(code_of<op::Concat>, parts, axis, 0, std::source_location::current());
  const Plan p = f.plan({f.xs, f.of_inputs(code_of<op::Tanh>, {1, 0}), f.of_inputs(code_of<op::Sigmoid>, {2, 3}), {cat}});
  REQUIRE(p.splits.size() == 1);
  for (int k : {1, 2}) {
    const BatchArg& arg = p.args[p.batches[k].args_begin];
    CHECK(arg.kind == BatchArg::kView);
    CHECK(p.reads[arg.reads_begin].split == 0);
  }
  const BatchArg& list = p.args[p.batches[3].args_begin];
  for (uint32_t r = list.reads_begin; r < list.reads_end; ++r) CHECK(p.reads[r].split < 0);
}

TEST_CASE("planner: batches of hundreds of rows are ordered as small ones, ties by node id", "[scheduler][planner]") {
  // Batches of 128 rows or more take the planner's radix sort (small ones a
  // comparison sort): the same order, whichever path a batch takes.
  constexpr size_t n = 300;
  SECTION("a chain listed in reverse reads views") {
    Fixture f(n);
    std::vector<NodeId> ys;
    for (size_t i = n; i-- > 0;) ys.push_back(f.unary(code_of<op::Tanh>, f.xs[i]));
    const Plan p = f.plan({f.xs, ys});
    const PlannedBatch& tanh = p.batches[1];
    CHECK(p.args[tanh.args_begin].kind == BatchArg::kView);
    for (uint32_t i = 0; i < n; ++i) CHECK(p.nodes[tanh.nodes_begin + i] == ys[n - 1 - i]);
  }
  SECTION("rows read by three batches are grouped by reader, each a range") {
    Fixture f(n);
    std::vector<NodeId> p;
    for (NodeId x : f.xs) p.push_back(f.unary(code_of<op::Tanh>, x));
    std::vector<std::vector<NodeId>> readers(3);
    for (size_t i = 0; i < n; ++i) readers[i % 3].push_back(f.unary(code_of<op::Sigmoid>, p[i]));
    const Plan plan = f.plan({f.xs, p, readers[0], readers[1], readers[2]});
    for (int k = 2; k <= 4; ++k) {
      const BatchArg& arg = plan.args[plan.batches[k].args_begin];
      CHECK(arg.kind == BatchArg::kView);
      CHECK(plan.reads[arg.reads_begin].len == n / 3);
      CHECK(plan.reads[arg.reads_begin].start == static_cast<uint32_t>(k - 2) * (n / 3));
    }
  }
  SECTION("rows fed by one value tie: the earlier node first, whatever the batch's order") {
    Fixture f(n);
    std::vector<NodeId> a, b;
    for (NodeId x : f.xs) {
      a.push_back(f.unary(code_of<op::Tanh>, x));
      b.push_back(f.unary(code_of<op::Tanh>, x));
    }
    std::vector<NodeId> batch;
    for (size_t i = n; i-- > 0;) {
      batch.push_back(b[i]);
      batch.push_back(a[i]);
    }
    const Plan p = f.plan({f.xs, batch});
    const PlannedBatch& tanh = p.batches[1];
    for (uint32_t i = 0; i < n; ++i) {
      CHECK(p.nodes[tanh.nodes_begin + 2 * i] == a[i]);
      CHECK(p.nodes[tanh.nodes_begin + 2 * i + 1] == b[i]);
    }
  }
}

TEST_CASE("build_round: a node parked after listing some arguments leaves none behind and a round outgrows its work list",
          "[scheduler][round]") {
  // Round 1: each x_i runs; y_i = tanh(p_i) waits on an unresolved
  // placeholder; z_i = x_i + y_i lists x_i, then parks on y_i.
  constexpr size_t kN = 40;
  Fixture f(kN);
  Trace& t = f.t;
  const auto here = std::source_location::current();
  std::vector<NodeId> ps, ys, zs;
  for (size_t i = 0; i < kN; ++i) {
    t.set_current_example(static_cast<int64_t>(i));
    ps.push_back(t.placeholder(t.store().shape[f.xs[i]], static_cast<int64_t>(i), "cond", here));
    ys.push_back(f.unary(code_of<op::Tanh>, ps.back()));
    zs.push_back(f.binary(code_of<op::Add>, f.xs[i], ys.back()));
  }
  RoundDag dag;
  std::vector<NodeId> aliases;
  uint64_t visits = 0;
  build_round(t.store(), t.ready(), aliases, dag, visits);
  REQUIRE(dag.size() == kN);
  for (size_t i = 0; i < kN; ++i) CHECK(dag.node[i] == f.xs[i]);
  CHECK(dag.args.empty());
  REQUIRE(dag.arg_begin.size() == kN + 1);
  CHECK(dag.arg_begin.back() == 0);
  CHECK(dag.uses.empty());

  // Round 2: the x_i ran; each p_i becomes x_i. The work list is the kN
  // placeholders (aliases, not entries); the y_i and z_i they wake are 2 kN entries.
  for (NodeId x : f.xs) t.store().flags[x] |= NodeStore::kComputed;
  for (size_t i = 0; i < kN; ++i) t.resolve(ps[i], f.xs[i]);
  aliases.clear();
  build_round(t.store(), t.ready(), aliases, dag, visits);
  CHECK(aliases.size() == kN);
  REQUIRE(dag.size() == 2 * kN);
  REQUIRE(dag.arg_begin.size() == dag.size() + 1);
  CHECK(dag.args.size() == kN);
  CHECK(dag.max_depth == 1);
  for (size_t i = 0; i < kN; ++i) {
    const uint32_t y = dag.local(ys[i]), z = dag.local(zs[i]);
    REQUIRE(dag.node[y] == ys[i]);
    REQUIRE(dag.node[z] == zs[i]);
    CHECK(dag.args_of(y).empty());
    CHECK(dag.depth[y] == 0);
    REQUIRE(dag.args_of(z).size() == 1);
    CHECK(dag.args_of(z)[0] == y);
    CHECK(dag.depth[z] == 1);
    REQUIRE(dag.uses_of(y).size() == 1);
    CHECK(dag.uses_of(y)[0] == z);
  }
}

// Two graphs record the same batch (a Tree-LSTM: calls and their results,
// lookups, parameters, a loss at every node, and a value of parameters only);
// one takes the round recording listed (ReadyQueue::plain), the other builds
// it the general way (mark_runnable): the same DAG, marks and visits.
TEST_CASE("build_round: the round recording listed is the round built the general way", "[scheduler][round]") {
  const std::vector<data::Tree> trees =
      data::synthetic_trees({.count = 24, .min_words = 1, .max_words = 12, .vocab_size = 50, .seed = 5});
  const models::TreeLSTM model({.vocab = 50, .hidden = 8}, 3);
  const at::Tensor w = at::randn({8});
  struct Round {
    RoundDag dag;
    uint64_t visits = 0;
    size_t nodes = 0;
  };
  auto round_of = [&](Graph& g, bool general) {
    Expr loss = model.sheaf_batch_loss(g, trees);
    Expr shared = dsl::tanh(g.param(w));  // no example: a shared value
    (void)(loss * dsl::sum(shared));
    ReadyQueue& q = sheaf::detail::engine_of(g).trace().ready();
    CHECK(q.plain());
    if (general) q.forget_recorded();
    CHECK(q.plain() == !general);
    Round r;
    std::vector<NodeId> aliases;
    const NodeStore& s = sheaf::detail::engine_of(g).trace().store();
    build_round(s, q, aliases, r.dag, r.visits);
    CHECK(aliases.empty());
    CHECK(q.plain());  // (the round took every candidate; candidates() would move them)
    r.nodes = s.size();
    return r;
  };
  Graph g1, g2;
  const Round a = round_of(g1, false), b = round_of(g2, true);
  REQUIRE(a.nodes == b.nodes);
  REQUIRE(a.dag.size() == b.dag.size());
  CHECK(a.dag.size() > 24 * 4);
  CHECK(a.dag.recorded);  // (each took its own way: marks from recording, and stamps)
  CHECK(!b.dag.recorded);
  CHECK(a.visits == b.visits);
  auto same = [](const auto& x, const auto& y) { return std::equal(x.begin(), x.end(), y.begin(), y.end()); };
  CHECK(same(a.dag.node, b.dag.node));
  CHECK(same(a.dag.sig, b.dag.sig));
  CHECK(same(a.dag.arg_begin, b.dag.arg_begin));
  CHECK(same(a.dag.args, b.dag.args));
  CHECK(same(a.dag.depth, b.dag.depth));
  CHECK(a.dag.max_depth == b.dag.max_depth);
  CHECK(a.dag.max_depth > 2);
  CHECK(same(a.dag.use_begin, b.dag.use_begin));
  CHECK(same(a.dag.uses, b.dag.uses));
  // Every node of the round (a call's results too) marked, with its local id.
  size_t marked = 0;
  for (NodeId n = 0; n < a.nodes; ++n) {
    const bool in_a = a.dag.in_round(n), in_b = b.dag.in_round(n);
    REQUIRE(in_a == in_b);
    if (!in_a) continue;
    ++marked;
    CHECK(a.dag.local(n) == b.dag.local(n));
  }
  CHECK(marked > a.dag.size());  // (the calls' further results)
}

// Round after round on one graph, fused, with control flow between: a graph
// that takes each round as recorded where it can plans and computes what its
// twin, made to build every round the general way, does.
TEST_CASE("build_round: rounds as recorded plan as the general way, round after round", "[scheduler][round]") {
  c10::NoGradGuard no_grad;
  const std::vector<data::Tree> trees =
      data::synthetic_trees({.count = 16, .min_words = 1, .max_words = 10, .vocab_size = 40, .seed = 9});
  const std::span<const data::Tree> first(trees.data(), 8), second(trees.data() + 8, 8);
  const models::TreeLSTM model({.vocab = 40, .hidden = 8}, 4);
  const at::Tensor v = at::randn({8});
  auto run = [&](Graph& g, bool general) {
    std::vector<std::string> plans;
    std::vector<at::Tensor> values;
    ReadyQueue& q = sheaf::detail::engine_of(g).trace().ready();
    auto forward = [&](Expr e, bool listed) {
      CHECK(q.plain() == listed);
      if (general) q.forget_recorded();
      g.forward(e);
      plans.push_back(sheaf::detail::engine_of(g).last_plan()->str());
      values.push_back(e.value());
    };
    const Expr a = model.sheaf_batch_loss(g, first);
    forward(a, true);
    // A computed argument from the round before, and new nodes.
    const Expr b = model.sheaf_batch_loss(g, second) + a;
    forward(b, true);
    // Control flow: placeholders in the list (the general way), then conds' rounds.
    std::vector<Expr> picked;
    for (int i = 0; i < 6; ++i) {
      auto in = g.example(i);
      const Expr x = dsl::tanh(g.input(at::randn({8})) * v);
      picked.push_back(dsl::cond(dsl::sum(x) > 0.0, [x] { return dsl::sigmoid(x); }, [x] { return x * 2.0; }));
    }
    forward(dsl::sum(std::span<const Expr>(picked)) + b, false);
    const Expr c = model.sheaf_batch_loss(g, first) * b;
    forward(c, true);
    return std::pair{plans, values};
  };
  Graph g1, g2;
  at::manual_seed(11);
  const auto [plans1, values1] = run(g1, false);
  at::manual_seed(11);
  const auto [plans2, values2] = run(g2, true);
  REQUIRE(plans1.size() == plans2.size());
  for (size_t k = 0; k < plans1.size(); ++k) {
    INFO("forward " << k);
    CHECK(plans1[k] == plans2[k]);
    CHECK(at::equal(values1[k], values2[k]));
  }
}
