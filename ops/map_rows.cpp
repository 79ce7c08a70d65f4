#include "map_rows.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <sheaf/core/error.h>

#include "grad_wanted.h"
#include "output_pool.h"

namespace sheaf::op {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [R, ...] through m: [m.host.size(), ...].
at::Tensor apply_map(const at::Tensor& input, const RowMap& m) {
  SHEAF_ASSERT(input.size(0) == m.from, "a row map of ", m.from, " rows applied to ", input.size(0));
  const at::Tensor x = input.is_cpu() ? input.contiguous() : input;
  const auto rows = static_cast<int64_t>(m.host.size());
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[0] = rows;
  if (!x.is_cpu()) {  // one gather on the device; the zero row appended
    if (!m.zeros) return x.index_select(0, m.index());
    std::vector<int64_t> zero = sizes;
    zero[0] = 1;
    return at::cat({x, at::zeros(zero, x.options())}).index_select(0, m.index());
  }
  at::Tensor out = empty_output(sizes, x.options());
  int64_t width = 1;
  for (int64_t d = 1; d < x.dim(); ++d) width *= x.size(d);
  const size_t bytes = static_cast<size_t>(width) * x.element_size();
  if (bytes == 0 || rows == 0) return out;  // nothing to move (and no buffer to point at)
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t from = x.size(0);
  for (int64_t i = 0; i < rows; ++i, dst += bytes) {
    const int64_t r = m.host[static_cast<size_t>(i)];
    if (r == from) std::memset(dst, 0, bytes);
    else std::memcpy(dst, src + static_cast<size_t>(r) * bytes, bytes);
  }
  return out;
}

// The maps ride in the node's saved data (the caller's may be gone by the backward).
void save(AutogradContext* ctx, const char* name, const RowMap& m) {
  ctx->saved_data[std::string(name) + ".host"] = m.host;
  ctx->saved_data[std::string(name) + ".device"] = m.device;
  ctx->saved_data[std::string(name) + ".zeros"] = m.zeros;
  ctx->saved_data[std::string(name) + ".from"] = m.from;
}
RowMap load(AutogradContext* ctx, const char* name) {
  RowMap m;
  m.host = ctx->saved_data[std::string(name) + ".host"].toIntVector();
  m.device = ctx->saved_data[std::string(name) + ".device"].toDevice();
  m.zeros = ctx->saved_data[std::string(name) + ".zeros"].toBool();
  m.from = ctx->saved_data[std::string(name) + ".from"].toInt();
  return m;
}

struct MapRows : torch::autograd::Function<MapRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const RowMap& m) {
    save(ctx, "map", m);
    return apply_map(x, m);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {map_rows(grads[0], load(ctx, "map").inverse()), at::Tensor()};
  }
};

}  // namespace

RowMap::RowMap(std::span<const int64_t> reads, int64_t from_rows, const c10::Device& on)
    : host(reads.begin(), reads.end()), from(from_rows), device(on) {
  for (int64_t r : host) {
    SHEAF_ASSERT(r >= 0 && r <= from_rows, "a row map reads row ", r, " of ", from_rows);
    zeros = zeros || r == from_rows;
  }
}

const at::Tensor& RowMap::index() const {
  if (!index_.defined()) {
    index_ = at::tensor(host, at::kLong);
    if (!device.is_cpu()) index_ = index_.to(device);
  }
  return index_;
}

RowMap RowMap::inverse() const {
  const auto rows = static_cast<int64_t>(host.size());
  std::vector<int64_t> back(static_cast<size_t>(from), rows);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = host[static_cast<size_t>(i)];
    if (r == from) continue;  // the zero row
    SHEAF_ASSERT(back[static_cast<size_t>(r)] == rows, "a row map reads row ", r, " twice: it has no inverse");
    back[static_cast<size_t>(r)] = i;
  }
  return RowMap(back, rows, device);
}

at::Tensor map_rows(const at::Tensor& x, const RowMap& m) {
  SHEAF_ASSERT(x.dim() >= 1, "map_rows needs rows");
  if (!grad_wanted(x)) return apply_map(x, m);
  return MapRows::apply(x, m);
}

}  // namespace sheaf::op
