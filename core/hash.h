// A fast hash of a few 64-bit words (shapes, signature keys).
#pragma once

#include <cstdint>
#include <span>

namespace sheaf {

inline uint64_t hash_words(std::span<const int64_t> w) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ w.size();
  for (int64_t x : w) {
    h ^= static_cast<uint64_t>(x);
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  return h;
}

}  // namespace sheaf
