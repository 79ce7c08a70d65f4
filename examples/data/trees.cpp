#include "trees.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <utility>

#include <sheaf/core/error.h>

#include "text.h"

namespace sheaf::data {

using detail::is_blank;
using detail::is_space;
using detail::Rng;
using detail::splitmix64;
using detail::ZipfSampler;

// ---------------------------------------------------------------------------
// Tree

int Tree::num_words() const {
  return static_cast<int>(std::count_if(left.begin(), left.end(), [](int32_t l) { return l < 0; }));
}

int Tree::height() const {
  if (size() == 0) return 0;
  // Post-order: both children's heights are known when a parent is reached.
  std::vector<int> h(size(), 0);
  for (int n = 0; n < size(); ++n)
    if (!is_leaf(n)) h[n] = 1 + std::max(h[left[n]], h[right[n]]);
  return h[root()];
}

// ---------------------------------------------------------------------------
// Vocab

namespace {
constexpr const char* kUnk = "<unk>";
}

Vocab::Vocab() : Vocab(std::vector<std::string>{kUnk}) {}

Vocab::Vocab(std::vector<std::string> words) : words_(std::move(words)) {
  ids_.reserve(words_.size());
  for (size_t i = 0; i < words_.size(); ++i) ids_.emplace(words_[i], static_cast<int32_t>(i));
}

Vocab Vocab::build(const std::vector<Tree>& trees, int min_count) {
  std::unordered_map<std::string_view, int> counts;
  for (const Tree& t : trees)
    for (const std::string& w : t.tokens) ++counts[w];

  std::vector<std::pair<std::string_view, int>> kept;
  for (const auto& [w, c] : counts)
    if (c >= min_count && w != kUnk) kept.emplace_back(w, c);
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });

  std::vector<std::string> words{kUnk};
  words.reserve(kept.size() + 1);
  for (const auto& [w, c] : kept) words.emplace_back(w);
  return Vocab(std::move(words));
}

int32_t Vocab::id(std::string_view word) const {
  auto it = ids_.find(word);
  return it == ids_.end() ? 0 : it->second;
}

const std::string& Vocab::word(int32_t id) const { return words_.at(static_cast<size_t>(id)); }

void Vocab::assign_ids(Tree& tree) const {
  const int leaves = tree.num_words();
  if (leaves != static_cast<int>(tree.tokens.size()))
    throw UserError("assign_ids: tree has " + std::to_string(leaves) + " leaves but " +
                    std::to_string(tree.tokens.size()) + " tokens");
  tree.word.assign(tree.size(), -1);
  // In post-order the leaves come in sentence order, as the tokens do.
  size_t k = 0;
  for (int n = 0; n < tree.size(); ++n)
    if (tree.is_leaf(n)) tree.word[n] = id(tree.tokens[k++]);
}

void Vocab::assign_ids(std::vector<Tree>& trees) const {
  for (Tree& t : trees) assign_ids(t);
}

// ---------------------------------------------------------------------------
// Parsing

namespace {

// Only ASCII whitespace separates: SST tokens can hold UTF-8 bytes, e.g. a
// no-break space (0xC2 0xA0) inside "8 1\/2", and those belong to the word.
bool is_word_char(char c) { return !is_space(c) && c != '(' && c != ')'; }

// An explicit stack rather than recursion, so a deeply nested (or hostile)
// line cannot overflow the call stack.
class Parser {
 public:
  Parser(std::string_view text, std::string_view source, int line) : text_(text), source_(source), line_(line) {}

  Tree parse() {
    const auto nodes = static_cast<size_t>(std::count(text_.begin(), text_.end(), '('));
    tree_.left.reserve(nodes);
    tree_.right.reserve(nodes);
    tree_.word.reserve(nodes);
    tree_.label.reserve(nodes);
    tree_.tokens.reserve(nodes / 2 + 1);

    skip_space();
    if (at_end() || peek() != '(') expected("'(' to start a tree");
    open_node();
    while (!open_.empty()) {
      skip_space();
      if (at_end()) expected("')'");
      if (peek() == '(') {
        if (open_.back().num_children == 2) fail(pos_, "node with more than 2 children (trees must be binary)");
        open_node();
      } else if (peek() == ')') {
        close_node();
      } else {
        expected("'(' or ')'");
      }
    }
    skip_space();
    if (!at_end()) fail(pos_, "trailing text after tree: " + describe(pos_));
    return std::move(tree_);
  }

 private:
  // A node whose '(' has been read and whose children are still being read.
  struct Open {
    int8_t label;
    size_t pos;  // of its '(', to point errors at the node
    int32_t children[2] = {-1, -1};
    int num_children = 0;
  };

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_space() {
    while (!at_end() && is_space(peek())) ++pos_;
  }

  std::string_view take_word() {
    const size_t start = pos_;
    while (!at_end() && is_word_char(peek())) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  // At '(': reads the label, then either a word and ')' (a leaf, done) or
  // leaves the node open for its children.
  void open_node() {
    const size_t start = pos_++;
    skip_space();
    const size_t label_pos = pos_;
    const std::string_view label = take_word();
    if (label.empty()) expected("a label 0..4");
    if (label.size() != 1 || label[0] < '0' || label[0] > '4')
      fail(label_pos, "label must be 0..4, found '" + std::string(label) + "'");
    const auto value = static_cast<int8_t>(label[0] - '0');

    skip_space();
    if (!at_end() && peek() == '(') {
      open_.push_back({value, start});
      return;
    }
    const std::string_view word = take_word();
    if (word.empty()) expected("a word or '(' after the label");
    skip_space();
    if (at_end() || peek() != ')') expected("')' after the word '" + std::string(word) + "'");
    ++pos_;
    tree_.tokens.emplace_back(word);
    attach(add_node(-1, -1, value));
  }

  // At ')': completes the innermost open node.
  void close_node() {
    const Open node = open_.back();
    open_.pop_back();
    if (node.num_children == 1) fail(node.pos, "node with 1 child (trees must be binary)");
    ++pos_;
    attach(add_node(node.children[0], node.children[1], node.label));
  }

  int32_t add_node(int32_t left, int32_t right, int8_t label) {
    tree_.left.push_back(left);
    tree_.right.push_back(right);
    tree_.word.push_back(-1);  // set by Vocab::assign_ids
    tree_.label.push_back(label);
    return static_cast<int32_t>(tree_.label.size() - 1);
  }

  // A node is added only once its whole subtree has been, which is what makes
  // the order post-order. With nothing open, `node` is the root.
  void attach(int32_t node) {
    if (open_.empty()) return;
    Open& parent = open_.back();
    parent.children[parent.num_children++] = node;
  }

  std::string describe(size_t pos) const {
    if (pos >= text_.size()) return "end of line";
    if (!is_word_char(text_[pos])) return std::string("'") + text_[pos] + "'";
    size_t end = pos;
    while (end < text_.size() && is_word_char(text_[end])) ++end;
    return "'" + std::string(text_.substr(pos, std::min<size_t>(end - pos, 40))) + "'";
  }

  [[noreturn]] void expected(const std::string& what) const {
    if (at_end()) fail(pos_, "unexpected end of line, expected " + what);
    fail(pos_, "expected " + what + ", found " + describe(pos_));
  }

  // Columns count bytes, as editors' "go to column" on ASCII text does.
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    int line = line_;
    size_t line_start = 0;
    for (size_t i = 0; i < pos && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const size_t column = pos - line_start + 1;
    throw UserError(std::string(source_) + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + what);
  }

  std::string_view text_;
  std::string_view source_;
  int line_;
  size_t pos_ = 0;
  Tree tree_;
  std::vector<Open> open_;
};

}  // namespace

Tree parse_tree(std::string_view text, std::string_view source, int line) {
  return Parser(text, source, line).parse();
}

std::vector<Tree> read_trees(const std::string& path) {
  const std::string text = detail::read_file(path, "tree file");
  std::vector<Tree> trees;
  detail::for_each_line(text, [&](std::string_view content, int line) {
    if (!is_blank(content)) trees.push_back(parse_tree(content, path, line));
  });
  return trees;
}

Treebank load_treebank(const std::string& dir, int min_count, Vocab& vocab) {
  const std::filesystem::path root(dir);
  Treebank bank{read_trees(root / "train.txt"), read_trees(root / "dev.txt"), read_trees(root / "test.txt")};
  vocab = Vocab::build(bank.train, min_count);
  vocab.assign_ids(bank.train);
  vocab.assign_ids(bank.dev);
  vocab.assign_ids(bank.test);
  return bank;
}

// ---------------------------------------------------------------------------
// Synthetic trees
//
// Shape follows SST (train: 19.1 words on average, 2..52, heights averaging 9.8):
//  - length: min_words + (max_words - min_words + 1) * Beta(2, 4), which is
//    skewed like SST's lengths; its mean is a third of the way up the range
//    (about 18.5 words for the default 3..50);
//  - bracketing: each span splits at a random point, often next to an end;
//  - words: Zipf(1.0) over ids 1..vocab_size-1, id 1 the most frequent;
//  - labels: a leaf usually takes its word's fixed polarity, otherwise a random
//    class; an internal node takes the rounded mean of its children's labels.
// Every label is thus a function of the words plus a little noise: learnable.

namespace {

constexpr double kLeafNoise = 0.2;  // chance that a leaf's label ignores its word's polarity
constexpr double kPeelWord = 0.55;  // chance that a span splits off one word at an end

// Independent of the seed, so train/dev/test drawn with different seeds agree.
int8_t polarity(int32_t word) { return static_cast<int8_t>(splitmix64(static_cast<uint64_t>(word)) % 5); }

// Rounded mean of two labels. A .5 tie rounds away from neutral (2): rounding
// toward it would make ~90% of roots neutral, while this gives a root label mix
// close to SST's, and stays symmetric between negative and positive.
int8_t combine(int8_t a, int8_t b) {
  const int sum = a + b;
  const int floor = sum / 2;
  if (sum % 2 == 0 || floor < 2) return static_cast<int8_t>(floor);
  return static_cast<int8_t>(floor + 1);
}

// Beta(2, 4) is the distribution of the 2nd smallest of 5 uniforms.
double beta_2_4(Rng& rng) {
  double u[5];
  for (double& x : u) x = rng.uniform();
  std::nth_element(u, u + 1, u + 5);
  return u[1];
}

class SyntheticTreeBuilder {
 public:
  SyntheticTreeBuilder(Rng& rng, const std::vector<int32_t>& words) : rng_(rng), words_(words) {
    const size_t nodes = 2 * words.size() - 1;
    tree_.left.reserve(nodes);
    tree_.right.reserve(nodes);
    tree_.word.reserve(nodes);
    tree_.label.reserve(nodes);
    tree_.tokens.reserve(words.size());
  }

  Tree build() {
    span(0, static_cast<int>(words_.size()));
    return std::move(tree_);
  }

 private:
  // Builds the subtree over words [lo, hi), children first (post-order).
  int32_t span(int lo, int hi) {
    if (hi - lo == 1) return leaf(words_[lo]);
    const int split = split_point(lo, hi);
    const int32_t l = span(lo, split);
    const int32_t r = span(split, hi);
    return add(l, r, -1, combine(tree_.label[l], tree_.label[r]));
  }

  // Uniform split points alone give trees shallower than SST's (mean height 7.0
  // against 9.8): SST attaches many single words ("the", ".", "'s") to a large
  // constituent, which makes long chains. kPeelWord brings the mean to SST's.
  int split_point(int lo, int hi) {
    if (rng_.uniform() < kPeelWord) return rng_.below(2) == 0 ? lo + 1 : hi - 1;
    return lo + 1 + rng_.below(hi - lo - 1);
  }

  int32_t leaf(int32_t word) {
    const int8_t label = rng_.uniform() < kLeafNoise ? static_cast<int8_t>(rng_.below(5)) : polarity(word);
    tree_.tokens.push_back("w" + std::to_string(word));
    return add(-1, -1, word, label);
  }

  int32_t add(int32_t left, int32_t right, int32_t word, int8_t label) {
    tree_.left.push_back(left);
    tree_.right.push_back(right);
    tree_.word.push_back(word);
    tree_.label.push_back(label);
    return static_cast<int32_t>(tree_.label.size() - 1);
  }

  Rng& rng_;
  const std::vector<int32_t>& words_;
  Tree tree_;
};

}  // namespace

std::vector<Tree> synthetic_trees(const SyntheticOptions& options) {
  if (options.count < 0 || options.min_words < 1 || options.max_words < options.min_words || options.vocab_size < 2)
    throw UserError("synthetic_trees: need count >= 0, 1 <= min_words <= max_words and vocab_size >= 2");
  Rng rng(options.seed);
  const ZipfSampler zipf(options.vocab_size);
  const int range = options.max_words - options.min_words + 1;

  std::vector<Tree> trees;
  trees.reserve(options.count);
  std::vector<int32_t> words;
  for (int i = 0; i < options.count; ++i) {
    const int length = options.min_words + static_cast<int>(beta_2_4(rng) * range);
    words.resize(length);
    for (int32_t& w : words) w = zipf(rng);
    trees.push_back(SyntheticTreeBuilder(rng, words).build());
  }
  return trees;
}

Vocab synthetic_vocab(int vocab_size) {
  std::vector<std::string> words{kUnk};
  for (int id = 1; id < vocab_size; ++id) words.push_back("w" + std::to_string(id));
  return Vocab(std::move(words));
}

TreeStats stats_of(const std::vector<Tree>& trees) {
  TreeStats s;
  s.trees = trees.size();
  if (trees.empty()) return s;
  double words = 0, height = 0;
  for (const Tree& t : trees) {
    const int w = t.num_words(), h = t.height();
    words += w;
    height += h;
    s.max_words = std::max(s.max_words, w);
    s.max_height = std::max(s.max_height, h);
  }
  s.mean_words = words / static_cast<double>(trees.size());
  s.mean_height = height / static_cast<double>(trees.size());
  return s;
}

std::string detail::read_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  // A directory opens fine on Linux and then reads as empty; report it instead.
  if (!in || std::filesystem::is_directory(path)) throw UserError("cannot open " + std::string(what) + " '" + path + "'");
  std::string text(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
  // A UTF-8 byte-order mark (editors on Windows write one) is not text: it
  // became part of the first word, or an unexplained "found ''" error.
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
  return text;
}

}  // namespace sheaf::data
