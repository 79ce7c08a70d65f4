// The planner's row sort against std::sort, on each of its paths: few rows
// (a comparison sort); rows that differ only in a source row read once each
// (placed directly; with a row read twice, or rows of two sources, not);
// rows of one reader and height that read each row of a few sources once
// (placed by source; with a gap, a row read twice, the placing's mark as an
// id, or sources too far apart, not); rows keyed by their own node (that key
// left out of the words; with one row fed by something, not); keys whose
// spread fits 32 bits (one word per row, one to four radix passes, more of
// smaller digits for fewer rows; also where the bits that differ between rows
// do not fit, but the spans do); keys that do not (byte passes over the
// 24-byte keys). With and without ties broken by id.
#include <algorithm>
#include <bit>
#include <random>
#include <vector>

#include <sheaf/scheduler/row_sort.h>

#include "../support.h"

using namespace sheaf;

namespace {

// Bits the four 32-bit halves of (first, then) need between their least and
// most values: the sort packs them into one word when this is <= 32.
int spread_bits(const Column<RowKey>& v) {
  int total = 0;
  for (int f = 0; f < 4; ++f) {
    uint32_t lo = UINT32_MAX, hi = 0;
    for (const RowKey& k : v) {
      const uint64_t w = f < 2 ? k.first : k.then;
      const auto h = static_cast<uint32_t>(f % 2 == 0 ? w >> 32 : w);
      lo = std::min(lo, h);
      hi = std::max(hi, h);
    }
    total += std::bit_width(hi - lo);
  }
  return total;
}

// The same from the bits in which rows differ from the first: the sort's
// first measure, which can exceed the spread (255 and 256 differ in 9 bits).
int differ_bits(const Column<RowKey>& v) {
  int total = 0;
  for (int f = 0; f < 4; ++f) {
    uint32_t d = 0;
    for (const RowKey& k : v) {
      const uint64_t w = (f < 2 ? k.first ^ v[0].first : k.then ^ v[0].then);
      d |= static_cast<uint32_t>(f % 2 == 0 ? w >> 32 : w);
    }
    total += std::bit_width(d);
  }
  return total;
}

enum class Keys {
  kNarrow, kNarrowTies, kWide, kWideTies, kSpread32, kSpread33, kStraddle,
  kPermutation, kPermutationTie, kPermutationTwoSources,
  kSources, kSourcesGap, kSourcesTwice, kSourcesTwiceMarkId, kSourcesFar,
  kOwnNode, kOwnNodeButOne
};

Column<RowKey> make_keys(size_t n, Keys kind, bool shuffled_ids, std::mt19937_64& rng) {
  Column<RowKey> v(n);
  for (size_t i = 0; i < n; ++i) {
    RowKey& k = v[i];
    k.id = static_cast<uint32_t>(i * 3 + 7);
    switch (kind) {
      case Keys::kNarrow:  // a round's readers and heights, rows of a few batches
        k.first = first_key(static_cast<uint32_t>(rng() % 3), static_cast<uint32_t>(rng() % 40));
        k.then = (uint64_t{100 + rng() % 4} << 32) | (i * 7919 % (n + 1));
        break;
      case Keys::kNarrowTies:  // two rows fed by one value: equal keys, ordered by id
        k.first = first_key(0, static_cast<uint32_t>(rng() % 5));
        k.then = (uint64_t{7} << 32) | (rng() % 8);
        break;
      case Keys::kWide:
        k.first = rng();
        k.then = rng();
        break;
      case Keys::kWideTies:  // wide keys in a few groups of equal keys
        k.first = (rng() % 4) * 0x9E3779B97F4A7C15ull;
        k.then = (rng() % 3) * 0xC2B2AE3D27D4EB4Full;
        break;
      case Keys::kSpread32:  // the halves' spreads sum to 32 bits exactly (one word per row)
      case Keys::kSpread33:  // one bit more (the byte-wise passes)
        k.first = first_key(static_cast<uint32_t>(i % 2 == 0 ? 0 : 0xFF), 0);  // 8 bits
        k.then = (uint64_t{i % 3 == 0 ? 0u : 0xFFFFu} << 32) |                    // 16 bits
                 ((i % 5 == 0 ? 1 : kind == Keys::kSpread32 ? 0xFF : 0x1FF) - rng() % 2);  // 8 or 9
        break;
      case Keys::kStraddle:  // halves of two values either side of a power of two: 9-14 bits differ, 1 spans
        k.first = first_key(static_cast<uint32_t>(255 + rng() % 2), static_cast<uint32_t>(1023 + rng() % 2));
        k.then = (uint64_t{16383 + rng() % 2} << 32) | (4095 + i % 2);
        break;
      case Keys::kPermutation:  // one reader and height, each row of one source batch once (placed directly)
      case Keys::kPermutationTie:  // the same with one source row read twice (another read by none)
        k.first = first_key(4, 2);
        k.then = (uint64_t{9} << 32) | (1000 + (i * 7919 + 13) % n);  // (7919 is prime: a permutation)
        break;
      case Keys::kPermutationTwoSources:  // the same rows, from two batches: not placed by row alone
        k.first = first_key(4, 2);
        k.then = (uint64_t{9 + i % 2} << 32) | (1000 + (i * 7919 + 13) % n);
        break;
      case Keys::kOwnNode:  // rows fed by nothing, keyed by their own node (their id): readers and heights sort
      case Keys::kOwnNodeButOne:  // the same but for one row fed by something (`then` is not its id)
        k.first = first_key(static_cast<uint32_t>(rng() % 20), static_cast<uint32_t>(rng() % 30));
        break;
      case Keys::kSources:       // one reader and height, each row of five source batches once (placed by source)
      case Keys::kSourcesGap:    // the same with a row of one source left out (the sort's way)
      case Keys::kSourcesTwice:  // the same with a row read twice, another by none (the sort's way)
      case Keys::kSourcesTwiceMarkId:  // the same, the first of the two rows with the largest id (placing's mark)
      case Keys::kSourcesFar:    // the sources' batches far apart (11 bits: the sort's way)
        k.first = first_key(4, 2);
        break;
    }
  }
  const bool twice = kind == Keys::kSourcesTwice || kind == Keys::kSourcesTwiceMarkId;
  if (kind == Keys::kSources || kind == Keys::kSourcesGap || twice || kind == Keys::kSourcesFar) {
    // Source s (batch 200 + 3s, or 200 + 300s, rows from 50s on) gets every fifth row, in a shuffled order.
    std::vector<uint64_t> then(n);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t source = i % 5;
      then[i] = ((200 + (kind == Keys::kSourcesFar ? 300 : 3) * source) << 32) | (50 * source + i / 5);
    }
    if (kind == Keys::kSourcesGap && n >= 15) then[5] += 2 * n;  // source 0's row 1 read as one past its last
    if (twice && n >= 15) then[5] = then[10];  // source 0's rows: 0, 2, 2, 3, ...
    std::shuffle(then.begin(), then.end(), rng);
    for (size_t i = 0; i < n; ++i) v[i].then = then[i];
  }
  if (kind == Keys::kPermutationTie && n >= 4)  // the least and most source rows kept: the range still spans n
    for (RowKey& k : v)
      if (static_cast<uint32_t>(k.then) == 1000 + n / 2) k.then += 1;
  if (shuffled_ids) {
    std::vector<uint32_t> ids;
    for (const RowKey& k : v) ids.push_back(k.id);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (size_t i = 0; i < n; ++i) v[i].id = ids[i];
  }
  if (kind == Keys::kOwnNode || kind == Keys::kOwnNodeButOne) {  // (after the ids' shuffle: still each row's own)
    for (RowKey& k : v) k.then = k.id;
    if (kind == Keys::kOwnNodeButOne && n > 0) v[n / 2].then = (uint64_t{3} << 32) | 5;
  }
  if (kind == Keys::kSourcesTwiceMarkId && n >= 15) {  // the first (by position) of the two rows of one value
    size_t first = n;
    for (size_t i = 0; i < n && first == n; ++i)
      for (size_t j = i + 1; j < n; ++j)
        if (v[j].then == v[i].then) {
          first = i;
          break;
        }
    if (first < n) v[first].id = UINT32_MAX;
  }
  return v;
}

// Whether sorted rows have one `first` and `then` values t, t + 1, ...: what
// sort_rows' true says of them.
bool follow(const Column<RowKey>& sorted) {
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first != sorted[0].first || sorted[i].then != sorted[i - 1].then + 1) return false;
  return true;
}

// Where sort_rows says the rows follow, the planner reads their keys (the
// first row's `then`): they must be the sorted ones, not left as they were.
bool same_keys(const Column<RowKey>& a, const Column<RowKey>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].then != b[i].then) return false;
  return true;
}

// The order sort_rows gives: its ids (the keys may be left as they were).
bool same_ids(const Column<RowKey>& a, const Column<RowKey>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].id != b[i].id) return false;
  return true;
}

}  // namespace

TEST_CASE("row sort: the same order as std::sort on every path", "[scheduler][planner][sort]") {
  std::mt19937_64 rng(11);
  SortScratch scratch;  // reused, as the planner does
  for (const size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{15}, size_t{16}, size_t{100}, size_t{127},
                         size_t{128}, size_t{700}, size_t{2047}, size_t{2048}, size_t{6000}})
    for (const Keys kind : {Keys::kNarrow, Keys::kNarrowTies, Keys::kWide, Keys::kWideTies, Keys::kSpread32,
                            Keys::kSpread33, Keys::kStraddle, Keys::kPermutation, Keys::kPermutationTie,
                            Keys::kPermutationTwoSources, Keys::kSources, Keys::kSourcesGap, Keys::kSourcesTwice,
                            Keys::kSourcesTwiceMarkId, Keys::kSourcesFar, Keys::kOwnNode, Keys::kOwnNodeButOne})
      for (const bool shuffled_ids : {false, true}) {
        Column<RowKey> v = make_keys(n, kind, shuffled_ids, rng);
        if (n >= 16) {
          const bool narrow = kind != Keys::kWide && kind != Keys::kWideTies && kind != Keys::kSpread33;
          INFO("spread " << spread_bits(v) << " bits");
          CHECK((spread_bits(v) <= 32) == narrow);  // the path this case means to take
          if (kind == Keys::kSpread32) CHECK(spread_bits(v) == 32);
          if (kind == Keys::kSpread33) CHECK(spread_bits(v) == 33);
          if (kind == Keys::kStraddle) CHECK(differ_bits(v) > 32);  // the spans measured after all
        }
        Column<RowKey> want = v;
        std::sort(want.begin(), want.end());
        INFO(n << " rows, keys " << static_cast<int>(kind) << (shuffled_ids ? ", ids shuffled" : ""));
        // True only where the rows follow one another; and said there on
        // the paths that promise it: rows in order, few rows, rows placed
        // by permute (each row of one source once).
        const bool follows = follow(want);
        const bool said = sort_rows(v, scratch);
        CHECK(same_ids(v, want));
        CHECK((!said || follows));
        if (said) CHECK(same_keys(v, want));
        if (kind == Keys::kPermutation) CHECK(said);
        v = want;
        CHECK(sort_rows(v, scratch) == follows);  // sorted already: stays, and is seen
        CHECK(same_ids(v, want));
        v = want;
        std::reverse(v.begin(), v.end());
        const bool said_reversed = sort_rows(v, scratch);
        CHECK(same_ids(v, want));
        CHECK((!said_reversed || follows));
        if (said_reversed) CHECK(same_keys(v, want));
        if (n < 16) CHECK(said_reversed == follows);
      }
}

TEST_CASE("row sort: words whose low halves ascend sort as std::sort sorts them", "[scheduler][planner][sort]") {
  std::mt19937_64 rng(12);
  Column<uint64_t> tmp;
  for (const size_t n : {size_t{0}, size_t{1}, size_t{100}, size_t{127}, size_t{128}, size_t{700}, size_t{5000}})
    for (const uint64_t sources : {uint64_t{1}, uint64_t{3}, uint64_t{300}, uint64_t{1} << 32})
      for (const uint64_t base : {uint64_t{0}, uint64_t{255}, uint64_t{1} << 20}) {
        Column<uint64_t> w(n);
        uint32_t low = 0;
        for (size_t i = 0; i < n; ++i) {
          low += 1 + static_cast<uint32_t>(rng() % 3);  // (positions: ascending, not every one)
          w[i] = (((base + rng() % sources) & 0xFFFFFFFFu) << 32) | low;
        }
        Column<uint64_t> want = w;
        std::sort(want.begin(), want.end());
        INFO(n << " words, " << sources << " sources from " << base);
        sort_positioned(w, tmp);
        CHECK(w == want);
        // Low halves out of order (not positions): sorted all the same.
        if (n < 2) continue;
        std::shuffle(want.begin(), want.end(), rng);
        w = want;
        std::sort(want.begin(), want.end());
        sort_positioned(w, tmp);
        CHECK(w == want);
      }
}
