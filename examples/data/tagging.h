// Tagged sentences for the BiLSTM tagger (examples/tagger): readers for DyNet's
// benchmark format and for CoNLL column files, a vocabulary that marks rare
// words (spelled out by a character LSTM in the char tagger), and a synthetic
// corpus for when no data is at hand.
//
//   auto train = sheaf::data::read_tagged("train.txt");            // word|TAG word|TAG ...
//   auto dev = sheaf::data::read_conll("dev.conllu", {.word = 1, .tag = 3});
//   auto vocab = sheaf::data::TaggingVocab::build(train, /*rare_count=*/1);
//   sheaf::data::Sentence s = vocab.encode(train[0]);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sheaf::data {

struct TaggedSentence {
  std::vector<std::string> words, tags;  // the same length, at least 1
};

// DyNet's benchmark format: one sentence a line, tokens separated by spaces,
// each token "word|TAG" split at its LAST '|' (so a word may hold '|'). Blank
// lines are skipped. A malformed token is a UserError "<file>:<line>:<column>: ...".
std::vector<TaggedSentence> read_tagged(const std::string& path);
std::vector<TaggedSentence> parse_tagged(std::string_view text, std::string_view source = "<string>");
// Writes sentences in that format (read_tagged reads them back equal). A word or
// tag that the format cannot hold (empty, with white space; a tag with '|') or
// an empty sentence is a UserError naming the sentence, and nothing is written;
// so is a file that cannot be written.
void write_tagged(const std::string& path, const std::vector<TaggedSentence>& sentences);

// CoNLL column files: one token a line, a blank line between sentences.
// Columns are 0-based. CoNLL-U ({.word = 1, .tag = 3}: FORM, UPOS; `conllu`):
// lines starting with '#' are comments, columns are separated by single tabs
// (an empty column keeps its place; an empty word or tag is an error; a line
// without a tab splits at runs of spaces), and multi-word ranges ("3-4") and
// empty nodes ("5.1") are skipped. CoNLL-2003 ({.word = 0, .tag = 3,
// .conllu = false}: NER): columns separated by runs of spaces or tabs, '#' a
// word like any other (a tweet's hashtag), "-DOCSTART-" lines skipped. A
// line with too few columns is a UserError naming file and line.
struct ConllColumns {
  int word = 1;
  int tag = 3;
  bool conllu = true;
};
std::vector<TaggedSentence> read_conll(const std::string& path, ConllColumns columns = {});
std::vector<TaggedSentence> parse_conll(std::string_view text, ConllColumns columns = {},
                                        std::string_view source = "<string>");

// A sentence as ids. Every token has a word id (0 = unknown) and its characters'
// ids (0 = unknown character, bytes: a UTF-8 letter is several characters);
// `rare` marks the tokens the char tagger spells out instead of looking up.
struct Sentence {
  std::vector<int64_t> word, tag;
  std::vector<std::vector<int64_t>> chars;
  std::vector<uint8_t> rare;
  int64_t size() const { return static_cast<int64_t>(word.size()); }
};

// Strings to dense ids, in order of first appearance; id 0 may be reserved.
class Index {
 public:
  explicit Index(std::string reserved = "") {
    if (!reserved.empty()) add(reserved);
  }
  int64_t add(std::string_view s);
  int64_t find(std::string_view s) const;  // -1 if absent
  size_t size() const { return names_.size(); }
  const std::string& name(int64_t id) const { return names_.at(static_cast<size_t>(id)); }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, int64_t> ids_;
};

class TaggingVocab {
 public:
  // Words, characters and tags of `train`. A word seen at most `rare_count`
  // times in train is rare (as are words not in train); rare words still get a
  // word id, so the word-level tagger learns them as the char tagger spells them.
  static TaggingVocab build(const std::vector<TaggedSentence>& train, int rare_count = 1);

  // Ids for a sentence; a tag not seen in train is a UserError naming it.
  Sentence encode(const TaggedSentence& s) const;
  std::vector<Sentence> encode(const std::vector<TaggedSentence>& s) const;

  Index words{"<unk>"}, chars{"<unk>"}, tags;
  std::vector<int64_t> counts;  // by word id: occurrences in train
  int rare_count = 1;
};

// Synthetic sentences with the sizes of DyNet's benchmark: `count` sentences of
// min_words..max_words (uniform), words Zipf-distributed over a vocabulary of
// "stem+suffix" spellings. A word's tag is mostly fixed by its suffix, and for
// a quarter of the suffixes it depends on the previous word's as well: learnable
// from the words, from their spelling, and needing context. Deterministic for a
// seed; the word -> tag rule does not depend on the seed, so splits drawn with
// different seeds share it.
struct SyntheticTaggingOptions {
  int count = 1000;
  int min_words = 5;
  int max_words = 40;
  int vocab_size = 10000;
  int tags = 30;
  uint64_t seed = 1;
};
std::vector<TaggedSentence> synthetic_tagged(const SyntheticTaggingOptions& options);

struct TaggingStats {
  size_t sentences = 0, tokens = 0, rare_tokens = 0;
  double mean_words = 0;
  int max_words = 0;
};
TaggingStats stats_of(const std::vector<Sentence>& sentences);

}  // namespace sheaf::data
