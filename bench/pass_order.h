// The order of the systems' timed passes in each repeat (bench/harness.cpp's
// measure()). A system's first batch after another system's pass is slower:
// its data leave the caches while the other runs, the more the longer that
// pass takes, whatever it runs (docs/benchmarks.md, "What is compared"). A
// fixed order charged most of that to whichever system came after the
// slowest one, in every repeat; a balanced order varies who comes before whom.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

namespace sheaf::bench {

// The order of `k` systems' passes in repeat `r` (from 0), after a repeat
// that ended with system `last` (k or more: none). Fixed: 0, 1, ..., k - 1.
// Balanced: row r of a Williams design, a Latin square in which, within
// repeats, each system comes right after each other one equally often (once
// over k repeats for even k; twice over 2k, the square and its rows
// reversed, for odd k; fewer repeats balance in part, and the pairs across
// two repeats are not balanced). Its first row is 0, 1, k-1, 2, k-2, ...;
// row q adds q to each. Consecutive rows never put one system twice in a
// row, except for k = 2 (then a row that would start with `last` is rotated
// by one: A B A B ...) and k = 3 (whose reversed rows go in the order 1, 0,
// 2 instead: 012 120 201 021 210 102, every pair twice, none repeated).
inline std::vector<size_t> pass_order(size_t k, int r, bool balanced, size_t last) {
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t{0});
  if (!balanced || k < 2) return order;
  const size_t rows = k % 2 == 0 ? k : 2 * k;
  size_t q = static_cast<size_t>(r) % rows;
  if (k == 3 && q >= 3) q = 3 + (q == 3 ? 1 : q == 4 ? 0 : 2);
  for (size_t j = 0; j < k; ++j) {
    const size_t first_row = j == 0 ? 0 : j % 2 == 1 ? (j + 1) / 2 : k - j / 2;
    order[j] = (first_row + q % k) % k;
  }
  if (q >= k) std::reverse(order.begin(), order.end());
  if (order.front() == last) std::rotate(order.begin(), order.begin() + 1, order.end());
  return order;
}

}  // namespace sheaf::bench
