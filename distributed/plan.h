// Pure planning for data parallelism, the same on every rank: which examples a
// rank takes, and which gradients travel together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sheaf {

// Splits examples among `world` ranks so that their summed work (e.g. each
// tree's node count) is as even as a greedy largest-first assignment makes it
// (within 4/3 of the best split). Deterministic: every rank computes the same
// split. Each rank's examples keep their original order.
std::vector<std::vector<size_t>> balanced_shards(std::span<const double> work, int world);

namespace detail {

// Gradients reduced in one collective. Dense ones are packed, in reverse
// parameter order (backward tends to finish the last-used parameters first),
// into buckets of about `cap_bytes`; a sparse one travels alone.
struct Bucket {
  std::vector<size_t> params;  // indices into the parameter list
  bool sparse = false;
};
std::vector<Bucket> plan_buckets(std::span<const int64_t> bytes, const std::vector<bool>& sparse, int64_t cap_bytes);

}  // namespace detail
}  // namespace sheaf
