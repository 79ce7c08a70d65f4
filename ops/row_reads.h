// Rows an op reads where they lie, gradients included: the interface the
// backend's in-place rows (backend/row_gather.h) give an op whose traits say
// it takes them (OpTraits::reads_in_place; OpTraits::rows_in_place, without
// autograd: then needs_grad() is false).
//
// A packed batch's argument gathered from earlier batches (an attention
// step's encoder rows, repeated for every step that reads them) is otherwise
// copied into a [rows, width] tensor first, and its gradient written into
// another such tensor that the gather's backward then adds into the sources'
// gradient. Read in place, the op's kernel reads each row from its source
// and adds each row's gradient straight into the source's gradient buffer
// (its hub), reached through autograd edges that the op's node takes.
//
// Declared here, below the backend, so that ops can use it; made only by the
// backend (RowGathers::in_place, owned by a shared_ptr: an op's autograd node
// keeps the rows it read through shared_from_this), on the CPU. The sources
// are read again in the backward, as saved tensors are: a backward that reads
// them calls check_unchanged() first, as SavedVariable::unpack checks a saved
// tensor's version.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

namespace torch::autograd {
struct Edge;
}

namespace sheaf {

class RowReads : public std::enable_shared_from_this<RowReads> {
 public:
  virtual ~RowReads() = default;
  // Row i's first float (rows of width() contiguous floats).
  std::span<const float* const> data() const { return data_; }
  int64_t width() const { return width_; }
  size_t rows() const { return data_.size(); }
  // Whether any source needs a gradient. Then the autograd node of the op that
  // reads these rows takes one edge per hub its gradients go to (appended to
  // `edges`), and leaves those edges' outputs undefined: the gradients are
  // in the hubs.
  bool needs_grad() const { return num_edges_ > 0; }
  size_t num_edges() const { return num_edges_; }
  virtual void append_edges(std::vector<torch::autograd::Edge>& edges) const = 0;

  // Several reads' gradient rows, for one kernel's backward: per read, per
  // row, where its gradient is added (null: that source needs none, or
  // autograd did not ask for it: wanted(read, k) false for the read's k-th
  // edge). Two rows, of one read or of two, may be the same place: a kernel
  // adds into them serially. Holds the hubs' locks (each taken once,
  // whichever reads share it) while alive.
  struct GradRows {
    std::vector<std::vector<float*>> rows;
    std::vector<std::unique_lock<std::mutex>> locks;
  };
  static GradRows grad_rows(std::span<const RowReads* const> reads,
                            const std::function<bool(size_t read, size_t edge)>& wanted);

  // The rows copied into one [n, shape...] tensor whose gradient reaches the
  // same hubs (for an op that takes this argument as a tensor after all).
  virtual at::Tensor materialize(std::span<const int64_t> sizes) const = 0;

  // A UserError, naming the op that read these rows, if a source was changed
  // in place since they were read (its version counter moved: a write into a
  // value() between forward and backward). Whatever reads data() again after
  // the forward calls it first, saying what it is (`by`: "its backward"): it
  // would otherwise compute with the new values, silently.
  virtual void check_unchanged(std::string_view by) const = 0;

 protected:
  // Every read's hubs locked at once (grad_rows): the backend's reads share
  // one lock order. `reads` holds this one.
  virtual GradRows lock_grad_rows(std::span<const RowReads* const> reads,
                                  const std::function<bool(size_t read, size_t edge)>& wanted) const = 0;

  std::vector<const float*> data_;
  int64_t width_ = 0;
  size_t num_edges_ = 0;
};

// An op's operand of rows (R rows of some width, floats): a tensor [R, ...],
// or rows read in place.
struct RowOperand {
  at::Tensor tensor;                // used when `reads` is null
  const RowReads* reads = nullptr;  // the backend's (a node that saves it shares its ownership)
};

inline RowReads::GradRows RowReads::grad_rows(std::span<const RowReads* const> reads,
                                              const std::function<bool(size_t read, size_t edge)>& wanted) {
  if (reads.empty()) return {};
  return reads[0]->lock_grad_rows(reads, wanted);
}

}  // namespace sheaf
