// Graph::forward: the pipeline as straight-line code.
//
//   recorded nodes --build_round--> RoundDag --strategy--> Batches --make_plan--> Plan --Executor--> values
//
// then control flow: predicates computed in this round are fetched to the host
// (once for all examples), their branches are recorded, and the next round runs.
#include <ATen/ops/cat.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>

#include "../scheduler/plan.h"
#include "../scheduler/round.h"
#include "../scheduler/strategy.h"
#include "../tracer/graph.h"
#include "../tracer/error.h"
#include "executor.h"

namespace sheaf {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

bool debug_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SHEAF_DEBUG");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

}  // namespace

void Graph::forward(std::span<const Expr> targets, const ForwardOptions& options) {
  for (const Expr& t : targets) node_of(t, "forward", std::source_location::current());
  const Strategy& strategy = options.strategy ? *options.strategy : *default_strategy_;
  const bool validate = options.validate || debug_enabled();
  // After prepare(), its round runs first; the time since prepare() is not tracing.
  if (!prepared_) stats_.trace_ms += ms_since(trace_start_);
  if (debug_enabled()) std::cerr << "[sheaf] graph before forward:\n" << dump();

  for (int round = 0;; ++round) {
    if (round >= options.max_rounds)
      throw UserError(detail::cat("sheaf: forward stopped after ", options.max_rounds,
                                  " rounds of control flow (ForwardOptions::max_rounds); a dsl::loop or "
                                  "coroutine may never finish"));
    if (prepared_) {
      prepared_ = false;
      execute_round();
    } else if (schedule_round(strategy, validate)) {
      execute_round();
    }
    if (!deliver_waiters()) break;
  }

  for (const Expr& t : targets)
    if (!store_.has(store_.resolve(t.id()), NodeStore::kComputed))
      throw UserError(detail::cat("sheaf: forward target %", t.id(),
                                  " could not be computed: it depends on a dsl::cond or dsl::loop that never "
                                  "resolved (an earlier error inside a branch?)"));
  trace_start_ = Clock::now();
}

void Graph::prepare(std::span<const Expr> targets, const ForwardOptions& options) {
  for (const Expr& t : targets) node_of(t, "prepare", std::source_location::current());
  if (prepared_) return;  // nothing recorded since can join that round
  stats_.trace_ms += ms_since(trace_start_);
  const Strategy& strategy = options.strategy ? *options.strategy : *default_strategy_;
  prepared_ = schedule_round(strategy, options.validate || debug_enabled());
  trace_start_ = Clock::now();
}

// Schedules the pending nodes into last_plan_. Returns false when there is
// nothing to launch (the round only resolved placeholders).
bool Graph::schedule_round(const Strategy& strategy, bool validate) {
  auto t0 = Clock::now();
  std::vector<NodeId>& aliases = round_->aliases;
  aliases.clear();
  RoundDag& dag = round_->dag;
  build_round(store_, pending_, aliases, dag);
  if (dag.size() == 0) {
    finish_aliases(aliases);
    stats_.schedule_ms += ms_since(t0);
    return false;
  }
  Batches& batches = round_->batches;
  batches.clear();
  if (memo_owner_ != &strategy) {
    memo_ = std::make_unique<StrategyMemo>();
    memo_owner_ = &strategy;
  }
  strategy.schedule(dag, batches, *memo_);
  if (validate) validate_batches(dag, batches, strategy.name());
  make_plan(store_, dag, batches, strategy.name(), *last_plan_);
  stats_.schedule_ms += ms_since(t0);
  if (debug_enabled()) std::cerr << "[sheaf] " << last_plan_->str();
  return true;
}

void Graph::execute_round() {
  const RoundDag& dag = round_->dag;
  std::vector<NodeId>& aliases = round_->aliases;
  auto t1 = Clock::now();
  Executor exec(store_, options_, stats_);
  try {
    exec.run(*last_plan_);
  } catch (...) {
    // Nodes that did not run go back to pending, so the graph stays usable.
    for (NodeId n : dag.node)
      if (!store_.has(n, NodeStore::kComputed)) pending_.push_back(n);
    pending_.insert(pending_.end(), aliases.begin(), aliases.end());
    std::sort(pending_.begin(), pending_.end());
    stats_.execute_ms += ms_since(t1);
    throw;
  }
  stats_.execute_ms += ms_since(t1);
  ++stats_.rounds;
  finish_aliases(aliases);
}

// A resolved placeholder's value is its branch's value: same batch, same row.
void Graph::finish_aliases(std::vector<NodeId>& aliases) {
  for (NodeId p : aliases) {
    NodeId r = store_.resolve(p);
    SHEAF_ASSERT(store_.has(r, NodeStore::kComputed), "alias target %", r, " of %", p, " not computed");
    store_.value_batch[p] = store_.value_batch[r];
    store_.value_row[p] = store_.value_row[r];
    store_.flags[p] |= NodeStore::kComputed;
  }
}

// Hands computed values to whoever waits for them (dsl::cond, dsl::loop, coroutines):
// one device->host copy for all of them. Returns whether anyone was served.
bool Graph::deliver_waiters() {
  std::vector<Waiter> ready;
  {
    size_t keep = 0;
    for (Waiter& w : waiters_) {
      if (store_.has(store_.resolve(w.node), NodeStore::kComputed)) ready.push_back(std::move(w));
      else waiters_[keep++] = std::move(w);
    }
    waiters_.resize(keep);
  }
  if (ready.empty()) return false;

  auto t0 = Clock::now();
  std::vector<at::Tensor> host(ready.size());
  {
    c10::NoGradGuard no_grad;
    // Group rows by the batch that holds them: one index_select per batch, one cat, one copy.
    std::vector<std::pair<uint32_t, size_t>> by_batch;  // (batch, waiter)
    for (size_t i = 0; i < ready.size(); ++i) by_batch.emplace_back(store_.value_batch[store_.resolve(ready[i].node)], i);
    std::stable_sort(by_batch.begin(), by_batch.end());
    std::vector<at::Tensor> flat;
    std::vector<size_t> order;
    for (size_t k = 0; k < by_batch.size();) {
      uint32_t b = by_batch[k].first;
      std::vector<int64_t> rows;
      size_t j = k;
      for (; j < by_batch.size() && by_batch[j].first == b; ++j) {
        NodeId r = store_.resolve(ready[by_batch[j].second].node);
        rows.push_back(store_.value_row[r] == kWholeRow ? -1 : store_.value_row[r]);
        order.push_back(by_batch[j].second);
      }
      const at::Tensor& t = store_.batch_out[b];
      if (rows[0] < 0) {
        for (size_t q = k; q < j; ++q) flat.push_back(t.detach().reshape({-1}));
      } else {
        at::Tensor idx = at::tensor(rows, at::TensorOptions().dtype(at::kLong));
        if (t.is_cuda()) idx = idx.pin_memory().to(t.device(), /*non_blocking=*/true);
        flat.push_back(t.detach().index_select(0, idx).reshape({-1}));
      }
      k = j;
    }
    at::Tensor all = (flat.size() == 1 ? flat[0] : at::cat(flat)).to(at::kCPU).contiguous();
    ++stats_.fetches;
    int64_t off = 0;
    for (size_t q = 0; q < order.size(); ++q) {
      NodeId r = store_.resolve(ready[order[q]].node);
      const Shape& s = store_.shape_of(r);
      host[order[q]] = all.narrow(0, off, s.numel()).view(std::vector<int64_t>(s.dims().begin(), s.dims().end()));
      off += s.numel();
    }
  }
  stats_.fetch_ms += ms_since(t0);

  auto t1 = Clock::now();
  for (size_t i = 0; i < ready.size(); ++i) ready[i].callback(host[i]);
  stats_.trace_ms += ms_since(t1);
  return true;
}

}  // namespace sheaf
