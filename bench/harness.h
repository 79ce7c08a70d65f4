// The benchmark harness: systems that run the same batches, interleaved
// repeats, medians, and one JSON object per measurement.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/optim/adagrad.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <data/tagging.h>
#include <data/trees.h>
#include <sheaf/sheaf.h>

#include "launches.h"

namespace sheaf::bench {

struct Options {
  std::string workload = "treelstm";
  std::string data;  // empty: synthetic
  std::string write_data;  // taggers: write the corpus (DyNet's word|TAG format) here and exit
  std::vector<int64_t> hidden{128};
  int64_t batch = 64;
  int64_t trees = 512;
  int repeat = 5;
  std::string order = "balanced";  // the systems' order in each timed repeat: balanced or fixed (pass_order.h)
  std::vector<std::string> systems{"per-example", "sheaf", "hand"};
  std::vector<std::string> modes{"train", "infer"};
  int threads = 1;
  bool json = false;
  bool root_only = false;
  std::string device = "cpu";
  bool profile = false;  // phases timed with the device synchronised between them
  std::string host_memory = "retain";  // retain (sheaf::retain_host_memory, for every system) or default
};

// One system's way of running one batch (index into the workload's batches).
struct System {
  std::string name;      // per-example, sheaf, hand
  std::string strategy;  // sheaf only
  std::function<void(size_t batch)> step;
  // Filled by sheaf systems after each step: launches, ms in trace / schedule / execute.
  struct Counters {
    double launches = 0, trace_ms = 0, sched_ms = 0, exec_ms = 0, gather_ms = 0, op_ms = 0, rounds = 0, steps = 0;
    double gathered_bytes = 0, gathered_inputs = 0, zero_copy_inputs = 0, in_place_inputs = 0;
    std::map<std::string, int> strategy_used;  // batches by the schedule they used (auto: its pick)
    // auto's comparisons: per candidate, the summed launches, gathers,
    // gathered bytes and cost of the plans it compared, and how many.
    std::map<std::string, std::array<double, 5>> compared;
    std::map<std::string, ExecCounters::OpTime> by_op;  // with --profile
    // One batch of a Sheaf graph; `part` > 0: another part of the same batch
    // (sheaf::Overlap's): its work adds up, its rounds run beside part 0's.
    void add(const Stats& s, size_t part = 0);
    double batch_rounds = 0;  // add()'s: the current batch's rounds so far
  } counters;
  // With --profile: ms in each phase of a step, summed over steps.
  struct Phases {
    double forward = 0, backward = 0, optimizer = 0, steps = 0;
  };
  std::shared_ptr<Phases> phases = std::make_shared<Phases>();
  double max_abs_diff = 0;  // vs per-example, measured before timing
  // Train: the parameters' gradients of batch 0's scaled loss (set by
  // StepMaker), and their largest difference from per-example's, measured by
  // measure() before any step moves the parameters (NaN: not measured).
  std::function<std::vector<at::Tensor>()> gradients;
  double max_abs_grad_diff = std::numeric_limits<double>::quiet_NaN();
  // Kernel launches per batch (forward, backward, optimizer; bench/launches.h)
  // and, with --profile, time per top-level op, from the counting pass.
  std::array<double, 3> launches{};
  std::map<std::string, LaunchCounter::OpTime> op_times;
  double counted_batches = 1;
  std::map<std::string, double> extra;  // workload-specific fields of the JSON line
};

// Trees for a workload: SST train (--data) or synthetic, cut into full batches.
struct Workload {
  std::vector<data::Tree> trees;
  int64_t vocab = 0;
  std::vector<std::vector<const data::Tree*>> batches;
};
Workload load_trees(const Options& o);

// Tagged sentences for the tagger and transformer workloads: from --data (a
// word|TAG file, or a directory holding train.txt) or synthetic ones with
// DyNet's benchmark sizes (5-40 words); the vocabulary (and so which words are
// rare) comes from a training set of at least 5,000 sentences. --trees of
// them, cut into full batches.
struct TaggingCorpus {
  data::TaggingVocab vocab;
  std::vector<data::Sentence> sentences;
  std::vector<std::vector<const data::Sentence*>> batches;
  double tokens_per_sentence = 0, rare_fraction = 0;
};
TaggingCorpus load_tagging_corpus(const Options& o);

// One result line.
class Json {
 public:
  Json& add(const std::string& k, const std::string& v) { return raw(k, "\"" + v + "\""); }
  Json& add(const std::string& k, const char* v) { return add(k, std::string(v)); }
  Json& add(const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return raw(k, buf);
  }
  Json& add(const std::string& k, int64_t v) { return raw(k, std::to_string(v)); }
  Json& add(const std::string& k, int v) { return raw(k, std::to_string(v)); }
  Json& add(const std::string& k, const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%.6g", i ? ", " : "", v[i]);
      s += buf;
    }
    return raw(k, s + "]");
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  Json& raw(const std::string& k, const std::string& v) {
    body_ += (body_.empty() ? "\"" : ", \"") + k + "\": " + v;
    return *this;
  }
  std::string body_;
};

double median(std::vector<double> v);

// The median over `repeat` runs of `body` (after one to warm up), in
// milliseconds, the device idle before and after each.
template <class F>
double median_ms(c10::Device device, int repeat, F&& body) {
  std::vector<double> times;
  for (int r = 0; r < repeat + 1; ++r) {
    synchronize(device);
    const auto t0 = std::chrono::steady_clock::now();
    body();
    synchronize(device);
    if (r > 0) times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(times);
}

// A --systems entry for Sheaf: "sheaf[:<strategy>][+prefetch][/unfused][/eager][/inline][/unpacked]".
// "sheaf" alone means every strategy; +prefetch records the next batch on a
// second host thread (sheaf::Prefetcher); /unfused turns elementwise fusion off;
// /eager runs every node as soon as it can run, even while control flow waits
// for other values (GraphOptions::defer_unawaited off);
// /inline records the models' sheaf::Functions op by op at every call
// (GraphOptions::inline_functions: the same program, one node per op);
// /unpacked leaves every product to OpenBLAS (GraphOptions::pack_weights off).
struct SheafSystem {
  std::vector<const Strategy*> strategies;
  bool prefetch = false;
  bool overlap = false;  // +overlap: the batch in two parts on two threads (sheaf::Overlap); a workload's own path
  bool fuse = true;
  bool defer = true;
  bool inline_functions = false;
  bool pack_weights = true;
  std::string label(const Strategy& s) const;  // the JSON "strategy" field: "auto", "lazy+prefetch/unfused"
  GraphOptions graph(const std::string& device, bool profile = false) const;  // the options its graphs use
};
// Nothing for a name that is not a Sheaf system; UserError for a bad strategy.
std::optional<SheafSystem> parse_sheaf_system(const std::string& name);
// A +overlap system's two parts of a batch of n items, about equal in rounds
// (sheaf::balanced_parts); a UserError for a batch under 2.
Parts balanced_halves(size_t n, const std::function<double(size_t)>& rounds);
// A workload's own system suffix (the model variant: "/matmul", "/seq") taken off.
inline std::string strip_suffix(const std::string& s, std::string_view suffix) {
  return s.ends_with(suffix) ? s.substr(0, s.size() - suffix.size()) : s;
}

// Turns a system's forward for batch b into its timed step: under no-grad for
// infer; for train, forward, backward of the loss * scale, and a step of an
// Adagrad optimizer of the step's own (every system pays the same update).
// With o.profile, each phase waits for the device and adds its time to the
// system's phases.
class StepMaker {
 public:
  StepMaker(const Options& o, bool train, std::vector<at::Tensor> params, double scale)
      : train_(train), profile_(o.profile), device_(o.device), params_(std::move(params)), scale_(scale) {}
  // Train: also sets s.gradients.
  std::function<void(size_t)> operator()(System& s, std::function<at::Tensor(size_t)> forward);

 private:
  bool train_, profile_;
  c10::Device device_;
  std::vector<at::Tensor> params_;
  double scale_;
  std::vector<std::unique_ptr<torch::optim::Adagrad>> optimizers_;
};

// The per-example system of a workload whose batches are lists of items: one
// item after another, the sum of `loss(item)` to train, `infer(item)` alone
// otherwise.
template <class Item>
System per_example_system(StepMaker& make_step, bool train, const std::vector<std::vector<const Item*>>& batches,
                          std::function<at::Tensor(const Item&)> loss, std::function<void(const Item&)> infer) {
  System s{"per-example", ""};
  s.step = make_step(s, [&batches, train, loss = std::move(loss), infer = std::move(infer)](size_t b) {
    at::Tensor total;
    for (const Item* item : batches[b]) {
      if (!train) {
        infer(*item);
        continue;
      }
      const at::Tensor l = loss(*item);
      total = total.defined() ? total + l : l;
    }
    return total;
  });
  return s;
}

// max |a - b| over all elements, on the host.
double max_diff(const at::Tensor& a, const at::Tensor& b);
// Runs the batch `record` records under `strategy` without gradients, and
// hands its computed targets to `read` while their graph lives. With
// `prefetch`, a Prefetcher's worker records and prepares the batch, as it
// does a +prefetch system's: its check covers that path too.
void sheaf_check_run(const GraphOptions& options, const Strategy& strategy, bool prefetch,
                     const std::function<std::vector<Expr>(Graph&)>& record,
                     const std::function<void(std::span<const Expr>)>& read);
// What a Sheaf system's agreement check compares with the reference: the
// values `record` returns (sheaf_check_run), stacked (or joined by `join`,
// given the computed outputs: a workload's own layout).
at::Tensor sheaf_stacked_outputs(const GraphOptions& options, const Strategy& strategy, bool prefetch,
                                 const std::function<std::vector<Expr>(Graph&)>& record,
                                 const std::function<at::Tensor(std::span<const Expr>)>& join = {});

// Sheaf systems built by add_sheaf_systems, owned here for the run.
struct SheafOwners {
  std::vector<std::unique_ptr<Graph>> graphs;
  std::vector<std::unique_ptr<Prefetcher>> prefetchers;
  std::vector<std::unique_ptr<Overlap>> overlaps;
};
// For each strategy of `spec`, appends a System whose step records batch b with
// `record` (train: its first target is the loss to back-propagate), runs it
// (through a Prefetcher for +prefetch) and adds the graph's Stats. Returns the
// new systems' indices (for their max_abs_diff).
std::vector<size_t> add_sheaf_systems(const Options& o, const SheafSystem& spec, bool train, size_t n_batches,
                                      StepMaker& make_step, const Prefetcher::Record& record,
                                      std::vector<System>& systems, SheafOwners& owners);

// Runs every system over batches [0, n_batches) `repeat` times, interleaved
// (each system once a repeat, in the order Options::order says: pass_order.h)
// after one warm-up pass; returns the per-repeat throughputs in items/s for
// each system, in the systems' order. A pass ends when the device has
// finished its work.
std::vector<std::vector<double>> measure(const Options& o, std::vector<System>& systems, size_t n_batches,
                                         double items_per_pass);

// Prints the results: JSON lines, or a table with ratios vs per-example and hand.
void report(const Options& o, const std::string& mode, int64_t hidden, int64_t items, const std::vector<System>& systems,
            const std::vector<std::vector<double>>& runs);

int run_treelstm(const Options& o);
int run_shift_reduce(const Options& o);
int run_host(const Options& o);
int run_calibrate(const Options& o);  // scheduler/cost.h's figures
int run_products(const Options& o);   // the packed product against the BLAS, shape by shape
int run_gated_rvnn(const Options& o);
int run_tagger(const Options& o);  // tagger and tagger-char
int run_attention(const Options& o);
int run_transformer(const Options& o);

}  // namespace sheaf::bench
