// Strategies and merge_batches on hand-built round DAGs: the scheduler's
// contract without a graph, a tracer or a launch.
#include <algorithm>
#include <random>

#include <sheaf/core/error.h>
#include <sheaf/scheduler/merge.h>
#include <sheaf/scheduler/round.h>
#include <sheaf/scheduler/strategy.h>

#include "../support.h"

using namespace sheaf;

namespace {

using Args = std::vector<std::vector<uint32_t>>;

RoundDag dag_of(std::vector<SigId> sigs, Args args) {
  RoundDag d;
  build_dag(sigs, args, d);
  return d;
}

// The batches as lists of node ids, in order.
std::vector<std::vector<uint32_t>> batches_of(const Strategy& s, const RoundDag& d) {
  Batches b;
  s.schedule(d, b);
  validate_batches(d, b, s.name());
  std::vector<std::vector<uint32_t>> out;
  for (size_t k = 0; k < b.size(); ++k) out.emplace_back(b[k].begin(), b[k].end());
  return out;
}

// Two chains of different lengths ending in a node of one signature (a loss):
//   0(a) -> 1(b) -> 2(L)        3(a) -> 4(b) -> 5(b) -> 6(L)
RoundDag two_chains() { return dag_of({0, 1, 2, 0, 1, 1, 2}, Args{{}, {0}, {1}, {}, {3}, {4}, {5}}); }

}  // namespace

TEST_CASE("build_dag: depths, uses and signatures of a hand-built DAG", "[scheduler]") {
  const RoundDag d = two_chains();
  CHECK(d.size() == 7);
  CHECK(d.depth == Column<uint32_t>{0, 1, 2, 0, 1, 2, 3});
  CHECK(d.max_depth == 3);
  CHECK(d.num_sigs() == 3);
  CHECK(std::vector<uint32_t>(d.uses_of(4).begin(), d.uses_of(4).end()) == std::vector<uint32_t>{5});
  CHECK(d.uses_of(6).empty());
}

TEST_CASE("depth: one batch per (depth, signature), the losses of unequal chains do not meet", "[scheduler]") {
  const auto b = batches_of(depth_strategy(), two_chains());
  CHECK(b == std::vector<std::vector<uint32_t>>{{0, 3}, {1, 4}, {2}, {5}, {6}});
}

TEST_CASE("agenda: shallowest signature first, the losses wait for each other", "[scheduler]") {
  const auto b = batches_of(agenda_strategy(), two_chains());
  // a (avg depth 0), then b (avg 4/3): {1, 4}, then b again {5}, then L (avg 2.5) together.
  CHECK(b == std::vector<std::vector<uint32_t>>{{0, 3}, {1, 4}, {5}, {2, 6}});
}

TEST_CASE("lazy and auto: depth merged, never more launches than depth", "[scheduler]") {
  const auto lazy = batches_of(lazy_strategy(), two_chains());
  CHECK(lazy.size() == 4);
  const auto autos = batches_of(auto_strategy(), two_chains());
  CHECK(autos.size() == 4);
}

TEST_CASE("merge_batches moves a batch later or earlier only where dependencies allow", "[scheduler]") {
  const RoundDag d = two_chains();
  SECTION("a loss moves later, into the other loss") {
    Batches b;
    for (std::vector<uint32_t> batch : std::vector<std::vector<uint32_t>>{{0, 3}, {1, 4}, {2}, {5}, {6}}) {
      b.nodes.insert(b.nodes.end(), batch.begin(), batch.end());
      b.close();
    }
    merge_batches(d, b);
    validate_batches(d, b, "merged");
    CHECK(b.size() == 4);
  }
  SECTION("a batch does not move past a consumer") {
    // 0(a) -> 1(a): two batches of one signature in a chain must stay apart.
    const RoundDag chain = dag_of({0, 0}, Args{{}, {0}});
    Batches b;
    b.nodes = {0, 1};
    b.begin = {0, 1, 2};
    merge_batches(chain, b);
    CHECK(b.size() == 2);
  }
}

TEST_CASE("validate_batches rejects invalid schedules", "[scheduler][errors]") {
  const RoundDag d = dag_of({0, 0, 1}, Args{{}, {}, {0, 1}});
  auto batches = [](std::vector<std::vector<uint32_t>> bs) {
    Batches b;
    for (const auto& x : bs) {
      b.nodes.insert(b.nodes.end(), x.begin(), x.end());
      b.close();
    }
    return b;
  };
  CHECK_NOTHROW(validate_batches(d, batches({{0, 1}, {2}}), "ok"));
  CHECK_THROWS_AS(validate_batches(d, batches({{2}, {0, 1}}), "x"), InternalError);      // before its arguments
  CHECK_THROWS_AS(validate_batches(d, batches({{0, 2}, {1}}), "x"), InternalError);      // mixed signatures
  CHECK_THROWS_AS(validate_batches(d, batches({{0, 1}}), "x"), InternalError);           // a node left out
  CHECK_THROWS_AS(validate_batches(d, batches({{0, 1}, {0}, {2}}), "x"), InternalError); // a node twice
  const RoundDag shared = dag_of({kNoSig, kNoSig}, Args{{}, {}});
  CHECK_THROWS_AS(validate_batches(shared, batches({{0, 1}}), "x"), InternalError);      // shared nodes batched
}

TEST_CASE("every strategy gives a valid schedule of random DAGs", "[scheduler]") {
  std::mt19937 rng(Catch::rngSeed());
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t n = 1 + rng() % 40;
    std::vector<SigId> sigs(n);
    Args args(n);
    for (uint32_t i = 0; i < n; ++i) {
      sigs[i] = rng() % 7 == 0 ? kNoSig : rng() % 4;
      for (uint32_t k = 0; i > 0 && k < rng() % 3; ++k) args[i].push_back(rng() % i);
    }
    const RoundDag d = dag_of(sigs, args);
    size_t depth_launches = 0;
    for (const Strategy* s : all_strategies()) {
      Batches b;
      s->schedule(d, b);
      INFO("trial " << trial << " strategy " << s->name());
      REQUIRE_NOTHROW(validate_batches(d, b, s->name()));
      if (s->name() == "depth") depth_launches = b.size();
    }
    Batches lazy;
    lazy_strategy().schedule(d, lazy);
    CHECK(lazy.size() <= depth_launches);
  }
}

// The depth schedule by its definition: batches by depth; within a depth one
// per signature in order of its first node, each shared node alone in its own
// place; a batch's nodes in local order.
std::vector<std::vector<uint32_t>> depth_by_definition(const RoundDag& d) {
  std::vector<std::vector<uint32_t>> out;
  for (uint32_t depth = 0; depth <= d.max_depth; ++depth) {
    std::vector<std::pair<SigId, size_t>> group;  // (signature, batch in out)
    for (uint32_t i = 0; i < d.size(); ++i) {
      if (d.depth[i] != depth) continue;
      auto g = std::find_if(group.begin(), group.end(), [&](const auto& p) { return p.first == d.sig[i]; });
      if (d.sig[i] == kNoSig || g == group.end()) {
        group.emplace_back(d.sig[i], out.size());
        out.push_back({i});
      } else {
        out[g->second].push_back(i);
      }
    }
  }
  return out;
}

TEST_CASE("depth: the schedule of its definition, on random DAGs of both paths", "[scheduler]") {
  // Few signatures and depths take the (depth, signature) table; a deep chain
  // of many signatures, the path by depth and then signature.
  std::mt19937 rng(Catch::rngSeed());
  for (int trial = 0; trial < 300; ++trial) {
    const bool deep = trial % 3 == 0;
    const uint32_t n = deep ? 200 + rng() % 200 : 1 + rng() % 60;
    const uint32_t kinds = deep ? 60 : 1 + rng() % 6;
    std::vector<SigId> sigs(n);
    Args args(n);
    for (uint32_t i = 0; i < n; ++i) {
      sigs[i] = rng() % 9 == 0 ? kNoSig : rng() % kinds;
      if (deep && i > 0) args[i].push_back(i - 1);  // a chain: depth i
      for (uint32_t k = 0; i > 0 && k < rng() % 3; ++k) args[i].push_back(rng() % i);
    }
    const RoundDag d = dag_of(sigs, args);
    INFO("trial " << trial << ", " << n << " nodes, depth " << d.max_depth << ", " << d.num_sigs() << " signatures");
    const size_t table = size_t{d.max_depth + 1} * d.num_sigs(), limit = 4 * d.size() + 1024;
    CHECK((table > limit) == deep);  // the path this trial means to take
    CHECK(batches_of(depth_strategy(), d) == depth_by_definition(d));
  }
}

TEST_CASE("a round's work list: sorted, without repeats, on both paths", "[scheduler][round]") {
  std::mt19937 rng(7);
  std::vector<uint64_t> bits;
  // (ids, graph size): few ids, or few for a big graph (a comparison sort); many for the graph (a bit per node).
  for (auto [count, size] :
       {std::pair<size_t, size_t>{10, 1000}, {70, 100000}, {2000, 100000}, {500, 4000}, {5000, 5000}}) {
    std::vector<NodeId> ids;
    std::uniform_int_distribution<NodeId> pick(0, static_cast<NodeId>(size - 1));
    for (size_t i = 0; i < count; ++i) ids.push_back(pick(rng));
    for (size_t i = 0; i < count / 5; ++i) ids.push_back(ids[i]);  // repeats
    ids.push_back(static_cast<NodeId>(size - 1));                   // the last id a graph has
    std::vector<NodeId> want = ids;
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    sort_unique(ids, size, bits);
    CHECK(ids == want);
    sort_unique(ids, size, bits);  // already sorted: unchanged
    CHECK(ids == want);
  }
  std::vector<NodeId> repeats{3, 3, 5, 5, 5, 9};
  sort_unique(repeats, 10, bits);
  CHECK(repeats == std::vector<NodeId>{3, 5, 9});
}
