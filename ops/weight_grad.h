// Weight gradients of a round, one product per weight.
//
// Every batch of a round that applies the same shared weight (a Tree-LSTM's U
// at each tree level, a parser's cell at each step) gets its input's gradient
// in backward as usual; the weight's gradient (and a shared bias's) is
// computed once, after all of theirs, as ONE product over all their rows:
// dW = [dY_1; ...; dY_k]^T [X_1; ...; X_k]. Batch by batch, each product's
// inner dimension is that batch's few rows and each rewrites all of dW;
// together they are one GEMM with a long inner dimension. The executor keeps
// one batcher per round; ops with a shared weight ask RunCtx for it.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "packed_gemm.h"

namespace sheaf {

// A shared weight W [n, k] laid out for packed_mm (ops/packed_gemm.h): W^T for
// the product x W^T, and, when W takes a gradient, W itself for dX = dY W.
struct PackedWeight {
  PackedMatrix forward, backward;
};

// Contiguous copies of W^T for the shared weights a graph applies again and
// again (a cell's weight at every step or tree level). OpenBLAS packs a [k, n]
// row-major operand faster than the [n, k] one at::linear hands it. One Zen 5
// core (OPENBLAS_NUM_THREADS=1), OpenBLAS 0.3.21 with its Haswell kernels,
// x [m, k] W^T + b for n = 128-1024, k = 64-544, time saved by W^T:
//   m = 8:  22-27% where k is not a multiple of 128; k = 128, 256, 512: 2-9%
//           for n >= 512, 6-20% for n <= 256
//   m = 32: 8-14% where k is not a multiple of 128; k = 128, 256, 512: -1-7%
// So W^T is used where the inner size is not a multiple of 128 or the weight is
// small (<= 64Ki entries): the parser's cells ([640, 288], [128, 416]) infer 8%
// faster. Elsewhere the copy (~0.35 ns an entry) does not pay for itself within
// a batch (a Tree-LSTM's [640, 256] read 2% slower); nor past 1Mi entries,
// beyond what was measured. A weight is transposed at its second product in a
// graph, so a weight used once never pays for the copy. The Engine owns one
// and clears it with the graph; an entry is also dropped when the weight's data,
// version counter, sizes or strides change (an optimizer step in place). An update the
// version counter does not see (through W.data(), or raw writes to its memory)
// while a graph is alive leaves a stale copy: update shared weights with
// in-place ops on the tensor itself (optimizers do), or clear() the graph
// first. Not for inference tensors (no version counter). CPU only: cuBLAS
// reads either layout.
//
// Where the CPU has AVX-512 or AVX2+FMA, packed() comes first: the weight in packed_mm's
// panels, made at its first product of 4 rows or more (OpenBLAS would copy it
// into its own panels in that call anyway) and again after an update in
// place; those weights reach get() only for products packed() leaves. GraphOptions::pack_weights off (set_packing(false))
// leaves OpenBLAS every product.
//
// A layout made for inference (autograd off) outlives clear() when the
// graph used it: at the weight's first use in the next graph its bytes are
// compared with a copy taken when it was laid out, so an update the version
// counter misses (W.data(), raw writes) between graphs still lays it out
// again. A gated tree net's inference (two [128, 256] weights) spent 2.7% of
// its batches laying them out again, 0.9% with this (perf samples, Zen 4).
// Layouts made with autograd on (training updates its weights in place every
// step) keep no copy and go with clear(), as do layouts a graph did not use.
class TransposedWeights {
 public:
  // W^T for w, or null where the plain layout is used (first use, not 2-D, not
  // on the CPU). The pointer stays valid until the next call or clear().
  const at::Tensor* get(const at::Tensor& w);
  // W packed (with its backward form when `backward`), or null: packing off or
  // not available, a weight it does not suit, or a new layout wanted for a
  // product of fewer than 4 rows (a weight applied once to a row or two: a
  // GEMV copies nothing; the next product lays it out), or a product of
  // `rows` that OpenBLAS's own threads run faster (packed_gemm_serves; the
  // weight's layout stays for its smaller products). Valid until the weight
  // changes.
  std::shared_ptr<const PackedWeight> packed(const at::Tensor& w, bool backward, int64_t rows = 4);
  // Whether packed() may pack at all (GraphOptions::pack_weights).
  void set_packing(bool on) { packing_ = on; }
  // Forgets the W^T copies and the layouts this graph did not use or that
  // keep no copy; the others are checked against W at their next use.
  void clear();

 private:
  // What a weight was when last seen: its memory, version counter, sizes and
  // strides. Any change (an update in place, re-seated, reshaped) decides again.
  struct Seen {
    const void* data = nullptr;
    int64_t version = -1;
    int64_t rows = 0, cols = 0, row_stride = 0, col_stride = 0;
    bool matches(const at::Tensor& w) const;
    void take(const at::Tensor& w);
  };
  struct Entry {
    at::Tensor w;  // held: its address cannot come back as another tensor's
    Seen seen;
    at::Tensor wt;  // undefined until the second use
  };
  struct PackedEntry {
    at::Tensor w;
    Seen seen;
    bool suits = false;           // W^T suits packed_mm (else every product goes to OpenBLAS)
    bool backward_suits = false;  // W itself does (dX = dY W packed too)
    std::shared_ptr<PackedWeight> packed;  // null: to be made at the next use
    // W's bytes when `packed` was made, where it outlives clear() (undefined: it does not).
    at::Tensor bytes;
    uint32_t used = 0;    // the last generation (clear() count) that asked for it
    bool check = false;   // kept by clear(): compare W with `bytes` before the next use
  };
  // Whether e's layout is still W's at its first use after clear() (else it is dropped).
  static void check_kept(PackedEntry& e, const at::Tensor& w);
  std::vector<Entry> entries_;
  std::vector<PackedEntry> packed_;
  uint32_t generation_ = 0;
  bool packing_ = true;
};

class WeightGradBatcher {
 public:
  WeightGradBatcher();
  ~WeightGradBatcher();
  // x W^T (+ b) for rows x [..., k], W [m, k], b [m] or undefined. With
  // autograd on W, its gradient (and b's) joins this batcher's product for W.
  // wt: W^T contiguous (TransposedWeights) or null. bias_rows: b is [rows, m],
  // one bias per row of x (a per-example bias: an LSTM step's input
  // projection), added by the same product; its gradient is dY.
  // packed: W in packed_mm's layout (ops/packed_gemm.h) for the product and,
  // if it has its backward form, for dX.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor* wt = nullptr,
                    bool bias_rows = false, std::shared_ptr<const PackedWeight> packed = nullptr);
  // Forgets the round's weights: the next product of a weight starts its own
  // gradient product (the autograd nodes made so far keep theirs).
  void clear() { taps_.clear(); }

 private:
  struct Tap;
  std::vector<std::pair<std::pair<const void*, const void*>, std::shared_ptr<Tap>>> taps_;
};

// The product alone, with GEMV for one row and, for large enough weights, a
// few rows padded to a multiple of 4 (OpenBLAS: one row through GEMM is
// several times slower than GEMV, and 7 rows of a [640, 288] weight take
// 76 us where 8 take 52 us). With wt (W^T, contiguous; no gradient reaches W
// through it) the product reads W^T instead. b: [m], [rows, m] (a bias per
// row) or undefined.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor* wt = nullptr);
// The same product through a packed weight (x: [m, k], any m).
at::Tensor linear_packed(const at::Tensor& x, const PackedWeight& w, const at::Tensor& b);

}  // namespace sheaf
