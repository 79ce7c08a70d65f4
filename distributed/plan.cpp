#include "plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <sheaf/core/error.h>

namespace sheaf {

std::vector<std::vector<size_t>> balanced_shards(std::span<const double> work, int world) {
  if (world < 1) throw UserError(detail::cat("balanced_shards: world size ", world, " (needs at least 1)"));
  // (A NaN compares false both ways: the sort's order, and so the shards,
  // would be left to chance, and could differ between ranks.)
  for (size_t i = 0; i < work.size(); ++i)
    if (!std::isfinite(work[i]) || work[i] < 0)
      throw UserError(detail::cat("balanced_shards: example ", i, "'s work is ", work[i],
                                  " (needs a finite number >= 0, e.g. its node count)"));
  std::vector<size_t> order(work.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Ties keep index order, so every rank sorts alike.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return work[a] > work[b]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<std::vector<size_t>> shards(static_cast<size_t>(world));
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += work[i];
    shards[r].push_back(i);
  }
  for (auto& s : shards) std::sort(s.begin(), s.end());
  return shards;
}

namespace detail {

std::vector<Bucket> plan_buckets(std::span<const int64_t> bytes, const std::vector<bool>& sparse, int64_t cap_bytes) {
  SHEAF_ASSERT(bytes.size() == sparse.size(), "plan_buckets: ", bytes.size(), " sizes, ", sparse.size(), " flags");
  std::vector<Bucket> buckets;
  int64_t filled = 0;
  bool open = false;
  for (size_t k = bytes.size(); k-- > 0;) {
    if (sparse[k]) {
      buckets.push_back({{k}, true});
      open = false;
      continue;
    }
    if (!open || (filled > 0 && filled + bytes[k] > cap_bytes)) {
      buckets.push_back({});
      filled = 0;
      open = true;
    }
    buckets.back().params.push_back(k);
    filled += bytes[k];
  }
  return buckets;
}

}  // namespace detail
}  // namespace sheaf
