// One data-parallel worker for the tests (tests/distributed/test_data_parallel.cpp
// and ctest's launch-two-workers): trains a small TreeLSTM for a few steps with
// sheaf::DataParallel, rendezvous from the environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), then checks its parameters against ONE worker
// training on the whole batches in this same process. Exit status: 0 equal,
// 1 different, 2 a UserError, 3 a DistributedError, 4 anything else.
//
//   sheaf-dp-worker [--steps N] [--batch N] [--hidden N] [--sparse gather|densify|none]
//                   [--bucket-mb X] [--no-overlap] [--timeout-ms N]
//                   [--file PATH] (meet through a FileStore: RANK and WORLD_SIZE only)
//                   [--die-at STEP] [--hang-at STEP] (this rank only: set them per rank)
//                   [--plain-backward-at STEP] (loss.backward() instead of dp.backward: a UserError)
//                   [--local-grad-at STEP] (first a local gradient under dp.local_gradients())
//                   [--rank R] [--world-size N] (instead of the environment's, for a misconfigured worker)
//                   [--sum N] (after training: dp.sum of N values, each rank + 1, printed)
//                   [--throw-in-backward-at STEP] (this rank: that step's backward throws once, from a hook
//                    on the embedding's gradient, the last to arrive; the worker catches it and runs the step again)
//                   [--broadcast SIZES] (after training: dp.broadcast of tensors of these sizes, e.g. 3,4;
//                    each filled with rank + 1; the sums of what arrived printed)
//                   [--accumulate K] (each step's shard in K micro-batches, a backward each, one
//                    optimizer step: the gradients add up, with one worker and with several)
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <unistd.h>

#include <data/trees.h>
#include <sheaf/sheaf.h>
#include <tree_lstm/model.h>

using namespace sheaf;

namespace {

struct Args {
  int steps = 3, batch = 8, hidden = 16, die_at = -1, hang_at = -1, timeout_ms = 20000;
  int plain_backward_at = -1, local_grad_at = -1, rank = -1, world_size = -1, sum = -1, throw_at = -1;
  int accumulate = 1;
  std::string broadcast;
  double bucket_mb = 0.01;  // small: several buckets, launched during backward
  bool overlap = true;
  std::string sparse = "gather";
  std::string file;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw UserError(k + " needs a value");
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--hidden") a.hidden = std::stoi(next());
    else if (k == "--sparse") a.sparse = next();
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(next());
    else if (k == "--no-overlap") a.overlap = false;
    else if (k == "--timeout-ms") a.timeout_ms = std::stoi(next());
    else if (k == "--die-at") a.die_at = std::stoi(next());
    else if (k == "--hang-at") a.hang_at = std::stoi(next());
    else if (k == "--plain-backward-at") a.plain_backward_at = std::stoi(next());
    else if (k == "--local-grad-at") a.local_grad_at = std::stoi(next());
    else if (k == "--rank") a.rank = std::stoi(next());
    else if (k == "--world-size") a.world_size = std::stoi(next());
    else if (k == "--sum") a.sum = std::stoi(next());
    else if (k == "--file") a.file = next();
    else if (k == "--throw-in-backward-at") a.throw_at = std::stoi(next());
    else if (k == "--broadcast") a.broadcast = next();
    else if (k == "--accumulate") a.accumulate = std::stoi(next());
    else throw UserError("unknown option " + k);
  }
  if (a.sparse != "gather" && a.sparse != "densify" && a.sparse != "none") throw UserError("--sparse: " + a.sparse);
  if (a.accumulate < 1) throw UserError("--accumulate: at least 1");
  return a;
}

using Batch = std::vector<const data::Tree*>;

// `steps` updates; with dp, each on this rank's shard of the batch.
void train(const Args& a, models::TreeLSTM& m, const std::vector<data::Tree>& trees, DataParallel* dp) {
  // Plain SGD: the parameters differ by lr x the gradients' difference. (Adagrad's
  // first step is about lr x sign(g), which turns rounding in gradients near zero
  // into differences of ~1e-5 between ANY two summation orders.)
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.5));
  Graph g;
  int throw_at = a.throw_at;
  bool retrying = false;  // the step after a backward that threw: its gradients not zeroed again
  // The examples' summed loss over the whole batch's size (undefined for none), recorded and run on g.
  auto loss_of = [&](const Batch& examples, size_t batch_size) {
    g.clear();
    if (examples.empty()) return at::Tensor();
    Expr total = m.sheaf_batch_loss(g, examples);
    g.forward(total);
    return total.value() / static_cast<double>(batch_size);
  };
  for (int s = 0; s < a.steps; ++s) {
    Batch batch, mine;
    std::vector<double> work;
    for (int i = 0; i < a.batch; ++i) {
      batch.push_back(&trees[static_cast<size_t>(s * a.batch + i)]);
      work.push_back(batch.back()->size());
    }
    if (dp == nullptr) mine = batch;
    else
      for (size_t i : dp->shard(work)) mine.push_back(batch[i]);
    if (a.accumulate > 1) {
      // Micro-batch j: every accumulate-th example of the shard from j on
      // (maybe none: every rank still calls backward), its loss over the
      // whole batch; the step's gradient is the sum of the K backward calls.
      opt.zero_grad();
      for (int j = 0; j < a.accumulate; ++j) {
        Batch micro;
        for (size_t i = static_cast<size_t>(j); i < mine.size(); i += static_cast<size_t>(a.accumulate))
          micro.push_back(mine[i]);
        const at::Tensor loss = loss_of(micro, batch.size());
        if (dp != nullptr) dp->backward(loss);
        else if (loss.defined()) loss.backward();
      }
      opt.step();
      continue;
    }
    const at::Tensor loss = loss_of(mine, batch.size());
    if (dp != nullptr && s == a.die_at) _exit(9);
    if (dp != nullptr && s == a.hang_at) std::this_thread::sleep_for(std::chrono::hours(1));
    if (dp != nullptr && s == a.local_grad_at && loss.defined()) {
      // A gradient for this rank alone (as a gradient penalty would take),
      // then the step's own: the result must not change.
      auto local = dp->local_gradients();
      loss.backward({}, /*retain_graph=*/true);
    }
    // (A retried step keeps what the failed backward left: DataParallel puts
    // every .grad back as it was, so the step adds to them once.)
    if (!retrying) opt.zero_grad();
    retrying = false;
    if (dp != nullptr && s == throw_at && loss.defined()) {
      // As a step that runs out of memory in backward: caught, and the step run again.
      const unsigned hook = m.E.register_hook([](const at::Tensor&) -> at::Tensor {
        throw std::runtime_error("simulated failure in backward");
      });
      try {
        dp->backward(loss);
      } catch (const std::exception& e) {
        if (std::string(e.what()).find("simulated failure") == std::string::npos) throw;
        std::printf("step %d: backward threw; running the step again\n", s);
        std::fflush(stdout);
      }
      m.E.remove_hook(hook);
      --s;
      throw_at = -1;
      retrying = true;
      continue;
    }
    if (dp != nullptr && s != a.plain_backward_at) dp->backward(loss);
    else if (loss.defined()) loss.backward();
    opt.step();
  }
}

int run(const Args& a) {
  Rendezvous where = Rendezvous::from_env();
  if (a.rank >= 0) where.rank = a.rank;
  if (a.world_size >= 0) where.world_size = a.world_size;
  if (!a.file.empty()) where = Rendezvous::file_store(a.file, where.rank, where.world_size);
  const std::vector<data::Tree> trees =
      data::synthetic_trees({.count = a.steps * a.batch, .max_words = 12, .vocab_size = 200, .seed = 3});
  const models::TreeLSTMOptions mo{.vocab = 200, .hidden = a.hidden, .sparse_embedding_grad = a.sparse != "none"};
  // Different seeds per rank: DataParallel must broadcast rank 0's values.
  models::TreeLSTM model(mo, 1 + static_cast<uint64_t>(where.rank));
  DataParallelOptions o{.timeout = std::chrono::milliseconds(a.timeout_ms), .bucket_mb = a.bucket_mb,
                        .overlap = a.overlap};
  if (a.sparse != "none") o.sparse = {model.E};
  o.sparse_mode = a.sparse == "densify" ? DataParallelOptions::Sparse::densify : DataParallelOptions::Sparse::gather;
  DataParallel dp(model.parameters(), where, o);
  train(a, model, trees, &dp);
  if (a.sum >= 0) {
    std::string summed;
    for (double v : dp.sum(std::vector<double>(static_cast<size_t>(a.sum), where.rank + 1.0)))
      summed += " " + std::to_string(static_cast<int>(v));
    std::printf("summed:%s\n", summed.c_str());
  }

  if (!a.broadcast.empty()) {
    std::vector<at::Tensor> ts;
    for (size_t at = 0; at < a.broadcast.size();) {
      const size_t comma = std::min(a.broadcast.find(',', at), a.broadcast.size());
      ts.push_back(at::full({std::stoll(a.broadcast.substr(at, comma - at))}, where.rank + 1.0));
      at = comma + 1;
    }
    dp.broadcast(ts);
    std::string got;
    for (const at::Tensor& t : ts) got += " " + std::to_string(static_cast<int>(t.sum().item<double>()));
    std::printf("broadcast:%s\n", got.c_str());
  }

  models::TreeLSTM alone(mo, 1);
  train(a, alone, trees, nullptr);
  double diff = 0;
  for (size_t i = 0; i < alone.parameters().size(); ++i)
    diff = std::max(diff, (model.parameters()[i] - alone.parameters()[i]).abs().max().item<double>());
  const DataParallelStats& st = dp.stats();
  std::printf("%s: max |data-parallel - one worker| = %.3g after %d steps; %lld collectives (%lld during "
              "backward), %lld bytes\n",
              where.describe().c_str(), diff, a.steps, static_cast<long long>(st.collectives),
              static_cast<long long>(st.launched_in_backward), static_cast<long long>(st.bytes));
  return diff <= 1e-5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    set_threads(1);
    return run(parse(argc, argv));
  } catch (const UserError& e) {
    std::fprintf(stderr, "user error: %s\n", e.what());
    return 2;
  } catch (const DistributedError& e) {
    std::fprintf(stderr, "distributed error: %s\n", e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 4;
  }
}
