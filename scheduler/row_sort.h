#pragma once
// The planner's row order (scheduler/plan.cpp, order_rows): rows sorted by a
// 24-byte key. Its own file so that the sort is tested alone against
// std::sort, on every path (few rows, rows placed directly, keys that fit 32
// bits, keys that do not). Also the planner's other big sort, of its reads
// by source (group_reads), by the same radix passes.

#include <cstdint>
#include <vector>

#include <sheaf/core/column.h>

namespace sheaf {

// A row's place in its batch: rows sort by (first, then, id); see order_rows.
struct RowKey {
  uint64_t first;  // first reader << 32 | ~height
  uint64_t then;   // where the first per-example input lives
  uint32_t id;     // node or region
  bool operator<(const RowKey& o) const {
    if (first != o.first) return first < o.first;
    if (then != o.then) return then < o.then;
    return id < o.id;
  }
};
inline uint64_t first_key(uint32_t reader, uint32_t height) { return (uint64_t{reader} << 32) | ~height; }

// Buffers kept between sorts (a plan sorts every batch of every round).
// Columns: grown without zero-filling, as they are written in full.
struct SortScratch {
  Column<RowKey> rows;
  Column<uint64_t> words, words_tmp;
  struct Source {
    uint32_t lo, hi, count;
  };
  std::vector<Source> sources;  // rows placed by source: each source's rows
  Column<uint32_t> ids;
};

// Orders rows by (first, then, id), as std::sort with RowKey's < would: the
// ids are the result. Afterwards v[i].id is the id of row i in that order;
// v[i].first and .then may be left as they were (the planner reads only the
// order of its nodes). True where the rows, in that order, have one `first`
// and `then` values t, t + 1, ..., t + n - 1, and their keys are the sorted
// ones (v[0].then is t): said where the sort keeps whole keys and seeing it
// is cheap (rows in order already: one more look at each; few rows; rows
// placed by permute: by construction); false does not say they are not.
// (The planner's rows that each read the next row of one batch: their
// input is a view.)
bool sort_rows(Column<RowKey>& v, SortScratch& x);

// Sorts words as std::sort would. Made for words whose low 32 bits ascend in
// the order they come (a position), which a radix sort by the high bits
// alone then orders (the planner's reads by source batch, in read order);
// other words take std::sort.
void sort_positioned(Column<uint64_t>& w, Column<uint64_t>& tmp);

}  // namespace sheaf
