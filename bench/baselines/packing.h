// Sequences packed time-major, as at::lstm takes them: the hand-batched
// baselines' layout for a batch of sequences of different lengths.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace sheaf::models {

// Sequences packed time-major as at::lstm wants them: longest first, step t
// holds the sequences longer than t. Built on the host, once per batch.
struct Packing {
  std::vector<int64_t> batch_sizes;
  std::vector<size_t> order;   // sequences by decreasing length (stable)
  std::vector<size_t> length;  // length[k]: of sequence order[k]
  // Position in the packed rows of element t of sequence order[k]: offset[t] + k.
  std::vector<int64_t> offset;

  Packing() = default;
  explicit Packing(const std::vector<size_t>& lengths) : order(lengths.size()) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
    for (size_t i : order) length.push_back(lengths[i]);
    int64_t rows = 0;
    for (size_t t = 0; t < (length.empty() ? 0 : length[0]); ++t) {
      int64_t n = 0;
      while (n < static_cast<int64_t>(length.size()) && length[static_cast<size_t>(n)] > t) ++n;
      offset.push_back(rows);
      batch_sizes.push_back(n);
      rows += n;
    }
  }
  int64_t rows() const { return offset.empty() ? 0 : offset.back() + batch_sizes.back(); }
  int64_t row(size_t k, size_t t) const { return offset[t] + static_cast<int64_t>(k); }
  // f(sequence, t, packed row) for every element.
  template <class F>
  void for_each(F&& f) const {
    for (size_t k = 0; k < order.size(); ++k)
      for (size_t t = 0; t < length[k]; ++t) f(order[k], t, row(k, t));
  }
};

}  // namespace sheaf::models
