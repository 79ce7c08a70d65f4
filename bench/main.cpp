// sheaf-bench: runs the same work per example, with Sheaf, and hand-batched, in
// one process, and reports throughput and ratios (JSON lines with --json).
//
//   sheaf-bench --workload treelstm --data ../shared/data/sst --hidden 128,256 --json
#include <CLI/CLI.hpp>

#include <cstdio>

#include <sheaf/sheaf.h>

#include <common/cli.h>

#include "harness.h"

int main(int argc, char** argv) {
  sheaf::bench::Options o;
  CLI::App app{"sheaf-bench: per-example vs Sheaf vs hand-batched, side by side"};
  app.add_option("--workload", o.workload,
                 "treelstm, shift_reduce, gated_rvnn (a dsl::cond at every tree node), tagger, tagger-char (BiLSTM "
                 "taggers; rare words spelled by a char BiLSTM), attention (seq2seq with dot-product attention on digit "
                 "strings of 3-20; infer is greedy decoding), transformer (an encoder layer tagging sentences of 5-40 "
                 "words; --hidden is its width), host (recording and scheduling a TreeLSTM batch, no "
                 "launch), calibrate (what a launch and a gathered MiB cost here: sheaf::CostModel), or products (Sheaf's "
                 "packed product against the BLAS, shape by shape, with --threads)")
      ->check(CLI::IsMember({"treelstm", "shift_reduce", "gated_rvnn", "tagger", "tagger-char", "attention", "transformer", "host", "calibrate", "products"}));
  app.add_option("--data", o.data,
                 "SST directory (train.txt, dev.txt, test.txt); for the taggers a word|TAG file or a directory with "
                 "train.txt; default: synthetic data");
  app.add_option("--write-data", o.write_data,
                 "taggers: write the sentences they would use (the synthetic corpus, or --data's) to this file in "
                 "DyNet's word|TAG format and exit: the same data for another system (bench/dynet)");
  app.add_option("--hidden", o.hidden, "hidden sizes")->delimiter(',');
  app.add_option("--batch", o.batch, "trees per batch")->check(sheaf::models::kPositiveNumber);
  app.add_option("--trees", o.trees, "trees (taggers: sentences; attention: pairs) per timed pass (a multiple of --batch is used)")->check(sheaf::models::kPositiveNumber);
  app.add_option("--repeat", o.repeat, "timed passes per system (the median is reported)")->check(sheaf::models::kPositiveNumber);
  app.add_option("--order", o.order,
                 "the systems' order in each timed repeat: balanced (rows of a Williams design: within repeats, each "
                 "system right after each other equally often over k repeats for k systems, 2k for an odd k; fewer "
                 "repeats balance in part; bench/pass_order.h) or fixed (as --systems lists them)")
      ->check(CLI::IsMember({"balanced", "fixed"}));
  app.add_option("--systems", o.systems, "per-example, sheaf (every strategy), sheaf:<strategy>, hand; treelstm, the taggers and training on shift_reduce and attention also "
                 "sheaf[:<strategy>]+prefetch (records the next batch on a second host thread); gated_rvnn, shift_reduce and "
                 "attention's inference also sheaf[:<strategy>]+overlap (the batch as two parts on two threads whose kernels "
                 "take turns: sheaf::Overlap); suffixes /unfused, /eager, /inline, "
                 "/unpacked (bench/harness.h); treelstm also hand:sheaf-gemm (hand with Sheaf's packed-weight product kernel), transformer hand:sheaf-attention (hand with Sheaf's CPU attention loop)")->delimiter(',');
  app.add_option("--modes", o.modes, "train, infer")->delimiter(',')->check(CLI::IsMember({"train", "infer"}));
  app.add_option("--threads", o.threads, sheaf::models::kThreadsHelp)->check(sheaf::models::kPositiveNumber);
  app.add_option("--device", o.device, "cpu or cuda");
  app.add_flag("--root-only", o.root_only, "classify the root only (default: every node, as DyNet's benchmark)");
  app.add_flag("--json", o.json, "one JSON object per measurement");
  app.add_flag("--profile", o.profile,
               "time each phase (forward: trace, schedule, gathers, ops; backward; optimizer) with the device "
               "synchronised between them; throughput is then not comparable");
  app.add_option("--host-memory", o.host_memory,
                 "retain: sheaf::retain_host_memory() at start, for every system (glibc keeps freed memory instead "
                 "of faulting it in again each batch); default: glibc's own settings")
      ->check(CLI::IsMember({"retain", "default"}));
  bool info = false;
  app.add_flag("--info", info, "print the LibTorch/BLAS/threads line and exit");
  CLI11_PARSE(app, argc, argv);
  if (!o.write_data.empty() && !o.workload.starts_with("tagger")) {
    std::fprintf(stderr, "sheaf-bench: --write-data is for --workload tagger or tagger-char, not %s\n", o.workload.c_str());
    return 2;
  }
  // (These make their own data: --data there was read by nothing, and the
  // figures were for synthetic data. The transformer reads a tagged corpus.)
  if (!o.data.empty() && (o.workload == "attention" || o.workload == "calibrate" || o.workload == "products")) {
    std::fprintf(stderr, "sheaf-bench: --data is not read by --workload %s (it makes its own data)\n",
                 o.workload.c_str());
    return 2;
  }
  if (info) {
    sheaf::set_threads(o.threads);
    std::printf("%s\n", sheaf::runtime_info().c_str());
    return 0;
  }

  int status = 1;
  try {
    sheaf::set_threads(o.threads);
    if (o.host_memory == "retain" && !sheaf::retain_host_memory()) o.host_memory = "default";
    if (!o.json) std::printf("%s\n", sheaf::runtime_info().c_str());
    if (o.workload == "host") status = sheaf::bench::run_host(o);
    else if (o.workload == "calibrate") status = sheaf::bench::run_calibrate(o);
    else if (o.workload == "products") status = sheaf::bench::run_products(o);
    else if (o.workload == "gated_rvnn") status = sheaf::bench::run_gated_rvnn(o);
    else if (o.workload.starts_with("tagger")) status = sheaf::bench::run_tagger(o);
    else if (o.workload == "attention") status = sheaf::bench::run_attention(o);
    else if (o.workload == "transformer") status = sheaf::bench::run_transformer(o);
    else status = o.workload == "treelstm" ? sheaf::bench::run_treelstm(o) : sheaf::bench::run_shift_reduce(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sheaf-bench: %s\n", e.what());
    return 1;
  }
  // Results that could not be written (a full disk, a closed pipe) are a
  // failure: exit 0 with the JSON lost read as a run with nothing to say.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "sheaf-bench: could not write the results to standard output\n");
    return 1;
  }
  return status;
}
