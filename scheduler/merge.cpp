#include "merge.h"

#include <algorithm>
#include <vector>

#include <sheaf/core/error.h>

namespace sheaf {

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
  std::vector<std::vector<uint32_t>> of_sig(dag.num_sigs());  // batch positions per signature, ascending
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


void validate_batches(const RoundDag& dag, const Batches& b, std::string_view strategy) {
  std::vector<uint32_t> batch_of(dag.size(), kNone32);
  for (uint32_t k = 0; k < b.size(); ++k) {
    auto nodes = b[k];
    SHEAF_ASSERT(!nodes.empty(), "strategy ", strategy, " emitted an empty batch");
    for (uint32_t i : nodes) {
      SHEAF_ASSERT(batch_of[i] == kNone32, "strategy ", strategy, " scheduled a node twice");
      SHEAF_ASSERT(dag.sig[i] == dag.sig[nodes[0]], "strategy ", strategy, " mixed signatures in a batch");
      SHEAF_ASSERT(dag.sig[i] != kNoSig || nodes.size() == 1, "strategy ", strategy, " batched shared nodes");
      for (uint32_t a : dag.args_of(i))
        SHEAF_ASSERT(batch_of[a] < k, "strategy ", strategy, " ran a node before its argument");
      batch_of[i] = k;
    }
  }
  for (uint32_t bo : batch_of) SHEAF_ASSERT(bo != kNone32, "strategy ", strategy, " left a node unscheduled");
}

}  // namespace sheaf
