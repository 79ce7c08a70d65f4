#include "task.h"

#include <sheaf/engine/engine.h>
#include <sheaf/engine/scopes.h>

namespace sheaf {

namespace detail {

AwaitToken await_value(const Expr& expr, std::function<void(const HostValue&)> resume, std::source_location loc) {
  Engine& g = Engine::of(expr, loc);
  const NodeId n = g.node_of(expr, "co_await", loc);
  g.expect_awaitable(loc);
  const int64_t example = g.trace().current_example();
  // Resumed under g's example then, and under the scopes of the other graphs
  // it may record into (engine/scopes.h). (held_scopes leaves g out: a
  // suspension inside this resumption finds it as the graph delivering.)
  const WaiterId id = g.when_computed(n, [&g, example, held = held_scopes(g), resume = std::move(resume)](
                                             const HostValue& v) {
    const ResumedScopes others(held);
    ListedExample scope(g, example);
    resume(v);
  });
  return AwaitToken{expr, id.index, id.generation};
}

void cancel_await(const AwaitToken& token) {
  if (Engine* g = Engine::find(token.expr)) g->cancel(WaiterId{token.index, token.generation});
}

std::string unfinished_message(const PromiseBase& p) {
  const PromiseBase* q = &p;
  while (q->awaiting != nullptr) q = q->awaiting;  // the innermost task of a chain of co_awaits
  if (q->value_wait.defined() && Engine::find(q->value_wait) == nullptr)
    return "Task::result() of a task that will never finish: its co_await waits on a value of a graph that was "
           "cleared or destroyed since (the wait went with it)";
  return "Task::result() of a task that has not finished; call Graph::forward() first";
}

void report_task_failure(std::exception_ptr error) {
  if (Engine* g = Engine::delivering()) g->report_failure(g->trace().current_example(), std::move(error));
}

}  // namespace detail

std::vector<float> host_values(const HostValue& v) { return std::vector<float>(v.data, v.data + v.numel()); }

double host_item(const HostValue& v, std::source_location loc) {
  if (v.numel() != 1)
    throw_user_at(loc, "fetch_item() of a value with ", v.numel(), " elements (op '", v.recorded.op, "', example ",
                  v.recorded.example, ", recorded at ", detail::format_loc(v.recorded.loc), "); it needs a scalar");
  return v.data[0];
}

// The first largest element, as at::argmax; a NaN counts as the largest.
int64_t host_argmax(const HostValue& v, std::source_location loc) {
  const int64_t n = v.numel();
  if (n == 0)
    throw_user_at(loc, "fetch_argmax() of an empty value (op '", v.recorded.op, "', example ", v.recorded.example,
                  ", recorded at ", detail::format_loc(v.recorded.loc), ")");
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    const float x = v.data[i], b = v.data[best];
    if (b != b) break;
    if (x != x || x > b) best = i;
  }
  return best;
}

}  // namespace sheaf
