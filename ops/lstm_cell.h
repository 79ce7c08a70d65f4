// The LSTM cell's elementwise math for one step of a packed sequence batch
// (ops/packed_lstm.cpp), as ONE vectorised loop over the step's rows forward
// and one backward, where written with ATen ops it is ~8 launches forward and
// ~20 backward a step, each a pass over memory. Float32 on the CPU only;
// compiled for the baseline x86-64, AVX2+FMA and AVX-512 and chosen at run
// time (core/cpu_features.h); the math is ops/pointwise_math.h's, as the fused
// elementwise kernels'.
//
// Layout: a step of `rows` rows, contiguous: gates a [rows, 4h] ([i, f, g, o],
// as LibTorch's), cell and hidden states [rows, h]. The first `carried` rows
// continue sequences of the previous step (their previous cell state is
// cprev's row); the others start from a zero cell state.
#pragma once

#include <cstdint>

namespace sheaf::op::lstm_cell {

// a: pre-activations in, activations out (the backward reads them); writes
// c = i*g + f*cprev and h = o*tanh(c).
void forward(float* a, float* c, float* h, const float* cprev, int64_t rows, int64_t carried, int64_t hidden);

// The gradients of one step, given its activations a, its cell state c and the
// previous one (cprev, rows < carried); dh: the step's output gradient, plus,
// for rows < continued (rows whose sequences go on into the step after, run
// before this one backward), dh_next and dc_next: the gradients that step sent
// back into this one's h and c. Writes da [rows, 4h] (the pre-activations'
// gradient) and, for rows < carried, dc_prev = dc * f (for the previous step).
void backward(const float* a, const float* c, const float* cprev, const float* dh, const float* dh_next,
              const float* dc_next, float* da, float* dc_prev, int64_t rows, int64_t carried, int64_t continued,
              int64_t hidden);

}  // namespace sheaf::op::lstm_cell
