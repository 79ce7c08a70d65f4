// The cond-heavy workload: a recursive network over SST trees that picks one of
// two cells at every node by a computed gate (examples/gated_rvnn/model.h).
// Per example (a host decision per node), with Sheaf (dsl::cond at every node:
// a tree takes as many rounds as it is high), and hand-batched with a mask
// (both cells for every node of a level), interleaved in one process run.
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <utility>


#include <baselines/gated_rvnn_hand.h>
#include <data/trees.h>
#include <gated_rvnn/model.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::Tree;
using models::GatedRvNN;
using models::HandGatedRvNN;

void run_mode(const Options& o, const std::string& mode, int64_t hidden, const Workload& w) {
  const bool train = mode == "train";
  const c10::Device device(o.device);
  GatedRvNN model({.vocab = w.vocab, .hidden = hidden}, 11);
  model.to(device);
  const double scale = 1.0 / static_cast<double>(o.batch);
  at::Tensor reference;  // root logits of the first batch, per example
  {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> rows;
    for (const Tree* t : w.batches[0]) rows.push_back(model.per_example_root_logits(*t));
    reference = at::stack(rows);
  }
  StepMaker make_step(o, train, model.parameters(), scale);
  SheafOwners owners;
  std::vector<System> systems;
  for (const std::string& name : o.systems) {
    if (name == "per-example") {
      System s{name, ""};
      s.step = make_step(s, [&](size_t b) {
        at::Tensor total;
        for (const Tree* t : w.batches[b]) {
          at::Tensor l = train ? model.per_example_loss(*t) : model.per_example_root_logits(*t);
          total = total.defined() && train ? total + l : l;
        }
        return train ? total : at::Tensor();
      });
      systems.push_back(std::move(s));
    } else if (name == "hand" || name == "hand:mask") {
      // hand: each cell on its own rows (the gates read on the host: the
      // stronger on a CPU, 1.12-1.20x the masked version here); hand:mask:
      // both cells on every row, a 0/1 mask keeps one (no wait for the gates:
      // measure both on a GPU).
      const auto branches = name == "hand" ? HandGatedRvNN::Branches::kSplit : HandGatedRvNN::Branches::kMask;
      System s{name == "hand" ? name : "hand-alt", name == "hand" ? "" : name.substr(5)};
      s.step = make_step(s, [&, branches](size_t b) {
        const HandGatedRvNN hand(model, branches);
        if (train) return hand.loss(w.batches[b]);
        hand.root_logits(w.batches[b]);
        return at::Tensor();
      });
      c10::NoGradGuard no_grad;
      s.max_abs_diff = max_diff(HandGatedRvNN(model, branches).root_logits(w.batches[0]), reference);
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(name); spec && spec->overlap) {
      // The batch as two parts on two threads, about equally high: one part's
      // host work while the other's kernels run (sheaf::Overlap).
      auto halves = std::make_shared<std::vector<Parts>>();
      auto parts_of = std::make_shared<std::vector<std::vector<std::vector<const Tree*>>>>();
      for (const auto& batch : w.batches) {
        halves->push_back(balanced_halves(batch.size(), [&](size_t i) { return batch[i]->height(); }));
        parts_of->push_back(deal(batch, halves->back()));
      }
      for (const Strategy* strategy : spec->strategies) {
        owners.overlaps.push_back(std::make_unique<Overlap>(spec->graph(o.device, o.profile), 2));
        Overlap* parts = owners.overlaps.back().get();
        const size_t index = systems.size();
        System s{"sheaf", spec->label(*strategy)};
        s.step = make_step(s, [&, parts, parts_of, strategy, index, train](size_t b) {
          parts->run(
              [&](Graph& g, size_t p) {
                const std::vector<const Tree*>& mine = (*parts_of)[b][p];
                if (train) return std::vector<Expr>{model.sheaf_batch_loss(g, mine)};
                return model.sheaf_batch_root_logits(g, mine);
              },
              {.strategy = strategy});
          at::Tensor loss;
          for (size_t p = 0; p < parts->parts(); ++p) {
            systems[index].counters.add(parts->graph(p).stats(), p);
            if (train) loss = loss.defined() ? loss + parts->targets(p)[0].value() : parts->targets(p)[0].value();
          }
          return loss;
        });
        {  // the root logits of batch 0, run so, back in the batch's order
          c10::NoGradGuard no_grad;
          parts->run([&](Graph& g, size_t p) { return model.sheaf_batch_root_logits(g, (*parts_of)[0][p]); },
                     {.strategy = strategy});
          std::vector<std::vector<at::Tensor>> logits(2);
          for (size_t p = 0; p < 2; ++p)
            for (const Expr& e : parts->targets(p)) logits[p].push_back(e.value());
          s.max_abs_diff = max_diff(at::stack(in_item_order((*halves)[0], std::move(logits))), reference);
        }
        systems.push_back(std::move(s));
      }
    } else if (auto spec = parse_sheaf_system(name)) {
      auto record = [&, train](Graph& g, size_t b) {
        if (train) return std::vector<Expr>{model.sheaf_batch_loss(g, w.batches[b])};
        return model.sheaf_batch_root_logits(g, w.batches[b]);
      };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, w.batches.size(), make_step, record, systems, owners);
      for (size_t q = 0; q < added.size(); ++q)
        systems[added[q]].max_abs_diff =
            max_diff(sheaf_stacked_outputs(spec->graph(o.device), *spec->strategies[q], spec->prefetch,
                                           [&](Graph& g) { return model.sheaf_batch_root_logits(g, w.batches[0]); }),
                     reference);
    } else {
      throw UserError("unknown system '" + name + "' for gated_rvnn (per-example, hand, hand:mask, sheaf[:<strategy>][+prefetch|+overlap][/unfused][/eager][/inline])");
    }
  }
  const double items = static_cast<double>(w.batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, w.batches.size(), items);
  report(o, mode, hidden, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_gated_rvnn(const Options& o) {
  const Workload w = load_trees(o);
  for (int64_t hidden : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, hidden, w);
  return 0;
}

}  // namespace sheaf::bench
