#include "scheduler.h"

#include "merge.h"

namespace sheaf {

bool Scheduler::schedule(Trace& trace, const Strategy& strategy, bool validate) {
  aliases_.clear();
  build_round(trace.store(), trace.pending(), aliases_, dag_);
  if (dag_.size() == 0) return false;
  batches_.clear();
  if (memo_owner_ != &strategy) {
    memo_ = StrategyMemo();
    memo_owner_ = &strategy;
  }
  strategy.schedule(dag_, batches_, memo_);
  if (validate) validate_batches(dag_, batches_, strategy.name());
  make_plan(trace.store(), dag_, batches_, strategy.name(), plan_);
  return true;
}

}  // namespace sheaf
