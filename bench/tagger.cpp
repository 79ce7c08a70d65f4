// The BiLSTM tagger workloads of DyNet's benchmark (examples/tagger/model.h):
// `tagger` (word embeddings) and `tagger-char` (rare words spelled by a char
// BiLSTM). The SAME model on the SAME sentences, per example (at::lstm per
// sentence and per rare word), with Sheaf, and hand-batched (packed at::lstm),
// interleaved in one process run. Sheaf's model runs each LSTM step by step
// (an LSTM cell a token: the autobatched form, as DyNet's); a system name
// ending in /seq writes each as one dsl::lstm over the sentence's rows.
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>

#include <baselines/tagger_hand.h>
#include <data/tagging.h>
#include <tagger/model.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

using data::Sentence;
using models::HandTagger;
using models::Tagger;

// Every sentence of the corpus: the vocabulary (and so which words are rare)
// comes from all of them, the timed passes use the first --trees.
std::vector<data::TaggedSentence> all_sentences(const Options& o) {
  if (o.data.empty()) return data::synthetic_tagged({.count = std::max<int>(5000, static_cast<int>(o.trees)), .seed = 1});
  const std::filesystem::path p(o.data);
  return data::read_tagged(std::filesystem::is_directory(p) ? (p / "train.txt").string() : o.data);
}

}  // namespace

TaggingCorpus load_tagging_corpus(const Options& o) {
  std::vector<data::TaggedSentence> train = all_sentences(o);
  TaggingCorpus c{data::TaggingVocab::build(train, 1), {}, {}};
  train.resize(std::min(train.size(), static_cast<size_t>(o.trees)));
  c.sentences = c.vocab.encode(train);
  const auto batch = static_cast<size_t>(o.batch);
  for (size_t start = 0; start + batch <= c.sentences.size(); start += batch) {
    c.batches.emplace_back();
    for (size_t i = start; i < start + batch; ++i) c.batches.back().push_back(&c.sentences[i]);
  }
  if (c.batches.empty()) throw UserError("fewer sentences than one batch");
  const data::TaggingStats st = data::stats_of(c.sentences);
  c.tokens_per_sentence = st.mean_words;
  c.rare_fraction = static_cast<double>(st.rare_tokens) / static_cast<double>(st.tokens);
  if (!o.json)
    std::printf("sentences: %zu (%s), mean %.1f words (max %d), %.1f%% rare tokens, vocab %zu words, %zu chars, %zu "
                "tags; %zu batches of %lld\n",
                st.sentences, o.data.empty() ? "synthetic" : o.data.c_str(), st.mean_words, st.max_words,
                100 * c.rare_fraction, c.vocab.words.size(), c.vocab.chars.size(), c.vocab.tags.size(),
                c.batches.size(), static_cast<long long>(o.batch));
  return c;
}

namespace {

// Every token's logits of a batch in sentence order, per example: the reference.
at::Tensor per_example_logits(const Tagger& m, std::span<const Sentence* const> batch) {
  std::vector<at::Tensor> out;
  for (const Sentence* s : batch) out.push_back(m.per_example_logits(*s));
  return at::cat(out).cpu();
}

void run_mode(const Options& o, const std::string& mode, int64_t hidden, const TaggingCorpus& c) {
  const bool train = mode == "train";
  const bool chars = o.workload == "tagger-char";
  const c10::Device device(o.device);
  const models::TaggerOptions options{.words = static_cast<int64_t>(c.vocab.words.size()),
                                      .chars = static_cast<int64_t>(c.vocab.chars.size()),
                                      .tags = static_cast<int64_t>(c.vocab.tags.size()),
                                      .hidden = hidden,
                                      .use_chars = chars};
  Tagger model(options, 13);
  model.to(device);
  models::TaggerOptions by_sequence = options;  // the same parameters (seed), each LSTM one dsl::lstm
  by_sequence.sequence_op = true;
  Tagger model_by_sequence(by_sequence, 13);
  model_by_sequence.to(device);
  at::Tensor reference;
  {
    c10::NoGradGuard no_grad;
    reference = per_example_logits(model, c.batches[0]);
  }
  StepMaker make_step(o, train, model.parameters(), 1.0 / static_cast<double>(o.batch));
  // The /seq systems train their own model's parameters (zeroed and stepped as the others').
  StepMaker make_seq_step(o, train, model_by_sequence.parameters(), 1.0 / static_cast<double>(o.batch));
  SheafOwners owners;
  std::vector<System> systems;
  for (const std::string& name : o.systems) {
    if (name == "per-example") {
      systems.push_back(per_example_system<Sentence>(
          make_step, train, c.batches, [&](const Sentence& x) { return model.per_example_loss(x); },
          [&](const Sentence& x) { model.per_example_logits(x); }));
    } else if (name == "hand" || name == "hand:lstm" || name == "hand:loop" || name == "hand:fused" ||
               name == "hand:sheaf-cell") {
      // "hand" is our one-node LSTM (packed_lstm, its cell in ATen ops) in
      // both modes: the fastest hand kernel to train, and in inference as fast
      // as at::lstm or faster on the machines measured (docs/benchmarks.md).
      const auto kernel = name == "hand:lstm"         ? HandTagger::Kernel::kLstmCall
                          : name == "hand:loop"       ? HandTagger::Kernel::kLoop
                          : name == "hand:sheaf-cell" ? HandTagger::Kernel::kSheafCell
                                                      : HandTagger::Kernel::kFused;
      System s{name == "hand" ? name : "hand-alt", name == "hand" ? "" : name.substr(5)};
      s.step = make_step(s, [&, train, kernel](size_t b) {
        const HandTagger hand(model, kernel);
        return train ? hand.loss(c.batches[b]) : hand.logits(c.batches[b]);
      });
      c10::NoGradGuard no_grad;
      s.max_abs_diff = max_diff(HandTagger(model, kernel).logits_in_sentence_order(c.batches[0]), reference);
      systems.push_back(std::move(s));
    } else if (auto spec = parse_sheaf_system(strip_suffix(name, "/seq"))) {
      const Tagger& m = name.ends_with("/seq") ? model_by_sequence : model;
      auto record = [&, train](Graph& g, size_t b) {
        if (train) return std::vector<Expr>{m.sheaf_batch_loss(g, c.batches[b])};
        return m.sheaf_batch_logits(g, c.batches[b]);
      };
      const std::vector<size_t> added =
          add_sheaf_systems(o, *spec, train, c.batches.size(), &m == &model_by_sequence ? make_seq_step : make_step,
                            record, systems, owners);
      for (size_t q = 0; q < added.size(); ++q) {
        if (&m == &model_by_sequence) systems[added[q]].strategy += "/seq";
        systems[added[q]].max_abs_diff =
            max_diff(sheaf_stacked_outputs(spec->graph(o.device), *spec->strategies[q], spec->prefetch,
                                           [&](Graph& g) { return m.sheaf_batch_logits(g, c.batches[0]); },
                                           Tagger::logit_rows),
                     reference);
      }
    } else {
      throw UserError("unknown system '" + name + "' for " + o.workload +
                      " (per-example, hand, sheaf[:<strategy>][+prefetch][/unfused][/eager][/inline][/seq])");
    }
  }
  const double items = static_cast<double>(c.batches.size() * static_cast<size_t>(o.batch));
  auto runs = measure(o, systems, c.batches.size(), items);
  for (size_t k = 0; k < systems.size(); ++k) {
    systems[k].extra["tokens_per_sec"] = median(runs[k]) * c.tokens_per_sentence;
    if (chars) systems[k].extra["rare_token_percent"] = 100 * c.rare_fraction;
  }
  report(o, mode, hidden, static_cast<int64_t>(items), systems, runs);
}

}  // namespace

int run_tagger(const Options& o) {
  if (!o.write_data.empty()) {
    data::write_tagged(o.write_data, all_sentences(o));
    std::printf("wrote %s\n", o.write_data.c_str());
    return 0;
  }
  const TaggingCorpus c = load_tagging_corpus(o);
  for (int64_t hidden : o.hidden)
    for (const std::string& mode : o.modes) run_mode(o, mode, hidden, c);
  return 0;
}

}  // namespace sheaf::bench
