// sheaf-bench's order of the systems' timed passes: each repeat runs every
// system once, no system runs twice in a row across repeats, and over a full
// balanced design each system comes right after each other one equally often.
#include <pass_order.h>

#include <algorithm>
#include <map>
#include <utility>

#include <catch2/catch.hpp>

using sheaf::bench::pass_order;

TEST_CASE("pass_order: a permutation a repeat, none twice in a row, each after each other equally often",
          "[bench]") {
  for (size_t k = 1; k <= 9; ++k) {
    CAPTURE(k);
    const int rows = k % 2 == 0 ? static_cast<int>(k) : 2 * static_cast<int>(k);
    std::map<std::pair<size_t, size_t>, int> after;  // (before, after) -> times, within repeats
    size_t last = k;
    for (int r = 0; r < 2 * rows; ++r) {
      const std::vector<size_t> order = pass_order(k, r, true, last);
      std::vector<size_t> sorted = order;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < k; ++i) REQUIRE(sorted[i] == i);
      if (k > 1) CHECK(order.front() != last);
      for (size_t i = 1; i < k; ++i) ++after[{order[i - 1], order[i]}];
      last = order.back();
    }
    // (k = 2 rotates rows to avoid a repeat: A B A B, B after A only across repeats.)
    if (k >= 3) {
      CHECK(after.size() == k * (k - 1));  // every ordered pair occurs
      for (const auto& [pair, times] : after) CHECK(times == after.begin()->second);
    }
    const std::vector<size_t> fixed = pass_order(k, 7, false, 0);
    CHECK(std::is_sorted(fixed.begin(), fixed.end()));
  }
}
