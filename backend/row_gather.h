// Gathers as plain row copies (on the CPU; on CUDA one kernel, row_copies.h),
// with one gradient per source batch.
//
// A batched input whose rows come from several earlier batches (children of a
// tree level, a parser's stack) is, through LibTorch ops, one index_select or
// narrow per source, a cat, and an index_select for the row order: each a
// dispatch, an allocation and an autograd node, forward and backward. Here it
// is one output tensor written by memcpy of rows, and one autograd node.
//
// Gradients: a reader node's backward adds its rows' gradients straight into
// ONE buffer per source batch (a "hub" node), which hands the whole buffer to
// the source's autograd edge once every reader has run. So a batch read by
// many later batches (a tree level read by every level above it) costs one
// zero-filled gradient, not one per reader. The graph keeps its hubs from
// round to round (ExecConfig::row_gathers): a batch read in many rounds (the
// words of a sentence, read by every step of control flow) also gets one,
// where a hub per round zero-filled a whole-batch gradient each round and
// autograd then added those up. The readers reach the
// hub through a 0-element tensor (the hub's only output): autograd then runs
// the hub after all its readers, and nothing but the buffer carries data.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <sheaf/core/error.h>
#include <sheaf/ops/row_reads.h>

namespace torch::autograd {
struct Edge;
}

namespace sheaf {

struct RowPick {
  uint32_t source;  // index into the sources given to gather()
  uint32_t row;
};

// Rows that a kernel reads where they lie (a fused program's input on the
// CPU, backend/fused.h; an op's argument, OpTraits::reads_in_place and
// rows_in_place): no gathered copy forward, and backward the kernel adds each
// row's gradient straight into its source's hub, as a gather's reader would.
// Made by RowGathers::in_place; holds its sources alive.
class InPlaceRows : public RowReads {
 public:
  // Not copied: impl_ points into the block that made these rows.
  InPlaceRows(const InPlaceRows&) = delete;
  InPlaceRows& operator=(const InPlaceRows&) = delete;
  void append_edges(std::vector<torch::autograd::Edge>& edges) const override;
  at::Tensor materialize(std::span<const int64_t> sizes) const override;
  void check_unchanged(std::string_view by) const override;

 protected:
  InPlaceRows() = default;  // made only as an InPlaceRowsBlock (RowGathers::in_place)

 private:
  friend class RowGathers;
  friend struct InPlaceRowsBlock;  // (row_gather.cpp: these rows and their Impl, one allocation)
  struct Impl;
  GradRows lock_grad_rows(std::span<const RowReads* const> reads,
                          const std::function<bool(size_t read, size_t edge)>& wanted) const override;
  const Impl* impl_ = nullptr;  // in the same block
};

// A tensor's version counter (-1: an inference tensor, which keeps none and
// cannot be changed in place outside InferenceMode), for tensors read again
// after forward: by a backward, or by a fused value computed when read.
int64_t version_of(const at::Tensor& t);
// A UserError if t's version moved from `then` (version_of when it was read;
// -1: not checked): `by` says what reads it again ("its backward").
void check_version(const Site& reader, std::string_view by, const at::Tensor& t, int64_t then);

class RowGathers {
 public:
  RowGathers();
  ~RowGathers();
  RowGathers(const RowGathers&) = delete;
  RowGathers& operator=(const RowGathers&) = delete;

  // Whether gather() can read rows of t: a float tensor whose rows are
  // contiguous (any stride between rows), on the CPU or on CUDA where the row
  // kernels run (row_copies_on). in_place() reads CPU rows only.
  static bool readable(const at::Tensor& t);

  // out[i] = sources[rows[i].source][rows[i].row], shape [rows.size(), row shape
  // of the sources]. `batches[k]` names source k (its hub is shared by every
  // gather from that batch until clear(), while the batch is the same tensor).
  // Sources must be readable() and share one row shape.
  at::Tensor gather(std::span<const at::Tensor* const> sources, std::span<const uint32_t> batches,
                    std::span<const RowPick> rows);
  // Several gathers side by side, each row their concatenation (a batched
  // concat whose per-example rows are its arguments' rows one after another):
  // rows holds `segments` runs of n = rows.size() / segments picks; within a
  // run the sources share a row size. out_sizes: [n, the concat's shape...].
  at::Tensor gather(std::span<const at::Tensor* const> sources, std::span<const uint32_t> batches,
                    std::span<const RowPick> rows, size_t segments, std::span<const int64_t> out_sizes);
  // The rows of gather(sources, batches, rows), read in place (nothing copied),
  // by the op at `reader` (named by check_unchanged's error).
  std::shared_ptr<const InPlaceRows> in_place(std::span<const at::Tensor* const> sources,
                                              std::span<const uint32_t> batches, std::span<const RowPick> rows,
                                              const Site& reader);

  // Forgets every hub (the graph was cleared: batch numbers start again).
  void clear() { hubs_.clear(); }

 private:
  struct Hub;
  std::shared_ptr<Hub> hub_for(uint32_t batch, const at::Tensor& source);
  std::unordered_map<uint32_t, std::shared_ptr<Hub>> hubs_;  // by source batch
};

}  // namespace sheaf
