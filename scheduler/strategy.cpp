#include "strategy.h"

#include <algorithm>
#include <set>
#include <string>

#include "../tracer/error.h"

namespace sheaf {

namespace {

uint32_t num_sigs(const RoundDag& dag) {
  uint32_t m = 0;
  for (uint32_t s : dag.sig)
    if (s != kNoSig) m = std::max(m, s + 1);
  return m;
}

class DepthStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "depth"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    const size_t m = dag.size();
    // Counting sort by depth, keeping the local (topological) order inside a depth.
    std::vector<uint32_t> start(dag.max_depth + 2, 0);
    for (uint32_t d : dag.depth) ++start[d + 1];
    for (size_t d = 1; d < start.size(); ++d) start[d] += start[d - 1];
    std::vector<uint32_t> by_depth(m);
    {
      std::vector<uint32_t> fill(start.begin(), start.end() - 1);
      for (uint32_t i = 0; i < m; ++i) by_depth[fill[dag.depth[i]]++] = i;
    }
    // Within a depth, one batch per signature, in order of first appearance.
    std::vector<uint32_t> group_of_sig(num_sigs(dag), 0xFFFFFFFFu);
    std::vector<uint32_t> group(m), count;
    for (uint32_t d = 0; d <= dag.max_depth; ++d) {
      count.clear();
      std::vector<uint32_t> sigs_here;
      for (uint32_t k = start[d]; k < start[d + 1]; ++k) {
        uint32_t i = by_depth[k], s = dag.sig[i];
        if (s == kNoSig) {
          group[i] = static_cast<uint32_t>(count.size());
          count.push_back(1);
          continue;
        }
        if (group_of_sig[s] == 0xFFFFFFFFu) {
          group_of_sig[s] = static_cast<uint32_t>(count.size());
          count.push_back(0);
          sigs_here.push_back(s);
        }
        group[i] = group_of_sig[s];
        ++count[group[i]];
      }
      const auto base = static_cast<uint32_t>(out.nodes.size());
      std::vector<uint32_t> at(count.size() + 1, base);
      for (size_t g = 0; g < count.size(); ++g) at[g + 1] = at[g] + count[g];
      out.nodes.resize(base + (start[d + 1] - start[d]));
      for (uint32_t k = start[d]; k < start[d + 1]; ++k) {
        uint32_t i = by_depth[k];
        out.nodes[at[group[i]]++] = i;
      }
      for (size_t g = 0; g < count.size(); ++g) out.begin.push_back(at[g]);
      for (uint32_t s : sigs_here) group_of_sig[s] = 0xFFFFFFFFu;
    }
  }
};

class AgendaStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "agenda"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    const size_t m = dag.size();
    const uint32_t sigs = num_sigs(dag);
    std::vector<double> avg(sigs, 0.0);
    std::vector<uint32_t> cnt(sigs, 0);
    for (size_t i = 0; i < m; ++i)
      if (dag.sig[i] != kNoSig) {
        avg[dag.sig[i]] += dag.depth[i];
        ++cnt[dag.sig[i]];
      }
    for (uint32_t s = 0; s < sigs; ++s)
      if (cnt[s]) avg[s] /= cnt[s];

    std::vector<uint32_t> indeg(m);
    for (uint32_t i = 0; i < m; ++i) indeg[i] = dag.arg_begin[i + 1] - dag.arg_begin[i];
    std::vector<std::vector<uint32_t>> ready(sigs);
    std::set<std::pair<double, uint32_t>> agenda;  // (average depth, sig) with ready nodes
    std::vector<uint32_t> alone;                   // ready shared nodes: run at once, one by one
    auto make_ready = [&](uint32_t i) {
      uint32_t s = dag.sig[i];
      if (s == kNoSig) {
        alone.push_back(i);
        return;
      }
      if (ready[s].empty()) agenda.emplace(avg[s], s);
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
    std::vector<uint32_t> batch;
    while (!agenda.empty() || !alone.empty()) {
      if (!alone.empty()) {
        uint32_t i = alone.back();
        alone.pop_back();
        emit(std::span(&i, 1));
        continue;
      }
      uint32_t s = agenda.begin()->second;
      agenda.erase(agenda.begin());
      batch.swap(ready[s]);
      ready[s].clear();
      emit(batch);
    }
  }
};

// Merging only removes launches. Any valid schedule (a sequence of batches) can
// be improved by moving a whole batch into another batch of the same signature:
// later, if every consumer of its nodes runs after that batch; or earlier, if
// every argument runs before it. Positions of batches never change (emptied
// batches just vanish), so each check is a comparison of positions.
void merge_batches(const RoundDag& dag, Batches& schedule) {
  const size_t nb = schedule.size();
  std::vector<std::vector<uint32_t>> members(nb);
  std::vector<uint32_t> pos_of_node(dag.size());
  for (uint32_t k = 0; k < nb; ++k) {
    auto nodes = schedule[k];
    members[k].assign(nodes.begin(), nodes.end());
    for (uint32_t i : nodes) pos_of_node[i] = k;
  }
  std::vector<std::vector<uint32_t>> of_sig(num_sigs(dag));  // batch positions per signature, ascending
  for (uint32_t k = 0; k < nb; ++k)
    if (dag.sig[members[k][0]] != kNoSig) of_sig[dag.sig[members[k][0]]].push_back(k);
  std::vector<uint8_t> alive(nb, 1);
  auto move = [&](uint32_t from, uint32_t to) {
    for (uint32_t i : members[from]) pos_of_node[i] = to;
    members[to].insert(members[to].end(), members[from].begin(), members[from].end());
    members[from].clear();
    alive[from] = 0;
  };
  // Each pass catches cascades in its own direction; a third pass rarely finds
  // anything, and this is a heuristic: stop after two.
  for (int pass = 0, changed = 1; changed && pass < 2; ++pass) {
    changed = 0;
    // Later: from the last batch down, so that consumers have settled first.
    for (uint32_t k = static_cast<uint32_t>(nb); k-- > 0;) {
      if (!alive[k] || dag.sig[members[k][0]] == kNoSig) continue;
      uint32_t limit = static_cast<uint32_t>(nb);  // exclusive
      for (uint32_t i : members[k])
        for (uint32_t u : dag.uses_of(i)) limit = std::min(limit, pos_of_node[u]);
      const auto& cand = of_sig[dag.sig[members[k][0]]];
      auto it = std::lower_bound(cand.begin(), cand.end(), limit);
      while (it != cand.begin() && *(it - 1) > k && !alive[*(it - 1)]) --it;
      if (it != cand.begin() && *(it - 1) > k) {
        move(k, *(it - 1));
        changed = 1;
      }
    }
    // Earlier: from the first batch up, so that arguments have settled first.
    for (uint32_t k = 0; k < nb; ++k) {
      if (!alive[k] || dag.sig[members[k][0]] == kNoSig) continue;
      int64_t lower = -1;  // exclusive
      for (uint32_t i : members[k])
        for (uint32_t a : dag.args_of(i)) lower = std::max<int64_t>(lower, pos_of_node[a]);
      const auto& cand = of_sig[dag.sig[members[k][0]]];
      auto it = lower < 0 ? cand.begin() : std::upper_bound(cand.begin(), cand.end(), static_cast<uint32_t>(lower));
      while (it != cand.end() && *it < k && !alive[*it]) ++it;
      if (it != cand.end() && *it < k) {
        move(k, *it);
        changed = 1;
      }
    }
  }
  Batches out;
  for (uint32_t k = 0; k < nb; ++k) {
    if (!alive[k]) continue;
    out.nodes.insert(out.nodes.end(), members[k].begin(), members[k].end());
    out.close();
  }
  schedule = std::move(out);
}

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

// Ours, the default: depth and DyNet's agenda each merged; the schedule with
// fewer launches wins. Neither heuristic dominates: depth keeps the level
// structure of trees, the agenda re-aligns sequences whose depths drift apart
// (a parser's steps, where REDUCE adds latency that SHIFT does not).
class AutoStrategy final : public Strategy {
 public:
  std::string_view name() const override { return "auto"; }
  void schedule(const RoundDag& dag, Batches& out) const override {
    Memo fresh;
    schedule(dag, out, fresh);
  }
  // With a memo, the winner of the last comparison is used alone for the next
  // kRecheck - 1 rounds: comparing costs a second schedule and merge per round.
  void schedule(const RoundDag& dag, Batches& out, Memo& memo) const override {
    static constexpr int kRecheck = 16;
    if (memo.rounds_left > 0) {
      --memo.rounds_left;
      run(memo.choice, dag, out);
      return;
    }
    Batches agenda;
    run(0, dag, out);
    run(1, dag, agenda);
    memo.choice = agenda.size() < out.size() ? 1 : 0;
    if (memo.choice == 1) out = std::move(agenda);
    memo.rounds_left = kRecheck - 1;
  }

 private:
  static void run(int choice, const RoundDag& dag, Batches& out) {
    if (choice == 0) {
      LazyStrategy().schedule(dag, out);
    } else {
      AgendaStrategy().schedule(dag, out);
      merge_batches(dag, out);
    }
  }
};

const DepthStrategy g_depth;
const AgendaStrategy g_agenda;
const LazyStrategy g_lazy;
const AutoStrategy g_auto;
const Strategy* const g_all[] = {&g_auto, &g_lazy, &g_agenda, &g_depth};

}  // namespace

const Strategy& depth_strategy() { return g_depth; }
const Strategy& agenda_strategy() { return g_agenda; }
const Strategy& lazy_strategy() { return g_lazy; }
const Strategy& auto_strategy() { return g_auto; }
const Strategy& default_strategy() { return g_auto; }
std::span<const Strategy* const> all_strategies() { return g_all; }

const Strategy& strategy_named(std::string_view name) {
  std::string known;
  for (const Strategy* s : g_all) {
    if (s->name() == name) return *s;
    known += (known.empty() ? "" : ", ") + std::string(s->name());
  }
  throw UserError(detail::cat("sheaf: unknown scheduling strategy '", name, "'; known: ", known));
}

void validate_batches(const RoundDag& dag, const Batches& b, std::string_view strategy) {
  std::vector<uint32_t> batch_of(dag.size(), 0xFFFFFFFFu);
  for (uint32_t k = 0; k < b.size(); ++k) {
    auto nodes = b[k];
    SHEAF_ASSERT(!nodes.empty(), "strategy ", strategy, " emitted an empty batch");
    for (uint32_t i : nodes) {
      SHEAF_ASSERT(batch_of[i] == 0xFFFFFFFFu, "strategy ", strategy, " scheduled a node twice");
      SHEAF_ASSERT(dag.sig[i] == dag.sig[nodes[0]], "strategy ", strategy, " mixed signatures in a batch");
      SHEAF_ASSERT(dag.sig[i] != kNoSig || nodes.size() == 1, "strategy ", strategy, " batched shared nodes");
      for (uint32_t a : dag.args_of(i))
        SHEAF_ASSERT(batch_of[a] < k, "strategy ", strategy, " ran a node before its argument");
      batch_of[i] = k;
    }
  }
  for (uint32_t bo : batch_of) SHEAF_ASSERT(bo != 0xFFFFFFFFu, "strategy ", strategy, " left a node unscheduled");
}

}  // namespace sheaf
