#include "row_sort.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>

#include <sheaf/core/error.h>

namespace sheaf {

namespace {

// One stable counting pass of an LSD radix sort: v by digit(k) in [0, buckets),
// through tmp (v's size); count has buckets + 1 entries.
template <class T, class Digit>
void counting_pass(Column<T>& v, Column<T>& tmp, uint32_t* count, size_t buckets, Digit digit) {
  std::fill(count, count + buckets + 1, 0);
  for (const T& k : v) ++count[digit(k) + 1];
  for (size_t b = 0; b < buckets; ++b) count[b + 1] += count[b];
  for (const T& k : v) tmp[count[digit(k)]++] = k;
  v.swap(tmp);
}

// LSD radix sort of 64-bit words by their bits [lo, lo + bits); stable, so
// lower bits keep the order they came in. The bits are shared evenly between
// 1-4 passes of up to 11 bits, as many as radix_words' cost model says. Every pass's counts come
// from one read of the words (Passes of them, independent increments: a
// count per pass and read was a chain of increments to one bucket, each
// waiting for the one before where neighbours share a digit).
template <int Passes>
void radix_passes(Column<uint64_t>& v, Column<uint64_t>& tmp, int lo, int digit) {
  const uint32_t buckets = uint32_t{1} << digit;
  const uint64_t mask = buckets - 1;
  std::array<uint32_t, 6144> count;  // at most 4 passes of 256 buckets, or 3 of 2048
  std::fill_n(count.data(), Passes * buckets, 0);
  for (const uint64_t k : v)
    for (int p = 0; p < Passes; ++p) ++count[p * buckets + ((k >> (lo + p * digit)) & mask)];
  for (int p = 0; p < Passes; ++p) {
    uint32_t* const at = count.data() + p * buckets;
    uint32_t sum = 0;
    for (uint32_t b = 0; b < buckets; ++b) {
      const uint32_t c = at[b];
      at[b] = sum;
      sum += c;
    }
    const int shift = lo + p * digit;
    for (const uint64_t k : v) tmp[at[(k >> shift) & mask]++] = k;
    v.swap(tmp);
  }
}
void radix_words(Column<uint64_t>& v, Column<uint64_t>& tmp, int lo, int bits) {
  SHEAF_ASSERT(bits >= 0 && bits <= 32 && lo + bits <= 64, "radix sort of ", bits, " bits from bit ", lo,
               ": at most 32 (four passes of 8)");
  if (bits == 0) return;
  // The fewest passes is not always the cheapest: a pass clears and sums its
  // buckets (2^digit) and moves every word. A few dozen words take more
  // passes of small digits (std::sort of them took twice as long), thousands
  // fewer passes of large ones.
  int passes = 0;
  size_t best = SIZE_MAX;
  for (int p = 1; p <= 4; ++p) {
    const int d = (bits + p - 1) / p;
    if (d > 11 || (p == 4 && d > 8)) continue;  // (the counts' room: 3 passes of 2048 buckets or 4 of 256)
    const size_t cost = static_cast<size_t>(p) * ((size_t{2} << d) + 3 * v.size());
    if (cost < best) {
      best = cost;
      passes = p;
    }
  }
  const int digit = (bits + passes - 1) / passes;
  tmp.resize(v.size());
  switch (passes) {
    case 1: return radix_passes<1>(v, tmp, lo, digit);
    case 2: return radix_passes<2>(v, tmp, lo, digit);
    case 3: return radix_passes<3>(v, tmp, lo, digit);
    default: return radix_passes<4>(v, tmp, lo, digit);
  }
}

// Rows sorted by (first, then): each run that ties (tied(i): row i ties with
// row i - 1) sorted by id (`less`: rows or words). Rows rarely tie (two rows
// fed by one value).
template <class T, class Tied, class Less>
void sort_ties(Column<T>& v, Tied tied, Less less) {
  for (size_t i = 1, j; i < v.size(); i = j + 1) {
    if (!tied(i)) {
      j = i;
      continue;
    }
    for (j = i + 1; j < v.size() && tied(j);) ++j;
    std::sort(v.begin() + static_cast<std::ptrdiff_t>(i - 1), v.begin() + static_cast<std::ptrdiff_t>(j), less);
  }
}

// place_by_source: the bits in which the rows' source batches may differ
// (a table of 2^this sources), and the mark of a place not yet filled.
constexpr int kMaxSourceBits = 10;
constexpr uint32_t kEmptyId = UINT32_MAX;

// Rows whose keys differ only in their last half, which less `least` is a
// permutation of [0, n): placed there. False, with v unchanged, if two rows
// share a place. (A place is empty while its `first` is not the rows' common
// one: no id or row number has to be kept free as a mark.)
bool permute(Column<RowKey>& v, Column<RowKey>& tmp, uint32_t least) {
  const size_t n = v.size();
  const uint64_t common = v[0].first, empty = ~common;
  tmp.resize(n);
  for (size_t i = 0; i < n; ++i) tmp[i].first = empty;
  for (size_t i = 0; i < n; ++i) {
    RowKey& to = tmp[static_cast<uint32_t>(v[i].then) - least];
    if (to.first == common) return false;
    to = v[i];
  }
  v.swap(tmp);
  return true;
}

// Rows of one `first` whose `then` names each row of a few source batches
// once, and every row between a source's least and most (a loss over every
// tree node reads each node's state once): placed by source and row, one
// count and one placing pass, no sort. False, with v unchanged, if a source's
// rows leave a gap or one is read twice. `batch0`: at most the sources' least
// batch (the high half of `then`); all are below batch0 + 2^batch_bits.
bool place_by_source(Column<RowKey>& v, SortScratch& x, uint32_t batch0, int batch_bits) {
  const size_t n = v.size();
  std::vector<SortScratch::Source>& src = x.sources;
  src.assign(size_t{1} << batch_bits, SortScratch::Source{UINT32_MAX, 0, 0});
  for (const RowKey& k : v) {
    SortScratch::Source& s = src[static_cast<uint32_t>(k.then >> 32) - batch0];
    const auto row = static_cast<uint32_t>(k.then);
    s.lo = std::min(s.lo, row);
    s.hi = std::max(s.hi, row);
    ++s.count;
  }
  // Each source's rows from `at` on: lo goes to at (s.lo becomes at - lo, the
  // offset of a row, modulo 2^32).
  uint32_t at = 0;
  for (SortScratch::Source& s : src) {
    if (s.count == 0) continue;
    if (s.hi - s.lo + 1 != s.count) return false;
    s.lo = at - s.lo;
    at += s.count;
  }
  Column<uint32_t>& ids = x.ids;
  ids.resize(n);
  std::fill(ids.begin(), ids.end(), kEmptyId);
  for (const RowKey& k : v) {
    uint32_t& to = ids[src[static_cast<uint32_t>(k.then >> 32) - batch0].lo + static_cast<uint32_t>(k.then)];
    // A row read twice; or an id that is the mark itself, which would hide
    // one read twice after it: both sorted the usual way.
    if (to != kEmptyId || k.id == kEmptyId) return false;
    to = k.id;
  }
  for (size_t i = 0; i < n; ++i) v[i].id = ids[i];
  return true;
}

}  // namespace

// Big batches (a loss over every tree node: thousands of rows) take a radix
// sort, linear where a comparison sort was a fifth of all host work. The four
// 32-bit halves of (first, then) span few values in a batch (readers and
// heights of one round, rows of a few batches): less their least, they
// usually fit together in 32 bits, above each row's position, so that one
// 8-byte word per row is sorted by those bits alone (radix_words). Rows that
// differ only in the last half, each value once (a batch that follows the
// rows of the one before), skip the passes: each is placed (permute); so do
// rows of one first half whose last half names each row of a few sources
// once (place_by_source).
// Otherwise, bytes of the 24-byte keys that differ between rows, then ties by id.
bool sort_rows(Column<RowKey>& v, SortScratch& x) {
  const size_t n = v.size();
  // Whether sorted rows follow one another (the result: see row_sort.h).
  auto consecutive = [&] {
    bool follow = true;
    for (size_t i = 1; i < n && follow; ++i) follow = v[i].first == v[0].first && v[i].then == v[i - 1].then + 1;
    return follow;
  };
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; ++i) sorted = !(v[i] < v[i - 1]);
  if (sorted) return consecutive();
  if (n < 16) {
    std::sort(v.begin(), v.end());
    return consecutive();
  }
  // The four 32-bit halves of (first, then), most significant first: all at
  // once (choosing one half per call was most of the sort's own instructions).
  auto halves = [](const RowKey& k) {
    return std::array<uint32_t, 4>{static_cast<uint32_t>(k.first >> 32), static_cast<uint32_t>(k.first),
                                   static_cast<uint32_t>(k.then >> 32), static_cast<uint32_t>(k.then)};
  };
  // First the bits in which rows differ from row 0 (two XORs and ORs a row,
  // where a least and most per half cost four times that): above its highest
  // such bit a half is the same in every row, so its bits below order the
  // rows as the whole half does, and the part above serves as its least.
  // Only where these widths add up to more than 32 bits are the halves'
  // spans measured (a half of values 255 and 256 differs in 9 bits, spans 1).
  const uint64_t first0 = v[0].first, then0 = v[0].then;
  uint64_t differ_first = 0, differ_then = 0;
  bool ascending = true;  // ids in position order: ties need no pass of their own
  // Rows fed by nothing (lookups, inputs) are keyed by their own node, their
  // id: `then` then orders them as the ties by id do, and its bits need no
  // pass (a batch of lookups: 10 bits of readers and heights, not 24).
  bool then_is_id = v[0].then == v[0].id;
  for (size_t i = 1; i < n; ++i) {
    differ_first |= v[i].first ^ first0;
    differ_then |= v[i].then ^ then0;
    ascending = ascending && v[i].id > v[i - 1].id;
    then_is_id = then_is_id && v[i].then == v[i].id;
  }
  const std::array<uint32_t, 4> h0 = halves(v[0]);
  const std::array<uint32_t, 4> differ = halves(RowKey{differ_first, differ_then, 0});
  uint32_t least[4];
  int width[4], total = 0;
  for (int f = 0; f < 4; ++f) {
    width[f] = std::bit_width(differ[f]);
    least[f] = width[f] == 32 ? 0 : h0[f] & ~((uint32_t{1} << width[f]) - 1);
    total += width[f];
  }
  if (total == width[3]) {  // only the last half differs: rows placed where each reads once
    uint32_t lo = h0[3], hi = h0[3];
    for (const RowKey& k : v) {
      lo = std::min(lo, static_cast<uint32_t>(k.then));
      hi = std::max(hi, static_cast<uint32_t>(k.then));
    }
    if (hi - lo == n - 1 && permute(v, x.rows, lo)) return true;  // (one first and source: then lo, lo + 1, ...)
  } else if (width[0] == 0 && width[1] == 0 && width[2] <= kMaxSourceBits && n >= 128 &&
             place_by_source(v, x, least[2], width[2])) {
    // (One `first`, rows of a few sources: placed where each reads once.
    // Fewer rows than 128 sort about as fast as the table of up to 1024
    // sources is cleared.)
    return false;
  }
  if (then_is_id) {
    total -= width[2] + width[3];
    width[2] = width[3] = 0;
  }
  if (total > 32) {
    uint32_t most[4];
    for (int f = 0; f < 4; ++f) least[f] = most[f] = h0[f];
    for (size_t i = 1; i < n; ++i) {
      const std::array<uint32_t, 4> h = halves(v[i]);
      for (int f = 0; f < 4; ++f) {
        least[f] = std::min(least[f], h[f]);
        most[f] = std::max(most[f], h[f]);
      }
    }
    total = 0;
    for (int f = 0; f < 4; ++f) {
      const uint32_t span = then_is_id && f >= 2 ? 0 : most[f] - least[f];
      width[f] = std::bit_width(span);
      total += width[f];
    }
  }
  if (total <= 32) {
    // One word a row: its key above its id, so that the words' order is the
    // rows' (ties by id included), and the ids are all the result needs (no
    // gather of 24-byte rows back: a tenth of the sort).
    Column<uint64_t>& w = x.words;
    w.resize(n);
    const int fields = then_is_id ? 2 : 4;  // (`then` left out where it is the id)
    for (size_t i = 0; i < n; ++i) {
      uint64_t key = 0;
      const std::array<uint32_t, 4> h = halves(v[i]);
      for (int f = 0; f < fields; ++f) key = (key << width[f]) | (h[f] - least[f]);
      w[i] = key << 32 | v[i].id;
    }
    // The passes sort by the keys alone and keep the order the rows came
    // in: by id where the ids ascend, else each run of tied keys is sorted
    // by id after (the words then order by id, the bits below the key).
    radix_words(w, x.words_tmp, 32, total);
    if (!ascending) sort_ties(w, [&](size_t i) { return (w[i] >> 32) == (w[i - 1] >> 32); }, std::less<>());
    for (size_t i = 0; i < n; ++i) v[i].id = static_cast<uint32_t>(w[i]);
    return false;
  }
  if (n < 128) {
    std::sort(v.begin(), v.end());
    return false;
  }
  const uint64_t differ_words[2] = {differ_then, differ_first};  // the bits that are not the same in every row
  Column<RowKey>& tmp = x.rows;
  tmp.resize(n);
  std::array<uint32_t, 257> count;
  for (int w = 0; w < 2; ++w)
    for (int shift = 0; shift < 64; shift += 8)
      if (((differ_words[w] >> shift) & 0xFF) != 0)
        counting_pass(v, tmp, count.data(), 256,
                      [&](const RowKey& k) { return ((w == 0 ? k.then : k.first) >> shift) & 0xFF; });
  sort_ties(v, [&](size_t i) { return v[i].first == v[i - 1].first && v[i].then == v[i - 1].then; },
            [](const RowKey& a, const RowKey& b) { return a.id < b.id; });
  return false;
}

void sort_positioned(Column<uint64_t>& w, Column<uint64_t>& tmp) {
  if (w.size() < 128) return std::sort(w.begin(), w.end());
  uint64_t differ = 0;
  bool ascending = true;  // (low halves out of order: the high bits alone do not sort them)
  for (size_t i = 0; i < w.size(); ++i) {
    differ |= w[i] ^ w[0];
    ascending = ascending && (i == 0 || static_cast<uint32_t>(w[i]) > static_cast<uint32_t>(w[i - 1]));
  }
  if (!ascending) return std::sort(w.begin(), w.end());
  const auto high = static_cast<uint32_t>(differ >> 32);  // (above its highest bit, every word's are the same)
  if (high != 0) radix_words(w, tmp, 32, std::bit_width(high));
}

}  // namespace sheaf
