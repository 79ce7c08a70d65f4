// tree_lstm: the main demo. A binary TreeLSTM (Tai et al. 2015) for sentiment
// trees, written for ONE tree (TreeLSTM::sheaf_loss in model.cpp), trained on
// batches of trees that Sheaf runs in batched launches. At the end the same
// training step is timed per example, hand-batched and with Sheaf.
//
//   ./build/examples/tree_lstm                                  # synthetic trees, ~10 s
//   ./build/examples/tree_lstm --data data/sst --epochs 5 --save tree_lstm.pt
//   ./build/examples/tree_lstm --data data/sst --load tree_lstm.pt --epochs 0
//   scripts/launch.sh 2 -- ./build/examples/tree_lstm --data data/sst  # 2 data-parallel workers
//
// Data-parallel: with WORLD_SIZE > 1 in the environment (scripts/launch.sh or
// torchrun set it), each worker takes its share of every batch (balanced by
// node count) and sheaf::DataParallel sums the gradients; rank 0 alone prints,
// evaluates and saves. --checkpoint/--resume work with any number of workers.
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>

#include <common/cli.h>
#include <common/parameter_file.h>
#include <common/progress.h>
#include <common/train_loop.h>
#include <data/trees.h>
#include <sheaf/sheaf.h>
#include <baselines/tree_lstm_hand.h>
#include <tree_lstm/model.h>

using namespace sheaf;
using data::Tree;
using models::Progress;
using models::TreeLSTM;
using Clock = std::chrono::steady_clock;
using Batch = std::vector<const Tree*>;

namespace {

struct Config {
  std::string data, save, load, checkpoint, resume, optimizer = "adagrad", strategy = "auto", device = "cpu";
  int64_t hidden = 150;
  int epochs = 3, batch = 25, train_trees = 0, compare_batches = 5;
  // One, not hardware_concurrency(): a TreeLSTM's ops are small, and a second
  // thread gained Sheaf ~10% on two cores (set_threads; docs/benchmarks.md,
  // "Threads"), where threads that wait by spinning lose the most as soon as
  // another process takes a core.
  int threads = 1;
  double lr = 0.05;
  uint64_t seed = 1;
  bool root_only = false, quiet = false;
  bool prefetch = true;  // record batch i+1 on a worker thread while batch i trains
  // Data-parallel workers (only with WORLD_SIZE > 1).
  double dist_timeout = 120, bucket_mb = 4;
  bool dp_overlap = true;
  std::string dp_sparse = "gather";
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Dataset {
  std::vector<Tree> train, dev, test;
  int64_t vocab = 0;
};

Dataset load_data(const Config& c) {
  Dataset d;
  if (!c.data.empty()) {
    if (!std::filesystem::is_directory(c.data)) throw UserError("--data: '" + c.data + "' is not a directory");
    data::Vocab vocab;
    data::Treebank bank = data::load_treebank(c.data, 1, vocab);
    d = {std::move(bank.train), std::move(bank.dev), std::move(bank.test), static_cast<int64_t>(vocab.size())};
  } else {
    // Different seeds, so dev holds unseen sentences; word polarities depend on
    // the word only, so what is learnt on train carries over.
    constexpr int kVocab = 5000;
    d.train = data::synthetic_trees({.count = c.train_trees > 0 ? c.train_trees : 2000, .vocab_size = kVocab, .seed = 1});
    d.dev = data::synthetic_trees({.count = 500, .vocab_size = kVocab, .seed = 2});
    d.vocab = static_cast<int64_t>(data::synthetic_vocab(kVocab).size());
  }
  if (c.train_trees > 0 && d.train.size() > static_cast<size_t>(c.train_trees)) d.train.resize(static_cast<size_t>(c.train_trees));
  if (d.train.empty() || d.dev.empty()) throw UserError("no training or no dev trees in '" + c.data + "'");
  return d;
}

void print_stats(const char* split, const std::vector<Tree>& trees) {
  const data::TreeStats s = data::stats_of(trees);
  std::printf("  %-5s %6zu trees, %.1f words (max %d), height %.1f (max %d)\n", split, s.trees, s.mean_words, s.max_words,
              s.mean_height, s.max_height);
}

// The Sheaf side of a batch: each tree's own program, recorded under its example id.
Expr record(Graph& g, const TreeLSTM& m, const Batch& batch) {
  g.clear();
  return m.sheaf_batch_loss(g, batch);
}

// Fine-grained root accuracy, batched with Sheaf (inference batches can be large).
double root_accuracy(Graph& g, const Strategy& s, const TreeLSTM& m, const std::vector<Tree>& trees) {
  constexpr size_t kEvalBatch = 250;
  c10::NoGradGuard no_grad;
  g.set_train(false);
  size_t correct = 0;
  for (size_t start = 0; start < trees.size(); start += kEvalBatch) {
    Batch batch;
    for (size_t i = start; i < std::min(trees.size(), start + kEvalBatch); ++i) batch.push_back(&trees[i]);
    g.clear();
    const std::vector<Expr> roots = m.sheaf_batch_root_logits(g, batch);  // no losses: nothing to train
    g.forward(roots, {.strategy = &s});
    std::vector<at::Tensor> logits;
    for (const Expr& r : roots) logits.push_back(r.value());
    const at::Tensor predicted = at::stack(logits).argmax(1).cpu();
    const auto p = predicted.accessor<int64_t, 1>();
    for (size_t i = 0; i < batch.size(); ++i) correct += p[static_cast<int64_t>(i)] == batch[i]->label.back();
  }
  g.set_train(true);
  return static_cast<double>(correct) / static_cast<double>(trees.size());
}

// Predicting train's most frequent root label: the rate to beat (roots are skewed).
std::pair<int, double> majority_class(const std::vector<Tree>& train, const std::vector<Tree>& dev) {
  std::array<size_t, TreeLSTM::kClasses> count{};
  for (const Tree& t : train) ++count[static_cast<size_t>(t.label.back())];
  const int best = static_cast<int>(std::max_element(count.begin(), count.end()) - count.begin());
  const auto hits = std::count_if(dev.begin(), dev.end(), [&](const Tree& t) { return t.label.back() == best; });
  return {best, static_cast<double>(hits) / static_cast<double>(dev.size())};
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c, const TreeLSTM& m) {
  if (c.optimizer == "adam") return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(c.lr));
  return std::make_unique<torch::optim::Adagrad>(m.parameters(), torch::optim::AdagradOptions(c.lr));
}

// Batch i+1 is recorded and scheduled on a worker thread while batch i runs
// forward, backward and the update (sheaf::Prefetcher), unless --no-prefetch.
// With several workers, each records its share of every batch (balanced by
// node count; the same split on every rank) and DataParallel sums gradients.
// Each epoch's order depends on the seed and the epoch only, so that --resume
// continues the same sequence with any number of workers.
void train_epoch(const Config& c, int epoch, Graph& g, const Strategy& s, const TreeLSTM& m,
                 torch::optim::Optimizer& opt, const std::vector<Tree>& train, DataParallel& dp) {
  std::mt19937_64 rng(c.seed * 1000003 + static_cast<uint64_t>(epoch));
  std::vector<Batch> batches = models::shuffled_batches(train, static_cast<size_t>(c.batch), rng);
  std::vector<size_t> sizes;
  for (Batch& b : batches) {
    sizes.push_back(b.size());
    if (dp.world_size() == 1) continue;
    std::vector<double> work;
    for (const Tree* t : b) work.push_back(t->size());
    Batch mine;
    for (size_t i : dp.shard(work)) mine.push_back(b[i]);
    b = std::move(mine);
  }
  double nodes = 0;
  for (const Tree& t : train) nodes += m.options().all_nodes ? t.size() : 1;
  double loss = 0, launches = 0, trace = 0, schedule = 0, execute = 0, backward = 0;
  size_t done = 0;
  Progress progress(!c.quiet, epoch, train.size(), "trees");
  dp.reset_stats();
  const auto t0 = Clock::now();
  models::train_pass(
      {.batches = batches.size(),
       .record = [&](Graph& pg, size_t b) { return batches[b].empty() ? pg.zeros({}) : m.sheaf_batch_loss(pg, batches[b]); },
       .size = [&](size_t b) { return sizes[b]; },
       .backward = [&](const at::Tensor& l) { dp.backward(l); },
       .prefetch = c.prefetch,
       .graph = {.device = c10::Device(c.device)},
       .strategy = &s,
       .after =
           [&](size_t b, const Expr& total, const Graph& graph, double backward_ms) {
             backward += backward_ms;
             loss += total.item();
             const Stats& st = graph.stats();
             launches += static_cast<double>(st.batches);
             trace += st.trace_ms, schedule += st.schedule_ms, execute += st.execute_ms;
             progress.update(done += sizes[b]);
           }},
      g, opt);
  const double seconds = seconds_since(t0), n = static_cast<double>(batches.size());
  progress.finish();
  loss = dp.sum({loss})[0];  // every rank's share
  if (!dp.is_root()) return;
  std::printf("epoch %d: loss %.4f per labelled node, %.0f trees/s (%.1f s)\n", epoch, loss / nodes,
              static_cast<double>(train.size()) / seconds, seconds);
  std::printf("  sheaf per batch: %.0f launches; trace %.2f ms, schedule %.2f ms%s, execute %.2f ms; "
              "backward+update %.2f ms\n",
              launches / n, trace / n, schedule / n, c.prefetch ? " (both on the prefetch thread)" : "", execute / n,
              backward / n);
  if (dp.world_size() > 1) {
    const DataParallelStats& st = dp.stats();
    std::printf("  data-parallel (rank 0 of %d): per batch %.2f ms in backward, %.2f ms waiting for the summed "
                "gradients; %.1f collectives (%.1f launched during backward), %.0f KB sent\n",
                dp.world_size(), st.backward_ms / n, st.wait_ms / n, static_cast<double>(st.collectives) / n,
                static_cast<double>(st.launched_in_backward) / n, static_cast<double>(st.bytes) / n / 1024);
  }
}

// Parameters, optimizer state and the last finished epoch, in one file.
void save_checkpoint(const std::string& path, const TreeLSTM& m, torch::optim::Optimizer& opt, int epoch) {
  torch::serialize::OutputArchive archive;
  const std::vector<at::Tensor> ps = m.parameters();
  for (size_t i = 0; i < ps.size(); ++i) archive.write("param" + std::to_string(i), ps[i].detach());
  archive.write("epoch", at::scalar_tensor(static_cast<int64_t>(epoch), at::kLong));
  torch::serialize::OutputArchive state;
  opt.save(state);
  archive.write("optimizer", state);
  archive.save_to(path);
}

// Returns the epoch the checkpoint finished.
int load_checkpoint(const std::string& path, TreeLSTM& m, torch::optim::Optimizer& opt) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(path);
  } catch (const std::exception& e) {
    throw UserError("--resume: cannot read '" + path + "': " + e.what());
  }
  std::vector<at::Tensor> saved;
  while (true) {
    at::Tensor p;  // undefined: try_read would write into a defined one in place
    if (!archive.try_read("param" + std::to_string(saved.size()), p)) break;
    saved.push_back(std::move(p));
  }
  if (saved.empty()) throw UserError("--resume: '" + path + "' is not a tree_lstm checkpoint (no parameters)");
  models::copy_parameters(saved, m.parameters(), path, "TreeLSTM");
  at::Tensor epoch;
  archive.read("epoch", epoch);
  torch::serialize::InputArchive state;
  archive.read("optimizer", state);
  try {
    opt.load(state);
  } catch (const std::exception& e) {  // (LibTorch's words: an internal assert in the other optimizer's file)
    const std::string what = e.what();
    throw UserError("--resume: cannot load the optimizer state in '" + path + "' (written with another --optimizer?): " +
                    what.substr(0, what.find('\n')));
  }
  return static_cast<int>(epoch.item<int64_t>());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The same batches, the same model, the same training step (forward, backward,
// update), per example, hand-batched, with Sheaf, and with Sheaf and its
// Prefetcher; interleaved so that machine noise hits all alike.
void compare_speed(const Config& c, TreeLSTM& m, const std::vector<Tree>& train, Graph& g, const Strategy& s) {
  std::vector<Batch> batches;
  for (size_t start = 0; batches.size() < static_cast<size_t>(c.compare_batches) &&
                         start + static_cast<size_t>(c.batch) <= train.size(); start += static_cast<size_t>(c.batch)) {
    batches.emplace_back();
    for (size_t i = start; i < start + static_cast<size_t>(c.batch); ++i) batches.back().push_back(&train[i]);
  }
  if (batches.empty()) return void(std::printf("speed: skipped (fewer trees than one batch)\n"));

  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  auto update = [&](size_t k, const at::Tensor& total, size_t trees) {
    opts[k]->zero_grad();
    (total / static_cast<double>(trees)).backward();
    opts[k]->step();
  };
  // One timed pass over the batches each (k: the system's optimizer).
  using Pass = std::function<void(size_t k)>;
  const std::vector<Pass> systems = {
      [&](size_t k) {
        for (const Batch& b : batches) {
          at::Tensor total = m.per_example_loss(*b[0]);
          for (size_t i = 1; i < b.size(); ++i) total = total + m.per_example_loss(*b[i]);
          update(k, total, b.size());
        }
      },
      [&](size_t k) {
        for (const Batch& b : batches) update(k, models::HandBatched(m).loss(b), b.size());
      },
      [&](size_t k) {
        for (const Batch& b : batches) {
          Expr total = record(g, m, b);
          g.forward(total, {.strategy = &s});
          update(k, total.value(), b.size());
        }
      },
      [&](size_t k) {
        Prefetcher prefetch({.device = c10::Device(c.device)},
                            [&](Graph& pg, size_t i) { return std::vector<Expr>{m.sheaf_batch_loss(pg, batches[i])}; },
                            {.strategy = &s});
        for (size_t i = 0; i < batches.size(); ++i) {
          const Prefetcher::Batch b = prefetch.take(i, i + 1 < batches.size() ? std::optional(i + 1) : std::nullopt);
          b.graph.forward(b.targets);
          update(k, b.targets[0].value(), batches[i].size());
        }
      },
  };
  for (size_t k = 0; k < systems.size(); ++k) {
    opts.push_back(make_optimizer(c, m));
    systems[k](k);  // warm-up: allocator caches, optimizer state
  }
  std::vector<std::vector<double>> rates(systems.size());
  for (int repeat = 0; repeat < 3; ++repeat)
    for (size_t k = 0; k < systems.size(); ++k) {
      const auto t0 = Clock::now();
      systems[k](k);
      rates[k].push_back(static_cast<double>(batches.size() * static_cast<size_t>(c.batch)) / seconds_since(t0));
    }
  const double per_example = median(rates[0]), hand = median(rates[1]), sheaf = median(rates[2]),
               prefetched = median(rates[3]);
  std::printf("speed (train, batch %d, hidden %lld, %d thread(s), %zu batches, median of 3):\n"
              "  per-example    %6.0f trees/s\n"
              "  hand-batched   %6.0f trees/s\n"
              "  sheaf          %6.0f trees/s  (%.1fx per-example, %.2fx hand)\n"
              "  sheaf+prefetch %6.0f trees/s  (%.1fx per-example, %.2fx hand; records on a second host thread)\n",
              c.batch, static_cast<long long>(c.hidden), c.threads, batches.size(), per_example, hand, sheaf,
              sheaf / per_example, sheaf / hand, prefetched, prefetched / per_example, prefetched / hand);
}

using models::at_least;
const CLI::Validator kPositive = at_least(1, "a positive integer"), kNonNegative = at_least(0, "a count >= 0");

// Every worker must walk the same batches: with another --batch or
// --train-trees one rank aborted inside gloo (std::terminate), with another
// --seed or --root-only they trained without a word, each sharding a batch
// the others did not have. Checked once, at the start, on every rank: rank
// 0's settings are broadcast, each compares them with its own, and the count
// of ranks that differ is summed, so that every rank stops (naming what
// differs where it does) instead of one stopping and the others waiting.
// Rank 0's `unwritable` (its --save or --checkpoint cannot be written) is
// summed in the same collective: every rank stops for it too.
void expect_same_settings(DataParallel& dp, const Config& c, size_t train_trees, int first_epoch,
                          const std::string& unwritable) {
  const std::vector<std::pair<std::string, int64_t>> mine{
      {"--batch", c.batch},
      {"training trees (--train-trees, --data)", static_cast<int64_t>(train_trees)},
      {"--seed", static_cast<int64_t>(c.seed)},
      {"--root-only", c.root_only},
      {"--epochs", c.epochs},
      {"the first epoch (--resume)", first_epoch},
      {"--lr", std::bit_cast<int64_t>(c.lr)},
      {"--optimizer", c.optimizer == "adam"}};
  std::vector<int64_t> values;
  for (const auto& [name, v] : mine) values.push_back(v);
  const at::Tensor theirs = at::tensor(values, at::kLong);
  dp.broadcast(std::span(&theirs, 1));  // rank 0's, on every rank
  std::string differ;
  for (size_t k = 0; k < mine.size(); ++k)
    if (theirs[static_cast<int64_t>(k)].item<int64_t>() != values[k]) differ += (differ.empty() ? "" : ", ") + mine[k].first;
  const std::vector<double> problems = dp.sum({differ.empty() ? 0.0 : 1.0, unwritable.empty() ? 0.0 : 1.0});
  if (!unwritable.empty()) throw UserError(unwritable);
  if (!differ.empty())
    throw UserError("this worker's settings differ from worker 0's in " + differ +
                    ": start every worker with the same options");
  if (problems[1] > 0)
    throw UserError("worker 0 cannot write its --save or --checkpoint file (its error says which)");
  if (problems[0] > 0) throw UserError("another worker's settings differ from worker 0's (its error says which)");
}

int run(Config c) {
  const Strategy& strategy = strategy_named(c.strategy);  // fail on a bad name before loading anything
  const Rendezvous where = Rendezvous::from_env();
  const bool root = where.rank == 0;
  if (!root) c.quiet = true;
  // Rank 0 writes them: checked before training (with other workers, once
  // they have joined, so that every one stops, not only rank 0).
  std::string unwritable;
  if (root) try {
      if (!c.save.empty()) models::expect_writable(c.save, "--save");
      if (!c.checkpoint.empty()) models::expect_writable(c.checkpoint, "--checkpoint");
    } catch (const UserError& e) {
      unwritable = e.what();
    }
  if (!unwritable.empty() && !where.distributed()) throw UserError(unwritable);
  set_threads(c.threads);
  retain_host_memory();  // freed memory stays in the process: no page faults to get it back each batch
  if (!c.quiet) std::printf("%s\n", runtime_info().c_str());
  const Dataset d = load_data(c);
  if (!c.quiet) {
    std::printf("data: %s, vocabulary %lld\n", c.data.empty() ? "synthetic trees" : c.data.c_str(),
                static_cast<long long>(d.vocab));
    print_stats("train", d.train);
    print_stats("dev", d.dev);
  }
  const auto [majority, majority_rate] = majority_class(d.train, d.dev);
  if (root) std::printf("dev root accuracy to beat: %.1f%% (always class %d, train's most frequent root label; chance 20%%)\n",
              100 * majority_rate, majority);

  // torch::optim::Adam rejects sparse gradients; Adagrad takes them, and they
  // keep its update of the embedding table to the rows a batch used.
  TreeLSTM model({.vocab = d.vocab, .hidden = c.hidden, .all_nodes = !c.root_only,
                  .sparse_embedding_grad = c.optimizer != "adam"}, c.seed);
  if (!c.load.empty()) model.load(c.load);
  model.to(c10::Device(c.device));  // before the optimizer: it holds the parameters
  auto opt = make_optimizer(c, model);
  int first_epoch = 1;
  // Every worker reads the checkpoint (the optimizer's state too); DataParallel
  // then makes sure all start from rank 0's parameters.
  if (!c.resume.empty()) first_epoch = load_checkpoint(c.resume, model, *opt) + 1;
  DataParallelOptions dpo{.timeout = std::chrono::milliseconds(static_cast<int64_t>(c.dist_timeout * 1000)),
                          .bucket_mb = c.bucket_mb, .overlap = c.dp_overlap};
  if (model.options().sparse_embedding_grad) dpo.sparse = {model.E};
  dpo.sparse_mode = c.dp_sparse == "densify" ? DataParallelOptions::Sparse::densify : DataParallelOptions::Sparse::gather;
  DataParallel dp(model.parameters(), where, dpo);
  if (where.distributed()) expect_same_settings(dp, c, d.train.size(), first_epoch, unwritable);
  Graph g({.device = c10::Device(c.device)});
  if (root && where.distributed())
    std::printf("data-parallel: %s, %d workers, batches of %d trees split by node count\n",
                where.describe().c_str(), where.world_size, c.batch);

  if (root)
    std::printf("%s: dev root accuracy %.1f%%\n", c.load.empty() && c.resume.empty() ? "untrained" : "loaded",
                100 * root_accuracy(g, strategy, model, d.dev));
  if (root && first_epoch > 1) std::printf("resuming after epoch %d (%s)\n", first_epoch - 1, c.resume.c_str());
  for (int epoch = first_epoch; epoch <= c.epochs; ++epoch) {
    train_epoch(c, epoch, g, strategy, model, *opt, d.train, dp);
    if (!root) continue;
    std::printf("  dev root accuracy %.1f%%\n", 100 * root_accuracy(g, strategy, model, d.dev));
    if (!c.checkpoint.empty()) {
      save_checkpoint(c.checkpoint, model, *opt, epoch);
      std::printf("  checkpoint: %s\n", c.checkpoint.c_str());
    }
    std::fflush(stdout);
  }
  if (!root) return 0;
  if (!d.test.empty()) std::printf("test root accuracy %.1f%%\n", 100 * root_accuracy(g, strategy, model, d.test));
  if (!c.save.empty()) {
    model.save(c.save);
    std::printf("saved parameters to %s\n", c.save.c_str());
  }
  // Last, because it trains the model a few more steps (one worker's speed).
  if (c.compare_batches > 0 && !where.distributed()) compare_speed(c, model, d.train, g, strategy);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"tree_lstm: a TreeLSTM on sentiment trees, written per tree, trained batched with Sheaf"};
  app.add_option("--data", c.data, "SST directory with train.txt, dev.txt, test.txt (default: synthetic trees)");
  app.add_option("--hidden", c.hidden, "hidden size")->check(kPositive);
  app.add_option("--epochs", c.epochs, "training epochs (0: only evaluate)")->check(kNonNegative);
  app.add_option("--batch", c.batch, "trees per batch (Tai et al.: 25)")->check(kPositive);
  CLI::Option* lr = app.add_option("--lr", c.lr, "learning rate (default 0.05 for adagrad, 0.002 for adam)")
                        ->check(at_least(std::numeric_limits<double>::min(), "a positive number"));
  app.add_option("--optimizer", c.optimizer, "adagrad or adam")->check(CLI::IsMember({"adagrad", "adam"}));
  app.add_flag("--root-only", c.root_only, "a loss at the root only (default: at every node)");
  app.add_option("--train-trees", c.train_trees, "use at most N training trees (synthetic default: 2000)")
      ->check(kPositive);
  app.add_option("--threads", c.threads, models::kThreadsHelp)->check(kPositive);
  std::string strategies;
  for (const Strategy* s : all_strategies()) strategies += (strategies.empty() ? "" : ", ") + std::string(s->name());
  app.add_option("--strategy", c.strategy, "Sheaf scheduling strategy: " + strategies);
  app.add_option("--device", c.device, "cpu or cuda (the same model code runs on either)");
  app.add_option("--save", c.save, "write the parameters here after training");
  CLI::Option* load = app.add_option("--load", c.load, "start from these parameters (with --epochs 0: just evaluate)");
  app.add_option("--seed", c.seed, "seed for initialisation and shuffling")->check(sheaf::models::kSeed);
  app.add_option("--compare-batches", c.compare_batches, "batches for the closing speed comparison (0: none)")
      ->check(kNonNegative);
  app.add_flag("--quiet", c.quiet, "no progress bar, runtime or data summary");
  app.add_option("--checkpoint", c.checkpoint, "after every epoch, write parameters, optimizer state and the epoch here");
  app.add_option("--resume", c.resume, "continue from a --checkpoint file (with any number of workers)")
      ->excludes(load);  // (the checkpoint's parameters replaced --load's without a word)
  app.add_option("--dist-timeout", c.dist_timeout, "data-parallel: seconds to wait for the slowest worker before failing")
      ->check(at_least(0.1, "at least 0.1 s"));
  app.add_option("--bucket-mb", c.bucket_mb, "data-parallel: gradients are summed in buckets of about this size")
      ->check(at_least(1e-6, "a positive size"));
  app.add_flag("!--no-overlap", c.dp_overlap, "data-parallel: send every gradient bucket after backward, not during it");
  app.add_option("--dp-sparse", c.dp_sparse, "data-parallel: embedding gradients gathered as rows, or made dense")
      ->check(CLI::IsMember({"gather", "densify"}));
  app.add_flag("!--no-prefetch", c.prefetch, "record and schedule each batch on the training thread (default: the "
                                             "next batch is recorded on a worker thread while one trains)");
  if (const int status = models::parse_cli(app, argc, argv, "tree_lstm"); status >= 0) return status;
  // Adam's steps are about lr from the first one on; Adagrad's shrink as squared gradients add up.
  if (c.optimizer == "adam" && lr->count() == 0) c.lr = 0.002;

  return models::run_cli("tree_lstm", [&] { return run(c); });
}
