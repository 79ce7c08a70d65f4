// The examples' training pass: shuffled batches, each batch's summed loss
// recorded (the next batch on a worker thread with sheaf::Prefetcher, unless
// turned off), run batched, divided by the batch size, back-propagated, and an
// optimizer step.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include <sheaf/sheaf.h>

#include "progress.h"

namespace sheaf::models {

// `items` in shuffled batches of at most `batch`, as pointers.
template <class Item>
std::vector<std::vector<const Item*>> shuffled_batches(const std::vector<Item>& items, size_t batch,
                                                       std::mt19937_64& rng) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::vector<const Item*>> out;
  for (size_t start = 0; start < order.size(); start += batch) {
    out.emplace_back();
    for (size_t i = start; i < std::min(order.size(), start + batch); ++i) out.back().push_back(&items[order[i]]);
  }
  return out;
}

struct TrainPass {
  size_t batches = 0;
  // Records batch b's summed loss on the graph it is given (as example ids 0..).
  std::function<Expr(Graph&, size_t b)> record;
  std::function<size_t(size_t b)> size;  // items in batch b (the loss is divided by it)
  // Back-propagates the divided loss (default: loss.backward()); data-parallel
  // training passes DataParallel::backward, whose loss may need no gradient
  // (a worker's empty share of a small batch).
  std::function<void(const at::Tensor& loss)> backward;
  bool prefetch = true;
  GraphOptions graph;                    // the Prefetcher's graphs
  const Strategy* strategy = nullptr;
  // After batch b's update: its summed loss, the graph that ran it, and the ms
  // spent in backward and the optimizer step.
  std::function<void(size_t b, const Expr& loss, const Graph& g, double backward_ms)> after;
};

// Runs the pass; without prefetch, batches are recorded on `g` (cleared first).
void train_pass(const TrainPass& pass, Graph& g, torch::optim::Optimizer& opt);

// One epoch of an example's usual loop: `items` in shuffled batches through
// train_pass, with a progress bar; the summed loss, launches per batch and
// seconds, for the example to print.
struct Epoch {
  int number = 1;
  size_t batch = 32;
  const char* unit = "items";
  bool progress = true, prefetch = true;
  const Strategy* strategy = nullptr;
};
struct EpochResult {
  double loss = 0, launches_per_batch = 0, seconds = 0;
};
template <class Item>
EpochResult train_epoch(const Epoch& e, const std::vector<Item>& items, std::mt19937_64& rng, Graph& g,
                        torch::optim::Optimizer& opt,
                        const std::function<Expr(Graph&, const std::vector<const Item*>&)>& record) {
  const std::vector<std::vector<const Item*>> batches = shuffled_batches(items, e.batch, rng);
  EpochResult r;
  size_t done = 0;
  Progress progress(e.progress, e.number, items.size(), e.unit);
  const auto t0 = std::chrono::steady_clock::now();
  train_pass({.batches = batches.size(),
              .record = [&](Graph& pg, size_t b) { return record(pg, batches[b]); },
              .size = [&](size_t b) { return batches[b].size(); },
              .prefetch = e.prefetch,
              .strategy = e.strategy,
              .after =
                  [&](size_t b, const Expr& total, const Graph& graph, double) {
                    r.loss += total.item();
                    r.launches_per_batch += static_cast<double>(graph.stats().batches);
                    progress.update(done += batches[b].size());
                  }},
             g, opt);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  progress.finish();
  r.launches_per_batch /= static_cast<double>(std::max<size_t>(batches.size(), 1));
  return r;
}

}  // namespace sheaf::models
