// A hash index from 64-bit hashes to small ids, open addressing with linear
// probing. Interning shapes and signatures happens for every recorded node, so
// this replaces std::unordered_map (a heap node per entry) on that path.
#pragma once

#include <cstdint>
#include <vector>

#include "ids.h"

namespace sheaf {

class FlatIndex {
 public:
  static constexpr uint32_t kEmpty = kNone32;

  // Calls same(id) for each id stored under `hash` until it returns true; returns
  // that id, or kEmpty after inserting `fresh` under `hash`.
  template <class Same>
  uint32_t find_or_insert(uint64_t hash, uint32_t fresh, Same&& same) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.id == kEmpty) {
        s = Slot{hash, fresh};
        ++size_;
        return kEmpty;
      }
      if (s.hash == hash && same(s.id)) return s.id;
    }
  }
  // The id stored under `hash` for which same(id) holds, or kEmpty.
  template <class Same>
  uint32_t find(uint64_t hash, Same&& same) const {
    if (slots_.empty()) return kEmpty;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.id == kEmpty) return kEmpty;
      if (s.hash == hash && same(s.id)) return s.id;
    }
  }
  void clear() {
    slots_.assign(slots_.size(), Slot{});
    size_ = 0;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t id = kEmpty;
  };
  void grow() {
    std::vector<Slot> old(slots_.empty() ? 64 : slots_.size() * 2);
    old.swap(slots_);
    const size_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.id == kEmpty) continue;
      size_t i = s.hash & mask;
      while (slots_[i].id != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace sheaf
