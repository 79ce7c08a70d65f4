// Per-example shapes. A node's shape never includes the batch axis: a batch of
// n nodes of shape [a, b] is one tensor [n, a, b].
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <span>
#include <string>
#include <vector>

namespace sheaf {

inline constexpr int kMaxRank = 4;

class Shape {
 public:
  constexpr Shape() = default;
  // A shape written by the user ({2, 3}, Shape{6}): more than kMaxRank sizes
  // is a UserError naming the line that wrote it.
  constexpr Shape(std::initializer_list<int64_t> dims, std::source_location loc = std::source_location::current()) {
    if (dims.size() > static_cast<size_t>(kMaxRank)) throw_rank(dims.size(), loc);
    for (int64_t d : dims) push(d);
  }
  static Shape of(std::span<const int64_t> dims);  // throws UserError if rank > kMaxRank

  constexpr int rank() const { return rank_; }
  constexpr int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  constexpr int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  std::span<const int64_t> dims() const& { return {dims_.data(), static_cast<size_t>(rank_)}; }
  // Of a temporary (`for (int64_t d : x.shape().dims())`, Expr::shape() being
  // a copy): the sizes themselves, not a view into a Shape about to go.
  std::vector<int64_t> dims() const&& { return {dims_.begin(), dims_.begin() + rank_}; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
    return n;
  }
  constexpr void push(int64_t d) { dims_[static_cast<size_t>(rank_++)] = d; }
  // One row's shape: this shape without its first axis (packed batches lay
  // values of different lengths end to end as rows of this shape).
  constexpr Shape row() const {
    Shape r;
    for (int i = 1; i < rank_; ++i) r.push(dims_[static_cast<size_t>(i)]);
    return r;
  }
  // Normalises a possibly negative axis; returns -1 when out of range.
  constexpr int axis(int a) const {
    if (a < 0) a += rank_;
    return (a >= 0 && a < rank_) ? a : -1;
  }
  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a.dims_[static_cast<size_t>(i)] != b.dims_[static_cast<size_t>(i)]) return false;
    return true;
  }
  std::string str() const;  // "[3, 4]"

 private:
  [[noreturn]] static void throw_rank(size_t rank, const std::source_location& loc);
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// The sizes of a batch of n values of shape s: [n, s...].
inline std::vector<int64_t> batched_sizes(int64_t n, const Shape& s) {
  std::vector<int64_t> sizes{n};
  sizes.insert(sizes.end(), s.dims().begin(), s.dims().end());
  return sizes;
}

}  // namespace sheaf
