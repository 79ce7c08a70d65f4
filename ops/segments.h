// Ops over the values of a packed batch, each value a run of rows (a
// segment): a softmax across each value's elements and a weighted sum of
// each value's rows (attention's weights and context over sources of
// different lengths, docs/ops.md "Lengths").
//
// In ATen these are 5-8 calls each (segment max, exp, index_add, ...) with as
// many autograd nodes; here each is one loop over the segments and ONE
// autograd node. Float32 CPU tensors only; anything else runs the ATen calls
// (with `ids`, each row's segment, on the tensors' device).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <vector>

namespace sheaf {

// Where each segment's rows start, and the end: counts [n] -> [n + 1].
std::vector<int64_t> segment_offsets(std::span<const int64_t> counts);
// Segments per task when a loop over n segments of `rows` rows of `width`
// floats in all is split across threads: enough work to pay for a task.
int64_t segment_grain(int64_t rows, int64_t segments, int64_t width);

// x [R, ...] -> [n, ...]: the largest (or smallest) of each segment's rows,
// without gradient (a shift or a choice, not a value to differentiate).
at::Tensor segment_extreme(const at::Tensor& x, const at::Tensor& ids, int64_t n, bool max);

// x [R], counts [n] (rows per segment, summing to R) -> [R]: softmax, or
// log-softmax, of each segment.
at::Tensor segment_softmax(const at::Tensor& x, std::span<const int64_t> counts, const at::Tensor& ids, bool log);

// w [R], B [R, p] -> [n, p]: row i is the sum of segment i's rows of B, each
// times its w. On float32 CPU tensors: weighted_row_sums (ops/matvec.h), which
// also takes B's rows read in place.
at::Tensor segment_weighted_sum(const at::Tensor& w, const at::Tensor& B, std::span<const int64_t> counts,
                                const at::Tensor& ids);

}  // namespace sheaf
