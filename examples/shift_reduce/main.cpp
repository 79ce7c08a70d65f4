// shift_reduce: a SPINN-style parser-encoder trained on sentiment trees with the
// gold transitions (structure-driven), then run on held-out sentences following
// its OWN predicted transitions (value-driven), batched across sentences.
//
//   ./build/examples/shift_reduce                       (synthetic trees)
//   ./build/examples/shift_reduce --data ../shared/data/sst --epochs 2
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <common/cli.h>
#include <data/trees.h>
#include <shift_reduce/model.h>

using namespace sheaf;
using models::ParseResult;
using models::ShiftReduce;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Eval {
  double accuracy = 0, transition_accuracy = 0, trees_per_sec = 0, steps_per_batch = 0, fetches_per_batch = 0;
};

// Parses `trees` in batches following the model's own transitions.
Eval evaluate(const ShiftReduce& m, const std::vector<data::Tree>& trees, size_t batch) {
  c10::NoGradGuard no_grad;
  Graph g({.device = m.E.device()});
  Eval e;
  size_t right = 0, transitions_right = 0, transitions = 0, batches = 0;
  const auto t0 = Clock::now();
  for (size_t start = 0; start < trees.size(); start += batch, ++batches) {
    g.clear();
    std::vector<Task<ParseResult>> tasks;
    const size_t end = std::min(trees.size(), start + batch);
    for (size_t i = start; i < end; ++i) {
      auto scope = g.example(static_cast<int>(i - start));
      tasks.push_back(m.parse(g, trees[i], /*predict=*/true));
    }
    g.forward();
    e.steps_per_batch += static_cast<double>(g.stats().rounds);
    e.fetches_per_batch += static_cast<double>(g.stats().fetches);
    for (size_t i = start; i < end; ++i) {
      ParseResult& r = tasks[i - start].result();
      right += r.logits.value().argmax().item<int64_t>() == trees[i].label.back();
      std::vector<int> gold = models::gold_transitions(trees[i]);
      for (size_t k = 0; k < gold.size(); ++k) transitions_right += gold[k] == r.transitions[k];
      transitions += gold.size();
    }
  }
  e.trees_per_sec = static_cast<double>(trees.size()) / seconds_since(t0);
  e.accuracy = static_cast<double>(right) / static_cast<double>(trees.size());
  e.transition_accuracy = static_cast<double>(transitions_right) / static_cast<double>(transitions);
  e.steps_per_batch /= static_cast<double>(batches);
  e.fetches_per_batch /= static_cast<double>(batches);
  return e;
}

double eager_trees_per_sec(const ShiftReduce& m, const std::vector<data::Tree>& trees, size_t count) {
  c10::NoGradGuard no_grad;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < count; ++i) m.parse_eager(trees[i % trees.size()], /*predict=*/true);
  return static_cast<double>(count) / seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir, device = "cpu";
  int epochs = 2, threads = 1;
  int64_t hidden = 128, tracking = 32, batch = 32, train_trees = 2000;
  CLI::App app{"shift_reduce: SPINN-style parser; gold transitions to train, its own predictions to parse"};
  app.add_option("--data", data_dir, "SST directory (default: synthetic trees)");
  app.add_option("--epochs", epochs)->check(CLI::NonNegativeNumber);
  app.add_option("--hidden", hidden)->check(CLI::PositiveNumber);
  app.add_option("--tracking", tracking, "tracking LSTM size")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--train-trees", train_trees, "at most this many training trees")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, models::kThreadsHelp)
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device, "cpu or cuda");
  CLI11_PARSE(app, argc, argv);

  try {
    set_threads(threads);
    retain_host_memory();  // freed memory stays in the process: no page faults to get it back each batch
    std::printf("%s\n", runtime_info().c_str());
    data::Vocab vocab;
    std::vector<data::Tree> train, dev;
    if (data_dir.empty()) {
      vocab = data::synthetic_vocab(5000);
      train = data::synthetic_trees({.count = static_cast<int>(train_trees), .seed = 1});
      dev = data::synthetic_trees({.count = 500, .seed = 2});
    } else {
      data::Treebank bank = data::load_treebank(data_dir, 1, vocab);
      train = std::move(bank.train);
      dev = std::move(bank.dev);
    }
    if (static_cast<int64_t>(train.size()) > train_trees) train.resize(static_cast<size_t>(train_trees));
    std::printf("%zu training trees, %zu dev trees, vocabulary %zu\n", train.size(), dev.size(), vocab.size());

    ShiftReduce m({.vocab = static_cast<int64_t>(vocab.size()), .hidden = hidden, .tracking = tracking}, 1);
    m.to(c10::Device(device));
    torch::optim::Adagrad opt(m.parameters(), torch::optim::AdagradOptions(0.05));
    std::mt19937_64 rng(1);
    Graph g({.device = c10::Device(device)});
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      std::shuffle(train.begin(), train.end(), rng);
      double loss = 0;
      const auto t0 = Clock::now();
      for (size_t start = 0; start + static_cast<size_t>(batch) <= train.size(); start += static_cast<size_t>(batch)) {
        g.clear();
        std::vector<Task<ParseResult>> tasks;
        for (size_t i = start; i < start + static_cast<size_t>(batch); ++i) {
          auto scope = g.example(static_cast<int>(i - start));
          tasks.push_back(m.parse(g, train[i], /*predict=*/false));  // gold: finishes at once, no waiting
        }
        std::vector<Expr> losses;
        for (auto& t : tasks) losses.push_back(t.result().loss);
        Expr total = dsl::sum(losses);
        g.forward(total);
        opt.zero_grad();
        (total.value() / static_cast<double>(batch)).backward();
        opt.step();
        loss += total.item();
      }
      const double secs = seconds_since(t0);
      Eval e = evaluate(m, dev, static_cast<size_t>(batch));
      std::printf("epoch %d: loss/tree %.3f, train %.0f trees/s (gold transitions); dev: sentiment %.1f%%, "
                  "transitions %.1f%% like gold, %.0f trees/s parsing with its own predictions\n",
                  epoch, loss / static_cast<double>(train.size()), static_cast<double>(train.size()) / secs,
                  100 * e.accuracy, 100 * e.transition_accuracy, e.trees_per_sec);
    }
    Eval e = evaluate(m, dev, static_cast<size_t>(batch));
    std::printf("predicted-transition parsing, batch %lld: %.1f batched steps and %.1f host fetches per batch; "
                "%.0f trees/s vs %.0f trees/s one sentence at a time\n",
                static_cast<long long>(batch), e.steps_per_batch, e.fetches_per_batch, e.trees_per_sec,
                eager_trees_per_sec(m, dev, std::min<size_t>(dev.size(), 200)));
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "shift_reduce: %s\n", ex.what());
    return 1;
  }
}
