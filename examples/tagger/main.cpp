// tagger: a BiLSTM part-of-speech / NER tagger written for ONE sentence
// (Tagger::sheaf_loss in model.cpp), trained on batches that Sheaf runs in
// batched launches. --chars spells rare words with a character BiLSTM.
//
//   ./build/examples/tagger                                    # synthetic sentences
//   ./build/examples/tagger --chars --epochs 2 --save tagger.pt
//   ./build/examples/tagger --train train.txt --dev dev.txt          # word|TAG lines (DyNet)
//   ./build/examples/tagger --train en-ud-train.conllu --dev en-ud-dev.conllu --format conllu
//   ./build/examples/tagger --train eng.train --dev eng.testa --format conll --word-column 0 --tag-column 3
//
// The vocabulary comes from --train, so --load needs the same --train (and
// --chars) as the run that saved: another file is a clear error (the file
// keeps a hash of the vocabulary it was trained with).
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adagrad.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>

#include <common/cli.h>
#include <common/parameter_file.h>
#include <common/train_loop.h>
#include <data/tagging.h>
#include <sheaf/sheaf.h>
#include <tagger/model.h>

using namespace sheaf;
using data::Sentence;
using models::Tagger;
using Clock = std::chrono::steady_clock;
using Batch = std::vector<const Sentence*>;

namespace {

struct Config {
  std::string train, dev, test, format = "dynet", save, load, strategy = "auto";
  int word_column = -1, tag_column = -1, rare_count = 1;
  int64_t embed = 128, hidden = 128, mlp = 32, char_embed = 64;
  int epochs = 3, batch = 32, train_sentences = 0, threads = 1;
  double lr = 0.1;
  uint64_t seed = 1;
  bool chars = false, quiet = false, prefetch = true, step_by_step = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<data::TaggedSentence> read_split(const Config& c, const std::string& path) {
  if (c.format == "dynet") return data::read_tagged(path);
  data::ConllColumns columns =
      c.format == "conllu" ? data::ConllColumns{1, 3, true} : data::ConllColumns{0, 3, /*conllu=*/false};
  if (c.word_column >= 0) columns.word = c.word_column;
  if (c.tag_column >= 0) columns.tag = c.tag_column;
  return data::read_conll(path, columns);
}

struct Dataset {
  data::TaggingVocab vocab;
  std::vector<Sentence> train, dev, test;
};

Dataset load_data(const Config& c) {
  std::vector<data::TaggedSentence> train, dev, test;
  // (They were read by nothing: a word|TAG line has no columns, nor has synthetic data.)
  if ((c.format == "dynet" || c.train.empty()) && (c.word_column >= 0 || c.tag_column >= 0))
    throw UserError("--word-column and --tag-column are for --train files of --format conll or conllu");
  if (c.train.empty()) {
    // (Before, they were ignored: the run trained and scored synthetic data.)
    if (!c.dev.empty() || !c.test.empty())
      throw UserError("--dev and --test need --train (the vocabulary comes from it)");
    const int n = c.train_sentences > 0 ? c.train_sentences : 3000;
    train = data::synthetic_tagged({.count = n, .seed = 1});
    dev = data::synthetic_tagged({.count = 500, .seed = 2});
  } else {
    if (c.dev.empty()) throw UserError("--train needs --dev");
    train = read_split(c, c.train);
    dev = read_split(c, c.dev);
    if (!c.test.empty()) test = read_split(c, c.test);
  }
  if (c.train_sentences > 0 && train.size() > static_cast<size_t>(c.train_sentences))
    train.resize(static_cast<size_t>(c.train_sentences));
  if (train.empty()) throw UserError("no training sentences in '" + c.train + "'");
  if (dev.empty()) throw UserError("no dev sentences in '" + c.dev + "'");
  Dataset d{data::TaggingVocab::build(train, c.rare_count), {}, {}, {}};
  // (A tag of dev or test missing from train: the error names the file.)
  auto encode = [&](const std::vector<data::TaggedSentence>& s, const std::string& file) {
    try {
      return d.vocab.encode(s);
    } catch (const UserError& e) {
      throw UserError((file.empty() ? std::string("synthetic data") : "'" + file + "'") + ": " + e.what());
    }
  };
  d.train = encode(train, c.train);
  d.dev = encode(dev, c.dev);
  d.test = encode(test, c.test);
  return d;
}

void print_stats(const char* split, const std::vector<Sentence>& s) {
  if (s.empty()) return;
  const data::TaggingStats st = data::stats_of(s);
  std::printf("  %-5s %6zu sentences, %7zu tokens, %.1f words (max %d), %.1f%% rare tokens\n", split, st.sentences,
              st.tokens, st.mean_words, st.max_words, 100.0 * static_cast<double>(st.rare_tokens) / static_cast<double>(st.tokens));
}

// Token accuracy, batched with Sheaf (no losses recorded: nothing to train).
double accuracy(Graph& g, const Strategy& s, const Tagger& m, const std::vector<Sentence>& sentences) {
  constexpr size_t kEvalBatch = 256;
  c10::NoGradGuard no_grad;
  size_t correct = 0, tokens = 0;
  for (size_t start = 0; start < sentences.size(); start += kEvalBatch) {
    Batch batch;
    for (size_t i = start; i < std::min(sentences.size(), start + kEvalBatch); ++i) batch.push_back(&sentences[i]);
    const std::vector<std::vector<int64_t>> predicted = m.predict(g, batch, &s);
    for (size_t k = 0; k < batch.size(); ++k) {
      tokens += predicted[k].size();
      for (size_t t = 0; t < predicted[k].size(); ++t) correct += predicted[k][t] == batch[k]->tag[t];
    }
  }
  return static_cast<double>(correct) / static_cast<double>(std::max<size_t>(tokens, 1));
}

// Batch i+1 is recorded and scheduled on a worker thread while batch i runs
// forward, backward and the update (sheaf::Prefetcher), unless --no-prefetch.
void train_epoch(const Config& c, int epoch, Graph& g, const Strategy& s, const Tagger& m,
                 torch::optim::Optimizer& opt, const std::vector<Sentence>& train, std::mt19937_64& rng) {
  double tokens = 0;
  for (const Sentence& x : train) tokens += static_cast<double>(x.size());
  const models::EpochResult r = models::train_epoch<Sentence>(
      {.number = epoch, .batch = static_cast<size_t>(c.batch), .unit = "sentences", .progress = !c.quiet,
       .prefetch = c.prefetch, .strategy = &s},
      train, rng, g, opt, [&](Graph& pg, const Batch& batch) { return m.sheaf_batch_loss(pg, batch); });
  std::printf("epoch %d: loss %.4f per token, %.0f sentences/s, %.0f tokens/s (%.1f s), %.0f launches per batch\n",
              epoch, r.loss / tokens, static_cast<double>(train.size()) / r.seconds, tokens / r.seconds, r.seconds,
              r.launches_per_batch);
}

int run(const Config& c) {
  set_threads(c.threads);
  retain_host_memory();  // freed memory stays in the process: no page faults to get it back each batch
  const Strategy& strategy = strategy_named(c.strategy);  // fail on a bad name before loading anything
  if (!c.save.empty()) models::expect_writable(c.save, "--save");
  if (!c.quiet) std::printf("%s\n", runtime_info().c_str());
  const Dataset d = load_data(c);
  if (!c.quiet) {
    std::printf("data: %s; %zu words, %zu characters, %zu tags; rare: seen at most %d time(s) in train%s\n",
                c.train.empty() ? "synthetic" : c.train.c_str(), d.vocab.words.size(), d.vocab.chars.size(),
                d.vocab.tags.size(), c.rare_count, c.chars ? " (spelled by the char BiLSTM)" : "");
    print_stats("train", d.train);
    print_stats("dev", d.dev);
    print_stats("test", d.test);
  }
  Tagger model({.words = static_cast<int64_t>(d.vocab.words.size()), .chars = static_cast<int64_t>(d.vocab.chars.size()),
                .tags = static_cast<int64_t>(d.vocab.tags.size()), .embed = c.embed, .hidden = c.hidden, .mlp = c.mlp,
                .char_embed = c.char_embed, .use_chars = c.chars, .sequence_op = !c.step_by_step},
               c.seed);
  if (!c.load.empty()) model.load(c.load, d.vocab);
  torch::optim::Adagrad opt(model.parameters(), torch::optim::AdagradOptions(c.lr));
  std::mt19937_64 rng(c.seed);
  Graph g;
  std::printf("%s: dev accuracy %.1f%%\n", c.load.empty() ? "untrained" : "loaded", 100 * accuracy(g, strategy, model, d.dev));
  for (int epoch = 1; epoch <= c.epochs; ++epoch) {
    train_epoch(c, epoch, g, strategy, model, opt, d.train, rng);
    std::printf("  dev accuracy %.1f%%\n", 100 * accuracy(g, strategy, model, d.dev));
    std::fflush(stdout);
  }
  if (!d.test.empty()) std::printf("test accuracy %.1f%%\n", 100 * accuracy(g, strategy, model, d.test));
  if (!c.save.empty()) {
    model.save(c.save, d.vocab);
    std::printf("saved parameters to %s\n", c.save.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"tagger: a BiLSTM tagger written per sentence, trained batched with Sheaf"};
  app.add_option("--train", c.train, "training file (default: synthetic sentences)");
  app.add_option("--dev", c.dev, "dev file (needed with --train)");
  app.add_option("--test", c.test, "test file, evaluated once after training");
  app.add_option("--format", c.format, "dynet (word|TAG lines), conllu (FORM, UPOS) or conll (CoNLL-2003: word, NER)")
      ->check(CLI::IsMember({"dynet", "conllu", "conll"}));
  app.add_option("--word-column", c.word_column, "CoNLL column of the word, 0-based (overrides --format's)")
      ->check(sheaf::models::kNonNegativeNumber);
  app.add_option("--tag-column", c.tag_column, "CoNLL column of the tag, 0-based (overrides --format's)")
      ->check(sheaf::models::kNonNegativeNumber);
  app.add_flag("--chars", c.chars, "spell rare words with a character BiLSTM (DyNet's bilstm-tagger-withchar)");
  // The sequence form is the default: on the CPU its LSTMs run a fused cell
  // (ops/lstm_cell.h), faster than hand-batched code where step by step is not
  // (docs/benchmarks.md).
  app.add_flag("--step-by-step,!--sequence-op", c.step_by_step,
               "each LSTM as a cell a token (autobatched step by step) instead of one dsl::lstm over the sentence");
  app.add_option("--rare-count", c.rare_count, "a word seen at most this often in train is rare")
      ->check(sheaf::models::kNonNegativeNumber);
  app.add_option("--embed", c.embed, "word embedding size (even with --chars)")->check(sheaf::models::kPositiveNumber);
  app.add_option("--hidden", c.hidden, "LSTM size per direction")->check(sheaf::models::kPositiveNumber);
  app.add_option("--mlp", c.mlp, "MLP size")->check(sheaf::models::kPositiveNumber);
  app.add_option("--char-embed", c.char_embed, "character embedding size")->check(sheaf::models::kPositiveNumber);
  app.add_option("--epochs", c.epochs, "training epochs (0: only evaluate)")->check(sheaf::models::kNonNegativeNumber);
  app.add_option("--batch", c.batch, "sentences per batch")->check(sheaf::models::kPositiveNumber);
  app.add_option("--lr", c.lr, "Adagrad learning rate")->check(sheaf::models::kPositiveNumber);
  app.add_option("--train-sentences", c.train_sentences, "use at most N training sentences (synthetic default: 3000)")
      ->check(sheaf::models::kPositiveNumber);
  app.add_option("--threads", c.threads, models::kThreadsHelp)->check(sheaf::models::kPositiveNumber);
  app.add_option("--strategy", c.strategy, "Sheaf scheduling strategy");
  app.add_option("--save", c.save, "write the parameters here after training");
  app.add_option("--load", c.load, "start from these parameters (with --epochs 0: just evaluate)");
  app.add_option("--seed", c.seed, "seed for initialisation and shuffling")->check(sheaf::models::kSeed);
  app.add_flag("--quiet", c.quiet, "no progress bar, runtime or data summary");
  app.add_flag("!--no-prefetch", c.prefetch, "record each batch on the training thread (default: the next batch "
                                             "is recorded on a worker thread while one trains)");
  if (const int status = models::parse_cli(app, argc, argv, "tagger"); status >= 0) return status;
  return models::run_cli("tagger", [&] { return run(c); });
}
