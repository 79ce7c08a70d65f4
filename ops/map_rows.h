// Rows of a tensor moved to other rows, where no row is read twice (a
// permutation, padding to a longest length, the real rows back out of
// padding): out[i] = x[index[i]], an index of x.size(0) reading a zero row.
//
// Why not index_select: its gradient zero-fills the source and adds the rows
// in with index_add (row by row on the CPU in LibTorch 1.13: an ATen op a
// row). A row read at most once makes the gradient another such map, the
// inverse one: grad_x[j] = grad_out[back[j]] (back[j] == out rows: no reader,
// zero), derived from the map when a backward runs. Both ways are one row
// copy each on the CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <vector>

namespace sheaf::op {

// One direction of a map: for each row of the result, the row it reads
// (`from_rows`: a zero row). Built from host indices; their tensor on
// `device` is made when first asked for (the CPU's loop reads the host
// copy; a backward map unused without a gradient is never uploaded).
struct RowMap {
  RowMap() = default;
  RowMap(std::span<const int64_t> reads, int64_t from_rows, const c10::Device& device);
  const at::Tensor& index() const;  // [rows of the result], int64, on device
  // The map back: for each source row, the result row that read it (the
  // result's row count where none did). A row read twice has none: refused.
  RowMap inverse() const;
  std::vector<int64_t> host;
  int64_t from = 0;        // rows of the source (and the zero row's index)
  bool zeros = false;      // some row reads the zero row
  c10::Device device = c10::kCPU;

 private:
  mutable at::Tensor index_;
};

// out = x's rows through `m` (each row read at most once); its gradient
// reaches x through m.inverse().
at::Tensor map_rows(const at::Tensor& x, const RowMap& m);

}  // namespace sheaf::op
