#include "shape.h"

#include "error.h"

namespace sheaf {

Shape Shape::of(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    throw UserError(detail::cat("sheaf: per-example values have rank at most ", kMaxRank, ", got rank ",
                                dims.size()));
  Shape s;
  for (int64_t d : dims) s.push(d);
  return s;
}

void Shape::throw_rank(size_t rank, const std::source_location& loc) {
  throw_user_at(loc, "per-example values have rank at most ", kMaxRank, ", got a shape of rank ", rank);
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

}  // namespace sheaf
