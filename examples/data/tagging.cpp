#include "tagging.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <sheaf/core/error.h>

#include "text.h"

namespace sheaf::data {

using detail::is_blank;
using detail::is_space;

namespace {

// Tab-separated fields (CoNLL-U): each tab ends one, so an empty field keeps
// its place (runs of separators merged shifted the columns after it).
std::vector<std::pair<std::string_view, size_t>> tab_fields(std::string_view line) {
  std::vector<std::pair<std::string_view, size_t>> out;
  for (size_t start = 0;;) {
    const size_t tab = line.find('\t', start);
    out.emplace_back(line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start), start + 1);
    if (tab == std::string_view::npos) return out;
    start = tab + 1;
  }
}

// Fields of a line split by `is_sep` runs, with each field's 1-based column.
template <class Sep>
std::vector<std::pair<std::string_view, size_t>> fields(std::string_view line, Sep is_sep) {
  std::vector<std::pair<std::string_view, size_t>> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_sep(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !is_sep(line[i])) ++i;
    if (i > start) out.emplace_back(line.substr(start, i - start), start + 1);
  }
  return out;
}

[[noreturn]] void fail(std::string_view source, int line, size_t column, const std::string& what) {
  std::string where = std::string(source) + ":" + std::to_string(line);
  if (column > 0) where += ":" + std::to_string(column);
  throw UserError(where + ": " + what);
}

}  // namespace

std::vector<TaggedSentence> parse_tagged(std::string_view text, std::string_view source) {
  std::vector<TaggedSentence> out;
  detail::for_each_line(text, [&](std::string_view line, int number) {
    if (is_blank(line)) return;
    TaggedSentence s;
    for (const auto& [token, column] : fields(line, is_space)) {
      const size_t bar = token.rfind('|');
      if (bar == std::string_view::npos || bar == 0 || bar + 1 == token.size())
        fail(source, number, column, "token '" + std::string(token) + "' is not word|TAG");
      s.words.emplace_back(token.substr(0, bar));
      s.tags.emplace_back(token.substr(bar + 1));
    }
    out.push_back(std::move(s));
  });
  return out;
}

std::vector<TaggedSentence> read_tagged(const std::string& path) {
  return parse_tagged(detail::read_file(path, "tagged file"), path);
}

void write_tagged(const std::string& path, const std::vector<TaggedSentence>& sentences) {
  // What the reader reads back: no separator (its is_space) in a word or tag, no '|' in a tag.
  auto writable = [](std::string_view s, bool tag) {
    return !s.empty() && std::none_of(s.begin(), s.end(), [&](char c) { return is_space(c) || (tag && c == '|'); });
  };
  // Checked first, written to a temporary file and renamed: an error leaves no half-written file.
  for (size_t i = 0; i < sentences.size(); ++i) {
    const TaggedSentence& s = sentences[i];
    if (s.words.empty()) throw UserError("write_tagged: sentence " + std::to_string(i) + " is empty");
    if (s.words.size() != s.tags.size())
      throw UserError("write_tagged: sentence " + std::to_string(i) + " has " + std::to_string(s.words.size()) +
                      " words and " + std::to_string(s.tags.size()) + " tags");
    for (size_t t = 0; t < s.words.size(); ++t) {
      if (!writable(s.words[t], false) || !writable(s.tags[t], true))
        throw UserError("write_tagged: sentence " + std::to_string(i) + ", token " + std::to_string(t) + " ('" +
                        s.words[t] + "|" + s.tags[t] + "') cannot be written as word|TAG");
    }
  }
  const std::string tmp = path + ".tmp";
  auto cannot_write = [&] {
    std::remove(tmp.c_str());
    return UserError("write_tagged: cannot write " + path);
  };
  {
    std::ofstream out(tmp);
    for (const TaggedSentence& s : sentences) {
      for (size_t t = 0; t < s.words.size(); ++t) out << (t ? " " : "") << s.words[t] << '|' << s.tags[t];
      out << '\n';
    }
    if (!out.flush()) throw cannot_write();
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw cannot_write();
}

std::vector<TaggedSentence> parse_conll(std::string_view text, ConllColumns c, std::string_view source) {
  if (c.word < 0 || c.tag < 0 || c.word == c.tag)
    throw UserError("read_conll: the word and tag columns must be different and >= 0");
  const size_t need = static_cast<size_t>(std::max(c.word, c.tag)) + 1;
  std::vector<TaggedSentence> out;
  TaggedSentence current;
  auto end_sentence = [&] {
    if (!current.words.empty()) out.push_back(std::move(current));
    current = {};
  };
  // (CoNLL-2003 has no comments: a '#' line was dropped, a hashtag with it.)
  detail::for_each_line(text, [&](std::string_view line, int number) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (is_blank(line)) return end_sentence();
    if (c.conllu && line.front() == '#') return;
    const bool tabs = line.find('\t') != std::string_view::npos;
    const auto f = !tabs ? fields(line, is_space)
                   : c.conllu ? tab_fields(line)
                              : fields(line, [](char ch) { return ch == '\t'; });
    if (f[0].first == "-DOCSTART-") return end_sentence();
    // CoNLL-U multi-word ranges (3-4) and empty nodes (5.1) are not tokens of their own.
    const std::string_view id = f[0].first;
    if (tabs && !id.empty() && id.front() >= '0' && id.front() <= '9' && id.find_first_of("-.") != std::string_view::npos)
      return;
    if (f.size() < need)
      fail(source, number, 0,
           "has " + std::to_string(f.size()) + " columns; the word (" + std::to_string(c.word) + ") and tag (" +
               std::to_string(c.tag) + ") columns need at least " + std::to_string(need));
    for (const int k : {c.word, c.tag})
      if (f[static_cast<size_t>(k)].first.empty())
        fail(source, number, f[static_cast<size_t>(k)].second,
             std::string(k == c.word ? "the word" : "the tag") + " column (" + std::to_string(k) + ") is empty");
    current.words.emplace_back(f[static_cast<size_t>(c.word)].first);
    current.tags.emplace_back(f[static_cast<size_t>(c.tag)].first);
  });
  end_sentence();
  return out;
}

std::vector<TaggedSentence> read_conll(const std::string& path, ConllColumns columns) {
  return parse_conll(detail::read_file(path, "CoNLL file"), columns, path);
}

int64_t Index::add(std::string_view s) {
  if (const int64_t id = find(s); id >= 0) return id;
  names_.emplace_back(s);
  return ids_[names_.back()] = static_cast<int64_t>(names_.size()) - 1;
}

int64_t Index::find(std::string_view s) const {
  const auto it = ids_.find(std::string(s));
  return it == ids_.end() ? -1 : it->second;
}

TaggingVocab TaggingVocab::build(const std::vector<TaggedSentence>& train, int rare_count) {
  TaggingVocab v;
  v.rare_count = rare_count;
  v.counts.push_back(0);  // <unk>
  for (const TaggedSentence& s : train) {
    for (const std::string& w : s.words) {
      const auto id = static_cast<size_t>(v.words.add(w));
      if (id >= v.counts.size()) v.counts.push_back(0);
      ++v.counts[id];
      for (char ch : w) v.chars.add(std::string_view(&ch, 1));
    }
    for (const std::string& t : s.tags) v.tags.add(t);
  }
  return v;
}

Sentence TaggingVocab::encode(const TaggedSentence& s) const {
  if (s.words.size() != s.tags.size() || s.words.empty())
    throw UserError("TaggingVocab::encode: a sentence needs one tag per word and at least one word");
  Sentence out;
  for (size_t i = 0; i < s.words.size(); ++i) {
    const int64_t id = std::max<int64_t>(words.find(s.words[i]), 0);
    const int64_t tag = tags.find(s.tags[i]);
    if (tag < 0) throw UserError("TaggingVocab::encode: tag '" + s.tags[i] + "' (word '" + s.words[i] + "') is not in the training data");
    out.word.push_back(id);
    out.tag.push_back(tag);
    out.rare.push_back(id == 0 || counts[static_cast<size_t>(id)] <= rare_count);
    std::vector<int64_t>& cs = out.chars.emplace_back();
    for (char ch : s.words[i]) cs.push_back(std::max<int64_t>(chars.find(std::string_view(&ch, 1)), 0));
  }
  return out;
}

std::vector<Sentence> TaggingVocab::encode(const std::vector<TaggedSentence>& s) const {
  std::vector<Sentence> out;
  out.reserve(s.size());
  for (const TaggedSentence& x : s) out.push_back(encode(x));
  return out;
}

// ---------------------------------------------------------------------------
// Synthetic sentences. Word w's spelling is a stem and one of 2 * tags suffixes,
// both drawn from w by a hash (not the seed); the suffix fixes the word's base
// tag (suffix / 2). Words whose suffix is a multiple of 4 take the sum of their
// own and the previous word's base tags instead; 5% of tokens get a random tag.

namespace {

constexpr double kTagNoise = 0.05;

struct SyntheticWord {
  std::string spelling;
  int base_tag;
  bool contextual;
};

SyntheticWord synthetic_word(int32_t w, int tags) {
  static constexpr std::string_view kLetters = "abcdefghijklmnopqrstuvwxyz";
  const uint64_t h = detail::splitmix64(static_cast<uint64_t>(w));
  const int suffix = static_cast<int>(h % static_cast<uint64_t>(2 * tags));
  uint64_t r = detail::splitmix64(h);
  std::string s;
  const int stem = 2 + static_cast<int>(r % 5);
  for (int i = 0; i < stem; ++i, r /= 26) s += kLetters[r % 26];
  // The suffix's letters are a function of the suffix only: the char model's cue.
  s += kLetters[static_cast<size_t>(suffix) % 26];
  s += kLetters[static_cast<size_t>(suffix / 26 + 7) % 26];
  return {std::move(s), suffix / 2, suffix % 4 == 0};
}

}  // namespace

std::vector<TaggedSentence> synthetic_tagged(const SyntheticTaggingOptions& o) {
  if (o.count < 0 || o.min_words < 1 || o.max_words < o.min_words || o.vocab_size < 2 || o.tags < 2)
    throw UserError("synthetic_tagged: need count >= 0, 1 <= min_words <= max_words, vocab_size >= 2 and tags >= 2");
  detail::Rng rng(o.seed);
  const detail::ZipfSampler zipf(o.vocab_size);
  std::vector<TaggedSentence> out(static_cast<size_t>(o.count));
  for (TaggedSentence& s : out) {
    const int n = o.min_words + rng.below(o.max_words - o.min_words + 1);
    int previous = 0;
    for (int i = 0; i < n; ++i) {
      SyntheticWord w = synthetic_word(zipf(rng), o.tags);
      int tag = w.contextual ? (w.base_tag + previous) % o.tags : w.base_tag;
      if (rng.uniform() < kTagNoise) tag = rng.below(o.tags);
      previous = w.base_tag;
      s.words.push_back(std::move(w.spelling));
      s.tags.push_back("T" + std::to_string(tag));
    }
  }
  return out;
}

TaggingStats stats_of(const std::vector<Sentence>& sentences) {
  TaggingStats st;
  st.sentences = sentences.size();
  for (const Sentence& s : sentences) {
    st.tokens += s.word.size();
    st.rare_tokens += static_cast<size_t>(std::count(s.rare.begin(), s.rare.end(), 1));
    st.max_words = std::max(st.max_words, static_cast<int>(s.word.size()));
  }
  st.mean_words = st.sentences ? static_cast<double>(st.tokens) / static_cast<double>(st.sentences) : 0;
  return st;
}

}  // namespace sheaf::data
