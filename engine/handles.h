// Expr handles name a graph by slot and generation, so a handle that outlived
// its graph (or a clear()) is detected instead of dereferencing freed memory.
#pragma once

#include <atomic>
#include <cstdint>

namespace sheaf::detail {

class Engine;

// A slot for a new engine; throws UserError when too many graphs are alive.
uint32_t acquire_slot(Engine* e);
void release_slot(uint32_t slot);
// Starts a new generation of the slot (clear()): older handles become stale.
uint32_t bump_generation(uint32_t slot);
uint32_t generation_of(uint32_t slot);
// The slots (handles.cpp). In this header so that engine_at is in line: every
// Expr argument of every op recorded is looked up (two calls a lookup were 3%
// of recording's instructions).
inline constexpr uint32_t kSlots = 1u << 14;
struct Slot {
  std::atomic<Engine*> engine{nullptr};
  std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> owner_since{0};  // the generation the current owner started at
};
extern Slot g_slots[kSlots];

// The engine of a handle, or nullptr if the slot is free or the generation stale.
inline Engine* engine_at(uint32_t slot, uint32_t generation) {
  if (slot >= kSlots) return nullptr;
  Engine* e = g_slots[slot].engine.load();
  return e != nullptr && g_slots[slot].generation.load() == generation ? e : nullptr;
}
// Whether the graph that made a handle (slot, generation) is gone: the slot is
// free, or a later graph took it (clear() keeps the owner; a new owner starts
// at a later generation). False for a live graph's stale (cleared) handle.
bool owner_gone(uint32_t slot, uint32_t generation);
// After a bump_generation: the slot's owner is gone although its engine stays
// there a while (a graph destroyed by a callback of its own forward(), whose
// engine frees itself as that forward ends): its handles say destroyed.
void disown(uint32_t slot);

// A number of this thread's own, never given to another (a thread_local's
// address, or a thread id, may be reused by a thread made after this one
// ends); never 0.
uint64_t this_thread_tag();

}  // namespace sheaf::detail
