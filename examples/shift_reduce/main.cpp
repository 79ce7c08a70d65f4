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
#include <limits>
#include <cmath>
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
  std::vector<int64_t> labels;              // per tree: the predicted sentiment
  std::vector<std::vector<int>> decisions;  // per tree: the transitions it took
};

// Parses `trees` in batches following the model's own transitions. Each
// batch runs as the Overlap's parts, of about equal length, one a thread,
// whose rounds take turns at the kernels: while one part's transitions run,
// another records what its predictions decided. One part: one graph on this
// thread.
Eval evaluate(Overlap& overlap, const ShiftReduce& m, const std::vector<data::Tree>& trees, size_t batch) {
  c10::NoGradGuard no_grad;
  const size_t parts = overlap.parts();
  Eval e;
  size_t right = 0, transitions_right = 0, transitions = 0, batches = 0;
  const auto t0 = Clock::now();
  for (size_t start = 0; start < trees.size(); start += batch, ++batches) {
    const size_t end = std::min(trees.size(), start + batch);
    const Parts dealt =
        balanced_parts(end - start, parts, [&](size_t i) { return static_cast<double>(trees[start + i].num_words()); });
    std::vector<std::vector<ParseResult>> results(parts);
    overlap.run([&](Graph& g, size_t p) {
      std::vector<Task<ParseResult>> tasks;
      for (size_t i : dealt[p]) {
        auto scope = g.example(static_cast<int>(i));
        tasks.push_back(m.parse(g, trees[start + i], /*predict=*/true));
      }
      g.forward();  // the parses run to their ends (each step waits for its prediction)
      std::vector<Expr> logits;
      for (auto& t : tasks) {
        results[p].push_back(t.result());
        logits.push_back(results[p].back().logits);
      }
      return logits;
    });
    double rounds = 0;
    for (size_t p = 0; p < parts; ++p) {
      rounds = std::max(rounds, static_cast<double>(overlap.graph(p).stats().rounds));  // the parts run side by side
      e.fetches_per_batch += static_cast<double>(overlap.graph(p).stats().fetches);
    }
    e.steps_per_batch += rounds;
    const std::vector<ParseResult> in_order = in_item_order(dealt, std::move(results));
    for (size_t i = start; i < end; ++i) {
      const ParseResult& r = in_order[i - start];
      e.labels.push_back(r.logits.value().argmax().item<int64_t>());
      e.decisions.push_back(r.transitions);
      right += e.labels.back() == trees[i].label.back();
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
  int64_t hidden = 128, tracking = 32, batch = 32, train_trees = 2000, eval_batch = 256, parts = 2;
  CLI::App app{"shift_reduce: SPINN-style parser; gold transitions to train, its own predictions to parse"};
  app.add_option("--data", data_dir, "SST directory (default: synthetic trees)");
  app.add_option("--epochs", epochs)->check(sheaf::models::kNonNegativeNumber);
  app.add_option("--hidden", hidden)->check(sheaf::models::kPositiveNumber);
  app.add_option("--tracking", tracking, "tracking LSTM size")->check(sheaf::models::kPositiveNumber);
  app.add_option("--batch", batch)->check(sheaf::models::kPositiveNumber);
  app.add_option("--train-trees", train_trees, "at most this many training trees")->check(sheaf::models::kPositiveNumber);
  app.add_option("--threads", threads, models::kThreadsHelp)
      ->check(sheaf::models::kPositiveNumber);
  app.add_option("--device", device, "cpu or cuda");
  app.add_option("--eval-batch", eval_batch, "dev sentences parsed together")->check(sheaf::models::kPositiveNumber);
  app.add_option("--parts", parts,
                 "parse each dev batch as this many parts, one a thread, whose kernels take turns (sheaf::Overlap: "
                 "one part's host work while another's kernels run; it needs a core a part); 1: one graph")
      ->check(sheaf::models::kPositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    set_threads(threads);
    retain_host_memory();  // freed memory stays in the process: no page faults to get it back each batch
    std::printf("%s\n", runtime_info().c_str());
    data::Vocab vocab;
    std::vector<data::Tree> train, dev;
    if (data_dir.empty()) {
      // (Past int, the generator's count wrapped: a negative number of trees.)
      constexpr int64_t kMostSynthetic = std::numeric_limits<int>::max();
      if (train_trees > kMostSynthetic)
        throw UserError("--train-trees " + std::to_string(train_trees) + ": the synthetic tree generator makes at most " +
                        std::to_string(kMostSynthetic) + " trees");
      vocab = data::synthetic_vocab(5000);
      train = data::synthetic_trees({.count = static_cast<int>(train_trees), .seed = 1});
      dev = data::synthetic_trees({.count = 500, .seed = 2});
    } else {
      data::Treebank bank = data::load_treebank(data_dir, 1, vocab);
      train = std::move(bank.train);
      dev = std::move(bank.dev);
    }
    if (static_cast<int64_t>(train.size()) > train_trees) train.resize(static_cast<size_t>(train_trees));
    // Training takes whole batches: with fewer trees than one it trained
    // nothing and printed a loss of 0 (or NaN for empty files).
    if (dev.empty()) throw UserError("no dev trees" + (data_dir.empty() ? std::string() : " in '" + data_dir + "'"));
    if (epochs > 0 && static_cast<int64_t>(train.size()) < batch)
      throw UserError(std::to_string(train.size()) + " training trees" +
                      (data_dir.empty() ? std::string() : " in '" + data_dir + "'") + " do not fill one --batch of " +
                      std::to_string(batch) + " (training takes whole batches): lower --batch");
    std::printf("%zu training trees, %zu dev trees, vocabulary %zu\n", train.size(), dev.size(), vocab.size());

    ShiftReduce m({.vocab = static_cast<int64_t>(vocab.size()), .hidden = hidden, .tracking = tracking}, 1);
    m.to(c10::Device(device));
    torch::optim::Adagrad opt(m.parameters(), torch::optim::AdagradOptions(0.05));
    std::mt19937_64 rng(1);
    Graph g({.device = c10::Device(device)});
    Overlap eval_parts({.device = c10::Device(device)}, static_cast<size_t>(parts));
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
      Eval e = evaluate(eval_parts, m, dev, static_cast<size_t>(eval_batch));
      std::printf("epoch %d: loss/tree %.3f, train %.0f trees/s (gold transitions); dev: sentiment %.1f%%, "
                  "transitions %.1f%% like gold, %.0f trees/s parsing with its own predictions\n",
                  epoch, loss / static_cast<double>(train.size()), static_cast<double>(train.size()) / secs,
                  100 * e.accuracy, 100 * e.transition_accuracy, e.trees_per_sec);
    }
    Eval e = evaluate(eval_parts, m, dev, static_cast<size_t>(eval_batch));
    std::printf("predicted-transition parsing, batch %lld: %.1f batched steps (the longest part's) and %.1f host "
                "fetches (all parts') per batch; %.0f trees/s vs %.0f trees/s one sentence at a time\n",
                static_cast<long long>(eval_batch), e.steps_per_batch, e.fetches_per_batch, e.trees_per_sec,
                eager_trees_per_sec(m, dev, std::min<size_t>(dev.size(), 200)));
    if (parts > 1) {
      // Both warm (each timed on its second pass), and parsed alike.
      Overlap one({.device = c10::Device(device)}, 1);
      (void)evaluate(one, m, dev, static_cast<size_t>(eval_batch));
      const Eval alone = evaluate(one, m, dev, static_cast<size_t>(eval_batch));
      const Eval in_parts = evaluate(eval_parts, m, dev, static_cast<size_t>(eval_batch));
      std::printf("  in %lld parts (sheaf::Overlap) against one graph: %.0f against %.0f trees/s\n",
                  static_cast<long long>(parts), in_parts.trees_per_sec, alone.trees_per_sec);
      // The same parses, tree by tree (up to an argmax that float rounding
      // of other batch shapes tips: one tree in a hundred is far beyond that).
      size_t differ = 0;
      for (size_t i = 0; i < dev.size(); ++i)
        differ += in_parts.labels[i] != alone.labels[i] || in_parts.decisions[i] != alone.decisions[i];
      if (differ > std::max<size_t>(1, dev.size() / 100))
        std::printf("  PARTS DIFFER: %zu of %zu trees parsed otherwise than by one graph\n", differ, dev.size());
    }
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "shift_reduce: %s\n", ex.what());
    return 1;
  }
}
