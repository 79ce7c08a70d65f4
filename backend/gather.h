// Several partial reads of one tensor's rows as ONE autograd node. Its backward
// allocates the source's gradient once and adds every read's gradient into it;
// separate index_select/narrow calls would each allocate and zero a gradient the
// size of the whole source, and autograd would then add those up.
#pragma once

#include <ATen/core/Tensor.h>

#include <span>
#include <vector>

namespace sheaf {

struct RowRead {
  int64_t start = 0, len = 0;
  at::Tensor index;  // defined: the rows to take (int64 [len]); else the range [start, start + len)
};

std::vector<at::Tensor> gather_rows(const at::Tensor& src, std::span<const RowRead> reads);

}  // namespace sheaf
