// Scaled dot-product attention over packed values on the CPU, as ONE loop
// forward and one backward (one autograd node), float32 only. Where the
// general path (ops/attention.h) pads every value's rows to its group's
// longest, masks the padded keys and runs the heads as batched GEMMs (each
// [L, d/heads] product too small for a GEMM to pay: ~10 LibTorch calls a
// group forward, more backward, every pass over padded scores), this reads
// each value's rows where they lie: per value and head, the scores of a query
// row, their softmax and the weighted sum of the value rows, in registers
// and one row of probabilities (kept for the backward).
//
//   q [Rq, d], k [Rk, d], v [Rk, dv]: value i's queries are the q_counts[i]
//   rows after the values before it, its keys and values the k_counts[i] rows
//   of k and v; -> [Rq, dv]. Per head h (d / heads columns of q and k,
//   dv / heads of v): softmax(scale * q_h k_h^T) v_h.
//
// The sums run in another order than a GEMM's: results match the padded path
// and LibTorch's formula to float rounding (tests/backend/test_attention_cpu.cpp),
// not bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

namespace sheaf::op {

// Whether attention_cpu takes these inputs: float32 CPU tensors.
bool attention_cpu_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// `scale` 0: 1 / sqrt(d / heads). Counts must sum to the rows of q and of k.
at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         std::span<const int64_t> q_counts, std::span<const int64_t> k_counts, int64_t heads,
                         double scale);

}  // namespace sheaf::op
