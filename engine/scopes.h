// The example scopes in force on this thread, listed innermost last: those of
// Graph::example, those of other graphs a task resumes under, and the example
// of the graph delivering values while its control flow runs user code
// (branches, loop bodies, deferred function calls and the tasks it resumes). A task
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

// Lists `example` as `engine`'s current example on this thread, and sets it;
// leave_scope unlists it. Scopes may end in any
// order (a Graph::ExampleScope kept in a suspended task's frame ends when the
// task does, perhaps after the scope it began in): a scope that ends while a
// later scope of the same graph is still listed hands that one the example it
// would have set back, and sets nothing itself; the innermost sets its own
// previous example back. So, on one thread, the example in force is the
// innermost listed scope's, and the one from before them all once every
// scope has ended, in whatever order. For that, whatever sets a graph's
// example around user code lists it too (ListedExample: branches, loop
// bodies, deferred calls, resumed tasks). clear() resets the example and ends
// the meaning of the graph's scopes listed before it: they set nothing back,
// nor do those of a destroyed graph.
// Threads: a scope that ends on another thread than it began (a task made on
// the Prefetcher's worker, finished by forward on the caller's) does nothing
// (Graph::ExampleScope checks its thread). Its listing stays on the first
// thread until held_scopes finds its graph cleared or gone, and until then
// counts as in force there: the scopes of that graph that end before it hand
// it their previous example, so the graph keeps the task scope's example
// until its next clear() (the Prefetcher clears a graph before each batch).
// Returns the listing's token, which leave_scope takes. (Not the scope
// object's address: a new scope in a task's frame may have the address of
// one whose listing is still here, one that ended on another thread.)
uint64_t enter_scope(Engine& engine, int64_t example);
// The listing `token` (on this thread) ends.
void leave_scope(uint64_t token);
// Unlists every scope of `engine` on this thread (it is being destroyed).
void forget_scopes(const Engine& engine);

// `example` listed for `engine` while alive (a scope without a Graph handle).
class ListedExample {
 public:
  ListedExample(Engine& engine, int64_t example) : token_(enter_scope(engine, example)) {}
  ~ListedExample() { leave_scope(token_); }
  ListedExample(const ListedExample&) = delete;
  ListedExample& operator=(const ListedExample&) = delete;

 private:
  uint64_t token_;
};

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
  std::vector<uint64_t> entered_;  // tokens
};

}  // namespace sheaf::detail
