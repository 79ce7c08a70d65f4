#include "scopes.h"

#include "engine.h"
#include "handles.h"

#include <algorithm>

namespace sheaf::detail {

namespace {

struct Listed {
  Engine* engine;
  int64_t example;
  const void* owner;
};
thread_local std::vector<Listed> t_scopes;

}  // namespace

void enter_scope(Engine& engine, int64_t example, const void* owner) {
  engine.trace().set_current_example(example);
  t_scopes.push_back(Listed{&engine, example, owner});
}

void unlist(const void* owner) {
  for (size_t i = t_scopes.size(); i-- > 0;)  // usually the last one
    if (t_scopes[i].owner == owner) {
      t_scopes.erase(t_scopes.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
}

void leave_scope(Engine& engine, int64_t previous, const void* owner) {
  unlist(owner);
  engine.trace().set_current_example(previous);
}

void forget_scopes(const Engine& engine) {
  std::erase_if(t_scopes, [&](const Listed& l) { return l.engine == &engine; });
}

ExampleScopeEntry::ExampleScopeEntry(Engine& engine, int64_t example)
    : engine_(engine), previous_(engine.trace().current_example()) {
  enter_scope(engine, example, this);
}
ExampleScopeEntry::~ExampleScopeEntry() { leave_scope(engine_, previous_, this); }

std::vector<HeldScope> held_scopes(const Engine& except) {
  std::vector<HeldScope> held;
  for (const Listed& l : t_scopes)
    if (l.engine != &except) held.push_back(HeldScope{l.engine->slot(), l.engine->generation(), l.example});
  return held;
}

ResumedScopes::ResumedScopes(const std::vector<HeldScope>& held) {
  for (const HeldScope& h : held)
    if (Engine* e = engine_at(h.slot, h.generation)) {
      entered_.push_back(Entered{e, h.slot, e->trace().current_example()});
      enter_scope(*e, h.example, this);
    }
}

ResumedScopes::~ResumedScopes() {
  // Innermost first: a graph entered twice ends with the example it had before the first.
  for (size_t i = entered_.size(); i-- > 0;) {
    const Entered& e = entered_[i];
    // (A graph the task destroyed was unlisted then: forget_scopes.)
    if (engine_in(e.slot) == e.engine) leave_scope(*e.engine, e.previous, this);
  }
}

}  // namespace sheaf::detail
