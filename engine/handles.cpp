#include "handles.h"

#include <atomic>
#include <mutex>
#include <vector>

#include <sheaf/core/error.h>

namespace sheaf::detail {

Slot g_slots[kSlots];

namespace {

std::mutex g_slots_mu;
std::vector<uint32_t> g_free_slots;
uint32_t g_slots_used = 0;

}  // namespace

uint32_t acquire_slot(Engine* e) {
  std::lock_guard lock(g_slots_mu);
  uint32_t s;
  if (!g_free_slots.empty()) {
    s = g_free_slots.back();
    g_free_slots.pop_back();
  } else {
    if (g_slots_used == kSlots) throw UserError(detail::cat("sheaf: more than ", kSlots, " sheaf::Graph objects alive at once"));
    s = g_slots_used++;
  }
  g_slots[s].owner_since.store(g_slots[s].generation.load());
  g_slots[s].engine.store(e);
  return s;
}

void release_slot(uint32_t s) {
  std::lock_guard lock(g_slots_mu);
  g_slots[s].generation.fetch_add(1);
  g_slots[s].engine.store(nullptr);
  g_free_slots.push_back(s);
}

uint32_t bump_generation(uint32_t s) { return g_slots[s].generation.fetch_add(1) + 1; }
uint32_t generation_of(uint32_t s) { return g_slots[s].generation.load(); }

bool owner_gone(uint32_t s, uint32_t generation) {
  if (s >= kSlots) return true;
  // (Error messages only: the lock keeps the three fields of one moment.)
  std::lock_guard lock(g_slots_mu);
  if (g_slots[s].engine.load() == nullptr) return true;
  // Ages, not values: generations wrap around.
  const uint32_t now = g_slots[s].generation.load();
  return now - generation > now - g_slots[s].owner_since.load();
}

void disown(uint32_t s) {
  std::lock_guard lock(g_slots_mu);
  g_slots[s].owner_since.store(g_slots[s].generation.load());
}

uint64_t this_thread_tag() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t tag = next.fetch_add(1);
  return tag;
}

}  // namespace sheaf::detail
