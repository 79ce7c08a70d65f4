// Products of per-example matrices with per-example vectors: y_b = A_b x_b for
// every example b of a batch (attention's scores H s and context H^T a, a
// per-example W's affine).
//
// at::bmm runs these on the CPU as one addmm per example, each a full ATen call
// (several microseconds) around a few thousand multiply-adds; this runs all of
// them in one loop (vectorised, examples split across threads) and its
// backward likewise as ONE autograd node: dA_b = g_b x_b^T, dx_b = A_b^T g_b.
// Float32 CPU tensors only; anything else goes to at::bmm.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>

#include "row_reads.h"

namespace sheaf {

// A [B, m, k], x [B, k] -> [B, m].
at::Tensor batched_matvec(const at::Tensor& A, const at::Tensor& x);

// A packed batch's products over rows, where either operand may be rows read
// in place (ops/row_reads.h): each row is read where it lies, and its
// gradient added into its source's. Gathered, an attention step's encoder
// rows (repeated for every step that reads them) were copied forward, their
// gradient written into another such copy, then added into the source: the
// most gathered bytes of a step-by-step attention decoder's training. One
// loop and one autograd node each; float32 CPU (in place: the only case).
//
// y[r] = A_r . x_r, A and x of R rows of k floats -> [R]: the scores A x of a
// packed matrix, its example's x repeated on each row. Tensors off the CPU:
// batched_matvec (LibTorch's bmm).
at::Tensor dot_rows(const RowOperand& A, const RowOperand& x);
// w of R rows of one float ([R]), B of R rows of p floats, counts [n] (rows
// per segment, summing to R) -> [n, p]: row s is the sum of segment s's rows
// of B, each times its w (attention's context x B). Float32 CPU.
at::Tensor weighted_row_sums(const RowOperand& w, const RowOperand& B, std::span<const int64_t> counts);

// X [m, k], v of k elements ([k], or a one-row weight [1, k]), bias undefined
// or of 1 or m elements -> [m, 1]: each row of X times v, plus the bias (a
// linear map with one output, such as a gate's score). No autograd (the
// caller's, or none): one allocation and one loop, where ATen's addmv path
// costs six calls around a few thousand multiply-adds (and reading v and the
// bias by pointer spares the select and reshape a caller would otherwise
// dispatch). Float32 CPU. Rows four at a time: a row's sum is rounded in an
// order that depends on its place among X's rows (the last 1-3 differ).
at::Tensor rows_dot(const at::Tensor& X, const at::Tensor& v, const at::Tensor& bias);

// The widest weight narrow_product takes (a classifier's classes); wider
// ones go to the products of ops/packed_gemm.h or OpenBLAS.
inline constexpr int64_t kNarrowRows = 8;

// X [m, k] times a weight W [c, k] of few rows (1 <= c <= kNarrowRows: a
// classifier's classes), plus a bias of c elements or none -> [m, c]. No
// autograd (the caller's, or none). One pass over X, each of a row's c sums
// in 8 partial sums: 2.5 us for [64, 128] x [5, 128]^T (a gated net's
// once-a-batch classifier), where at::linear, a dispatch, a TensorIterator
// for the bias and OpenBLAS's small-matrix path, takes 3 us warm and took
// 40-70 us as that classifier ran it (cold, ~2% of the net's inference).
// Float32 CPU.
at::Tensor narrow_product(const at::Tensor& X, const at::Tensor& W, const at::Tensor& bias);

}  // namespace sheaf
