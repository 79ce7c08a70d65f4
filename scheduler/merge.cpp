#include "merge.h"

#include <algorithm>
#include <span>
#include <vector>

#include <sheaf/core/error.h>

namespace sheaf {

// Merging only removes launches. Any valid schedule (a sequence of batches) can
// be improved by moving a whole batch into another batch of the same signature:
// later, if every consumer of its nodes runs after that batch; or earlier, if
// every argument runs before it. Positions of batches never change (emptied
// batches just vanish), so each check is a comparison of positions.
namespace {
// Kept per thread, as the strategies' scratch: merging runs every round.
struct MergeScratch {
  Column<uint32_t> owner, first, last, next, batch_of, by_sig;  // (written in full: no zero-fill as they grow)
  std::vector<uint32_t> sig_begin, cursor;
  std::vector<uint8_t> alive;
  Batches out;
};
thread_local MergeScratch t_merge;
}  // namespace

// A move splices lists of the schedule's batches, not of nodes: a batch's
// nodes stay a range of schedule.nodes, a node's position is its batch's
// owner, and the merged schedule is those ranges copied in order. (Lists of
// nodes made every move and every scan a chain of dependent loads.)
void merge_batches(const RoundDag& dag, Batches& schedule) {
  MergeScratch& x = t_merge;
  const auto nb = static_cast<uint32_t>(schedule.size());
  const uint32_t* const nodes = schedule.nodes.data();
  const uint32_t* const begin = schedule.begin.data();
  // A batch's signature is its first node's (a move appends to the receiver).
  auto sig_of = [&](uint32_t k) { return dag.sig[nodes[begin[k]]]; };
  // A few batches of different signatures (a cond-heavy net's rounds: a
  // gate and its two cells) have nothing to merge: seen in a few
  // comparisons, before the per-node passes below.
  if (nb <= 16) {
    bool repeats = false;
    for (uint32_t k = 1; k < nb && !repeats; ++k)
      for (uint32_t j = 0; j < k && !repeats; ++j) repeats = sig_of(k) != kNoSig && sig_of(j) == sig_of(k);
    if (!repeats) return;
  }
  // owner[k]: the batch whose launch runs batch k's nodes (k while alive);
  // alive batch t runs batches first[t], next[first[t]], ... last[t].
  Column<uint32_t>&owner = x.owner, &first = x.first, &last = x.last, &next = x.next, &batch_of = x.batch_of;
  owner.resize(nb);
  first.resize(nb);
  last.resize(nb);
  next.resize(nb);
  batch_of.resize(dag.size());
  for (uint32_t k = 0; k < nb; ++k) {
    owner[k] = first[k] = last[k] = k;
    next[k] = kNone32;
    for (uint32_t j = begin[k]; j < begin[k + 1]; ++j) batch_of[nodes[j]] = k;
  }
  auto pos = [&](uint32_t node) { return owner[batch_of[node]]; };
  // Batch positions per signature, ascending (a counting sort into CSR form).
  const uint32_t nsig = dag.num_sigs();
  std::vector<uint32_t>&sig_begin = x.sig_begin, &cursor = x.cursor;
  Column<uint32_t>& by_sig = x.by_sig;
  sig_begin.assign(nsig + 1, 0);
  for (uint32_t k = 0; k < nb; ++k)
    if (sig_of(k) != kNoSig) ++sig_begin[sig_of(k) + 1];
  for (uint32_t s = 0; s < nsig; ++s) sig_begin[s + 1] += sig_begin[s];
  cursor.assign(sig_begin.begin(), sig_begin.end() - 1);
  by_sig.resize(sig_begin[nsig]);
  for (uint32_t k = 0; k < nb; ++k)
    if (sig_of(k) != kNoSig) by_sig[cursor[sig_of(k)]++] = k;
  auto candidates = [&](SigId s) {
    return std::span<const uint32_t>(by_sig.data() + sig_begin[s], sig_begin[s + 1] - sig_begin[s]);
  };
  std::vector<uint8_t>& alive = x.alive;
  alive.assign(nb, 1);
  auto move = [&](uint32_t from, uint32_t to) {
    for (uint32_t k = first[from]; k != kNone32; k = next[k]) owner[k] = to;
    next[last[to]] = first[from];
    last[to] = last[from];
    alive[from] = 0;
  };
  bool moved = false;
  // Each pass catches cascades in its own direction; a third pass rarely finds
  // anything, and this is a heuristic: stop after two.
  for (int pass = 0, changed = 1; changed && pass < 2; ++pass) {
    changed = 0;
    // Later: from the last batch down, so that consumers have settled first.
    for (uint32_t k = nb; k-- > 0;) {
      if (!alive[k] || sig_of(k) == kNoSig) continue;
      const auto cand = candidates(sig_of(k));
      if (cand.back() <= k) continue;  // no later batch to join: skip the scan of uses
      // The nearest batch it could join: once a use comes no later than it,
      // none can be joined (a level's batch read by the next level's: the
      // first use ends the scan).
      auto nearest = std::upper_bound(cand.begin(), cand.end(), k);
      while (nearest != cand.end() && !alive[*nearest]) ++nearest;
      if (nearest == cand.end()) continue;
      uint32_t limit = nb;  // exclusive
      for (uint32_t m = first[k]; m != kNone32 && limit > *nearest; m = next[m])
        for (uint32_t j = begin[m]; j < begin[m + 1] && limit > *nearest; ++j)
          for (uint32_t u : dag.uses_of(nodes[j])) limit = std::min(limit, pos(u));
      if (limit <= *nearest) continue;
      auto it = std::lower_bound(cand.begin(), cand.end(), limit);
      while (it != cand.begin() && *(it - 1) > k && !alive[*(it - 1)]) --it;
      if (it != cand.begin() && *(it - 1) > k) {
        move(k, *(it - 1));
        changed = 1;
        moved = true;
      }
    }
    // Earlier: from the first batch up, so that arguments have settled first.
    for (uint32_t k = 0; k < nb; ++k) {
      if (!alive[k] || sig_of(k) == kNoSig) continue;
      const auto cand = candidates(sig_of(k));
      if (cand.front() >= k) continue;  // no earlier batch to join
      // The latest batch it could join: an argument there or later ends the scan.
      auto latest = std::lower_bound(cand.begin(), cand.end(), k);
      while (latest != cand.begin() && !alive[*(latest - 1)]) --latest;
      if (latest == cand.begin()) continue;
      const int64_t bound = *(latest - 1);
      int64_t lower = -1;  // exclusive
      for (uint32_t m = first[k]; m != kNone32 && lower < bound; m = next[m])
        for (uint32_t j = begin[m]; j < begin[m + 1] && lower < bound; ++j)
          for (uint32_t a : dag.args_of(nodes[j])) lower = std::max<int64_t>(lower, pos(a));
      if (lower >= bound) continue;
      auto it = lower < 0 ? cand.begin() : std::upper_bound(cand.begin(), cand.end(), static_cast<uint32_t>(lower));
      while (it != cand.end() && *it < k && !alive[*it]) ++it;
      if (it != cand.end() && *it < k) {
        move(k, *it);
        changed = 1;
        moved = true;
      }
    }
  }
  if (!moved) return;  // the schedule stands as it was
  Batches& out = x.out;
  out.nodes.resize(schedule.nodes.size());
  out.begin.resize(1);
  uint32_t* w = out.nodes.data();
  for (uint32_t t = 0; t < nb; ++t) {
    if (!alive[t]) continue;
    for (uint32_t m = first[t]; m != kNone32; m = next[m]) w = std::copy(nodes + begin[m], nodes + begin[m + 1], w);
    out.begin.push_back(static_cast<uint32_t>(w - out.nodes.data()));
  }
  std::swap(schedule, out);  // both keep their buffers
}

void validate_batches(const RoundDag& dag, const Batches& b, std::string_view strategy, bool users_own) {
  auto check = [&](bool ok, std::string_view what) {
    if (ok) return;
    if (users_own)
      throw UserError(detail::cat("sheaf: scheduling strategy '", strategy, "' ", what,
                                  " (Strategy::schedule must put every node of the round in exactly one batch, "
                                  "one signature a batch, shared nodes alone, each batch after its nodes' arguments)"));
    throw_internal("strategy ", strategy, " ", what);
  };
  std::vector<uint32_t> batch_of(dag.size(), kNone32);
  for (uint32_t k = 0; k < b.size(); ++k) {
    auto nodes = b[k];
    check(!nodes.empty(), "emitted an empty batch");
    for (uint32_t i : nodes) {
      check(i < dag.size(), "scheduled a node that is not in the round");
      check(batch_of[i] == kNone32, "scheduled a node twice");
      check(dag.sig[i] == dag.sig[nodes[0]], "mixed signatures in a batch");
      check(dag.sig[i] != kNoSig || nodes.size() == 1, "batched shared nodes");
      for (uint32_t a : dag.args_of(i)) check(batch_of[a] < k, "ran a node before its argument");
      batch_of[i] = k;
    }
  }
  for (uint32_t bo : batch_of) check(bo != kNone32, "left a node unscheduled");
}

}  // namespace sheaf
