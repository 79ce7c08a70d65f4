// attention: a sequence-to-sequence model with dot-product attention, written
// for ONE example (Seq2Seq in model.cpp), trained with teacher forcing on
// batches that Sheaf runs in batched launches, and decoded greedily with one
// co_await per step (each example stops at its own end token).
//
// The task is generated: reverse (or, with --task sort, sort) a string of
// 3-20 digits. Exact match on held-out strings is reported after every epoch.
//
//   ./build/examples/attention                         # reverse, 6 epochs
//   ./build/examples/attention --task sort --max-length 12 --save sort.pt
//   ./build/examples/attention --load sort.pt --task sort --epochs 0
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <random>

#include <attention/model.h>
#include <common/cli.h>
#include <common/parameter_file.h>
#include <common/train_loop.h>
#include <data/digits.h>
#include <sheaf/sheaf.h>

using namespace sheaf;
using data::DigitPair;
using models::Seq2Seq;
using Clock = std::chrono::steady_clock;
using Batch = std::vector<const DigitPair*>;

namespace {

struct Config {
  std::string task = "reverse", save, load, strategy = "auto";
  int min_length = 3, max_length = 20, train_pairs = 20000, dev_pairs = 500;
  int64_t embed = 32, hidden = 64;
  int epochs = 6, batch = 64, threads = 1, parts = 2;
  double lr = 0.003;
  uint64_t seed = 1;
  bool quiet = false, prefetch = true, step_by_step = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Exact match of greedy decoding, batched with Sheaf: each batch as the
// Overlap's parts, of about equal lengths, one a thread, whose rounds take
// turns at the kernels (one part's host work while another's kernels run).
// With `answers`, each pair's decoded answer too.
double exact_match(Overlap& overlap, const Strategy& s, const Seq2Seq& m, const std::vector<DigitPair>& pairs,
                   std::vector<std::vector<int64_t>>* answers = nullptr) {
  constexpr size_t kEvalBatch = 256;
  c10::NoGradGuard no_grad;
  size_t correct = 0;
  for (size_t start = 0; start < pairs.size(); start += kEvalBatch) {
    Batch batch;
    for (size_t i = start; i < std::min(pairs.size(), start + kEvalBatch); ++i) batch.push_back(&pairs[i]);
    // (A source's length is its answer's: the steps it decodes.)
    const Parts parts = balanced_parts(batch.size(), overlap.parts(),
                                       [&](size_t i) { return static_cast<double>(batch[i]->source.size()); });
    const std::vector<Batch> mine = deal(batch, parts);
    std::vector<std::vector<std::vector<int64_t>>> decoded(overlap.parts());
    overlap.run(
        [&](Graph& g, size_t p) {
          decoded[p] = m.sheaf_decode(g, mine[p], &s);
          return std::vector<Expr>{};
        },
        {.strategy = &s});
    const std::vector<std::vector<int64_t>> out = in_item_order(parts, std::move(decoded));
    if (answers) answers->insert(answers->end(), out.begin(), out.end());
    for (size_t k = 0; k < batch.size(); ++k)
      correct += std::equal(out[k].begin(), out[k].end(), batch[k]->target.begin(), batch[k]->target.end() - 1) &&
                 out[k].size() + 1 == batch[k]->target.size();
  }
  return static_cast<double>(correct) / static_cast<double>(std::max<size_t>(pairs.size(), 1));
}

// Batch i+1 is recorded and scheduled on a worker thread while batch i runs
// forward, backward and the update (sheaf::Prefetcher), unless --no-prefetch.
void train_epoch(const Config& c, int epoch, Graph& g, const Strategy& s, const Seq2Seq& m,
                 torch::optim::Optimizer& opt, const std::vector<DigitPair>& train, std::mt19937_64& rng) {
  double tokens = 0;
  for (const DigitPair& p : train) tokens += static_cast<double>(p.target.size());
  const models::EpochResult r = models::train_epoch<DigitPair>(
      {.number = epoch, .batch = static_cast<size_t>(c.batch), .unit = "pairs", .progress = !c.quiet,
       .prefetch = c.prefetch, .strategy = &s},
      train, rng, g, opt, [&](Graph& pg, const Batch& batch) { return m.sheaf_batch_loss(pg, batch); });
  std::printf("epoch %d: loss %.4f per token, %.0f pairs/s (%.1f s), %.0f launches per batch\n", epoch,
              r.loss / tokens, static_cast<double>(train.size()) / r.seconds, r.seconds, r.launches_per_batch);
}

int run(const Config& c) {
  set_threads(c.threads);
  retain_host_memory();  // freed memory stays in the process: no page faults to get it back each batch
  const Strategy& strategy = strategy_named(c.strategy);  // fail on a bad name before anything else
  if (!c.save.empty()) models::expect_writable(c.save, "--save");
  if (!c.quiet) std::printf("%s\n", runtime_info().c_str());
  const data::DigitTask task = c.task == "sort" ? data::DigitTask::kSort : data::DigitTask::kReverse;
  const std::vector<DigitPair> train = data::synthetic_digits(
      {.count = c.train_pairs, .min_length = c.min_length, .max_length = c.max_length, .task = task, .seed = c.seed});
  const std::vector<DigitPair> dev = data::synthetic_digits(
      {.count = c.dev_pairs, .min_length = c.min_length, .max_length = c.max_length, .task = task, .seed = c.seed + 1000});
  if (!c.quiet)
    std::printf("data: %s digit strings of length %d-%d; %zu training pairs, %zu held out\n", c.task.c_str(),
                c.min_length, c.max_length, train.size(), dev.size());
  Seq2Seq model({.embed = c.embed, .hidden = c.hidden, .sequence_op = !c.step_by_step}, c.seed);
  if (!c.load.empty()) model.load(c.load);
  torch::optim::Adam opt(model.parameters(), torch::optim::AdamOptions(c.lr));
  std::mt19937_64 rng(c.seed);
  Graph g;
  Overlap decoder({}, static_cast<size_t>(c.parts));
  const auto t0 = Clock::now();
  std::printf("%s: exact match %.1f%%\n", c.load.empty() ? "untrained" : "loaded",
              100 * exact_match(decoder, strategy, model, dev));
  for (int epoch = 1; epoch <= c.epochs; ++epoch) {
    train_epoch(c, epoch, g, strategy, model, opt, train, rng);
    const auto d0 = Clock::now();
    const double em = exact_match(decoder, strategy, model, dev);
    std::printf("  exact match %.1f%% (greedy decoding: %.0f pairs/s; %.0f s since the start)\n", 100 * em,
                static_cast<double>(dev.size()) / seconds_since(d0), seconds_since(t0));
    std::fflush(stdout);
  }
  if (c.parts > 1 && !c.quiet) {
    Overlap one({}, 1);
    std::vector<std::vector<int64_t>> in_parts_answers, alone_answers;
    auto pairs_per_sec = [&](Overlap& o, std::vector<std::vector<int64_t>>& answers) {
      (void)exact_match(o, strategy, model, dev);  // warm: both timed on their second pass
      const auto d0 = Clock::now();
      (void)exact_match(o, strategy, model, dev, &answers);
      return static_cast<double>(dev.size()) / seconds_since(d0);
    };
    const double in_parts = pairs_per_sec(decoder, in_parts_answers), alone = pairs_per_sec(one, alone_answers);
    std::printf("greedy decoding in %d parts (sheaf::Overlap) against one graph: %.0f against %.0f pairs/s\n", c.parts,
                in_parts, alone);
    // The same answers, pair by pair (up to an argmax that float rounding of
    // other batch shapes tips: one pair in a hundred is far beyond that).
    size_t differ = 0;
    for (size_t i = 0; i < dev.size(); ++i) differ += in_parts_answers[i] != alone_answers[i];
    if (differ > std::max<size_t>(1, dev.size() / 100))
      std::printf("  PARTS DIFFER: %zu of %zu pairs decoded otherwise than by one graph\n", differ, dev.size());
  }
  if (!c.save.empty()) {
    model.save(c.save);
    std::printf("saved parameters to %s\n", c.save.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"attention: a seq2seq model with dot-product attention written per example, trained batched with Sheaf"};
  app.add_option("--task", c.task, "reverse or sort the digit string")->check(CLI::IsMember({"reverse", "sort"}));
  app.add_option("--min-length", c.min_length, "shortest source string")->check(sheaf::models::kPositiveNumber);
  app.add_option("--max-length", c.max_length, "longest source string")->check(sheaf::models::kPositiveNumber);
  app.add_option("--train-pairs", c.train_pairs, "training pairs")->check(sheaf::models::kPositiveNumber);
  app.add_option("--dev-pairs", c.dev_pairs, "held-out pairs for exact match")->check(sheaf::models::kPositiveNumber);
  app.add_option("--embed", c.embed, "token embedding size")->check(sheaf::models::kPositiveNumber);
  app.add_option("--hidden", c.hidden, "decoder size (even: the encoder has half per direction)")
      ->check(sheaf::models::kPositiveNumber);
  app.add_option("--epochs", c.epochs, "training epochs (0: only evaluate)")->check(sheaf::models::kNonNegativeNumber);
  app.add_option("--batch", c.batch, "pairs per batch")->check(sheaf::models::kPositiveNumber);
  app.add_option("--lr", c.lr, "Adam learning rate")->check(sheaf::models::kPositiveNumber);
  app.add_option("--threads", c.threads, models::kThreadsHelp)->check(sheaf::models::kPositiveNumber);
  app.add_option("--strategy", c.strategy, "Sheaf scheduling strategy");
  app.add_option("--save", c.save, "write the parameters here after training");
  app.add_option("--load", c.load, "start from these parameters (with --epochs 0: just evaluate)");
  app.add_option("--seed", c.seed, "seed for data, initialisation and shuffling")->check(sheaf::models::kSeed);
  // The sequence form is the default: on the CPU its LSTMs run a fused cell (ops/lstm_cell.h).
  app.add_flag("--step-by-step,!--sequence-op", c.step_by_step,
               "the encoder and the teacher-forced decoder a cell a step (autobatched) instead of dsl::lstm");
  app.add_option("--parts", c.parts,
                 "decode each held-out batch as this many parts, one a thread, whose kernels take turns "
                 "(sheaf::Overlap: one part's host work while another's kernels run; it needs a core a part); 1: one graph")
      ->check(sheaf::models::kPositiveNumber);
  app.add_flag("--quiet", c.quiet, "no progress bar, runtime or data summary");
  app.add_flag("!--no-prefetch", c.prefetch, "record each batch on the training thread (default: the next batch "
                                             "is recorded on a worker thread while one trains)");
  if (const int status = models::parse_cli(app, argc, argv, "attention"); status >= 0) return status;
  if (c.max_length < c.min_length) {
    std::fprintf(stderr, "attention: --max-length must be at least --min-length (see --help)\n");
    return 1;
  }
  return models::run_cli("attention", [&] { return run(c); });
}
