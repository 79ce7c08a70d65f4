#include "scopes.h"

#include "engine.h"
#include "handles.h"

#include <algorithm>

namespace sheaf::detail {

namespace {

struct Listed {
  Engine* engine;
  uint32_t slot;        // with generation: the engine is alive and not cleared while engine_at gives it
  uint32_t generation;  // the graph's when listed: a clear() since ends the scope's meaning
  int64_t example;
  int64_t previous;     // the graph's example before: set back when this scope ends innermost
  uint64_t token;
};
thread_local std::vector<Listed> t_scopes;
thread_local uint64_t t_next_token = 0;  // (per thread: a listing is found only on its own thread)

}  // namespace

uint64_t enter_scope(Engine& engine, int64_t example) {
  const int64_t previous = engine.trace().current_example();
  const uint64_t token = ++t_next_token;
  t_scopes.push_back(Listed{&engine, engine.slot(), engine.generation(), example, previous, token});
  engine.trace().set_current_example(example);
  return token;
}

void leave_scope(uint64_t token) {
  std::vector<Listed>& scopes = t_scopes;
  // Usually the innermost (a cond's branch, recorded per tree node): no later
  // scope to hand its previous example to, nothing to move up.
  if (!scopes.empty() && scopes.back().token == token) {
    const Listed l = scopes.back();
    scopes.pop_back();
    if (engine_at(l.slot, l.generation) == l.engine) l.engine->trace().set_current_example(l.previous);
    return;  // (else cleared, its example reset, or destroyed since)
  }
  size_t i = scopes.size();
  while (i-- > 0)
    if (scopes[i].token == token) break;
  // Not listed: dropped (held_scopes, forget_scopes) because its graph is cleared or gone.
  if (i == static_cast<size_t>(-1)) return;
  const Listed l = scopes[i];
  scopes.erase(scopes.begin() + static_cast<std::ptrdiff_t>(i));
  if (engine_at(l.slot, l.generation) != l.engine) return;  // cleared (its example reset) or destroyed since
  // A later scope of this graph still in force keeps its example, and sets
  // back this one's previous when it ends (scopes that end out of order).
  for (size_t j = i; j < scopes.size(); ++j)
    if (scopes[j].engine == l.engine && scopes[j].slot == l.slot && scopes[j].generation == l.generation) {
      scopes[j].previous = l.previous;
      return;
    }
  l.engine->trace().set_current_example(l.previous);
}

void forget_scopes(const Engine& engine) {
  std::erase_if(t_scopes, [&](const Listed& l) { return l.engine == &engine; });
}

std::vector<HeldScope> held_scopes(const Engine& except) {
  std::vector<HeldScope> held;
  if (const Engine* d = Engine::delivering(); d != nullptr && d != &except)
    held.push_back(HeldScope{d->slot(), generation_of(d->slot()), d->trace().current_example()});
  // The innermost scope of each graph: one entry a graph, however many scopes
  // are listed (those kept in suspended tasks' frames, those re-entered).
  // Entries of graphs gone or cleared since (a scope that ended on another
  // thread than the one that listed it: a Prefetcher's graphs are cleared,
  // not destroyed) are dropped; only the handles' atomics are read.
  for (size_t i = t_scopes.size(); i-- > 0;) {
    const Listed& l = t_scopes[i];
    if (engine_at(l.slot, l.generation) != l.engine) {
      t_scopes.erase(t_scopes.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (l.engine == &except ||
        std::any_of(held.begin(), held.end(), [&](const HeldScope& h) { return h.slot == l.slot; }))
      continue;
    held.push_back(HeldScope{l.slot, l.generation, l.example});
  }
  return held;
}

ResumedScopes::ResumedScopes(const std::vector<HeldScope>& held) {
  entered_.reserve(held.size());  // (first: every listing made keeps its token)
  try {
    for (const HeldScope& h : held)
      if (Engine* e = engine_at(h.slot, h.generation)) entered_.push_back(enter_scope(*e, h.example));
  } catch (...) {  // (out of memory) no destructor runs: a listing left here would take others' hand-overs
    for (size_t i = entered_.size(); i-- > 0;) leave_scope(entered_[i]);
    throw;
  }
}

ResumedScopes::~ResumedScopes() {
  // (A graph the task destroyed meanwhile was unlisted then, forget_scopes;
  // one it cleared sets nothing back: leave_scope.)
  for (size_t i = entered_.size(); i-- > 0;) leave_scope(entered_[i]);
}

}  // namespace sheaf::detail
