#include "harness.h"

#include <ATen/ops/stack.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <vector>

#include <sheaf/sheaf.h>

#include "launches.h"
#include "pass_order.h"

namespace sheaf::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a.cpu() - b.cpu()).abs().max().item<double>(); }

void sheaf_check_run(const GraphOptions& options, const Strategy& strategy, bool prefetch,
                     const std::function<std::vector<Expr>(Graph&)>& record,
                     const std::function<void(std::span<const Expr>)>& read) {
  c10::NoGradGuard no_grad;  // (the worker records under it too: Prefetcher::take)
  if (!prefetch) {
    Graph g(options);
    const std::vector<Expr> targets = record(g);
    g.forward(targets, {.strategy = &strategy});
    return read(targets);
  }
  Prefetcher batches(options, [&](Graph& g, size_t) { return record(g); }, ForwardOptions{.strategy = &strategy});
  (void)batches.take(0, 0);  // recorded here; the worker records the same batch again...
  Prefetcher::Batch batch = batches.take(0);  // ...and this is the worker's
  batch.graph.forward(batch.targets, {.strategy = &strategy});
  read(batch.targets);
}

at::Tensor sheaf_stacked_outputs(const GraphOptions& options, const Strategy& strategy, bool prefetch,
                                 const std::function<std::vector<Expr>(Graph&)>& record,
                                 const std::function<at::Tensor(std::span<const Expr>)>& join) {
  at::Tensor out;
  sheaf_check_run(options, strategy, prefetch, record, [&](std::span<const Expr> targets) {
    if (join) {
      out = join(targets);
      return;
    }
    std::vector<at::Tensor> rows;
    for (const Expr& e : targets) rows.push_back(e.value());
    out = at::stack(rows);
  });
  return out;
}

Parts balanced_halves(size_t n, const std::function<double(size_t)>& rounds) {
  if (n < 2) throw UserError("sheaf-bench: a +overlap system needs batches of 2 or more (--batch)");
  return balanced_parts(n, 2, rounds);
}

std::optional<SheafSystem> parse_sheaf_system(const std::string& name) {
  std::string rest = name;
  if (rest != "sheaf" && rest.rfind("sheaf:", 0) != 0 && rest.rfind("sheaf+", 0) != 0 && rest.rfind("sheaf/", 0) != 0)
    return std::nullopt;
  SheafSystem s;
  auto take_suffix = [&](std::string_view suffix) {
    if (!rest.ends_with(suffix)) return false;
    rest.resize(rest.size() - suffix.size());
    return true;
  };
  s.pack_weights = !take_suffix("/unpacked");
  s.inline_functions = take_suffix("/inline");
  s.defer = !take_suffix("/eager");
  s.fuse = !take_suffix("/unfused");
  s.prefetch = take_suffix("+prefetch");
  s.overlap = !s.prefetch && take_suffix("+overlap");
  if (rest == "sheaf") s.strategies.assign(all_strategies().begin(), all_strategies().end());
  else s.strategies.push_back(&strategy_named(rest.substr(6)));
  return s;
}

std::string SheafSystem::label(const Strategy& s) const {
  return std::string(s.name()) + (prefetch ? "+prefetch" : "") + (overlap ? "+overlap" : "") + (fuse ? "" : "/unfused") + (defer ? "" : "/eager") +
         (inline_functions ? "/inline" : "") + (pack_weights ? "" : "/unpacked");
}

GraphOptions SheafSystem::graph(const std::string& device, bool profile) const {
  return GraphOptions{.device = c10::Device(device),
                      .profile = profile,
                      .fuse = fuse,
                      .pack_weights = pack_weights,
                      .defer_unawaited = defer,
                      .inline_functions = inline_functions};
}

void System::Counters::add(const Stats& s, size_t part) {
  launches += static_cast<double>(s.batches);
  trace_ms += s.trace_ms;
  sched_ms += s.schedule_ms;
  exec_ms += s.execute_ms;
  gather_ms += s.gather_ms;
  op_ms += s.op_ms;
  // The parts of a batch run side by side: its rounds are its longest part's.
  const double r = static_cast<double>(s.rounds);
  if (part == 0) {
    rounds += r;
    batch_rounds = r;
  } else if (r > batch_rounds) {
    rounds += r - batch_rounds;
    batch_rounds = r;
  }
  gathered_bytes += static_cast<double>(s.gathered_bytes);
  gathered_inputs += static_cast<double>(s.gathered_inputs);
  in_place_inputs += static_cast<double>(s.in_place_inputs);
  zero_copy_inputs += static_cast<double>(s.zero_copy_inputs);
  if (!s.strategy_used.empty() && part == 0) ++strategy_used[std::string(s.strategy_used)];
  for (const Stats::Candidate& c : std::span(s.compared).first(part == 0 ? s.compared.size() : 0)) {  // (part 0's: one a batch)
    std::array<double, 5>& sum = compared[std::string(c.name)];
    sum[0] += static_cast<double>(c.launches);
    sum[1] += static_cast<double>(c.gathers);
    sum[2] += static_cast<double>(c.gathered_bytes);
    sum[3] += c.cost_us;
    sum[4] += 1;
  }
  if (part == 0) steps += 1;
  for (const auto& [op, t] : s.by_op) {
    ExecCounters::OpTime& mine = by_op[op];
    mine.launches += t.launches;
    mine.gather_ms += t.gather_ms;
    mine.op_ms += t.op_ms;
  }
}

std::function<void(size_t)> StepMaker::operator()(System& s, std::function<at::Tensor(size_t)> forward) {
  using Clock = std::chrono::steady_clock;
  // A phase's time, to the device's idle point; nothing is timed without --profile.
  auto phase = [profile = profile_, device = device_](double& into, auto&& body) {
    if (!profile) return body();
    synchronize(device);
    auto t0 = Clock::now();
    auto result = body();
    synchronize(device);
    into += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return result;
  };
  std::shared_ptr<System::Phases> phases = s.phases;
  if (!train_) return [forward, phase, phases](size_t b) {
    c10::NoGradGuard no_grad;
    LaunchCounter::set_phase(LaunchCounter::kForward);
    phase(phases->forward, [&] { return forward(b); });
    phases->steps += 1;
  };
  s.gradients = [forward, params = params_, scale = scale_] {
    const at::Tensor loss = forward(0) * scale;
    std::vector<at::Tensor> grads = torch::autograd::grad({loss}, params, {}, false, false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = at::zeros_like(params[i]);  // a parameter this loss does not use
      else if (grads[i].is_sparse()) grads[i] = grads[i].to_dense();  // (sums repeated rows)
      grads[i] = grads[i].cpu();
    }
    return grads;
  };
  optimizers_.push_back(std::make_unique<torch::optim::Adagrad>(params_, torch::optim::AdagradOptions(0.05)));
  torch::optim::Adagrad* opt = optimizers_.back().get();
  return [forward, opt, scale = scale_, phase, phases](size_t b) {
    opt->zero_grad();
    LaunchCounter::set_phase(LaunchCounter::kForward);
    at::Tensor loss = phase(phases->forward, [&] { return forward(b); });
    LaunchCounter::set_phase(LaunchCounter::kBackward);
    phase(phases->backward, [&] {
      (loss * scale).backward();
      return 0;
    });
    LaunchCounter::set_phase(LaunchCounter::kOptimizer);
    phase(phases->optimizer, [&] { return opt->step(); });
    phases->steps += 1;
  };
}

std::vector<size_t> add_sheaf_systems(const Options& o, const SheafSystem& spec, bool train, size_t n_batches,
                                      StepMaker& make_step, const Prefetcher::Record& record,
                                      std::vector<System>& systems, SheafOwners& owners) {
  if (spec.overlap)  // (the batch split in parts: a workload that can split its batches runs it itself)
    throw UserError("sheaf-bench: +overlap systems are for gated_rvnn, shift_reduce and attention's inference");
  const GraphOptions graph = spec.graph(o.device, o.profile);
  std::vector<size_t> added;
  for (const Strategy* strategy : spec.strategies) {
    System s{"sheaf", spec.label(*strategy)};
    const size_t index = systems.size();
    auto finish = [&systems, index, train](Graph& g, std::span<const Expr> targets) {
      systems[index].counters.add(g.stats());
      return train ? targets[0].value() : at::Tensor();
    };
    if (spec.prefetch) {
      // Batch b+1 is recorded and scheduled on a worker thread while batch b runs.
      owners.prefetchers.push_back(std::make_unique<Prefetcher>(graph, record, ForwardOptions{.strategy = strategy}));
      Prefetcher* pf = owners.prefetchers.back().get();
      s.step = make_step(s, [pf, strategy, n_batches, finish](size_t b) {
        Prefetcher::Batch batch = pf->take(b, b + 1 < n_batches ? std::optional(b + 1) : std::nullopt);
        batch.graph.forward(batch.targets, {.strategy = strategy});
        return finish(batch.graph, batch.targets);
      });
    } else {
      owners.graphs.push_back(std::make_unique<Graph>(graph));
      Graph* g = owners.graphs.back().get();
      s.step = make_step(s, [g, strategy, record, finish](size_t b) {
        g->clear();
        const std::vector<Expr> targets = record(*g, b);
        g->forward(targets, {.strategy = strategy});
        return finish(*g, targets);
      });
    }
    added.push_back(index);
    systems.push_back(std::move(s));
  }
  return added;
}

// Train: each system's gradients of batch 0 against per-example's, on the
// parameters before any step (each system's steps move the shared ones).
void check_gradients(std::vector<System>& systems) {
  auto reference = std::find_if(systems.begin(), systems.end(), [](const System& s) { return s.name == "per-example"; });
  if (reference == systems.end() || !reference->gradients) return;
  const std::vector<at::Tensor> want = reference->gradients();
  double scale = 0;
  for (const at::Tensor& g : want) scale = std::max(scale, g.abs().max().item<double>());
  reference->extra["max_abs_grad"] = scale;  // what the others' differences compare with
  for (System& s : systems) {
    if (&s == &*reference || !s.gradients) continue;
    const std::vector<at::Tensor> got = s.gradients();
    // (A system may train a model of its own, made with per-example's seed:
    // the same parameters, in the same order, or the figure means nothing.)
    bool comparable = got.size() == want.size();
    for (size_t i = 0; comparable && i < want.size(); ++i) comparable = got[i].sizes() == want[i].sizes();
    if (!comparable)
      throw UserError("sheaf-bench: system '" + s.name + (s.strategy.empty() ? "" : ":" + s.strategy) +
                      "' trains parameters that do not match per-example's; its gradients cannot be compared");
    double d = 0;
    for (size_t i = 0; i < want.size(); ++i) d = std::max(d, max_diff(got[i], want[i]));
    s.max_abs_grad_diff = d;
  }
}

std::vector<std::vector<double>> measure(const Options& o, std::vector<System>& systems, size_t n_batches,
                                         double items_per_pass) {
  using Clock = std::chrono::steady_clock;
  const c10::Device device(o.device);
  const int repeat = o.repeat;
  const bool progress = !o.json;
  std::vector<std::vector<double>> runs(systems.size());
  check_gradients(systems);
  // Warm-up: allocator caches, lazy initialisation, first-touch of parameters.
  for (System& s : systems) s.step(0);
  // Launches, counted in a pass of their own (the counter costs time); with
  // --profile, every system's time per op too.
  for (System& s : systems) {
    LaunchCounter counter(o.profile);
    for (size_t b = 0; b < n_batches; ++b) s.step(b);
    const auto c = counter.counts();
    for (size_t p = 0; p < s.launches.size(); ++p) s.launches[p] = static_cast<double>(c[p]) / static_cast<double>(n_batches);
    if (o.profile) s.op_times = counter.by_op();
    s.counted_batches = static_cast<double>(n_batches);
  }
  for (System& s : systems) s.counters = {}, *s.phases = {};
  synchronize(device);
  size_t last = systems.size();
  for (int r = 0; r < repeat; ++r) {
    const std::vector<size_t> order = pass_order(systems.size(), r, o.order == "balanced", last);
    if (!order.empty()) last = order.back();  // (a workload may have left no system to run)
    for (const size_t k : order) {
      // On a GPU, an untimed step first: the system that ran after another
      // paid ~27 ms more for its first batch on an H200 (TreeLSTM, batch 256:
      // whichever Sheaf strategy came first, half its throughput). With this
      // step it paid ~9 ms more; the cause is not established (the allocator
      // is the suspect), so the first Sheaf system after per-example still
      // reads low there.
      if (device.is_cuda()) {
        systems[k].step(0);
        synchronize(device);
      }
      auto t0 = Clock::now();
      for (size_t b = 0; b < n_batches; ++b) systems[k].step(b);
      synchronize(device);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      runs[k].push_back(items_per_pass / s);
      if (progress) std::fprintf(stderr, "\r  repeat %d/%d  %-22s %10.1f /s   ", r + 1, repeat,
                                 (systems[k].name + (systems[k].strategy.empty() ? "" : ":" + systems[k].strategy)).c_str(),
                                 runs[k].back());
    }
  }
  if (progress) std::fprintf(stderr, "\r%80s\r", "");
  return runs;
}

Workload load_trees(const Options& o) {
  Workload w;
  if (!o.data.empty()) {
    data::Vocab vocab;
    data::Treebank bank = data::load_treebank(o.data, 1, vocab);
    w.trees = std::move(bank.train);
    w.vocab = static_cast<int64_t>(vocab.size());
  } else {
    w.trees = data::synthetic_trees({.count = static_cast<int>(o.trees), .seed = 1});
    w.vocab = 5000;
  }
  if (static_cast<int64_t>(w.trees.size()) > o.trees) w.trees.resize(static_cast<size_t>(o.trees));
  const auto batch = static_cast<size_t>(o.batch);
  for (size_t start = 0; start + batch <= w.trees.size(); start += batch) {
    w.batches.emplace_back();
    for (size_t i = start; i < start + batch; ++i) w.batches.back().push_back(&w.trees[i]);
  }
  if (w.batches.empty()) throw UserError("fewer trees than one batch");
  if (!o.json) {
    data::TreeStats st = data::stats_of(w.trees);
    std::printf("trees: %zu (%s), mean %.1f words, mean height %.1f, max height %d; %zu batches of %lld\n", st.trees,
                o.data.empty() ? "synthetic" : o.data.c_str(), st.mean_words, st.mean_height, st.max_height,
                w.batches.size(), static_cast<long long>(o.batch));
  }
  return w;
}

void report(const Options& o, const std::string& mode, int64_t hidden, int64_t items, const std::vector<System>& systems,
            const std::vector<std::vector<double>>& runs) {
  double per_example = 0, hand = 0;
  for (size_t k = 0; k < systems.size(); ++k) {
    if (systems[k].name == "per-example") per_example = median(runs[k]);
    if (systems[k].name == "hand") hand = median(runs[k]);
  }
  if (!o.json) {
    if (o.profile) std::printf("\nPROFILE: phases synchronised with the device; throughput below is not comparable");
    std::printf("\n%s, %s, hidden %lld, batch %lld, %lld items, %d thread(s), %s; median of %d\n", o.workload.c_str(),
                mode.c_str(), static_cast<long long>(hidden), static_cast<long long>(o.batch),
                static_cast<long long>(items), o.threads, o.device.c_str(), o.repeat);
    std::printf("  %-20s %12s %10s %10s %10s %10s %10s\n", "system", "items/s", "vs per-ex", "vs hand", "launches",
                "sched ms", "max|diff|");
  }
  for (size_t k = 0; k < systems.size(); ++k) {
    const System& s = systems[k];
    const double tps = median(runs[k]);
    const double steps = std::max(1.0, s.counters.steps);
    if (o.json) {
      Json j;
      j.add("workload", o.workload).add("system", s.name).add("strategy", s.strategy).add("mode", mode)
          .add("device", o.device).add("hidden", hidden).add("batch", o.batch).add("trees", items)
          .add("threads", o.threads).add("repeat", o.repeat).add("order", o.order).add("host_memory", o.host_memory)
          .add("trees_per_sec", tps).add("runs", runs[k])
          .add("speedup_vs_per_example", per_example > 0 ? tps / per_example : 0.0)
          .add("ratio_vs_hand", hand > 0 ? tps / hand : 0.0)
          .add("launches_per_batch", s.counters.launches / steps)
          .add("launches_forward", s.launches[LaunchCounter::kForward])
          .add("launches_backward", s.launches[LaunchCounter::kBackward])
          .add("launches_optimizer", s.launches[LaunchCounter::kOptimizer])
          .add("trace_ms_per_batch", s.counters.trace_ms / steps)
          .add("sched_ms_per_batch", s.counters.sched_ms / steps)
          .add("exec_ms_per_batch", s.counters.exec_ms / steps)
          .add("gathered_bytes_per_batch", s.counters.gathered_bytes / steps)
          .add("gathered_inputs_per_batch", s.counters.gathered_inputs / steps)
          .add("in_place_inputs_per_batch", s.counters.in_place_inputs / steps)
          .add("zero_copy_inputs_per_batch", s.counters.zero_copy_inputs / steps)
          .add("max_abs_diff_vs_per_example", s.max_abs_diff);
      if (!std::isnan(s.max_abs_grad_diff)) j.add("max_abs_grad_diff_vs_per_example", s.max_abs_grad_diff);
      if (!s.counters.strategy_used.empty()) {  // the schedule most batches used (auto: what it picked)
        auto most = s.counters.strategy_used.begin();
        for (auto it = most; it != s.counters.strategy_used.end(); ++it)
          if (it->second > most->second) most = it;
        j.add("strategy_used", most->first);
      }
      // What auto weighed, per candidate: [launches, gathers, gathered bytes,
      // cost in us] (scheduler/cost.h), averaged over the batches in which it
      // compared (each batch's last comparison: Stats keeps one).
      for (const auto& [name, sum] : s.counters.compared)
        j.add("compared_" + name, std::vector<double>{sum[0] / sum[4], sum[1] / sum[4], sum[2] / sum[4], sum[3] / sum[4]});
      if (o.profile) {
        const double ph = std::max(1.0, s.phases->steps);
        j.add("profile", 1).add("forward_ms_per_batch", s.phases->forward / ph)
            .add("backward_ms_per_batch", s.phases->backward / ph)
            .add("optimizer_ms_per_batch", s.phases->optimizer / ph)
            .add("gather_ms_per_batch", s.counters.gather_ms / steps)
            .add("op_ms_per_batch", s.counters.op_ms / steps);
      }
      for (const auto& [key, value] : s.extra) j.add(key, value);
      std::printf("%s\n", j.str().c_str());
    } else {
      std::string name = s.name + (s.strategy.empty() ? "" : ":" + s.strategy);
      std::printf("  %-20s %12.1f %9.2fx %9.2fx %10.1f %10.2f %10.2g", name.c_str(), tps,
                  per_example > 0 ? tps / per_example : 0.0, hand > 0 ? tps / hand : 0.0, s.counters.launches / steps,
                  s.counters.sched_ms / steps, s.max_abs_diff);
      for (const auto& [key, value] : s.extra) std::printf("  %s %.1f", key.c_str(), value);
      std::printf("\n");
      if (o.profile) {
        const double ph = std::max(1.0, s.phases->steps);
        std::printf("  %-20s ms/batch: forward %.2f", "", s.phases->forward / ph);
        if (s.counters.steps > 0)  // a Sheaf system: its forward's parts
          std::printf(" (trace %.2f, schedule %.2f, gathers %.2f, ops %.2f)", s.counters.trace_ms / steps,
                      s.counters.sched_ms / steps, s.counters.gather_ms / steps, s.counters.op_ms / steps);
        std::printf(", backward %.2f, optimizer %.2f\n", s.phases->backward / ph, s.phases->optimizer / ph);
        for (const auto& [op, t] : s.counters.by_op)
          std::printf("  %-20s   sheaf %-22s %7.1f launches, gathers %6.2f ms, op %6.2f ms per batch\n", "",
                      op.c_str(), static_cast<double>(t.launches) / steps, t.gather_ms / steps, t.op_ms / steps);
        // Every system's top-level ops, from the counting pass (not synchronised: CPU times).
        std::vector<std::pair<double, std::string>> ops;
        for (const auto& [op, t] : s.op_times) ops.emplace_back(t.ms, op);
        std::sort(ops.rbegin(), ops.rend());
        for (size_t k = 0; k < ops.size() && k < 40; ++k) {
          const auto& t = s.op_times.at(ops[k].second);
          std::printf("  %-20s   aten  %-22s %7.1f launches, %6.2f ms per batch\n", "", ops[k].second.c_str(),
                      static_cast<double>(t.launches) / s.counted_batches, t.ms / s.counted_batches);
        }
      }
    }
  }
  std::fflush(stdout);
}

}  // namespace sheaf::bench
