// The tree data module: the SST parser and its error messages, files, the
// vocabulary and the synthetic trees. Self-contained: the real treebank is only
// checked when it is present.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../../examples/data/trees.h"
#include <sheaf/core/error.h>

using namespace sheaf::data;
using Catch::Contains;

namespace {

namespace fs = std::filesystem;

// A fresh directory for one test, removed afterwards; tests may run in parallel.
class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("sheaf-test-trees-" + std::to_string(std::random_device{}()))) {
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, const std::string& text) const {
    const fs::path file = path_ / name;
    std::ofstream(file, std::ios::binary) << text;
    return file.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

// Children come before parents, every internal node has two children, and
// every node but the root is the child of exactly one node.
void require_binary_post_order(const Tree& t) {
  REQUIRE(t.size() > 0);
  std::vector<int> parents(t.size(), 0);
  int internal = 0;
  for (int n = 0; n < t.size(); ++n) {
    if (t.is_leaf(n)) {
      REQUIRE(t.right[n] == -1);
      continue;
    }
    ++internal;
    REQUIRE(t.left[n] >= 0);
    REQUIRE(t.right[n] >= 0);
    REQUIRE(t.left[n] < n);
    REQUIRE(t.right[n] < n);
    ++parents[t.left[n]];
    ++parents[t.right[n]];
  }
  for (int n = 0; n < t.root(); ++n) REQUIRE(parents[n] == 1);
  REQUIRE(parents[t.root()] == 0);
  REQUIRE(internal == t.num_words() - 1);
  REQUIRE(t.num_words() == static_cast<int>(t.tokens.size()));
}

}  // namespace

TEST_CASE("parse_tree reads the example tree in post-order", "[trees]") {
  const Tree t = parse_tree("(3 (2 It) (4 (2 's) (3 good)))");

  // 0: It  1: 's  2: good  3: ('s good)  4: root
  REQUIRE(t.size() == 5);
  REQUIRE(t.root() == 4);
  REQUIRE(t.num_words() == 3);
  REQUIRE(t.height() == 2);
  CHECK(t.left == std::vector<int32_t>{-1, -1, -1, 1, 0});
  CHECK(t.right == std::vector<int32_t>{-1, -1, -1, 2, 3});
  CHECK(t.label == std::vector<int8_t>{2, 2, 3, 4, 3});
  CHECK(t.word == std::vector<int32_t>{-1, -1, -1, -1, -1});
  CHECK(t.tokens == std::vector<std::string>{"It", "'s", "good"});
  CHECK(t.is_leaf(0));
  CHECK_FALSE(t.is_leaf(3));
  require_binary_post_order(t);
}

TEST_CASE("parse_tree accepts SST's tokens, spacing and single-word trees", "[trees]") {
  SECTION("punctuation-like tokens and UTF-8 bytes are words") {
    // SST has "8<no-break space>1\/2": only ASCII whitespace separates.
    const Tree t = parse_tree("(2 (2 -LRB-) (2 (2 ``) (2 8\xC2\xA0" "1\\/2)))");
    CHECK(t.tokens == std::vector<std::string>{"-LRB-", "``", "8\xC2\xA0" "1\\/2"});
  }
  SECTION("extra spaces, tabs and a trailing CR") {
    const Tree t = parse_tree("  (1\t(0  bad )(2 film ) )\r");
    CHECK(t.tokens == std::vector<std::string>{"bad", "film"});
    CHECK(t.label == std::vector<int8_t>{0, 2, 1});
  }
  SECTION("a one-word tree is a single leaf") {
    const Tree t = parse_tree("(4 great)");
    CHECK(t.size() == 1);
    CHECK(t.height() == 0);
    CHECK(t.num_words() == 1);
  }
  SECTION("a right-branching chain") {
    const Tree t = parse_tree("(2 (2 a) (2 (2 b) (2 (2 c) (2 d))))");
    CHECK(t.height() == 3);
    require_binary_post_order(t);
  }
}

TEST_CASE("parse_tree reports malformed trees with line and column", "[trees][errors]") {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"", "<string>:1:1: unexpected end of line, expected '('"},
      {"2 good", "<string>:1:1: expected '(' to start a tree, found '2'"},
      {"(", "<string>:1:2: unexpected end of line, expected a label 0..4"},
      {"(7 good)", "<string>:1:2: label must be 0..4, found '7'"},
      {"(2 (x good) (2 bad))", "<string>:1:5: label must be 0..4, found 'x'"},
      {"(2 (2 a) (12 b))", "<string>:1:11: label must be 0..4, found '12'"},
      {"(2)", "<string>:1:3: expected a word or '(' after the label, found ')'"},
      {"(2 a b)", "<string>:1:6: expected ')' after the word 'a', found 'b'"},
      {"(2 (2 a) b)", "<string>:1:10: expected '(' or ')', found 'b'"},
      {"(2 (2 a))", "<string>:1:1: node with 1 child"},
      {"(2 (2 a) (2 b) (2 c))", "<string>:1:16: node with more than 2 children"},
      {"(3 (2 It) (4 (2 's) (3 good))", "<string>:1:30: unexpected end of line, expected ')'"},
      {"(2 (2 a) (2 b)))", "<string>:1:16: trailing text after tree: ')'"},
      {"(2 (2 a) (2 b)) (2 c)", "<string>:1:17: trailing text after tree"},
  };
  for (const Case& c : cases) {
    INFO("input: \"" << c.text << "\"");
    REQUIRE_THROWS_AS(parse_tree(c.text), sheaf::UserError);
    REQUIRE_THROWS_WITH(parse_tree(c.text), Contains(c.message));
  }
}

TEST_CASE("parse_tree errors name the given source and line", "[trees][errors]") {
  REQUIRE_THROWS_WITH(parse_tree("(2 (2 a)", "dev.txt", 7), Contains("dev.txt:7:9: unexpected end of line"));
  // Text spanning lines: the line and column are those of the offending character.
  REQUIRE_THROWS_WITH(parse_tree("(2 (2 a)\n  (9 b))", "f.txt", 3), Contains("f.txt:4:4: label must be 0..4"));
}

TEST_CASE("read_trees reads one tree per line and skips blank lines", "[trees][files]") {
  TempDir dir;
  const std::string path = dir.write("trees.txt", "(3 (2 It) (3 good))\n\n   \n(1 (1 dull) (2 .))\r\n(2 ok)");
  const std::vector<Tree> trees = read_trees(path);
  REQUIRE(trees.size() == 3);
  CHECK(trees[0].tokens == std::vector<std::string>{"It", "good"});
  CHECK(trees[1].tokens == std::vector<std::string>{"dull", "."});
  CHECK(trees[2].tokens == std::vector<std::string>{"ok"});
}

TEST_CASE("read_trees skips a UTF-8 byte-order mark", "[trees][files]") {
  TempDir dir;
  // (It was read as text: "expected '(' to start a tree, found ''".)
  const std::vector<Tree> trees = read_trees(dir.write("bom.txt", "\xEF\xBB\xBF(3 (2 It) (3 good))\n"));
  REQUIRE(trees.size() == 1);
  CHECK(trees[0].tokens == std::vector<std::string>{"It", "good"});
}

TEST_CASE("read_trees names the file, line and column of a malformed line", "[trees][files][errors]") {
  TempDir dir;
  const std::string path = dir.write("bad.txt", "(2 (2 a) (2 b))\n(3 c)\n(2 (2 a) (5 b))\n(2 d)\n");
  REQUIRE_THROWS_AS(read_trees(path), sheaf::UserError);
  REQUIRE_THROWS_WITH(read_trees(path), Contains(path + ":3:11: label must be 0..4"));
}

TEST_CASE("read_trees names a missing file", "[trees][files][errors]") {
  TempDir dir;
  const std::string missing = dir.path() + "/no-such-file.txt";
  REQUIRE_THROWS_AS(read_trees(missing), sheaf::UserError);
  REQUIRE_THROWS_WITH(read_trees(missing), Contains(missing));
  REQUIRE_THROWS_WITH(read_trees(dir.path()), Contains(dir.path()));
}

TEST_CASE("Vocab keeps words seen min_count times, others are <unk>", "[trees][vocab]") {
  std::vector<Tree> trees = {parse_tree("(2 (2 the) (2 (2 the) (3 film)))"), parse_tree("(2 (2 the) (1 dull))"),
                             parse_tree("(2 (2 a) (3 film))")};

  SECTION("min_count 1 keeps every word, most frequent first") {
    const Vocab v = Vocab::build(trees);
    REQUIRE(v.size() == 5);  // <unk> the film a dull
    CHECK(v.word(0) == "<unk>");
    CHECK(v.id("the") == 1);
    CHECK(v.id("film") == 2);
    CHECK(v.id("a") == 3);  // ties in count are alphabetical
    CHECK(v.id("dull") == 4);
    CHECK(v.word(v.id("dull")) == "dull");
    CHECK_THROWS_AS(v.word(5), std::out_of_range);
  }
  SECTION("min_count 2 maps rare words to <unk>") {
    const Vocab v = Vocab::build(trees, 2);
    REQUIRE(v.size() == 3);  // <unk> the film
    CHECK(v.id("a") == 0);
    CHECK(v.id("dull") == 0);
    CHECK(v.id("never seen") == 0);
    CHECK(v.id("<unk>") == 0);

    v.assign_ids(trees);
    CHECK(trees[0].word == std::vector<int32_t>{1, 1, 2, -1, -1});
    CHECK(trees[1].word == std::vector<int32_t>{1, 0, -1});
  }
  SECTION("a tree whose tokens do not match its leaves is refused") {
    Tree t = trees[0];
    t.tokens.pop_back();
    CHECK_THROWS_AS(Vocab::build(trees).assign_ids(t), sheaf::UserError);
  }
  SECTION("a default Vocab knows only <unk>") {
    const Vocab v;
    CHECK(v.size() == 1);
    CHECK(v.id("the") == 0);
  }
}

TEST_CASE("load_treebank builds the vocabulary from train only", "[trees][files][vocab]") {
  TempDir dir;
  dir.write("train.txt", "(3 (2 a) (3 good))\n(1 (2 a) (1 bad))\n");
  dir.write("dev.txt", "(3 (2 a) (4 great))\n");
  dir.write("test.txt", "(1 bad)\n");
  Vocab vocab;
  const Treebank bank = load_treebank(dir.path(), 1, vocab);
  REQUIRE(bank.train.size() == 2);
  REQUIRE(bank.dev.size() == 1);
  REQUIRE(bank.test.size() == 1);
  CHECK(vocab.size() == 4);  // <unk> a bad good
  CHECK(bank.dev[0].word == std::vector<int32_t>{vocab.id("a"), 0, -1});
  CHECK(bank.test[0].word == std::vector<int32_t>{vocab.id("bad")});

  fs::remove(dir.path() + "/test.txt");
  REQUIRE_THROWS_WITH(load_treebank(dir.path(), 1, vocab), Contains("test.txt"));
}

TEST_CASE("synthetic_trees is deterministic per seed", "[trees][synthetic]") {
  const auto same = [](const std::vector<Tree>& a, const std::vector<Tree>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].left != b[i].left || a[i].right != b[i].right || a[i].word != b[i].word ||
          a[i].label != b[i].label || a[i].tokens != b[i].tokens)
        return false;
    return true;
  };
  const auto first = synthetic_trees({.count = 50, .seed = 7});
  CHECK(same(first, synthetic_trees({.count = 50, .seed = 7})));
  CHECK_FALSE(same(first, synthetic_trees({.count = 50, .seed = 8})));
}

TEST_CASE("synthetic_trees are binary, SST-sized and consistently labelled", "[trees][synthetic]") {
  const SyntheticOptions options{.count = 2000, .vocab_size = 300, .seed = 3};
  const std::vector<Tree> trees = synthetic_trees(options);
  REQUIRE(trees.size() == 2000);
  const Vocab vocab = synthetic_vocab(options.vocab_size);
  REQUIRE(vocab.size() == 300);

  for (const Tree& t : trees) {
    REQUIRE(t.num_words() >= options.min_words);
    REQUIRE(t.num_words() <= options.max_words);
    require_binary_post_order(t);
    Tree renumbered = t;
    vocab.assign_ids(renumbered);
    REQUIRE(renumbered.word == t.word);  // tokens "w<id>" agree with synthetic_vocab
    for (int n = 0; n < t.size(); ++n) {
      REQUIRE(t.label[n] >= 0);
      REQUIRE(t.label[n] <= 4);
      if (t.is_leaf(n)) {
        REQUIRE(t.word[n] >= 1);
        REQUIRE(t.word[n] < options.vocab_size);
      } else {
        REQUIRE(t.word[n] == -1);
        // The rounded mean of the children: within half a class of it.
        const int twice_mean = t.label[t.left[n]] + t.label[t.right[n]];
        REQUIRE(std::abs(2 * t.label[n] - twice_mean) <= 1);
      }
    }
  }
  const TreeStats s = stats_of(trees);
  CHECK(s.mean_words >= 12);
  CHECK(s.mean_words <= 26);
  CHECK(s.mean_height >= 6);
  CHECK(s.mean_height <= 14);
}

TEST_CASE("synthetic_trees honours custom length bounds", "[trees][synthetic]") {
  for (const auto& [lo, hi] : {std::pair{1, 1}, std::pair{5, 9}, std::pair{40, 60}}) {
    const auto trees = synthetic_trees({.count = 300, .min_words = lo, .max_words = hi, .seed = 11});
    const TreeStats s = stats_of(trees);
    CHECK(s.max_words <= hi);
    for (const Tree& t : trees) REQUIRE(t.num_words() >= lo);
  }
  CHECK_THROWS_AS(synthetic_trees({.min_words = 10, .max_words = 5}), sheaf::UserError);
  CHECK_THROWS_AS(synthetic_trees({.vocab_size = 1}), sheaf::UserError);
}

TEST_CASE("stats_of summarises words and heights", "[trees]") {
  const std::vector<Tree> trees = {parse_tree("(2 (2 a) (2 (2 b) (2 c)))"), parse_tree("(2 d)")};
  const TreeStats s = stats_of(trees);
  CHECK(s.trees == 2);
  CHECK(s.mean_words == Approx(2.0));
  CHECK(s.max_words == 3);
  CHECK(s.mean_height == Approx(1.0));
  CHECK(s.max_height == 2);
  CHECK(stats_of({}).trees == 0);
}

// Runs only where the Stanford Sentiment Treebank is present (SHEAF_SST_DIR, or
// the shared data folder): every line must parse, with SST's known sizes.
TEST_CASE("the real SST files parse completely when present", "[trees][sst]") {
  const char* env = std::getenv("SHEAF_SST_DIR");
  const std::string dir = env ? env : "/work/shared/data/sst";
  if (!fs::exists(dir + "/train.txt")) return;
  Vocab vocab;
  const Treebank bank = load_treebank(dir, 1, vocab);
  CHECK(bank.train.size() == 8544);
  CHECK(bank.dev.size() == 1101);
  CHECK(bank.test.size() == 2210);
  CHECK(stats_of(bank.train).mean_words == Approx(19.1).margin(0.1));
  for (const Tree& t : bank.train) require_binary_post_order(t);
}
