// Attention workload: the seq2seq model of examples/attention/model.h on
// generated digit reversal (sources of 3-20 digits), per example (eager
// LibTorch), with Sheaf (each strategy) and hand-batched (padded and masked,
// packed LSTMs: bench/baselines/attention_hand.h). Modes: train (teacher
// forcing: forward + backward + step) and infer (greedy decoding: per-example
// code syncs once per step per example; Sheaf and the hand-batched decoder once
// per step for the whole batch). The model is untrained, so every example
// decodes its whole budget (source length + 4 steps) in every system.
//
// max_abs_diff: train, the largest difference of any example's loss from the
// per-example one on the first batch; infer, the number of examples of the
// first batch whose greedy output differs from the per-example one (0 expected).
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <array>

#include <memory>

#include <attention/model.h>
#include <baselines/attention_hand.h>
#include <data/digits.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::DigitPair;
using models::HandSeq2Seq;
using models::Seq2Seq;
using Batch = std::vector<const DigitPair*>;

struct Pairs {
  std::vector<DigitPair> pairs;
  std::vector<Batch> batches;
  double target_tokens_per_pair = 0;
};

Pairs load(const Options& o) {
  Pairs p;
  p.pairs = data::synthetic_digits({.count = static_cast<int>(o.trees), .min_length = 3, .max_length = 20, .seed = 11});
  const auto batch = static_cast<size_t>(o.batch);
  for (size_t start = 0; start + batch <= p.pairs.size(); start += batch) {
    p.batches.emplace_back();
    for (size_t i = start; i < start + batch; ++i) p.batches.back().push_back(&p.pairs[i]);
  }
  if (p.batches.empty()) throw UserError("fewer pairs than one batch (--trees sets the number of pairs)");
  for (const DigitPair& x : p.pairs) p.target_tokens_per_pair += static_cast<double>(x.target.size());
  p.target_tokens_per_pair /= static_cast<double>(p.pairs.size());
  if (!o.json)
    std::printf("pairs: %zu digit strings of 3-20 (reverse), %.1f target tokens each; %zu batches of %lld\n",
                p.pairs.size(), p.target_tokens_per_pair, p.batches.size(), static_cast<long long>(o.batch));
  return p;
}

// Examples whose outputs differ from the reference's.
double count_different(const std::vector<std::vector<int64_t>>& a, const std::vector<std::vector<int64_t>>& b) {
  double n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

void run_mode(const Options& o, const std::string& mode, int64_t hidden, const Pairs& data) {
  const bool train = mode == "train";
  const c10::Device device(o.device);
  Seq2Seq model({.embed = 32, .hidden = hidden}, 17);
  model.to(device);
  Seq2Seq model_by_sequence({.embed = 32, .hidden = hidden, .sequence_op = true}, 17);  // same parameters (seed)
  model_by_sequence.to(device);
  const std::vector<Batch>& batches = data.batches;
  const Batch& first = batches[0];

  at::Tensor reference_losses;
  std::vector<std::vector<int64_t>> reference_outputs;
  {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> losses;
    for (const DigitPair* p : first) {
      losses.push_back(model.per_example_loss(*p));
      reference_outputs.push_back(model.per_example_greedy(p->source, Seq2Seq::max_steps_for(p->source)));
    }
    reference_losses = at::stack(losses);
  }

  StepMaker make_step(o, train, model.parameters(), 1.0 / static_cast<double>(o.batch));
  // The /seq systems train their own model's parameters (zeroed and stepped as the others').
  StepMaker make_seq_step(o, train, model_by_sequence.parameters(), 1.0 / static_cast<double>(o.batch));
  std::vector<std::unique_ptr<Graph>> graphs;
  SheafOwners owners;
  std::vector<System> systems;
  for (const std::string& name : o.systems) {
    const Seq2Seq& m = name.ends_with("/seq") ? model_by_sequence : model;  // a Sheaf system's model
    StepMaker& sheaf_step = &m == &model_by_sequence ? make_seq_step : make_step;
    if (name == "per-example") {
      systems.push_back(per_example_system<DigitPair>(
          make_step, train, batches, [&](const DigitPair& p) { return model.per_example_loss(p); },
          [&](const DigitPair& p) { model.per_example_greedy(p.source, Seq2Seq::max_steps_for(p.source)); }));
    } else if (name == "hand" || name == "hand:bmm" || name == "hand:mulsum" || name == "hand:at-lstm") {
      // "hand" decodes with the faster products on this machine's CPU and
      // trains its LSTMs with op::packed_lstm (docs/benchmarks.md); hand:at-lstm
      // runs them with at::lstm in training too.
      const auto products = name == "hand:bmm" ? HandSeq2Seq::Products::kBmm : HandSeq2Seq::Products::kMulSum;
      const auto lstm = name == "hand:at-lstm" ? HandSeq2Seq::Lstm::kLstmCall : HandSeq2Seq::Lstm::kAuto;
      const HandSeq2Seq hand(model, products, lstm);
      System s{name == "hand" ? name : "hand-alt", name == "hand" ? "" : name.substr(5)};
      s.step = make_step(s, [&, hand, train](size_t b) {
        if (train) return hand.loss(batches[b]);
        hand.greedy(batches[b]);
        return at::Tensor();
      });
      c10::NoGradGuard no_grad;
      s.max_abs_diff = train ? max_diff(hand.example_losses(first), reference_losses)
                             : count_different(hand.greedy(first), reference_outputs);
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(strip_suffix(name, "/seq")); spec && train) {
      if (spec->overlap) {  // (a teacher-forced batch records whole before forward: a Prefetcher's case)
        std::fprintf(stderr, "sheaf-bench: %s skipped in train mode (+overlap is for decoding)\n", name.c_str());
        continue;
      }
      auto record = [&](Graph& g, size_t b) { return std::vector<Expr>{m.sheaf_batch_loss(g, batches[b])}; };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, batches.size(), sheaf_step, record, systems, owners);
      for (size_t q = 0; q < added.size(); ++q) {
        if (&m == &model_by_sequence) systems[added[q]].strategy += "/seq";
        systems[added[q]].max_abs_diff =
            max_diff(sheaf_stacked_outputs(spec->graph(o.device), *spec->strategies[q], spec->prefetch,
                                           [&](Graph& g) {
                                             std::vector<Expr> losses;
                                             for (size_t i = 0; i < first.size(); ++i) {
                                               auto scope = g.example(static_cast<int>(i));
                                               losses.push_back(m.sheaf_loss(g, *first[i]));
                                             }
                                             return losses;
                                           }),
                     reference_losses);
      }
    } else if (spec && spec->overlap) {
      // Greedy decoding as two parts of about equal lengths on two threads:
      // one part's host work while the other's kernels run (sheaf::Overlap).
      for (const Strategy* strategy : spec->strategies) {
        owners.overlaps.push_back(std::make_unique<Overlap>(spec->graph(o.device, o.profile), 2));
        Overlap* parts = owners.overlaps.back().get();
        const size_t index = systems.size();
        System s{"sheaf", spec->label(*strategy) + (&m == &model_by_sequence ? "/seq" : "")};
        auto decode = [&, parts, strategy](const Batch& batch) {
          // (A source's length is its answer's: the steps it decodes.)
          const Parts halves = balanced_halves(batch.size(), [&](size_t i) { return batch[i]->source.size(); });
          const std::vector<Batch> mine = deal(batch, halves);
          std::vector<std::vector<std::vector<int64_t>>> out(2);
          parts->run(
              [&](Graph& g, size_t p) {
                out[p] = m.sheaf_decode(g, mine[p], strategy);
                return std::vector<Expr>{};
              },
              {.strategy = strategy});
          return in_item_order(halves, std::move(out));
        };
        s.step = sheaf_step(s, [&, parts, index, decode](size_t b) {
          decode(batches[b]);
          for (size_t p = 0; p < parts->parts(); ++p) systems[index].counters.add(parts->graph(p).stats(), p);
          return at::Tensor();
        });
        c10::NoGradGuard no_grad;
        s.max_abs_diff = count_different(decode(first), reference_outputs);
        systems.push_back(std::move(s));
      }
    } else if (spec) {
      // Greedy decoding records as it runs (each step waits for the last
      // argmax): nothing to record ahead on a second thread.
      if (spec->prefetch) {
        std::fprintf(stderr, "sheaf-bench: %s skipped in infer mode (decoding records as it runs)\n", name.c_str());
        continue;
      }
      for (const Strategy* strategy : spec->strategies) {
        graphs.push_back(std::make_unique<Graph>(spec->graph(o.device, o.profile)));
        Graph* g = graphs.back().get();
        const size_t index = systems.size();
        System s{"sheaf", spec->label(*strategy) + (&m == &model_by_sequence ? "/seq" : "")};
        s.step = sheaf_step(s, [&, g, strategy, index](size_t b) {
          m.sheaf_decode(*g, batches[b], strategy);
          systems[index].counters.add(g->stats());
          return at::Tensor();
        });
        c10::NoGradGuard no_grad;
        s.max_abs_diff = count_different(m.sheaf_decode(*g, first, strategy), reference_outputs);
        systems.push_back(std::move(s));
      }
    } else {
      throw UserError("unknown system '" + name + "' for attention (per-example, hand, hand:bmm, hand:mulsum, hand:at-lstm, sheaf[:<strategy>][+prefetch|+overlap][/unfused][/eager][/inline][/seq])");
    }
  }
  const double items = static_cast<double>(batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, batches.size(), items);
  for (size_t k = 0; k < systems.size(); ++k)
    systems[k].extra["target_tokens_per_sec"] = median(runs[k]) * data.target_tokens_per_pair;
  report(o, mode, hidden, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_attention(const Options& o) {
  const Pairs data = load(o);
  for (int64_t hidden : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, hidden, data);
  return 0;
}

}  // namespace sheaf::bench
