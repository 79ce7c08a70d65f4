#include "scopes.h"

#include "engine.h"
#include "handles.h"

#include <algorithm>

namespace sheaf::detail {

namespace {

struct Listed {
  Engine* engine;
  uint32_t slot;        // (the engine is alive while engine_in(slot) is it)
  uint32_t generation;  // the graph's when listed: a clear() since ends the scope's meaning
  int64_t example;
  const void* owner;
};
thread_local std::vector<Listed> t_scopes;

// Removes the innermost entry of `owner` (for `engine`, if given); whether there was one.
bool unlist(const void* owner, const Engine* engine = nullptr) {
  for (size_t i = t_scopes.size(); i-- > 0;)  // usually the last one
    if (t_scopes[i].owner == owner && (engine == nullptr || t_scopes[i].engine == engine)) {
      t_scopes.erase(t_scopes.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  return false;
}

}  // namespace

void enter_scope(Engine& engine, int64_t example, const void* owner) {
  engine.trace().set_current_example(example);
  t_scopes.push_back(Listed{&engine, engine.slot(), generation_of(engine.slot()), example, owner});
}

ScopeSite scope_site(Engine& engine) {
  return ScopeSite{&engine, engine.slot(), releases_of(engine.slot()), this_thread_tag()};
}

void leave_scope(const ScopeSite& site, int64_t previous, const void* owner) {
  if (site.thread != this_thread_tag()) return;  // (its listing there goes once the graph is cleared: held_scopes)
  unlist(owner);
  if (engine_in(site.slot) != site.engine || releases_of(site.slot) != site.releases) return;  // the graph is gone
  site.engine->trace().set_current_example(previous);
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
  for (const HeldScope& h : held)
    if (Engine* e = engine_at(h.slot, h.generation)) {
      entered_.push_back(Entered{e, e->trace().current_example()});
      enter_scope(*e, h.example, this);
    }
}

ResumedScopes::~ResumedScopes() {
  for (size_t i = entered_.size(); i-- > 0;) {
    const Entered& e = entered_[i];
    // Still listed: the graph is alive (one the task destroyed was unlisted
    // then, forget_scopes; another may have its slot and address now).
    if (unlist(this, e.engine)) e.engine->trace().set_current_example(e.previous);
  }
}

}  // namespace sheaf::detail
