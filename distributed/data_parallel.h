// Data-parallel training over LibTorch's c10d: every worker (a process, on
// this machine or another) records and runs its share of each batch in its own
// Graph, and the gradients are summed across workers by Gloo while backward
// still runs.
//
//   sheaf::DataParallel dp(model.parameters(), sheaf::Rendezvous::from_env(),
//                          {.sparse = {model.E}});      // broadcasts rank 0's values
//   for (auto& batch : batches) {
//     auto mine = dp.shard(work_of(batch));             // this rank's examples
//     ... record them on g, g.forward(loss) ...
//     opt.zero_grad();
//     dp.backward(loss.value() / batch.size());         // the WHOLE batch's size
//     opt.step();                                       // same update on every rank
//   }
//
// Gradients are SUMMED across ranks. Divide each rank's summed loss by the
// whole batch's size, and the update equals one worker's on the whole batch,
// however unevenly the shards split it (`average` gives PyTorch DDP's mean
// instead, exact only when every rank's loss is a mean over equally many
// examples). Every rank must call backward() once per step, even with an empty
// shard (pass an undefined tensor, or one that needs no gradient).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "plan.h"
#include "rendezvous.h"

namespace sheaf {

// A worker died, hung past the timeout, or a collective failed: says which rank
// (when the survivors can tell) and at which step.
class DistributedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DataParallelOptions {
  // How long a collective or the rendezvous may wait for the slowest worker.
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
  // Dense gradients travel in buckets of about this size, each launched as soon
  // as backward has produced all of its gradients (and every earlier bucket
  // has been launched: ranks must launch in the same order).
  double bucket_mb = 4;
  bool overlap = true;  // false: every bucket launched after backward returns
  bool average = false; // divide the summed gradients by the world size
  // Parameters whose gradients are sparse (e.g. a lookup table with sparse
  // gradients). Anything else that gets a sparse gradient is a UserError.
  std::vector<at::Tensor> sparse;
  // How sparse gradients travel: gathered from every rank (Gloo's sparse
  // allreduce: indices and rows) or made dense and summed like the others.
  enum class Sparse { gather, densify } sparse_mode = Sparse::gather;
};

struct DataParallelStats {
  int64_t steps = 0;
  int64_t collectives = 0;             // buckets launched
  int64_t launched_in_backward = 0;    // of those, launched while backward was still running
  int64_t bytes = 0;                   // this rank's gradient bytes sent into collectives
  double backward_ms = 0;              // inside autograd (collectives may run meanwhile)
  double wait_ms = 0;                  // after backward: launching the rest, waiting, writing .grad
};

class DataParallel {
 public:
  // Joins the other workers (a world of one needs no store and no peers),
  // checks that every rank has the same parameter shapes and types, and
  // broadcasts rank 0's values. The parameters must outlive this object.
  DataParallel(std::vector<at::Tensor> params, const Rendezvous& where, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const;
  int world_size() const;
  bool is_root() const { return rank() == 0; }

  // The examples of a batch this rank takes, given each one's work (e.g. its
  // node count): balanced_shards(work, world_size())[rank()].
  std::vector<size_t> shard(std::span<const double> work) const;

  // loss.backward(), with each parameter's gradient summed (or averaged)
  // over ranks and ADDED to its .grad, as loss.backward() adds: several calls
  // before a step accumulate (micro-batches), the same with one worker as
  // with many. A parameter no rank touched gets a zero gradient. If loss.backward()
  // throws before any bucket went out (always so without overlap), the step
  // may be run again; after, every later call is a UserError (this rank's
  // collectives no longer pair with the others').
  void backward(const at::Tensor& loss);

  // With two or more workers, a parameter's gradient computed outside
  // backward() (a plain loss.backward(); on LibTorch 2.x also an
  // autograd::grad over the parameters, whose hooks 1.13 does not run) is a
  // UserError thrown from that backward: it would not be summed, each rank
  // would step with its own, and the models would drift apart (sheaf's
  // check_batched over these parameters counts too). Gradients meant for
  // this rank alone (a gradient penalty, a saliency map) are computed while
  // the guard lives; it covers every thread, and must not outlive `dp`:
  //   { auto local = dp.local_gradients(); auto g = torch::autograd::grad(...); }
  class LocalGradients {
   public:
    LocalGradients(LocalGradients&& o) noexcept : dp_(std::exchange(o.dp_, nullptr)) {}
    LocalGradients(const LocalGradients&) = delete;
    LocalGradients& operator=(const LocalGradients&) = delete;
    LocalGradients& operator=(LocalGradients&&) = delete;
    ~LocalGradients();

   private:
    friend class DataParallel;
    explicit LocalGradients(DataParallel* dp) : dp_(dp) {}
    DataParallel* dp_;
  };
  [[nodiscard]] LocalGradients local_gradients();

  // Copies rank 0's values into these tensors on every rank (e.g. optimizer
  // state after a resume). Every rank passes as many tensors of the same
  // sizes and types (compared first: a UserError on every rank otherwise).
  void broadcast(std::span<const at::Tensor> tensors);
  // Sums a few host numbers over the ranks (e.g. an epoch's loss and counts).
  std::vector<double> sum(std::vector<double> values);
  void barrier();

  const DataParallelStats& stats() const;
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sheaf
