#include "data_parallel.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sparse_coo_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <sheaf/core/error.h>

#include "store.h"

namespace sheaf {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Each rank's heartbeat and phase live in the store (one key: "beats phase"),
// so that when a collective fails the survivors can tell a dead worker from a
// hung one. A FileStore appends every write to its file and never compacts
// it: there a beat comes every second (~25 bytes a second a rank, ~7x less).
constexpr auto kBeat = std::chrono::milliseconds(300);
constexpr auto kFileBeat = std::chrono::milliseconds(1000);

std::string signature_of(std::span<const at::Tensor> params, const std::vector<bool>& sparse) {
  std::ostringstream os;
  os << params.size() << " parameters";
  for (size_t i = 0; i < params.size(); ++i)
    os << "\nparameter " << i << ": " << params[i].sizes() << " " << params[i].dtype() << (sparse[i] ? " sparse" : "");
  return os.str();
}

// Gloo's TCP pairs write to their sockets without MSG_NOSIGNAL. When a peer
// dies, the next write raises SIGPIPE, whose default action kills this
// worker before the collective's error can name the dead rank (CI saw a
// survivor exit 141). Python ignores SIGPIPE at start, so PyTorch never
// shows this; a C++ worker must do the same. Only where the disposition is
// still the default: a program's own handler stays.
void ignore_sigpipe() {
  struct sigaction now {};
  if (sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

std::string as_string(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }
std::vector<uint8_t> as_bytes(const std::string& s) { return {s.begin(), s.end()}; }

}  // namespace

struct DataParallel::Impl {
  Rendezvous where;
  DataParallelOptions o;
  std::vector<at::Tensor> params;
  std::vector<bool> sparse;
  std::vector<detail::Bucket> buckets;
  std::vector<size_t> bucket_of;   // per parameter
  std::vector<int64_t> offset_of;  // per dense parameter: elements into its bucket's flat tensor

  struct Live {
    std::vector<at::Tensor> tensors;  // what the collective reduces (one tensor)
    size_t missing = 0;               // gradients not yet arrived this step
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Live> live;
  std::vector<at::Tensor> flats;      // per dense bucket, kept between steps
  std::vector<bool> got;
  std::vector<at::Tensor> sparse_grads;
  // Each parameter's .grad from before this backward, where it holds
  // something (moved out, not copied): the summed gradients are added to it,
  // as loss.backward() adds to .grad (micro-batches: two backward calls
  // before a step). Left in place, autograd would add this rank's own
  // gradient to it, which the summed one could only replace. A .grad of
  // zeros (LibTorch 1.13's zero_grad zeroes in place) stays where it is:
  // replacing the sum there is adding to it, and autograd then writes into
  // it instead of making a second set of gradients.
  std::vector<at::Tensor> before;
  std::vector<size_t> zeroed;  // parameters whose zero .grad stayed in place
  size_t next_launch = 0;
  bool armed = false;
  // Set when a backward threw after some of its buckets went out: this rank's
  // collectives no longer pair with the others' (the message for every later call).
  std::string broken;
  int local = 0;  // LocalGradients alive: gradients outside backward() are this rank's own
  std::mutex mu;  // hooks may run on autograd's device threads

  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::vector<unsigned> hooks;
  int64_t step = 0;
  DataParallelStats stats;

  std::atomic<int64_t> phase{0};  // 2 x step while in backward, + 1 after; published by the heartbeat
  std::thread beat;
  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool stopping = false;

  std::string who() const { return "sheaf::DataParallel (" + where.describe() + ")"; }
  double timeout_s() const { return std::chrono::duration<double>(o.timeout).count(); }
  // Asks `done` every `step` until it holds (true) or `deadline` passes
  // (false): the store's own waits all use its one timeout.
  template <class Done>
  static bool poll(Done done, Clock::time_point deadline, std::chrono::milliseconds step) {
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(step);
    }
    return true;
  }
  std::string key(const char* what, int r) const { return detail::cat("sheaf/", what, "/", r); }
  std::chrono::milliseconds beat_every() const { return where.file.empty() ? kBeat : kFileBeat; }
  void put_beat(int64_t beats) {
    store->set(key("beat", where.rank), as_bytes(detail::cat(beats, " ", phase.load())));
  }
  struct Beat {
    int64_t beats, phase;
  };
  std::vector<Beat> read_beats() {
    std::vector<Beat> out;
    for (int r = 0; r < where.world_size; ++r) {
      const std::string v = as_string(store->get(key("beat", r)));
      const size_t space = v.find(' ');
      out.push_back(Beat{std::stoll(v.substr(0, space)), std::stoll(v.substr(space + 1))});
    }
    return out;
  }

  // The store's own errors while the workers meet (a worker, or rank 0 and
  // its store, gone before Gloo connects) as a DistributedError, as a collective's are.
  template <class F>
  void through_store(const char* what, F f) {
    try {
      f();
    } catch (const UserError&) {
      throw;
    } catch (const DistributedError&) {
      throw;
    } catch (const std::exception& e) {
      throw DistributedError(detail::cat(who(), ": ", what, " failed: the rendezvous store ",
                                         where.rank == 0 ? "did not get every worker's part (did one stop?)"
                                                         : "does not answer (did rank 0 stop?)",
                                         " [", e.what(), "]"));
    }
  }

  void join() {
    store = detail::open_store(where, o.timeout);
    roll_call();
    through_store("publishing this worker's heartbeat", [&] { put_beat(0); });
    beat = std::thread([this] {
      int64_t n = 0;
      std::unique_lock lock(beat_mu);
      while (!beat_cv.wait_for(lock, beat_every(), [this] { return stopping; })) {
        try {
          // The phase travels with the heartbeat, not at every step: a store
          // round trip per step costs both ranks' cores on a busy machine.
          put_beat(++n);
        } catch (const std::exception&) {
          return;  // the store is gone: the main thread finds out at its next collective
        }
      }
    });
    through_store("comparing the workers' models", [&] { check_same_model(); });
    try {
      auto options = c10d::ProcessGroupGloo::Options::create();
      options->timeout = o.timeout;
      options->devices.push_back(gloo_device());
      pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("gloo", store),
                                                       where.rank, where.world_size, options);
    } catch (const std::exception& e) {
      throw DistributedError(who() + ": Gloo could not connect the workers: " + e.what());
    }
  }

  // GLOO_SOCKET_IFNAME names the interface, as in PyTorch; a world on one
  // machine (a file store, or a loopback MASTER_ADDR) stays on loopback;
  // otherwise Gloo picks the address this host's name resolves to.
  std::shared_ptr<::gloo::transport::Device> gloo_device() const {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != 0)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    const std::string& a = where.master_addr;
    if (!where.file.empty() || a == "localhost" || a.starts_with("127.") || a == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  // Before anything else, a roll call: each rank claims its number and says
  // the world it was started for; rank 0 waits for every claim (or the
  // timeout) and publishes one verdict that every rank acts on, so that two
  // workers with one RANK, workers started with different WORLD_SIZEs, or a
  // worker that never comes are a UserError saying so on every rank that
  // came, not a store's timeout (or a hang) further on. (A duplicate that
  // claims after the verdict stops alone: the others form a whole world.)
  void roll_call() {
    const std::string verdict_key = "sheaf/roll-call/verdict";
    through_store("the roll call", [&] {
      // A verdict before this worker's claim is an earlier roll call's (in a
      // fresh file rank 0 writes one only after claims, or after its window
      // closed): every worker of this run says so, and none claims in it.
      if (!where.file.empty()) {
        // (A write first: LibTorch 1.13's FileStore makes its file on the
        // first write, and a read before it waits for the file.)
        store->add("sheaf/roll-call/came", 1);
        if (store->check({verdict_key})) {
          // Its verdict tells the two apart: this run's failure (a rank that
          // did not arrive in time) is the one to act on.
          const std::string earlier = verdict_text(store->get(verdict_key));
          throw UserError(who() + ": the rendezvous file " + where.file +
                          " holds a roll call that already ended (an earlier run's, or this run's, which this "
                          "worker came too late for; its verdict: " + (earlier.empty() ? "every rank came" : earlier) +
                          "): remove the file and start every worker again");
        }
      }
      if (store->add(key("rank", where.rank), 1) > 1) {
        // Rank 0 a duplicate (an earlier run's rank 0 died before its verdict):
        // its message is the verdict, or the others would wait for one.
        if (where.rank == 0 && !where.file.empty())
          store->compareSet(verdict_key, {}, verdict_bytes(duplicate(0)));
        throw UserError(who() + ": " + duplicate(where.rank));
      }
      store->set(key("world", where.rank), as_bytes(std::to_string(where.world_size)));
      if (where.rank == 0) return judge(verdict_key);
      // The others wait for rank 0 to come, then for its verdict (it waits at
      // most the timeout for the last claim), then say they read it.
      auto wait_for = [&](const std::string& k, Clock::duration limit) {
        return poll([&] { return store->check({k}); }, Clock::now() + limit, std::chrono::milliseconds(10));
      };
      if (!wait_for(key("world", 0), o.timeout))
        throw UserError(detail::cat(who(), ": rank 0 did not come within ", timeout_s(),
                                    " s (is rank 0 running, with this MASTER_ADDR/MASTER_PORT or rendezvous file?)"));
      if (!wait_for(verdict_key, o.timeout + std::chrono::seconds(5)))
        throw UserError(detail::cat(who(), ": rank 0 came but gave no verdict on the roll call within ",
                                    timeout_s() + 5, " s"));
      const std::string verdict = verdict_text(store->get(verdict_key));
      const int64_t world0 = std::stoll(as_string(store->get(key("world", 0))));
      store->set(key("roll-call-read", where.rank), as_bytes("1"));
      if (!verdict.empty()) throw UserError(detail::cat(who(), ": ", verdict));
      // (A rank beyond rank 0's world is not in its roll call.)
      if (world0 != where.world_size)
        throw UserError(detail::cat(who(), ": rank 0 was started with WORLD_SIZE=", world0, ", this rank with ",
                                    where.world_size, " (every worker needs the same WORLD_SIZE)"));
    });
  }

  std::string duplicate(int r) const {
    return detail::cat("two workers were started with RANK=", r, " (each needs its own rank, 0..WORLD_SIZE-1",
                       where.file.empty() ? ")" : "; or the rendezvous file is left from an earlier run: remove it)");
  }

  // A verdict is stored after one byte, never empty: compareSet with an empty
  // expected value sets a key that is missing and also one whose value is
  // empty, so a success stored as "" could be replaced by a late duplicate's.
  static std::vector<uint8_t> verdict_bytes(const std::string& verdict) { return as_bytes("v" + verdict); }
  static std::string verdict_text(const std::vector<uint8_t>& bytes) {
    const std::string s = as_string(bytes);
    return s.empty() ? s : s.substr(1);
  }

  // Rank 0's part of the roll call: one check of all claims per poll, and
  // each claim looked at as it comes (a known mismatch does not wait out the
  // timeout for a rank still missing).
  void judge(const std::string& verdict_key) {
    const int world = where.world_size;
    std::vector<std::string> claims;
    for (int r = 0; r < world; ++r) claims.push_back(key("rank", r));
    std::vector<bool> came(static_cast<size_t>(world), false);
    came[0] = true;
    int count = 1;
    std::string verdict;
    auto look = [&] {
      for (int r = 1; r < world && verdict.empty(); ++r) {
        const size_t ri = static_cast<size_t>(r);
        if (came[ri] || !store->check({claims[ri]})) continue;
        came[ri] = true;
        ++count;
        const int64_t theirs = std::stoll(as_string(store->get(key("world", r))));
        if (store->add(claims[ri], 0) > 1) verdict = duplicate(r);
        else if (theirs != world)
          verdict = detail::cat("rank ", r, " was started with WORLD_SIZE=", theirs, ", rank 0 with ", world,
                                " (every worker needs the same WORLD_SIZE)");
      }
    };
    auto next_look = Clock::now();
    poll([&] {
      const bool all = store->check(claims);
      if (all || Clock::now() >= next_look) {
        look();
        next_look = Clock::now() + std::chrono::milliseconds(100);
      }
      // (On a file store a second rank 0 may have given its verdict: see below.)
      return all || !verdict.empty() || count == world || (!where.file.empty() && store->check({verdict_key}));
    }, Clock::now() + o.timeout, std::chrono::milliseconds(10));
    look();  // claims made since the last look, within the timeout's last 100 ms
    for (int r = 1; r < world && verdict.empty(); ++r)  // a duplicate that claimed after its rank was looked at
      if (came[static_cast<size_t>(r)] && store->add(claims[static_cast<size_t>(r)], 0) > 1) verdict = duplicate(r);
    if (verdict.empty() && count < world) {
      std::string missing;
      for (int r = 1; r < world; ++r)
        if (!came[static_cast<size_t>(r)]) missing += detail::cat(missing.empty() ? "" : ", ", r);
      verdict = detail::cat("rank(s) ", missing, " did not arrive within ", timeout_s(), " s (were all ", world,
                            " workers started, with the same MASTER_ADDR/MASTER_PORT?)");
    }
    // Set only if none is there: a second rank 0 on a file store (two started
    // with RANK=0, or an earlier run's) gives its own verdict, and every rank,
    // this one too, acts on the one that was first.
    verdict = verdict_text(store->compareSet(verdict_key, {}, verdict_bytes(verdict)));
    if (verdict.empty()) return;
    // Rank 0 serves the store: it stays until the ranks that came have read
    // the verdict (or a moment has passed), so that they report it too.
    std::vector<std::string> readers;
    for (int r = 1; r < world; ++r)
      if (came[static_cast<size_t>(r)]) readers.push_back(key("roll-call-read", r));
    poll([&] { return readers.empty() || store->check(readers); },
         Clock::now() + std::min<Clock::duration>(o.timeout, std::chrono::seconds(5)), std::chrono::milliseconds(5));
    throw UserError(detail::cat(who(), ": ", verdict));
  }

  // Every rank publishes its parameter list and compares it with everyone's,
  // so that all of them stop with the same message.
  void check_same_model() {
    const std::string mine = signature_of(params, sparse);
    store->set(key("model", where.rank), as_bytes(mine));
    std::vector<std::string> theirs;
    for (int r = 0; r < where.world_size; ++r) theirs.push_back(as_string(store->get(key("model", r))));
    // Rank 0 serves the store: it stays until every rank has read every model.
    const std::string read = "sheaf/models-read";
    store->add(read, 1);
    poll([&] { return where.rank != 0 || store->add(read, 0) >= where.world_size; }, Clock::now() + o.timeout,
         std::chrono::milliseconds(5));
    for (int r = 0; r < where.world_size; ++r)
      if (theirs[static_cast<size_t>(r)] != mine)
        throw UserError(detail::cat(who(), ": the workers' models differ (were they all started with the same "
                                    "flags, e.g. --hidden?): ", first_difference(theirs[static_cast<size_t>(r)], mine, r)));
  }

  // "rank 1 has parameter 0: [5000, 65] Float, this rank has 0: [5000, 64] Float"
  std::string first_difference(const std::string& theirs, const std::string& mine, int r) const {
    std::istringstream a(theirs), b(mine);
    std::string x, y;
    while (true) {
      const bool more_a = static_cast<bool>(std::getline(a, x)), more_b = static_cast<bool>(std::getline(b, y));
      if (!more_a || !more_b || x != y) {
        return detail::cat("rank ", r, " has ", more_a ? x : "no more parameters", ", this rank has ",
                           more_b ? y : "no more parameters");
      }
    }
  }

  void plan() {
    std::vector<int64_t> bytes;
    std::vector<bool> flags(params.size(), false);
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.defined() || !p.requires_grad() || !p.is_leaf())
        throw UserError(detail::cat(who(), ": parameter ", i, " is not a leaf tensor that requires a gradient"));
      for (const at::Tensor& s : o.sparse) flags[i] = flags[i] || s.is_same(p);
      bytes.push_back(static_cast<int64_t>(p.numel() * p.element_size()));
    }
    for (const at::Tensor& s : o.sparse)
      if (std::none_of(params.begin(), params.end(), [&](const at::Tensor& p) { return s.is_same(p); }))
        throw UserError(who() + ": a tensor in DataParallelOptions::sparse is not one of the parameters");
    sparse = flags;
    buckets = detail::plan_buckets(bytes, sparse, static_cast<int64_t>(o.bucket_mb * (1 << 20)));
    bucket_of.assign(params.size(), 0);
    offset_of.assign(params.size(), 0);
    live.resize(buckets.size());
    flats.resize(buckets.size());
    sparse_grads.resize(params.size());
    for (size_t k = 0; k < buckets.size(); ++k) {
      int64_t n = 0;
      for (size_t i : buckets[k].params) {
        bucket_of[i] = k;
        offset_of[i] = n;
        n += params[i].numel();
        const at::Tensor& first = params[buckets[k].params[0]];
        if (!buckets[k].sparse && (params[i].scalar_type() != first.scalar_type() || params[i].device() != first.device()))
          throw UserError(detail::cat(who(), ": parameters ", buckets[k].params[0], " (", first.scalar_type(), " on ",
                                      first.device(), ") and ", i, " (", params[i].scalar_type(), " on ",
                                      params[i].device(), ") share a gradient bucket but differ in type or device "
                                      "(bucket_mb smaller than either keeps them apart)"));
      }
      if (!buckets[k].sparse) flats[k] = at::empty({n}, params[buckets[k].params[0]].options());
    }
  }

  void on_grad(size_t i, const at::Tensor& grad) {
    std::lock_guard lock(mu);
    if (!armed) {
      if (local > 0) return;
      throw UserError(detail::cat(
          who(), ": parameter ", i, " ", params[i].sizes(), " got a gradient outside DataParallel::backward (a plain "
          "loss.backward(), or autograd::grad over the parameters): it would not be summed across the ", where.world_size,
          " workers, and their models would drift apart. Call dp.backward(loss); for gradients meant for this rank "
          "alone, hold `auto local = dp.local_gradients();` while computing them"));
    }
    const size_t k = bucket_of[i];
    if (sparse[i]) {
      if (!grad.is_sparse())
        throw UserError(detail::cat(who(), ": parameter ", i, " is listed in DataParallelOptions::sparse but got a "
                                    "dense gradient (a lookup without sparse gradients?)"));
      sparse_grads[i] = sparse_grads[i].defined() ? sparse_grads[i] + grad : grad;
    } else {
      if (grad.is_sparse())
        throw UserError(detail::cat(who(), ": parameter ", i, " ", params[i].sizes(), " got a sparse gradient: "
                                    "list it in DataParallelOptions::sparse"));
      at::Tensor slot = flats[k].narrow(0, offset_of[i], params[i].numel());
      if (got[i]) slot.add_(grad.reshape(-1));
      else slot.copy_(grad.reshape(-1));
    }
    if (!got[i]) {
      got[i] = true;
      --live[k].missing;
    }
    if (o.overlap) launch_ready(true);
  }

  // Buckets go out strictly in order: a collective is matched across ranks by
  // its position in the sequence.
  void launch_ready(bool in_backward) {
    while (next_launch < buckets.size() && live[next_launch].missing == 0) launch(next_launch++, in_backward);
  }

  void launch(size_t k, bool in_backward) {
    const detail::Bucket& b = buckets[k];
    Live& l = live[k];
    c10::NoGradGuard no_grad;
    if (!b.sparse) {
      for (size_t i : b.params)
        if (!got[i]) flats[k].narrow(0, offset_of[i], params[i].numel()).zero_();
      l.tensors = {flats[k]};
    } else {
      const size_t i = b.params[0];
      const at::Tensor& p = params[i];
      at::Tensor g = sparse_grads[i];
      if (!g.defined()) {  // no rows from this rank
        std::vector<int64_t> rows(p.sizes().begin(), p.sizes().end());
        rows[0] = 0;
        g = at::sparse_coo_tensor(at::empty({1, 0}, p.options().dtype(at::kLong)), at::empty(rows, p.options()),
                                  p.sizes());
      }
      g = g.coalesce();
      sparse_grads[i] = at::Tensor();
      l.tensors = {o.sparse_mode == DataParallelOptions::Sparse::densify ? g.to_dense() : g};
    }
    stats.bytes += l.tensors[0].is_sparse()
                       ? (l.tensors[0]._indices().numel() * 8 + l.tensors[0]._values().numel() *
                                                                    l.tensors[0].element_size())
                       : l.tensors[0].numel() * l.tensors[0].element_size();
    ++stats.collectives;
    stats.launched_in_backward += in_backward;
    l.work = guarded("launching a gradient allreduce", [&] { return pg->allreduce(l.tensors); });
  }

  void check_usable() const {
    if (!broken.empty()) throw UserError(broken);
  }

  void backward(const at::Tensor& loss) {
    check_usable();
    ++stats.steps;
    const auto t0 = Clock::now();
    const bool runs = loss.defined() && loss.requires_grad();
    if (where.world_size == 1) {
      if (runs) loss.backward();
      stats.backward_ms += ms_since(t0);
      return;
    }
    ++step;
    phase = 2 * step;
    {
      std::lock_guard lock(mu);
      got.assign(params.size(), false);
      for (size_t k = 0; k < buckets.size(); ++k) live[k].missing = buckets[k].params.size();
      next_launch = 0;
      armed = true;
    }
    set_aside_grads();
    try {
      if (runs) loss.backward();
    } catch (...) {
      std::lock_guard lock(mu);
      armed = false;
      for (at::Tensor& g : sparse_grads) g = at::Tensor();
      restore_grads(0);  // (as they were: a step run again adds to them once)
      // Nothing sent yet: the others wait for this rank's first bucket, which
      // the next backward sends (the step may be skipped or retried, on every
      // rank alike). Some sent: the others' next buckets would pair with the
      // next step's first ones, and a rank that skips the step drifts apart.
      if (next_launch == 0) {  // the step did not happen: its number is the next one's again
        --step;
        phase = 2 * step + 1;
      } else {
        broken = detail::cat(who(), ": step ", step, "'s backward threw after ", next_launch, " of ", buckets.size(),
                             " gradient buckets went out to the other ranks, so this rank's collectives no longer "
                             "pair with theirs and it cannot go on (skipping the step would let the models drift "
                             "apart). Let the exception end this worker: the others stop with an error naming it");
      }
      throw;
    }
    stats.backward_ms += ms_since(t0);
    const auto t1 = Clock::now();
    phase = 2 * step + 1;
    {
      std::lock_guard lock(mu);
      armed = false;
      for (auto& l : live) l.missing = 0;  // whatever did not arrive is zero
      launch_ready(false);
    }
    c10::NoGradGuard no_grad;
    for (size_t k = 0; k < buckets.size(); ++k) {
      try {
        guarded("a gradient allreduce", [&] { return live[k].work->wait(); });
      } catch (const std::exception& e) {
        // The buckets not written yet get their .grad back; this rank's
        // collectives no longer pair with the others'.
        restore_grads(k);
        broken = e.what();
        throw;
      }
      write_back(k);
    }
    stats.wait_ms += ms_since(t1);
  }

  void set_aside_grads() {
    before.assign(params.size(), at::Tensor());
    zeroed.clear();
    // Which dense .grads hold anything: one host read for all of them.
    std::vector<size_t> dense;
    std::vector<at::Tensor> nonzero;
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      if (!g.defined()) continue;
      if (g.is_sparse()) {
        before[i] = std::exchange(params[i].mutable_grad(), at::Tensor());
        continue;
      }
      dense.push_back(i);
      nonzero.push_back(g.ne(0).any());
    }
    if (dense.empty()) return;
    const at::Tensor held = at::stack(nonzero).cpu().contiguous();
    const bool* holds = held.data_ptr<bool>();
    for (size_t k = 0; k < dense.size(); ++k) {
      const size_t i = dense[k];
      if (holds[k]) before[i] = std::exchange(params[i].mutable_grad(), at::Tensor());
      else zeroed.push_back(i);
    }
  }

  // The .grad of the parameters of buckets `first` on, as before this backward.
  void restore_grads(size_t first) {
    c10::NoGradGuard no_grad;
    std::vector<bool> restore(params.size(), false);
    for (size_t k = first; k < buckets.size(); ++k)
      for (size_t i : buckets[k].params) restore[i] = true;
    for (size_t i : zeroed)
      if (restore[i]) {
        params[i].mutable_grad().zero_();  // (autograd added into it in place)
        restore[i] = false;
      }
    for (size_t i = 0; i < params.size(); ++i)
      if (restore[i]) params[i].mutable_grad() = std::move(before[i]);  // (undefined where it was)
  }

  void write_back(size_t k) {
    const detail::Bucket& b = buckets[k];
    // Gloo's sparse allreduce returns a new tensor; a dense one sums in place.
    at::Tensor reduced = b.sparse && live[k].tensors[0].is_sparse() ? live[k].work->result()[0] : live[k].tensors[0];
    live[k].work.reset();
    if (o.average) reduced = reduced / static_cast<double>(where.world_size);
    for (size_t i : b.params) {
      at::Tensor& grad = params[i].mutable_grad();
      at::Tensor value = b.sparse ? reduced : reduced.narrow(0, offset_of[i], params[i].numel()).view(params[i].sizes());
      at::Tensor& old = before[i];
      if (old.defined() && !old.is_sparse()) grad = std::move(old.add_(value));  // (dense += dense or sparse)
      else if (old.defined()) grad = value + old;
      else if (!b.sparse && grad.defined() && !grad.is_sparse() && grad.sizes() == params[i].sizes()) grad.copy_(value);
      else grad = b.sparse ? value : value.clone();
      old = at::Tensor();
    }
  }

  // Runs one collective step; its failure goes through fail().
  template <class F>
  std::invoke_result_t<F&> guarded(const char* what, F&& f) {
    try {
      return f();
    } catch (const std::exception& e) {
      fail(what, e);
    }
  }

  // Names the rank that stopped (its heartbeat ended) or that is behind (it
  // has not reached this step's phase), when the store can still tell.
  [[noreturn]] void fail(const char* what, const std::exception& e) {
    std::string cause;
    try {
      const std::vector<Beat> beat0 = read_beats();
      std::this_thread::sleep_for(4 * beat_every());
      const std::vector<Beat> beat1 = read_beats();
      const int64_t mine = phase.load();
      for (int r = 0; r < where.world_size; ++r) {
        const size_t ri = static_cast<size_t>(r);
        if (r == where.rank) continue;
        const int64_t theirs = beat1[ri].phase;
        if (beat1[ri].beats == beat0[ri].beats)
          cause += detail::cat("; rank ", r, " stopped (no heartbeat: the process died or was killed) during step ",
                               (theirs + 1) / 2);
        else if (theirs < mine)
          cause += detail::cat("; rank ", r, " is alive but ",
                               theirs % 2 == 0 ? "still in step " + std::to_string(theirs / 2) + "'s backward"
                                               : "has not started step " + std::to_string(step),
                               " (hung, or slower than the timeout of ",
                               timeout_s(), " s)");
      }
      if (cause.empty()) cause = "; every rank is alive and reached this step";
    } catch (const std::exception&) {
      cause = where.rank == 0 ? "; the rendezvous store does not answer"
                              : "; rank 0 stopped (its rendezvous store does not answer: the process died or was "
                                "killed)";
    }
    throw DistributedError(detail::cat(who(), ": ", what, " failed in step ", step, cause.substr(1), " [", e.what(),
                                       "]"));
  }

  // Where the ranks' values differ (the first position, and the least and
  // largest value there), or nothing. A collective over tensors of different
  // sizes hangs or fails inside Gloo, naming nothing: one small collective
  // (the largest of each value and of its negation) before the real one.
  struct Mismatch {
    size_t index;
    int64_t fewest, most;
  };
  std::optional<Mismatch> differs(const char* what, std::span<const int64_t> values) {
    std::vector<int64_t> both(values.begin(), values.end());
    for (int64_t v : values) both.push_back(-v);
    std::vector<at::Tensor> t{at::tensor(both, at::kLong)};
    c10d::AllreduceOptions largest;
    largest.reduceOp = c10d::ReduceOp::MAX;
    guarded(what, [&] { return pg->allreduce(t, largest)->wait(); });
    const auto a = t[0].accessor<int64_t, 1>();
    const auto n = static_cast<int64_t>(values.size());
    for (int64_t i = 0; i < n; ++i)
      if (a[i] != -a[n + i]) return Mismatch{static_cast<size_t>(i), -a[n + i], a[i]};
    return std::nullopt;
  }

  void broadcast(std::span<const at::Tensor> tensors, bool checked) {
    if (where.world_size == 1) return;
    if (checked) {
      // How many tensors, then each one's size, rank and type.
      const auto n = static_cast<int64_t>(tensors.size());
      if (const auto m = differs("comparing what each rank broadcasts", std::span(&n, 1)))
        throw UserError(detail::cat(who(), ": DataParallel::broadcast got ", n, " tensors on this rank, but the ranks "
                                    "passed from ", m->fewest, " to ", m->most, ": every rank must pass the same tensors"));
      std::vector<int64_t> shapes;
      for (const at::Tensor& t : tensors) {
        shapes.push_back(t.numel());
        shapes.push_back(t.dim());
        shapes.push_back(static_cast<int64_t>(t.scalar_type()));
      }
      static constexpr const char* kWhat[] = {"size", "rank", "type"};
      if (const auto m = n > 0 ? differs("comparing what each rank broadcasts", shapes) : std::nullopt) {
        const at::Tensor& t = tensors[m->index / 3];
        throw UserError(detail::cat(who(), ": DataParallel::broadcast: tensor ", m->index / 3, " (", t.sizes(), " ",
                                    t.scalar_type(), " on this rank) differs in ", kWhat[m->index % 3],
                                    " between the ranks: every rank must pass tensors of the same shapes and types"));
      }
    }
    c10::NoGradGuard no_grad;
    for (const at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t.is_contiguous() ? t : t.contiguous()};
      guarded("a broadcast", [&] { return pg->broadcast(one)->wait(); });
      if (!one[0].is_same(t)) at::Tensor(t).copy_(one[0]);
    }
  }

  ~Impl() {
    for (size_t i = 0; i < hooks.size(); ++i) params[i].remove_hook(hooks[i]);
    if (pg && std::uncaught_exceptions() == 0 && broken.empty()) {
      // The store's server is rank 0: it stays until every rank is done with it.
      try {
        pg->barrier()->wait();
      } catch (const std::exception&) {
      }
    }
    {
      std::lock_guard lock(beat_mu);
      stopping = true;
    }
    beat_cv.notify_all();
    if (beat.joinable()) beat.join();
  }
};

DataParallel::DataParallel(std::vector<at::Tensor> params, const Rendezvous& where, DataParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  where.check();  // (one worker never opens a store, where it would be checked)
  Impl& m = *impl_;
  m.where = where;
  m.o = std::move(options);
  m.params = std::move(params);
  if (m.o.bucket_mb <= 0) throw UserError(m.who() + ": bucket_mb must be positive");
  m.plan();
  if (where.world_size == 1) return;
  ignore_sigpipe();
  m.join();
  m.broadcast(m.params, false);  // (check_same_model has compared them)
  for (size_t i = 0; i < m.params.size(); ++i)
    m.hooks.push_back(m.params[i].register_hook([&m, i](const at::Tensor& grad) { m.on_grad(i, grad); }));
}

DataParallel::~DataParallel() = default;

int DataParallel::rank() const { return impl_->where.rank; }
int DataParallel::world_size() const { return impl_->where.world_size; }

std::vector<size_t> DataParallel::shard(std::span<const double> work) const {
  return balanced_shards(work, world_size())[static_cast<size_t>(rank())];
}

void DataParallel::backward(const at::Tensor& loss) { impl_->backward(loss); }
DataParallel::LocalGradients DataParallel::local_gradients() {
  std::lock_guard lock(impl_->mu);
  ++impl_->local;
  return LocalGradients(this);
}

DataParallel::LocalGradients::~LocalGradients() {
  if (dp_ == nullptr) return;
  std::lock_guard lock(dp_->impl_->mu);
  --dp_->impl_->local;
}

void DataParallel::broadcast(std::span<const at::Tensor> tensors) {
  impl_->check_usable();
  impl_->broadcast(tensors, true);
}
std::vector<double> DataParallel::sum(std::vector<double> values) {
  impl_->check_usable();
  if (world_size() == 1) return values;
  // First how many (sum() is for an epoch's numbers, not per step: one more
  // small collective per call is nothing).
  const auto n = static_cast<int64_t>(values.size());
  if (const auto m = impl_->differs("comparing how many values each rank sums", std::span(&n, 1)))
    throw UserError(detail::cat(impl_->who(), ": DataParallel::sum got ", n, " values on this rank, but the ranks "
                                "passed from ", m->fewest, " to ", m->most, ": every rank must sum the same number"));
  if (values.empty()) return values;
  std::vector<at::Tensor> t{at::tensor(values, at::kDouble)};
  impl_->guarded("summing host values", [&] { return impl_->pg->allreduce(t)->wait(); });
  const auto a = t[0].accessor<double, 1>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = a[static_cast<int64_t>(i)];
  return values;
}

void DataParallel::barrier() {
  impl_->check_usable();
  if (world_size() == 1) return;
  impl_->guarded("a barrier", [&] { return impl_->pg->barrier()->wait(); });
}
const DataParallelStats& DataParallel::stats() const { return impl_->stats; }
void DataParallel::reset_stats() { impl_->stats = {}; }

}  // namespace sheaf
