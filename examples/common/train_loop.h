// The examples' training pass: shuffled batches, each batch's summed loss
// recorded (the next batch on a worker thread with sheaf::Prefetcher, unless
// turned off), run batched, divided by the batch size, back-propagated, and an
// optimizer step.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include <sheaf/sheaf.h>

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

}  // namespace sheaf::models
