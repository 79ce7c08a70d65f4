// The example scopes in force on this thread: those of Graph::example and
// those of other graphs a task resumes under, listed innermost last, and the
// current example of the graph delivering values (the user code its control
// flow runs, branches, loop bodies, deferred function calls and the tasks it
// resumes, under an unlisted ExampleGuard: a cond costs no listing). A task
// remembers them when it suspends and resumes under them again, so that what
// it records afterwards keeps its example in every graph, not only in the one
// whose value it awaited (which resumes it under its own scope).
#pragma once

#include <cstdint>
#include <vector>

namespace sheaf::detail {

class Engine;

// One graph's scope as a task left it: the graph by handle (a graph cleared
// or destroyed since is skipped) and its example then.
struct HeldScope {
  uint32_t slot, generation;
  int64_t example;
};

// Sets `engine`'s current example to `example` and lists it on this thread
// under `owner` (a scope object); leave_scope unlists it and sets the example
// it had back. Scopes may end in any order (a Graph::ExampleScope kept in a task's
// frame ends when the task does). One that ends on another thread than it
// began (a task made on the Prefetcher's thread, finished by forward) stays
// listed on the first; held_scopes drops it once its graph is cleared or gone.
void enter_scope(Engine& engine, int64_t example, const void* owner);

// A Graph::ExampleScope's end, which may come after its graph's (a scope kept
// in a task's frame, the task destroyed after the graph) or on another thread
// (a task made on the Prefetcher's thread): `previous` is set back only on
// the thread that began it, and only while the engine that was in `slot`
// (released `releases` times then) is still there.
struct ScopeSite {
  Engine* engine;
  uint32_t slot, releases;
  uint64_t thread;  // the number of the thread where it began (scopes.cpp)
};
ScopeSite scope_site(Engine& engine);
void leave_scope(const ScopeSite& site, int64_t previous, const void* owner);
// Unlists every scope of `engine` on this thread (it is being destroyed).
void forget_scopes(const Engine& engine);

// The scopes in force now, the innermost of each graph other than `except`
// (the graph the task awaits: it resumes the task under its own example):
// the delivering graph's current example, then the listed scopes.
std::vector<HeldScope> held_scopes(const Engine& except);

// While alive: `held`'s scopes again, for the graphs still alive (and not
// cleared). A graph the task destroys meanwhile is left alone at the end.
class ResumedScopes {
 public:
  explicit ResumedScopes(const std::vector<HeldScope>& held);
  ~ResumedScopes();
  ResumedScopes(const ResumedScopes&) = delete;
  ResumedScopes& operator=(const ResumedScopes&) = delete;

 private:
  struct Entered {
    Engine* engine;
    int64_t previous;  // its example before
  };
  std::vector<Entered> entered_;
};

}  // namespace sheaf::detail
