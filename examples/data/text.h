// What the data readers and generators share: reading a whole file, ASCII
// whitespace, and a random source that gives the same data for a seed with any
// standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace sheaf::data::detail {

// The file's bytes; UserError naming `what` and the path if it cannot be read.
std::string read_file(const std::string& path, std::string_view what);

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }
inline bool is_blank(std::string_view line) { return std::all_of(line.begin(), line.end(), is_space); }

// Calls f(line, line_number) for each line (1-based), without the '\n'.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  int number = 1;
  for (size_t start = 0; start < text.size(); ++number) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    f(text.substr(start, end - start), number);
    start = end + 1;
  }
}

// The std distributions are implementation-defined; mapping the engine's raw
// bits ourselves gives the same data for a seed with any standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  int below(int n) { return static_cast<int>(uniform() * n); }                   // [0, n)

 private:
  std::mt19937_64 engine_;
};

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Zipf(1.0) over ids 1..vocab_size-1, id 1 the most frequent.
class ZipfSampler {
 public:
  explicit ZipfSampler(int vocab_size) {
    double total = 0;
    for (int id = 1; id < vocab_size; ++id) cdf_.push_back(total += 1.0 / id);
  }
  int32_t operator()(Rng& rng) const {
    const double u = rng.uniform() * cdf_.back();
    // u < cdf_.back(), so the bound is always a real entry.
    return static_cast<int32_t>(std::upper_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin()) + 1;
  }

 private:
  std::vector<double> cdf_;  // cdf_[i]: unnormalised P(id <= i + 1)
};

}  // namespace sheaf::data::detail
