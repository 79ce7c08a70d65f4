#include "scheduler.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include <sheaf/core/hash.h>
#include <sheaf/ops/op_list.h>

#include "merge.h"

namespace sheaf {

namespace {
using Clock = std::chrono::steady_clock;
// Adds the time since `t` to `into` and restarts `t`.
void lap(Clock::time_point& t, double& into) {
  const auto now = Clock::now();
  into += std::chrono::duration<double, std::milli>(now - t).count();
  t = now;
}
}  // namespace

bool Scheduler::schedule(Trace& trace, const Strategy& strategy, bool validate, bool fuse, const CostModel& cost,
                         const Awaited* awaited) {
  auto t = Clock::now();
  aliases_.clear();
  compared_.clear();
  build_round(trace.store(), trace.ready(), aliases_, dag_, times_.visits, awaited);
  lap(t, times_.round_ms);
  if (dag_.size() == 0) return false;
  try {
    plan_round(trace, strategy, validate, fuse, cost, t);
  } catch (...) {
    // A user's strategy threw or emitted an invalid schedule: the round's
    // nodes go back to the queue, so that a forward with another strategy
    // runs them (they were lost before: "could not be computed" ever after).
    return_round(trace);
    throw;
  }
  return true;
}

void Scheduler::return_round(Trace& trace) const {
  const NodeStore& s = trace.store();
  ReadyQueue& ready = trace.ready();
  auto give_back = [&](NodeId n) {
    ready.add(n);
    if (s.op[n] == code_of<op::Call>)  // (its further results, recorded right after it, as a failed run's)
      for (int64_t k = 1; k < s.attrs_of(n)[1]; ++k) ready.add(n + static_cast<NodeId>(k));
  };
  for (size_t i = 0; i < dag_.size(); ++i) {
    if (dag_.node[i] != kNoNode) give_back(dag_.node[i]);
    else
      for (NodeId m : fuser_.members(fuser_.region(dag_.region[i]))) give_back(m);
  }
  for (NodeId p : aliases_) ready.add(p);
}

void Scheduler::plan_round(Trace& trace, const Strategy& strategy, bool validate, bool fuse, const CostModel& cost,
                           Clock::time_point& t) {
  if (fuse) fuser_.fuse(trace.store(), dag_);
  fused_ = fuse;
  lap(t, times_.fuse_ms);
  if (memo_owner_ != &strategy) {
    memo_ = StrategyMemo();
    memo_owner_ = &strategy;
  }
  const Fuser* fuser = fuse ? &fuser_ : nullptr;
  const std::span<const Strategy* const> candidates = strategy.candidates();
  for (size_t k = 0; k < candidates.size(); ++k)
    if (candidates[k] == nullptr)
      throw UserError(detail::cat("sheaf: scheduling strategy '", strategy.name(), "': candidates()[", k,
                                  "] is a null pointer"));
  // A user's list of candidates may change between rounds (or a strategy be
  // made anew at a gone one's address): the memo's choice is taken only while
  // it names one of them, else the candidates are compared again.
  if (memo_.choice >= static_cast<int>(candidates.size())) memo_ = StrategyMemo();
  if (candidates.empty()) {
    plan_with(trace, strategy, &memo_, strategy.name(), validate, fuser);
  } else if (memo_.rounds_left > 0) {
    --memo_.rounds_left;
    plan_with(trace, *candidates[static_cast<size_t>(memo_.choice)], nullptr, strategy.name(), validate, fuser);
  } else {
    compare(trace, strategy, validate, fuser, cost);
  }
  chosen_ = strategy.chosen(memo_);
  t = Clock::now();
  count_split_shared(trace);
  lap(t, times_.plan_ms);
}

bool Scheduler::plan_holds(const Trace& trace) const {
  const NodeStore& s = trace.store();
  const bool grad = c10::GradMode::is_enabled();
  if (plan_.grad != grad || plan_.base != s.batch_out.size()) return false;
  if (grad)  // (without autograd every placed lookup stays so)
    for (NodeId n : plan_.placed)
      if (table_batch(s, n) == kNone32) return false;
  return true;
}

void Scheduler::replan(Trace& trace) {
  const std::string label = plan_.strategy;  // (make_plan assigns it)
  make_plan(trace.store(), dag_, batches_, label, plan_, fused_ ? &fuser_ : nullptr);
}

// `label`: the strategy asked for (plans and errors name it). `memo`: what the
// graph remembers for `strategy` (none for a candidate: its chooser has it).
void Scheduler::plan_with(Trace& trace, const Strategy& strategy, StrategyMemo* memo, std::string_view label,
                          bool validate, const Fuser* fuser) {
  auto t = Clock::now();
  batches_.clear();
  if (memo) strategy.schedule(dag_, batches_, *memo);
  else strategy.schedule(dag_, batches_);
  if (validate) validate_batches(dag_, batches_, label, !built_in(strategy));
  lap(t, times_.strategy_ms);
  make_plan(trace.store(), dag_, batches_, label, plan_, fuser);
  lap(t, times_.plan_ms);
}

// Plans the round with each candidate and keeps the cheapest (ties: the
// first), used alone until the next comparison: a comparison costs a schedule
// and a plan per candidate. The next comes after kRecheck rounds, or, when the
// same candidate won again, after twice as many as last time, up to
// kRecheckMax: a graph whose work keeps its shape (the usual training loop)
// stops paying for comparisons that change nothing, and one whose work
// changes is rechecked within kRecheckMax rounds. Only plans, no timing,
// decide: the same graph gets the same schedule on every run. The candidates
// are planned last to first: the store holds the rows of the last plan made,
// so when the first (the usual winner) wins, its plan stands without being
// made again.
void Scheduler::compare(Trace& trace, const Strategy& strategy, bool validate, const Fuser* fuser,
                        const CostModel& cost) {
  static constexpr int kRecheck = 16, kRecheckMax = 128;
  const std::span<const Strategy* const> candidates = strategy.candidates();
  compared_.resize(candidates.size());
  size_t best = candidates.size() - 1;
  for (size_t k = candidates.size(); k-- > 0;) {
    plan_with(trace, *candidates[k], nullptr, strategy.name(), validate, fuser);
    compared_[k] = PlanCost{std::string(candidates[k]->name()), plan_.batches.size(), plan_.gathers, plan_.gathered_bytes,
                            cost.of(plan_.batches.size(), plan_.gathers, plan_.gathered_bytes)};
    if (compared_[k].cost_us <= compared_[best].cost_us) best = k;
  }
  if (best != 0) plan_with(trace, *candidates[best], nullptr, strategy.name(), validate, fuser);
  memo_.interval = memo_.choice == static_cast<int>(best) ? std::min(2 * memo_.interval, kRecheckMax) : kRecheck;
  memo_.choice = static_cast<int>(best);
  memo_.rounds_left = memo_.interval - 1;
}

std::string describe(std::span<const PlanCost> costs) {
  std::ostringstream os;
  for (size_t k = 0; k < costs.size(); ++k)
    os << (k ? ", " : "") << costs[k].name << " " << costs[k].launches << " launches + " << costs[k].gathers
       << " gathers of " << costs[k].gathered_bytes / 1024 << " KiB = " << costs[k].cost_us << " us";
  return os.str();
}

// Lone batches whose shared operand is read by that node only, grouped by what
// their signature would be if shared operands counted by shape: two or more
// in a group would have been one launch with one shared tensor.
void Scheduler::count_split_shared(const Trace& trace) {
  const NodeStore& s = trace.store();
  split_shared_ = 0;
  split_shared_node_ = kNoNode;
  loose_.clear();
  std::vector<int64_t>& key = key_;
  for (size_t k = 0; k < batches_.size(); ++k) {
    if (batches_[k].size() != 1) continue;
    const NodeId n = dag_.node[batches_[k][0]];
    if (n == kNoNode) {  // a fused region: its pattern names its shared inputs
      const uint32_t r = dag_.region[batches_[k][0]];
      if (r != kNone32) count_split_region(trace, fuser_.region(r));
      continue;
    }
    if (dag_.sig[batches_[k][0]] == kNoSig) continue;  // a shared node
    bool lone_shared = false;
    key.assign({s.op[n], s.shape[n]});
    key.insert(key.end(), s.attrs_of(n).begin(), s.attrs_of(n).end());
    for (NodeId a : s.args_of(n)) {
      const NodeId r = s.resolve(a);
      key.push_back(s.shape[r]);
      lone_shared = lone_shared || (s.has(r, NodeStore::kShared) && trace.param_uses(r) == 1);
    }
    if (lone_shared) loose_.emplace_back(hash_words(key), n);
  }
  std::sort(loose_.begin(), loose_.end());
  for (size_t i = 0, j; i < loose_.size(); i = j) {
    for (j = i; j < loose_.size() && loose_[j].first == loose_[i].first;) ++j;
    if (j - i < 2) continue;
    split_shared_ += static_cast<uint32_t>(j - i);
    if (split_shared_node_ == kNoNode) split_shared_node_ = loose_[i].second;
  }
}

// A lone fused region with a shared input read by it only: keyed by its
// members' ops and shapes and its shared inputs' shapes (not identities).
void Scheduler::count_split_region(const Trace& trace, const Region& region) {
  const NodeStore& s = trace.store();
  std::vector<int64_t>& key = key_;
  bool lone_shared = false;
  key.assign({-2});
  for (NodeId in : fuser_.inputs(region)) {
    if (!s.has(in, NodeStore::kShared)) continue;
    key.push_back(s.shape[in]);
    lone_shared = lone_shared || trace.param_uses(in) == 1;
  }
  for (NodeId m : fuser_.members(region)) {
    key.push_back(s.op[m]);
    key.push_back(s.shape[m]);
  }
  if (lone_shared) loose_.emplace_back(hash_words(key), fuser_.members(region)[0]);
}

}  // namespace sheaf
