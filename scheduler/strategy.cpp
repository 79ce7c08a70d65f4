#include "strategy.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <string>

#include <sheaf/core/error.h>

#include "merge.h"

namespace sheaf {

namespace {

// Scratch buffers of the strategies, kept per thread (the strategies are
// stateless singletons shared by every graph): a graph cleared and refilled
// batch after batch schedules without allocating (tests/host/test_allocations.cpp).
struct Scratch {
  std::vector<uint32_t> start, fill, group_of_sig, count, sigs_here, at;  // depth
  Column<uint32_t> by_depth, group;  // (written in full: no zero-fill as they grow)
  std::vector<std::pair<uint32_t, uint32_t>> seen;  // depth (the table's buckets in order)
  std::vector<double> avg;                                                                // agenda
  std::vector<uint32_t> cnt, indeg, alone, batch;
  std::vector<std::vector<uint32_t>> ready;
  std::vector<std::pair<double, uint32_t>> agenda;
  Batches other;  // auto: the schedule it compares with
};
thread_local Scratch t_scratch;

class DepthStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "depth"; }
  // One batch per (depth, signature), by depth; within a depth in order of
  // each signature's first node; each shared node (kNoSig) alone, in its own
  // place in that order; a batch's nodes in local (topological) order.
  void schedule(const RoundDag& dag, Batches& out) const override {
    const uint32_t sigs = dag.num_sigs();
    const size_t table = size_t{dag.max_depth + 1} * sigs;
    // Where the (depth, signature) table is at most a few entries a node, one
    // counting pass over the nodes costs less than sorting by depth and then
    // grouping each depth's nodes (two passes each, through the depth order).
    // A deep round of many signatures (a long unrolled chain) would make the
    // table mostly empty, zeroed for nothing: depth first, then signatures.
    if (table <= 4 * dag.size() + 1024) by_table(dag, out, sigs, table);
    else by_depth(dag, out, sigs);
  }

 private:
  static void by_table(const RoundDag& dag, Batches& out, uint32_t sigs, size_t table) {
    Scratch& x = t_scratch;
    const auto m = static_cast<uint32_t>(dag.size());
    // Each node's bucket, each bucket's count, and the buckets (with their
    // depth) in order of first node: shared nodes take buckets past the table.
    std::vector<uint32_t>& count = x.count;
    count.assign(table, 0);
    Column<uint32_t>& bucket = x.group;
    bucket.resize(m);
    std::vector<std::pair<uint32_t, uint32_t>>& seen = x.seen;  // (depth, bucket)
    seen.clear();
    for (uint32_t i = 0; i < m; ++i) {
      const SigId s = dag.sig[i];
      const uint32_t d = dag.depth[i];
      uint32_t b;
      if (s == kNoSig) {
        b = static_cast<uint32_t>(count.size());
        count.push_back(0);
      } else {
        b = d * sigs + s;
      }
      if (count[b]++ == 0) seen.emplace_back(d, b);
      bucket[i] = b;
    }
    // The buckets by depth (a counting sort: first appearance kept within a
    // depth), then each bucket's count becomes its first slot.
    std::vector<uint32_t>&start = x.start, &order = x.at;
    start.assign(dag.max_depth + 2, 0);
    for (const auto& [d, b] : seen) ++start[d + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    order.resize(seen.size());
    for (const auto& [d, b] : seen) order[start[d]++] = b;
    auto at = static_cast<uint32_t>(out.nodes.size());
    for (uint32_t b : order) {
      const uint32_t c = count[b];
      count[b] = at;
      at += c;
      out.begin.push_back(at);
    }
    out.nodes.resize(at);
    for (uint32_t i = 0; i < m; ++i) out.nodes[count[bucket[i]]++] = i;
  }

  static void by_depth(const RoundDag& dag, Batches& out, uint32_t sigs) {
    Scratch& x = t_scratch;
    const size_t m = dag.size();
    // Counting sort by depth, keeping the local (topological) order inside a depth.
    std::vector<uint32_t>& start = x.start;
    start.assign(dag.max_depth + 2, 0);
    for (uint32_t d : dag.depth) ++start[d + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    Column<uint32_t>& by_depth = x.by_depth;
    by_depth.resize(m);
    x.fill.assign(start.begin(), start.end() - 1);
    for (uint32_t i = 0; i < m; ++i) by_depth[x.fill[dag.depth[i]]++] = i;
    // Within a depth, one batch per signature, in order of first appearance.
    std::vector<uint32_t>& group_of_sig = x.group_of_sig;
    group_of_sig.assign(sigs, kNone32);
    Column<uint32_t>& group = x.group;
    std::vector<uint32_t>&count = x.count, &sigs_here = x.sigs_here, &at = x.at;
    group.resize(m);
    for (uint32_t d = 0; d <= dag.max_depth; ++d) {
      count.clear();
      sigs_here.clear();
      for (uint32_t k = start[d]; k < start[d + 1]; ++k) {
        uint32_t i = by_depth[k], s = dag.sig[i];
        if (s == kNoSig) {
          group[i] = static_cast<uint32_t>(count.size());
          count.push_back(1);
          continue;
        }
        if (group_of_sig[s] == kNone32) {
          group_of_sig[s] = static_cast<uint32_t>(count.size());
          count.push_back(0);
          sigs_here.push_back(s);
        }
        group[i] = group_of_sig[s];
        ++count[group[i]];
      }
      const auto base = static_cast<uint32_t>(out.nodes.size());
      at.assign(count.size() + 1, base);
      for (size_t g = 0; g < count.size(); ++g) at[g + 1] = at[g] + count[g];
      out.nodes.resize(base + (start[d + 1] - start[d]));
      for (uint32_t k = start[d]; k < start[d + 1]; ++k) {
        uint32_t i = by_depth[k];
        out.nodes[at[group[i]]++] = i;
      }
      for (size_t g = 0; g < count.size(); ++g) out.begin.push_back(at[g]);
      for (uint32_t s : sigs_here) group_of_sig[s] = kNone32;
    }
  }
};

class AgendaStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "agenda"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    Scratch& x = t_scratch;
    const size_t m = dag.size();
    const uint32_t sigs = dag.num_sigs();
    std::vector<double>& avg = x.avg;
    std::vector<uint32_t>& cnt = x.cnt;
    avg.assign(sigs, 0.0);
    cnt.assign(sigs, 0);
    for (size_t i = 0; i < m; ++i)
      if (dag.sig[i] != kNoSig) {
        avg[dag.sig[i]] += dag.depth[i];
        ++cnt[dag.sig[i]];
      }
    for (uint32_t s = 0; s < sigs; ++s)
      if (cnt[s]) avg[s] /= cnt[s];

    std::vector<uint32_t>& indeg = x.indeg;
    indeg.resize(m);
    for (uint32_t i = 0; i < m; ++i) indeg[i] = dag.arg_begin[i + 1] - dag.arg_begin[i];
    std::vector<std::vector<uint32_t>>& ready = x.ready;
    if (ready.size() < sigs) ready.resize(sigs);
    for (uint32_t s = 0; s < sigs; ++s) ready[s].clear();
    // (average depth, sig) of the signatures with ready nodes, a min-heap: each
    // signature is in it at most once, so it pops in the order of a sorted set.
    std::vector<std::pair<double, uint32_t>>& agenda = x.agenda;
    agenda.clear();
    constexpr std::greater<> kMinFirst;
    std::vector<uint32_t>& alone = x.alone;  // ready shared nodes: run at once, one by one
    alone.clear();
    auto make_ready = [&](uint32_t i) {
      uint32_t s = dag.sig[i];
      if (s == kNoSig) {
        alone.push_back(i);
        return;
      }
      if (ready[s].empty()) {
        agenda.emplace_back(avg[s], s);
        std::push_heap(agenda.begin(), agenda.end(), kMinFirst);
      }
      ready[s].push_back(i);
    };
    auto emit = [&](std::span<const uint32_t> batch) {
      out.nodes.insert(out.nodes.end(), batch.begin(), batch.end());
      out.close();
      for (uint32_t i : batch)
        for (uint32_t u : dag.uses_of(i))
          if (--indeg[u] == 0) make_ready(u);
    };
    for (uint32_t i = 0; i < m; ++i)
      if (indeg[i] == 0) make_ready(i);
    std::vector<uint32_t>& batch = x.batch;
    while (!agenda.empty() || !alone.empty()) {
      if (!alone.empty()) {
        uint32_t i = alone.back();
        alone.pop_back();
        emit(std::span(&i, 1));
        continue;
      }
      std::pop_heap(agenda.begin(), agenda.end(), kMinFirst);
      const uint32_t s = agenda.back().second;
      agenda.pop_back();
      // A copy, not a swap: swapped buffers would wander between signatures
      // and grow again (an allocation per round once warm).
      batch.assign(ready[s].begin(), ready[s].end());
      ready[s].clear();
      emit(batch);
    }
  }
};

// Ours: the depth schedule, merged. Never more launches than depth; batches
// what depth cannot (losses of trees of different heights).
class LazyStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "lazy"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    DepthStrategy().schedule(dag, out);
    merge_batches(dag, out);
  }
};

// DyNet's agenda, then merged as lazy merges depth's batches: one of auto's candidates.
class MergedAgendaStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "agenda"; }  // what auto reports it picked
  void schedule(const RoundDag& dag, Batches& out) const override {
    AgendaStrategy().schedule(dag, out);
    merge_batches(dag, out);
  }
};

// Ours, the default: depth and DyNet's agenda each merged; the scheduler keeps
// the cheaper (scheduler/cost.h). Neither heuristic dominates: depth keeps the
// level structure of trees, the agenda re-aligns sequences whose depths drift
// apart (a parser's steps, where REDUCE adds latency that SHIFT does not).
class AutoStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "auto"; }
  // Without a scheduler to cost plans: the schedule with fewer launches.
  void schedule(const RoundDag& dag, Batches& out) const override {
    Batches& other = t_scratch.other;
    other.clear();
    candidates()[0]->schedule(dag, out);
    candidates()[1]->schedule(dag, other);
    if (other.size() < out.size()) std::swap(out, other);  // both keep their buffers
  }
  std::string_view chosen(const StrategyMemo& memo) const override {
    return memo.choice >= 0 ? candidates()[static_cast<size_t>(memo.choice)]->name() : name();
  }
  std::span<const Strategy* const> candidates() const override;
};

const DepthStrategy g_depth;
const AgendaStrategy g_agenda;
const LazyStrategy g_lazy;
const MergedAgendaStrategy g_merged_agenda;
const AutoStrategy g_auto;
const Strategy* const g_all[] = {&g_auto, &g_lazy, &g_agenda, &g_depth};
const Strategy* const g_auto_candidates[] = {&g_lazy, &g_merged_agenda};

std::span<const Strategy* const> AutoStrategy::candidates() const { return g_auto_candidates; }

}  // namespace

const Strategy& depth_strategy() { return g_depth; }
const Strategy& agenda_strategy() { return g_agenda; }
const Strategy& lazy_strategy() { return g_lazy; }
const Strategy& auto_strategy() { return g_auto; }
const Strategy& default_strategy() { return g_auto; }
std::span<const Strategy* const> all_strategies() { return g_all; }
bool built_in(const Strategy& s) { return std::find(std::begin(g_all), std::end(g_all), &s) != std::end(g_all); }

const Strategy& strategy_named(std::string_view name) {
  std::string known;
  for (const Strategy* s : g_all) {
    if (s->name() == name) return *s;
    known += (known.empty() ? "" : ", ") + std::string(s->name());
  }
  throw UserError(detail::cat("sheaf: unknown scheduling strategy '", name, "'; known: ", known));
}

}  // namespace sheaf
