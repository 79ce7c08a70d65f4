// Sentiment-treebank data for the TreeLSTM example, the benchmark and the tests:
// binary constituency trees in the Stanford Sentiment Treebank (SST) format, a
// vocabulary, and synthetic trees with SST-like shape for when the data is absent.
//
//   sheaf::data::Vocab vocab;
//   auto bank = sheaf::data::load_treebank("data/sst", /*min_count=*/1, vocab);
//   for (const auto& t : bank.train) { /* t.left[n], t.right[n], t.word[n], t.label[n] */ }
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sheaf::data {

// A binary constituency tree, nodes in post-order (children before parents), so
// a single forward pass over the node indices computes every child before its
// parent; the root is the last node.
struct Tree {
  std::vector<int32_t> left, right;  // child node indices, -1 for leaves
  std::vector<int32_t> word;         // vocabulary id for leaves, -1 for internal nodes
  std::vector<int8_t> label;         // sentiment class 0..4 of every node
  std::vector<std::string> tokens;   // the leaf words in sentence order (kept for vocab building)

  int size() const { return static_cast<int>(label.size()); }
  int root() const { return size() - 1; }
  int num_words() const;  // number of leaves
  int height() const;     // leaves have height 0; internal node = 1 + max(child heights)
  bool is_leaf(int n) const { return left[n] < 0; }
};

class Vocab {
 public:
  Vocab();  // just "<unk>"

  // Words seen at least min_count times in `trees` get ids 1.. (most frequent
  // first, ties alphabetical, so ids do not depend on hash order); id 0 is "<unk>".
  static Vocab build(const std::vector<Tree>& trees, int min_count = 1);

  int32_t id(std::string_view word) const;  // 0 if unknown
  size_t size() const { return words_.size(); }  // including <unk>
  const std::string& word(int32_t id) const;     // throws std::out_of_range for a bad id

  // Sets tree.word for every leaf from tree.tokens.
  void assign_ids(Tree& tree) const;
  void assign_ids(std::vector<Tree>& trees) const;

 private:
  // Lets id() look up a string_view without building a std::string.
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  explicit Vocab(std::vector<std::string> words);  // words[0] is "<unk>"
  friend Vocab synthetic_vocab(int vocab_size);

  std::vector<std::string> words_;  // by id
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> ids_;
};

// Parses one PTB-bracketed tree as in the Stanford Sentiment Treebank:
//   (3 (2 It) (4 (2 's) (3 good)))
// Every node has a label 0..4; a leaf is "(label word)"; an internal node has
// exactly two children. A word is any run of characters other than ASCII
// whitespace and parentheses (SST has "-LRB-", "'s", "``" and UTF-8 such as a
// no-break space inside "8 1\/2"). Throws sheaf::UserError with a message
// "<source>:<line>:<column>: <what is wrong>", line and column 1-based, where
// `line` is the line number of the first character of `text`.
Tree parse_tree(std::string_view text, std::string_view source = "<string>", int line = 1);

// Reads a file with one tree per line (blank lines skipped). A malformed line
// throws the parse error above naming file, line and column; a missing file
// throws sheaf::UserError naming it.
std::vector<Tree> read_trees(const std::string& path);

struct Treebank {
  std::vector<Tree> train, dev, test;
};

// Reads DIR/train.txt, DIR/dev.txt and DIR/test.txt, builds the vocabulary from
// train with min_count and assigns ids in all three splits (unknown words -> 0).
Treebank load_treebank(const std::string& dir, int min_count, Vocab& vocab);

// Synthetic trees with SST-like shape for when the real data is absent: for the
// defaults, about 18.6 words (3..50) and height 9.7 on average (SST: 19.1 and
// 9.8). Words are "w<id>", Zipf-distributed over ids 1..vocab_size-1; a leaf's
// label is mostly its word's fixed polarity and an internal node's label is the
// rounded mean of its children's, so the labels are learnable. trees.cpp says how.
struct SyntheticOptions {
  int count = 1000;
  int min_words = 3;
  int max_words = 50;
  int vocab_size = 5000;
  uint64_t seed = 1;
};

// Deterministic for a given options value, on every platform. Word polarities
// depend on the word id only, not on the seed, so splits drawn with different
// seeds share one labelling and a model trained on one generalises to another.
std::vector<Tree> synthetic_trees(const SyntheticOptions& options);

// A Vocab that maps "w<i>" to i for i in 1..vocab_size-1 (id 0 = <unk>), matching synthetic_trees.
Vocab synthetic_vocab(int vocab_size);

// Summary statistics, for printing.
struct TreeStats {
  size_t trees = 0;
  double mean_words = 0, mean_height = 0;
  int max_words = 0, max_height = 0;
};
TreeStats stats_of(const std::vector<Tree>& trees);

}  // namespace sheaf::data
