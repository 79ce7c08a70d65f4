// TreeLSTM workload: the SAME model on the SAME trees, per example, with Sheaf
// (each strategy) and hand-batched, interleaved in one process run.
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <cstdio>
#include <string_view>

#include <data/trees.h>
#include <baselines/tree_lstm_hand.h>
#include <sheaf/ops/packed_gemm.h>
#include <tree_lstm/model.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::Tree;
using models::HandBatched;
using models::TreeLSTM;

// Root logits [trees, 5] and mean loss per labelled node, for the agreement check.
struct Outputs {
  at::Tensor logits;
  double loss_per_node;
};

double labelled_nodes(const TreeLSTM& m, std::span<const Tree* const> batch) {
  double n = 0;
  for (const Tree* t : batch) n += m.options().all_nodes ? t->size() : 1;
  return n;
}

Outputs per_example_outputs(const TreeLSTM& m, std::span<const Tree* const> batch) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> logits;
  double loss = 0;
  for (const Tree* t : batch) {
    logits.push_back(m.per_example_root_logits(*t));
    loss += m.per_example_loss(*t).item<double>();
  }
  return {at::stack(logits).cpu(), loss / labelled_nodes(m, batch)};
}

double diff(const Outputs& a, const Outputs& b) {
  return std::max((a.logits - b.logits).abs().max().item<double>(), std::abs(a.loss_per_node - b.loss_per_node));
}

// A Sheaf run of `batch` with these options: its loss and each tree's root logits.
Outputs sheaf_outputs(const TreeLSTM& m, std::span<const Tree* const> batch, const GraphOptions& options,
                      const Strategy& strategy, bool prefetch) {
  Outputs out;
  auto record = [&](Graph& g) {  // the loss, then each root
    std::vector<Expr> roots;
    Expr loss = m.sheaf_batch_loss(g, batch, &roots);
    roots.insert(roots.begin(), loss);
    return roots;
  };
  sheaf_check_run(options, strategy, prefetch, record, [&](std::span<const Expr> targets) {
    std::vector<at::Tensor> logits;
    for (const Expr& e : targets.subspan(1)) logits.push_back(e.value());
    out = {at::stack(logits).cpu(), targets[0].item() / labelled_nodes(m, batch)};
  });
  return out;
}

void run_mode(const Options& o, const std::string& mode, int64_t hidden, const Workload& w) {
  const bool train = mode == "train";
  const c10::Device device(o.device);
  TreeLSTM model({.vocab = w.vocab, .hidden = hidden, .all_nodes = !o.root_only}, 7);
  model.to(device);
  const double scale = 1.0 / static_cast<double>(o.batch);
  const Outputs reference = per_example_outputs(model, w.batches[0]);

  StepMaker make_step(o, train, model.parameters(), scale);

  SheafOwners owners;
  std::vector<System> systems;
  for (const std::string& name : o.systems) {
    if (name == "per-example") {
      System s{name, ""};
      s.step = make_step(s, [&](size_t b) {
        if (!train) {
          for (const Tree* t : w.batches[b]) model.per_example_root_logits(*t);
          return at::Tensor();
        }
        at::Tensor total = model.per_example_loss(*w.batches[b][0]);
        for (size_t i = 1; i < w.batches[b].size(); ++i) total = total + model.per_example_loss(*w.batches[b][i]);
        return total;
      });
      systems.push_back(std::move(s));
    } else if (name == "hand" || name == "hand:sheaf-gemm") {
      // hand:sheaf-gemm: the same code with Sheaf's packed-weight product kernel
      // (needs AVX2+FMA): a reference, not a LibTorch baseline.
      const auto product = name == "hand" ? HandBatched::Product::kLibTorch : HandBatched::Product::kSheafPacked;
      if (product == HandBatched::Product::kSheafPacked &&
          (!packed_gemm_available() || !packed_gemm_suits(model.U.detach().t()) ||
           !packed_gemm_suits(model.U.detach()))) {
        std::fprintf(stderr, "sheaf-bench: %s skipped (needs AVX2+FMA, the CPU, and U within the kernel's sizes)\n",
                     name.c_str());
        continue;
      }
      System s{name == "hand" ? name : "hand-alt", name == "hand" ? "" : name.substr(5)};
      s.step = make_step(s, [&, product](size_t b) {
        HandBatched hand(model, product);
        return train ? hand.loss(w.batches[b]) : hand.root_logits(w.batches[b]);
      });
      {
        c10::NoGradGuard no_grad;
        HandBatched hand(model, product);
        Outputs out{hand.root_logits(w.batches[0]).cpu(),
                    hand.loss(w.batches[0]).item<double>() / labelled_nodes(model, w.batches[0])};
        s.max_abs_diff = diff(out, reference);
      }
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(name)) {
      // Train: the loss only. Infer: each tree's root logits only (what a user would record).
      auto record = [&, train](Graph& g, size_t b) {
        if (train) return std::vector<Expr>{model.sheaf_batch_loss(g, w.batches[b])};
        return model.sheaf_batch_root_logits(g, w.batches[b]);
      };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, w.batches.size(), make_step, record, systems, owners);
      for (size_t q = 0; q < added.size(); ++q)
        systems[added[q]].max_abs_diff = diff(
            sheaf_outputs(model, w.batches[0], spec->graph(o.device), *spec->strategies[q], spec->prefetch), reference);
    } else {
      throw UserError("unknown system '" + name + "' (per-example, hand, hand:sheaf-gemm, sheaf[:<strategy>][+prefetch][/unfused][/eager][/inline][/unpacked])");
    }
  }

  const double items = static_cast<double>(w.batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, w.batches.size(), items);
  report(o, mode, hidden, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_treelstm(const Options& o) {
  const Workload w = load_trees(o);
  for (int64_t hidden : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, hidden, w);
  return 0;
}

}  // namespace sheaf::bench
