#include "control.h"

#include <memory>

#include <sheaf/engine/engine.h>
#include <sheaf/engine/scopes.h>

namespace sheaf::dsl {

namespace {

using sheaf::detail::Engine;
using sheaf::detail::ListedExample;
using sheaf::detail::ValueCallback;

// Predicates are per-example scalars; a host value of any other size is a mistake.
bool truth(const HostValue& v, const Site& site) {
  if (v.numel() != 1) throw_user(site, "the predicate must be a scalar, got ", v.numel(), " elements");
  return v.data[0] != 0.0f;
}

Engine& engine_for(const Expr& e, const Site& site) {
  Engine* g = Engine::find(e);
  if (g == nullptr) throw_user(site, Engine::unusable(e, "the predicate"));
  return *g;
}

void expect_scalar(Engine& g, const Expr& e, const Site& site, const char* what) {
  const NodeStore& s = g.store();
  NodeId n = g.node_of(e, site.op, site.loc);
  if (s.shape[n] != kUnknownShape && s.shape_of(n).rank() != 0)
    throw_user(site, what, " must be a per-example scalar, got shape ", s.shape_of(n).str());
}

// Records `fn` for the example the control flow belongs to.
template <class F>
auto in_example(Engine& g, int64_t example, F&& fn) {
  if (example < 0) return fn();
  ListedExample scope(g, example);  // (a task made here keeps it: held_scopes, engine/scopes.h)
  return fn();
}

struct LoopState {
  Engine* g;
  std::function<Expr(const std::vector<Expr>&)> cond_fn;
  std::function<std::vector<Expr>(const std::vector<Expr>&)> body_fn;
  std::vector<NodeId> results;  // the placeholders handed to the user
  int max_iterations;
  Site site;
};

// Records the condition for `state`; when its value is known, either records the
// body and goes round again, or binds the results to `state`.
void loop_step(const std::shared_ptr<LoopState>& st, std::vector<Expr> state, int iteration) {
  Engine& g = *st->g;
  Expr c = in_example(g, st->site.example, [&] { return st->cond_fn(state); });
  expect_scalar(g, c, st->site, "the loop condition");
  g.when_computed(c.id(), [st, state = std::move(state), iteration](const HostValue& v) {
    Engine& g = *st->g;
    if (!truth(v, st->site)) {
      for (size_t i = 0; i < state.size(); ++i)
        g.trace().resolve(st->results[i], g.node_of(state[i], "loop", st->site.loc));
      return;
    }
    if (iteration >= st->max_iterations)
      throw_user(st->site, "more than max_iterations = ", st->max_iterations,
                 " iterations: the condition stayed true (raise max_iterations if that is intended)");
    std::vector<Expr> next = in_example(g, st->site.example, [&] { return st->body_fn(state); });
    if (next.size() != state.size())
      throw_user(st->site, "the body returned ", next.size(), " values for a state of ", state.size());
    for (size_t i = 0; i < next.size(); ++i) {
      NodeId n = g.node_of(next[i], "loop", st->site.loc);
      const NodeStore& s = g.store();
      const ShapeId want = s.shape[st->results[i]];
      if (s.shape[n] != kUnknownShape && want != kUnknownShape && s.shape[n] != want)
        throw_user(st->site, "the body returned shape ", s.shape_of(n).str(), " for state ", i, ", which has shape ",
                   s.shape_of(st->results[i]).str());
    }
    loop_step(st, std::move(next), iteration + 1);
  });
}

}  // namespace

namespace cond_impl {

CondSlot cond_begin(const Expr& pred, bool callable, const Shape* declared, std::source_location loc) {
  Site site{"cond", kSharedExample, loc};
  Engine& g = engine_for(pred, site);
  g.note_recording("cond", loc);  // a frozen body's Expr: refused before a placeholder joins the body
  site.example = pred.example(loc) >= 0 ? pred.example(loc) : g.trace().current_example();
  expect_scalar(g, pred, site, "the predicate");
  if (!callable) throw_user(site, "both branches must be callable");
  if (declared != nullptr)
    for (int64_t d : declared->dims())
      if (d < 0) throw_user(site, "the declared shape ", declared->str(), " has a negative size");
  const ShapeId shape = declared != nullptr ? g.trace().store().shapes.intern(*declared) : kUnknownShape;
  return CondSlot{&g, site, g.expr(g.trace().placeholder(shape, site.example, "cond", loc))};
}

void cond_wait(const CondSlot& c, const Expr& pred, ValueCallback&& callback) {
  c.engine->when_computed(pred.id(), std::move(callback));
}

void cond_resolve(const CondSlot& c, const HostValue& pred, Expr (*branch)(void*, bool), void* object) {
  Engine& g = *c.engine;
  const Site& site = c.site;
  const bool taken = truth(pred, site);
  Expr r = in_example(g, site.example, [&] { return branch(object, taken); });
  const NodeId n = g.node_of(r, "cond", site.loc);
  const NodeStore& s = g.store();
  const ShapeId want = s.shape[c.result.id()];
  // (A branch whose own shape waits on another cond is checked when it is known: Trace::resolve.)
  if (want != kUnknownShape && s.shape[n] != kUnknownShape && s.shape[n] != want)
    throw_user(site, "the ", taken ? "then" : "else", " branch returned shape ", s.shape_of(n).str(),
               " but the cond declares ", s.shapes[want].str());
  g.trace().resolve(c.result.id(), n);
}

}  // namespace cond_impl

std::vector<Expr> loop(std::vector<Expr> init, std::function<Expr(const std::vector<Expr>&)> cond_fn,
                       std::function<std::vector<Expr>(const std::vector<Expr>&)> body_fn, int max_iterations,
                       std::source_location loc) {
  Site site{"loop", kSharedExample, loc};
  if (init.empty()) throw_user(site, "needs a non-empty state");
  Engine& g = engine_for(init[0], site);
  g.note_recording("loop", loc);  // as cond's
  site.example = init[0].example(loc) >= 0 ? init[0].example(loc) : g.trace().current_example();
  if (!cond_fn || !body_fn) throw_user(site, "the condition and the body must be callable");
  if (max_iterations < 0) throw_user(site, "max_iterations must be >= 0");
  auto st = std::make_shared<LoopState>(LoopState{&g, std::move(cond_fn), std::move(body_fn), {}, max_iterations, site});
  std::vector<Expr> out;
  for (const Expr& e : init) {
    // A state downstream of an unresolved dsl::cond has no shape yet: the
    // loop's result gets it when the loop ends (Trace::resolve).
    NodeId n = g.node_of(e, "loop", loc);
    out.push_back(g.expr(g.trace().placeholder(g.store().shape[n], site.example, "loop", loc)));
    st->results.push_back(out.back().id());
  }
  loop_step(st, std::move(init), 0);
  return out;
}

Expr loop(Expr init, std::function<Expr(Expr)> cond_fn, std::function<Expr(Expr)> body_fn, int max_iterations,
          std::source_location loc) {
  // (An empty std::function stays empty: the loop above refuses it by name.)
  std::function<Expr(const std::vector<Expr>&)> c;
  std::function<std::vector<Expr>(const std::vector<Expr>&)> b;
  if (cond_fn) c = [c = std::move(cond_fn)](const std::vector<Expr>& s) { return c(s[0]); };
  if (body_fn) b = [b = std::move(body_fn)](const std::vector<Expr>& s) { return std::vector<Expr>{b(s[0])}; };
  return loop(std::vector<Expr>{init}, std::move(c), std::move(b), max_iterations, loc)[0];
}

}  // namespace sheaf::dsl

