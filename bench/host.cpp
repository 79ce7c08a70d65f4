// Host work only: recording and scheduling a TreeLSTM batch, no launch
// (Graph::prepare plans the round and stops). Nanoseconds per node for
// recording and for each scheduling step, the median over batches.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>

#include <data/trees.h>
#include <tree_lstm/model.h>

#include "harness.h"

namespace sheaf::bench {

int run_host(const Options& o) {
  const Workload w = load_trees(o);
  for (int64_t hidden : o.hidden) {
    models::TreeLSTM model({.vocab = w.vocab, .hidden = hidden}, 7);
    for (const std::string& name : o.systems) {
      const std::optional<SheafSystem> spec = parse_sheaf_system(name);
      if (!spec) continue;  // host work is Sheaf's alone
      for (const Strategy* strategy : spec->strategies) {
        GraphOptions options = spec->graph("cpu");
        options.strategy = strategy;
        Graph g(options);
        std::vector<double> record, round, fuse, strat, plan, total;
        double nodes = 0;
        double recorded = 0;  // every batch's nodes, warm-up included (scripts/host-instructions.sh divides by it)
        for (int r = 0; r < o.repeat + 1; ++r)
          for (const auto& batch : w.batches) {
            g.clear();
            const auto t0 = std::chrono::steady_clock::now();
            Expr loss = model.sheaf_batch_loss(g, batch);
            const auto t1 = std::chrono::steady_clock::now();
            g.prepare(std::span(&loss, 1));
            const auto t2 = std::chrono::steady_clock::now();
            recorded += static_cast<double>(g.size());
            if (r == 0) continue;  // warm-up
            const Stats& s = g.stats();
            nodes = static_cast<double>(g.size());
            const double per = 1e6 / nodes;
            record.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() * per);
            round.push_back(s.round_ms * per);
            fuse.push_back(s.fuse_ms * per);
            strat.push_back(s.strategy_ms * per);
            plan.push_back(s.plan_ms * per);
            total.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count() * per);
          }
        const std::string label = spec->label(*strategy);
        if (o.json) {
          Json j;
          j.add("workload", "host").add("system", "sheaf").add("strategy", label).add("hidden", hidden)
              .add("batch", o.batch).add("nodes_per_batch", nodes).add("record_ns_per_node", median(record))
              .add("round_ns_per_node", median(round)).add("fuse_ns_per_node", median(fuse))
              .add("strategy_ns_per_node", median(strat)).add("plan_ns_per_node", median(plan))
              .add("trace_schedule_ns_per_node", median(total))
              .add("trace_schedule_ms_per_batch", median(total) * nodes * 1e-6).add("nodes_recorded", recorded);
          std::printf("%s\n", j.str().c_str());
        } else {
          std::printf("host, sheaf:%s, batch %lld, %.0f nodes: ns per node: record %.1f, round %.1f, fuse %.1f, "
                      "strategy %.1f, plan %.1f; trace + schedule %.1f, %.2f ms a batch (median of %zu batches)\n",
                      label.c_str(), static_cast<long long>(o.batch), nodes, median(record), median(round), median(fuse),
                      median(strat), median(plan), median(total), median(total) * nodes * 1e-6, total.size());
        }
      }
    }
  }
  return 0;
}

}  // namespace sheaf::bench
