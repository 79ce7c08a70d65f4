// Shift-reduce workload: the SPINN-style parser on the same sentences per
// example (eager LibTorch), with Sheaf (each strategy) and hand-batched
// (bench/baselines/shift_reduce_hand.h). Modes: train (gold
// transitions, forward + backward + step) and infer (the model's own predicted
// transitions: per-example code syncs once per step per sentence; Sheaf and the
// hand-batched parser once per step for the whole batch).
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <optional>
#include <ranges>

#include <data/trees.h>
#include <baselines/shift_reduce_hand.h>
#include <shift_reduce/model.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::Tree;
using models::HandShiftReduce;
using models::ParseResult;
using models::ShiftReduce;

void run_mode(const Options& o, const std::string& mode, int64_t hidden, const std::vector<std::vector<const Tree*>>& batches,
              int64_t vocab) {
  const bool train = mode == "train";
  const c10::Device device(o.device);
  ShiftReduce model({.vocab = vocab, .hidden = hidden, .tracking = 32}, 7);
  model.to(device);
  const double scale = 1.0 / static_cast<double>(o.batch);

  // Reference for the agreement check: per-example logits of the first batch.
  std::vector<at::Tensor> reference;
  {
    c10::NoGradGuard no_grad;
    for (const Tree* t : batches[0]) reference.push_back(model.parse_eager(*t, !train).logits.cpu());
  }
  auto diff_to_reference = [&](const std::vector<at::Tensor>& logits) {
    double d = 0;
    for (size_t i = 0; i < logits.size(); ++i) d = std::max(d, (logits[i] - reference[i]).abs().max().item<double>());
    return d;
  };

  StepMaker make_step(o, train, model.parameters(), scale);

  // Records sentences `items` (indices) of batch b into g, runs them (every
  // round), returns the loss and the root logits.
  auto run_sheaf_part = [&](Graph& g, const Strategy& strategy, size_t b, const auto& items,
                            std::vector<at::Tensor>* logits) {
    g.clear();
    std::vector<Task<ParseResult>> tasks;
    for (size_t i : items) {
      auto scope = g.example(static_cast<int>(i));
      tasks.push_back(model.parse(g, *batches[b][i], !train));
    }
    g.forward({}, {.strategy = &strategy});
    std::vector<Expr> losses;
    for (auto& t : tasks) losses.push_back(t.result().loss);
    Expr total = dsl::sum(losses);
    g.forward(total, {.strategy = &strategy});
    if (logits)
      for (auto& t : tasks) logits->push_back(t.result().logits.value().detach().cpu());
    return total;
  };
  auto run_sheaf = [&](Graph& g, const Strategy& strategy, size_t b, std::vector<at::Tensor>* logits) {
    return run_sheaf_part(g, strategy, b, std::views::iota(size_t{0}, batches[b].size()), logits).value();
  };

  std::vector<std::unique_ptr<Graph>> graphs;
  SheafOwners owners;  // the +prefetch systems
  std::vector<System> systems;
  // Sequential transition steps per batch: one sentence after another, or all in lock-step.
  double transitions = 0;
  for (const auto& batch : batches)
    for (const Tree* t : batch) transitions += 2.0 * t->num_words() - 1;
  for (const std::string& name : o.systems) {
    if (name == "per-example") {
      System s{name, ""};
      s.step = make_step(s, [&](size_t b) {
        at::Tensor total;
        for (const Tree* t : batches[b]) {
          at::Tensor l = model.parse_eager(*t, !train).loss;
          total = total.defined() ? total + l : l;
        }
        return total;
      });
      s.extra["steps"] = transitions / static_cast<double>(batches.size());
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(name); spec && spec->overlap) {
      // The batch as two parts of about equal steps on two threads: one
      // part's host work while the other's kernels run (sheaf::Overlap).
      auto halves = std::make_shared<std::vector<Parts>>();
      for (const auto& batch : batches)
        halves->push_back(balanced_halves(batch.size(), [&](size_t i) { return batch[i]->num_words(); }));
      for (const Strategy* strategy : spec->strategies) {
        owners.overlaps.push_back(std::make_unique<Overlap>(spec->graph(o.device, o.profile), 2));
        Overlap* parts = owners.overlaps.back().get();
        const size_t index = systems.size();
        System s{"sheaf", spec->label(*strategy)};
        auto run_parts = [&, parts, halves, strategy](size_t b, std::vector<at::Tensor>* logits) {
          std::vector<std::vector<at::Tensor>> part_logits(2);
          parts->run(
              [&](Graph& g, size_t p) {
                return std::vector<Expr>{
                    run_sheaf_part(g, *strategy, b, (*halves)[b][p], logits ? &part_logits[p] : nullptr)};
              },
              {.strategy = strategy});
          if (logits) *logits = in_item_order((*halves)[b], std::move(part_logits));
          return parts->targets(0)[0].value() + parts->targets(1)[0].value();
        };
        s.step = make_step(s, [&, parts, index, run_parts](size_t b) {
          at::Tensor loss = run_parts(b, nullptr);
          for (size_t p = 0; p < parts->parts(); ++p) systems[index].counters.add(parts->graph(p).stats(), p);
          return loss;
        });
        {
          c10::NoGradGuard no_grad;
          std::vector<at::Tensor> logits;
          run_parts(0, &logits);
          s.max_abs_diff = diff_to_reference(logits);
        }
        systems.push_back(std::move(s));
      }
    } else if (auto spec = parse_sheaf_system(name); spec && !spec->prefetch) {
      for (const Strategy* strategy : spec->strategies) {
        graphs.push_back(std::make_unique<Graph>(spec->graph(o.device, o.profile)));
        Graph* g = graphs.back().get();
        const size_t index = systems.size();
        System s{"sheaf", spec->label(*strategy)};
        s.step = make_step(s, [&, g, strategy, index](size_t b) {
          at::Tensor loss = run_sheaf(*g, *strategy, b, nullptr);
          systems[index].counters.add(g->stats());
          return loss;
        });
        {
          c10::NoGradGuard no_grad;
          std::vector<at::Tensor> logits;
          run_sheaf(*g, *strategy, 0, &logits);
          s.max_abs_diff = diff_to_reference(logits);
        }
        systems.push_back(std::move(s));
      }
    } else if (auto spec = parse_sheaf_system(name); spec && spec->prefetch) {
      // Training only: with gold transitions a batch records completely before
      // forward (no task waits), so batch b+1 can be recorded on a worker while
      // batch b runs. Parsing follows its own predictions inside forward.
      if (!train) {
        std::fprintf(stderr, "sheaf-bench: %s skipped in infer mode (a parse records as it runs)\n", name.c_str());
        continue;
      }
      // Batch b's parses with gold transitions: done once recorded (they never wait).
      auto gold_parses = [&](Graph& g, size_t b) {
        std::vector<ParseResult> parses;
        for (size_t i = 0; i < batches[b].size(); ++i) {
          auto scope = g.example(static_cast<int>(i));
          parses.push_back(model.parse(g, *batches[b][i], /*predict=*/false).result());
        }
        return parses;
      };
      // gold_parses by value: this record outlives the block (a Prefetcher's
      // systems keep it), and a reference to the lambda here dangled, a crash
      // once later systems' code reused its stack slot (`--systems
      // sheaf:auto+prefetch,hand`).
      auto record = [gold_parses](Graph& g, size_t b) {
        std::vector<Expr> losses;
        for (const ParseResult& r : gold_parses(g, b)) losses.push_back(r.loss);
        return std::vector<Expr>{dsl::sum(losses)};
      };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, batches.size(), make_step, record, systems, owners);
      // Checked as it runs: batch 0 recorded and prepared by a Prefetcher's worker.
      auto record_logits = [&](Graph& g) {
        std::vector<Expr> logits;
        for (const ParseResult& r : gold_parses(g, 0)) logits.push_back(r.logits);
        return logits;
      };
      for (size_t q = 0; q < added.size(); ++q) {
        sheaf_check_run(spec->graph(o.device), *spec->strategies[q], true, record_logits,
                        [&](std::span<const Expr> targets) {
                          std::vector<at::Tensor> logits;
                          for (const Expr& e : targets) logits.push_back(e.value().detach().cpu());
                          systems[added[q]].max_abs_diff = diff_to_reference(logits);
                        });
      }
    } else if (name == "hand") {
      const HandShiftReduce hand(model);
      System s{name, ""};
      s.step = make_step(s, [&, hand](size_t b) { return hand.run(batches[b], !train).loss; });
      // Batched steps: the longest sentence's 2n - 1, per batch.
      double steps = 0;
      for (const auto& batch : batches) {
        int longest = 0;
        for (const Tree* t : batch) longest = std::max(longest, t->num_words());
        steps += 2.0 * longest - 1;
      }
      s.extra["steps"] = steps / static_cast<double>(batches.size());
      {
        // The path that is timed: with autograd when training.
        std::optional<c10::NoGradGuard> no_grad;
        if (!train) no_grad.emplace();
        const at::Tensor logits = hand.run(batches[0], !train).logits.detach().cpu();
        std::vector<at::Tensor> rows;
        for (int64_t i = 0; i < logits.size(0); ++i) rows.push_back(logits[i]);
        s.max_abs_diff = diff_to_reference(rows);
      }
      systems.push_back(std::move(s));
    } else {
      throw UserError("unknown system '" + name + "' for shift_reduce (per-example, hand, sheaf[:<strategy>][+prefetch|+overlap][/unfused][/eager][/inline])");
    }
  }

  const double items = static_cast<double>(batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, batches.size(), items);
  for (System& s : systems)  // Sheaf's batched steps: its rounds per batch, averaged like the others'
    if (s.name == "sheaf") s.extra["steps"] = s.counters.rounds / std::max(1.0, s.counters.steps);
  report(o, mode, hidden, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_shift_reduce(const Options& o) {
  const Workload w = load_trees(o);
  for (int64_t hidden : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, hidden, w.batches, w.vocab);
  return 0;
}

}  // namespace sheaf::bench
