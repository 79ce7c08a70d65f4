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
    const uint32_t chains = 2 + rng() % 3;  // deep: 2-4 chains side by side (several nodes a depth)
    std::vector<SigId> sigs(n);
    Args args(n);
    for (uint32_t i = 0; i < n; ++i) {
      sigs[i] = rng() % 9 == 0 ? kNoSig : rng() % kinds;
      if (deep && i >= chains) args[i].push_back(i - chains);
      for (uint32_t k = 0; i > 0 && k < rng() % 3; ++k) args[i].push_back(rng() % i);
    }
    const RoundDag d = dag_of(sigs, args);
    INFO("trial " << trial << ", " << n << " nodes, depth " << d.max_depth << ", " << d.num_sigs() << " signatures");
    const size_t table = size_t{d.max_depth + 1} * d.num_sigs(), limit = 4 * d.size() + 1024;
    CHECK((table > limit) == deep);  // the path this trial means to take
    CHECK(batches_of(depth_strategy(), d) == depth_by_definition(d));
  }
}

// merge_batches as first written: a list of nodes per batch, a position per
// node. The library's version splices lists of batches instead (fewer
// dependent loads); it must make the same moves, so the same schedules.
void merge_by_nodes(const RoundDag& dag, Batches& schedule) {
  const auto nb = static_cast<uint32_t>(schedule.size());
  std::vector<uint32_t> head(nb), tail(nb), next(dag.size()), pos(dag.size());
  for (uint32_t k = 0; k < nb; ++k) {
    const auto b = schedule[k];
    head[k] = b.front();
    tail[k] = b.back();
    for (size_t j = 0; j < b.size(); ++j) {
      next[b[j]] = j + 1 < b.size() ? b[j + 1] : kNone32;
      pos[b[j]] = k;
    }
  }
  auto sig_of = [&](uint32_t k) { return dag.sig[head[k]]; };
  std::vector<uint8_t> alive(nb, 1);
  auto cand = [&](SigId s) {  // positions of the batches of signature s, ascending
    std::vector<uint32_t> c;
    for (uint32_t k = 0; k < nb; ++k)
      if (sig_of(k) == s) c.push_back(k);
    return c;
  };
  auto move = [&](uint32_t from, uint32_t to) {
    for (uint32_t i = head[from]; i != kNone32; i = next[i]) pos[i] = to;
    next[tail[to]] = head[from];
    tail[to] = tail[from];
    alive[from] = 0;
  };
  for (int pass = 0, changed = 1; changed && pass < 2; ++pass) {
    changed = 0;
    for (uint32_t k = nb; k-- > 0;) {  // later: the latest alive batch before every use
      if (!alive[k] || sig_of(k) == kNoSig) continue;
      uint32_t limit = nb;
      for (uint32_t i = head[k]; i != kNone32; i = next[i])
        for (uint32_t u : dag.uses_of(i)) limit = std::min(limit, pos[u]);
      uint32_t to = kNone32;
      for (uint32_t c : cand(sig_of(k)))
        if (c > k && c < limit && alive[c]) to = c;
      if (to != kNone32) {
        move(k, to);
        changed = 1;
      }
    }
    for (uint32_t k = 0; k < nb; ++k) {  // earlier: the earliest alive batch after every argument
      if (!alive[k] || sig_of(k) == kNoSig) continue;
      int64_t lower = -1;
      for (uint32_t i = head[k]; i != kNone32; i = next[i])
        for (uint32_t a : dag.args_of(i)) lower = std::max<int64_t>(lower, pos[a]);
      uint32_t to = kNone32;
      for (uint32_t c : cand(sig_of(k)))
        if (c < k && static_cast<int64_t>(c) > lower && alive[c] && to == kNone32) to = c;
      if (to != kNone32) {
        move(k, to);
        changed = 1;
      }
    }
  }
  Batches out;
  for (uint32_t k = 0; k < nb; ++k) {
    if (!alive[k]) continue;
    for (uint32_t i = head[k]; i != kNone32; i = next[i]) out.nodes.push_back(i);
    out.close();
  }
  schedule = out;
}

TEST_CASE("merge_batches: the moves of a merge by lists of nodes, on random schedules", "[scheduler]") {
  std::mt19937 rng(Catch::rngSeed());
  int merged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t n = 1 + rng() % 150, kinds = 1 + rng() % 8;
    std::vector<SigId> sigs(n);
    Args args(n);
    for (uint32_t i = 0; i < n; ++i) {
      sigs[i] = rng() % 15 == 0 ? kNoSig : rng() % kinds;
      for (uint32_t k = 0; i > 0 && k < rng() % 4; ++k) args[i].push_back(i - 1 - static_cast<uint32_t>(rng() % std::min<uint64_t>(i, 1 + rng() % 20)));
    }
    const RoundDag d = dag_of(sigs, args);
    for (const Strategy* s : {&depth_strategy(), &agenda_strategy()}) {
      Batches got, want;
      s->schedule(d, got);
      want = got;
      const size_t before = got.size();
      merge_batches(d, got);
      merge_by_nodes(d, want);
      merged += got.size() < before;
      INFO("trial " << trial << ", " << s->name() << ", " << n << " nodes, " << before << " batches");
      REQUIRE(std::vector<uint32_t>(got.nodes.begin(), got.nodes.end()) ==
              std::vector<uint32_t>(want.nodes.begin(), want.nodes.end()));
      REQUIRE(got.begin == want.begin);
    }
  }
  CHECK(merged > 400);  // most schedules had something to merge
}

TEST_CASE("a round's work list: sorted, without repeats, on both paths", "[scheduler][round]") {
  std::mt19937 rng(7);
  std::vector<uint64_t> bits;
  // (ids, graph size): few ids, or few for a big graph (a comparison sort); many for the graph (a bit per node).
  for (auto [count, size] :
       {std::pair<size_t, size_t>{10, 1000}, {70, 100000}, {2000, 100000}, {500, 4000}, {5000, 5000}}) {
    NodeList ids;
    std::uniform_int_distribution<NodeId> pick(0, static_cast<NodeId>(size - 1));
    for (size_t i = 0; i < count; ++i) ids.push_back(pick(rng));
    for (size_t i = 0; i < count / 5; ++i) ids.push_back(ids[i]);  // repeats
    ids.push_back(static_cast<NodeId>(size - 1));                   // the last id a graph has
    NodeList want = ids;
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    sort_unique(ids, size, bits);
    CHECK(ids == want);
    sort_unique(ids, size, bits);  // already sorted: unchanged
    CHECK(ids == want);
  }
  NodeList repeats{3, 3, 5, 5, 5, 9};
  sort_unique(repeats, 10, bits);
  CHECK(repeats == NodeList{3, 5, 9});
}
