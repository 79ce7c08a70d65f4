// Digit-string transduction for the attention example (examples/attention): a
// source string of digits and the target the model must write, the source
// reversed (or sorted) and then an end token. Generated, so the example, its
// test and the benchmark need no data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include <sheaf/core/error.h>

#include "text.h"

namespace sheaf::data {

// Token ids: digits 0..9, then the decoder's start and end tokens.
inline constexpr int64_t kDigitBos = 10, kDigitEos = 11, kDigitVocab = 12;

struct DigitPair {
  std::vector<int64_t> source;  // digits, at least one
  std::vector<int64_t> target;  // the answer's digits, then kDigitEos
};

enum class DigitTask { kReverse, kSort };

struct DigitOptions {
  int count = 1000;
  int min_length = 3, max_length = 20;  // source lengths, uniform
  DigitTask task = DigitTask::kReverse;
  uint64_t seed = 1;
};

inline std::vector<DigitPair> synthetic_digits(const DigitOptions& o) {
  if (o.count < 0 || o.min_length < 1 || o.max_length < o.min_length)
    throw UserError("synthetic_digits: need count >= 0 and 1 <= min_length <= max_length");
  detail::Rng rng(o.seed);
  std::vector<DigitPair> out(static_cast<size_t>(o.count));
  for (DigitPair& p : out) {
    const int n = o.min_length + rng.below(o.max_length - o.min_length + 1);
    for (int i = 0; i < n; ++i) p.source.push_back(rng.below(10));
    p.target = p.source;
    if (o.task == DigitTask::kReverse) std::reverse(p.target.begin(), p.target.end());
    else std::sort(p.target.begin(), p.target.end());
    p.target.push_back(kDigitEos);
  }
  return out;
}

}  // namespace sheaf::data
