// Transformer workload: one Transformer encoder layer as a tagger
// (examples/transformer/model.h) on sentences of 5-40 words, per example (eager
// LibTorch), with Sheaf, and hand-batched (padded and masked attention, packed
// position-wise work: bench/baselines/transformer_hand.h), interleaved in one
// process run. --hidden sets the model width d (4 heads, feed-forward 2d).
//
// Sheaf packs the sentences' rows for every op but attention's products of
// two per-example matrices (docs/ops.md, "Lengths"); the model's
// dsl::attention packs those too. A system name ending in /matmul runs the
// model with each head written as matmul / softmax / matmul instead (once per
// distinct length).
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <baselines/transformer_hand.h>
#include <transformer/model.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::Sentence;
using models::HandTransformer;
using models::TransformerTagger;

at::Tensor per_example_logits(const TransformerTagger& m, std::span<const Sentence* const> batch) {
  std::vector<at::Tensor> out;
  for (const Sentence* s : batch) out.push_back(m.per_example_logits(*s));
  return at::cat(out).cpu();
}

void run_mode(const Options& o, const std::string& mode, int64_t d, const TaggingCorpus& c) {
  const bool train = mode == "train";
  const c10::Device device(o.device);
  const models::TransformerOptions options{.words = static_cast<int64_t>(c.vocab.words.size()),
                                           .tags = static_cast<int64_t>(c.vocab.tags.size()),
                                           .d = d,
                                           .heads = 4,
                                           .ff = 2 * d};
  TransformerTagger model(options, /*seed=*/19);
  model.to(device);
  models::TransformerOptions by_heads = options;  // the same parameters (seed), heads op by op
  by_heads.attention_op = false;
  TransformerTagger model_by_heads(by_heads, /*seed=*/19);
  model_by_heads.to(device);
  at::Tensor reference;
  {
    c10::NoGradGuard no_grad;
    reference = per_example_logits(model, c.batches[0]);
  }
  StepMaker make_step(o, train, model.parameters(), 1.0 / static_cast<double>(o.batch));
  // The /matmul systems train their own model's parameters (zeroed and stepped as the others').
  StepMaker make_heads_step(o, train, model_by_heads.parameters(), 1.0 / static_cast<double>(o.batch));
  SheafOwners owners;
  std::vector<System> systems;
  for (const std::string& name : o.systems) {
    if (name == "per-example") {
      systems.push_back(per_example_system<Sentence>(
          make_step, train, c.batches, [&](const Sentence& x) { return model.per_example_loss(x); },
          [&](const Sentence& x) { model.per_example_logits(x); }));
    } else if (name == "hand" || name == "hand:pad" || name == "hand:sheaf-attention" ||
               name.starts_with("hand:buckets")) {
      // hand: the sentences sorted by length in 4 groups, each padded to its
      // own longest (4 read best of 1, 2, 4 and 8 here, stop 66); hand:pad:
      // every sentence padded to the batch's longest; hand:bucketsG: G groups;
      // hand:sheaf-attention: attention by Sheaf's CPU loop (a reference).
      const bool sheaf_attention = name == "hand:sheaf-attention";
      const int buckets = name == "hand" || sheaf_attention ? 4 : name == "hand:pad" ? 1 : std::stoi(name.substr(12));
      const HandTransformer hand(model, buckets, sheaf_attention);
      System s{name == "hand" ? name : "hand-alt", name == "hand" ? "" : name.substr(5)};
      s.step = make_step(s, [&, hand, train](size_t b) { return train ? hand.loss(c.batches[b]) : hand.logits(c.batches[b]); });
      c10::NoGradGuard no_grad;
      s.max_abs_diff = max_diff(hand.logits(c.batches[0]), reference);
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(strip_suffix(name, "/matmul"))) {
      const TransformerTagger& m = name.ends_with("/matmul") ? model_by_heads : model;
      auto record = [&, train](Graph& g, size_t b) {
        if (train) return std::vector<Expr>{m.sheaf_batch_loss(g, c.batches[b])};
        return m.sheaf_batch_logits(g, c.batches[b]);
      };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, c.batches.size(), &m == &model_by_heads ? make_heads_step : make_step,
                            record, systems, owners);
      for (size_t q = 0; q < added.size(); ++q) {
        if (&m == &model_by_heads) systems[added[q]].strategy += "/matmul";
        auto cat = [](std::span<const Expr> logits) {  // each sentence's [L, tags]
          std::vector<at::Tensor> rows;
          for (const Expr& e : logits) rows.push_back(e.value());
          return at::cat(rows);
        };
        systems[added[q]].max_abs_diff =
            max_diff(sheaf_stacked_outputs(spec->graph(o.device), *spec->strategies[q], spec->prefetch,
                                           [&](Graph& g) { return m.sheaf_batch_logits(g, c.batches[0]); }, cat),
                     reference);
      }
    } else {
      throw UserError("unknown system '" + name + "' for transformer (per-example, hand, hand:pad, hand:bucketsG, hand:sheaf-attention, sheaf[:<strategy>][+prefetch][/unfused][/eager][/inline][/matmul])");
    }
  }
  const double items = static_cast<double>(c.batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, c.batches.size(), items);
  for (size_t k = 0; k < systems.size(); ++k) systems[k].extra["tokens_per_sec"] = median(runs[k]) * c.tokens_per_sentence;
  report(o, mode, d, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_transformer(const Options& o) {
  const TaggingCorpus c = load_tagging_corpus(o);
  for (int64_t d : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, d, c);
  return 0;
}

}  // namespace sheaf::bench
