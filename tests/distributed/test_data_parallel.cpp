// sheaf::DataParallel: the pure planning (shards, buckets), and real workers:
// sheaf-dp-worker processes on loopback, each checking itself against one
// worker on the whole batches, and the failures a user meets (a worker that
// dies or hangs, different models, nobody at the address).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ops/zeros.h>
#include <sheaf/core/error.h>
#include <sheaf/distributed/data_parallel.h>

// After LibTorch's headers: glog's CHECK would replace Catch's.
#include <catch2/catch.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// A port nobody listens on now (the kernel's pick; free again once closed).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t n = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &n);
  close(s);
  return ntohs(a.sin_port);
}

struct Exit {
  int status = -1;  // exit status, or -1 if killed at the deadline
  std::string out;  // stdout and stderr
};

// Starts one worker per entry of `args` with RANK/WORLD_SIZE/MASTER_* set (plus
// `env`), waits until the ranks in `awaited` (default: all) have exited or
// `deadline` has passed, and kills what is left.
std::vector<Exit> run_workers(const std::vector<std::vector<std::string>>& args,
                              std::map<std::string, std::string> env = {}, std::chrono::seconds deadline = 120s,
                              std::vector<size_t> awaited = {}) {
  const int world = static_cast<int>(args.size());
  const fs::path dir = fs::temp_directory_path() / ("sheaf-dp-" + std::to_string(getpid()) + "-" +
                                                    std::to_string(free_port()));
  fs::create_directories(dir);
  if (!env.count("MASTER_ADDR")) env["MASTER_ADDR"] = "127.0.0.1";
  if (!env.count("MASTER_PORT")) env["MASTER_PORT"] = std::to_string(free_port());
  if (!env.count("WORLD_SIZE")) env["WORLD_SIZE"] = std::to_string(world);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> e = env;
    if (!e.count("RANK")) e["RANK"] = std::to_string(r);
    std::vector<std::string> vars;
    for (char** p = environ; *p != nullptr; ++p) {
      const std::string v = *p;
      if (!e.count(v.substr(0, v.find('=')))) vars.push_back(v);
    }
    for (const auto& [k, v] : e) vars.push_back(k + "=" + v);
    std::vector<std::string> argv{SHEAF_DP_WORKER};
    argv.insert(argv.end(), args[static_cast<size_t>(r)].begin(), args[static_cast<size_t>(r)].end());
    std::vector<char*> cargv, cenv;
    for (auto& s : argv) cargv.push_back(s.data());
    for (auto& s : vars) cenv.push_back(s.data());
    cargv.push_back(nullptr);
    cenv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = (dir / (std::to_string(r) + ".log")).string();
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = 0;
    REQUIRE(posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), cenv.data()) == 0);
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  std::vector<Exit> out(static_cast<size_t>(world));
  const auto end = std::chrono::steady_clock::now() + deadline;
  if (awaited.empty())
    for (size_t r = 0; r < pids.size(); ++r) awaited.push_back(r);
  auto waiting = [&] { return std::any_of(awaited.begin(), awaited.end(), [&](size_t r) { return pids[r] > 0; }); };
  while (waiting() && std::chrono::steady_clock::now() < end) {
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      if (pids[r] > 0 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        out[r].status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pids[r] = 0;
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  for (pid_t p : pids)
    if (p > 0) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  for (size_t r = 0; r < out.size(); ++r) {
    std::ifstream f(dir / (std::to_string(r) + ".log"));
    std::stringstream ss;
    ss << f.rdbuf();
    out[r].out = ss.str();
  }
  fs::remove_all(dir);
  return out;
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("balanced_shards splits work evenly, deterministically, each example once", "[distributed]") {
  const std::vector<double> work{9, 1, 1, 1, 5, 4, 3, 2, 8, 6};
  for (int world : {1, 2, 3, 4, 16}) {
    const auto shards = sheaf::balanced_shards(work, world);
    REQUIRE(shards.size() == static_cast<size_t>(world));
    std::vector<int> seen(work.size(), 0);
    double most = 0;
    for (const auto& s : shards) {
      CHECK(std::is_sorted(s.begin(), s.end()));
      double load = 0;
      for (size_t i : s) ++seen[i], load += work[i];
      most = std::max(most, load);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    const double total = std::accumulate(work.begin(), work.end(), 0.0);
    // Greedy largest-first is within 4/3 of the best split (and of its lower bounds).
    CHECK(most <= std::max(total / world, 9.0) * 4 / 3 + 1e-9);
    CHECK(shards == sheaf::balanced_shards(work, world));
  }
  CHECK(sheaf::balanced_shards(work, 2)[0] != sheaf::balanced_shards(work, 2)[1]);
  CHECK_THROWS_AS(sheaf::balanced_shards(work, 0), sheaf::UserError);
  // Work that does not order (NaN) or is no amount (negative, infinite): named, not split by chance.
  for (double bad : {std::nan(""), -1.0, HUGE_VAL}) {
    std::vector<double> w = work;
    w[3] = bad;
    CHECK_THROWS_WITH(sheaf::balanced_shards(w, 2), Catch::Contains("example 3's work is"));
  }
}

TEST_CASE("plan_buckets: reverse order, capped, sparse gradients alone", "[distributed]") {
  const std::vector<int64_t> bytes{400, 100, 100, 300, 50};
  const auto b = sheaf::detail::plan_buckets(bytes, {true, false, false, false, false}, 350);
  REQUIRE(b.size() == 3);
  CHECK(b[0].params == std::vector<size_t>({4, 3}));  // 50 + 300
  CHECK(b[1].params == std::vector<size_t>({2, 1}));
  CHECK(!b[1].sparse);
  CHECK(b[2].params == std::vector<size_t>({0}));
  CHECK(b[2].sparse);
  // A parameter larger than the cap still gets a bucket of its own.
  CHECK(sheaf::detail::plan_buckets(bytes, std::vector<bool>(5, false), 10).size() == 5);
}

TEST_CASE("a gradient bucket of parameters of two types or devices is a UserError", "[distributed]") {
  // One worker: the buckets are planned all the same (no store is opened).
  const sheaf::Rendezvous alone;
  const at::Tensor f = at::zeros({4}).requires_grad_(), d = at::zeros({4}, at::kDouble).requires_grad_();
  const at::Tensor m = at::zeros({4}, at::TensorOptions().device(at::kMeta)).requires_grad_();
  CHECK_THROWS_WITH(sheaf::DataParallel({f, d}, alone), Catch::Contains("parameters 1 (Double on cpu) and 0 (Float on cpu)") &&
                                                          Catch::Contains("differ in type or device"));
  CHECK_THROWS_WITH(sheaf::DataParallel({m, f}, alone), Catch::Contains("(Float on meta)") &&
                                                          Catch::Contains("differ in type or device"));
  CHECK_NOTHROW(sheaf::DataParallel({f, d}, alone, {.bucket_mb = 1e-6}));  // each in a bucket of its own
}

TEST_CASE("Rendezvous reads torchrun's variables, and names a bad one", "[distributed]") {
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "1", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29500", 1);
  unsetenv("LOCAL_RANK");
  const sheaf::Rendezvous r = sheaf::Rendezvous::from_env();
  CHECK(r.rank == 1);
  CHECK(r.world_size == 2);
  CHECK(r.local_rank == 1);
  CHECK(r.master_addr == "10.0.0.7");
  CHECK(r.master_port == 29500);
  setenv("RANK", "2", 1);
  CHECK_THROWS_WITH(sheaf::Rendezvous::from_env(), Catch::Contains("RANK='2'"));
  setenv("RANK", "0", 1);
  setenv("MASTER_PORT", "http", 1);
  CHECK_THROWS_WITH(sheaf::Rendezvous::from_env(), Catch::Contains("MASTER_PORT='http'"));
  unsetenv("MASTER_PORT");
  CHECK_THROWS_WITH(sheaf::Rendezvous::from_env(), Catch::Contains("MASTER_PORT is not set"));
  for (const char* v : {"WORLD_SIZE", "MASTER_ADDR"}) unsetenv(v);
  // RANK 0 alone is a world of one; another rank alone would train as one too, on every example.
  CHECK(sheaf::Rendezvous::from_env().world_size == 1);
  setenv("RANK", "1", 1);
  CHECK_THROWS_WITH(sheaf::Rendezvous::from_env(), Catch::Contains("RANK='1' is set but WORLD_SIZE is not"));
  unsetenv("RANK");
  CHECK(sheaf::Rendezvous::from_env().world_size == 1);
  // Filled in by hand: one worker opens no store, and was never checked (its
  // shard() then indexed past the one shard).
  sheaf::Rendezvous alone;
  alone.rank = 1;
  const std::vector<at::Tensor> params{at::zeros({2}).requires_grad_()};
  CHECK_THROWS_WITH(sheaf::DataParallel(params, alone), Catch::Contains("rank 1 is not in 0..0"));
  alone.rank = 0;
  alone.world_size = 0;
  CHECK_THROWS_WITH(sheaf::DataParallel(params, alone), Catch::Contains("world size 0"));
  alone.world_size = 1;
  sheaf::DataParallel dp(params, alone);
  const std::vector<double> work{1.0, 2.0};
  CHECK(dp.shard(work) == std::vector<size_t>({0, 1}));
}

TEST_CASE("two workers on half batches equal one worker on the whole batches", "[distributed]") {
  for (const std::string sparse : {"none", "gather", "densify"}) {
    for (const bool overlap : {true, false}) {
      std::vector<std::string> a{"--steps", "3", "--sparse", sparse};
      if (!overlap) a.push_back("--no-overlap");
      INFO("--sparse " << sparse << (overlap ? "" : " --no-overlap"));
      const auto out = run_workers({a, a});
      for (const Exit& e : out) {
        INFO(e.out);
        CHECK(e.status == 0);
        CHECK_THAT(e.out, Catch::Contains("max |data-parallel - one worker|"));
      }
      if (overlap) CHECK_THAT(out[0].out, !Catch::Contains("(0 during backward)"));
    }
  }
}

TEST_CASE("several backward calls before a step add up, as loss.backward() does", "[distributed]") {
  // Micro-batches (gradient accumulation): each dp.backward adds its summed
  // gradients to .grad. Two workers replaced them, so a step took its last
  // micro-batch's gradient only, while one worker added them all.
  for (const std::string sparse : {"none", "gather", "densify"}) {
    INFO("--sparse " << sparse);
    const std::vector<std::string> a{"--steps", "2", "--accumulate", "3", "--sparse", sparse};
    for (const Exit& e : run_workers({a, a})) {
      INFO(e.out);
      CHECK(e.status == 0);
      CHECK_THAT(e.out, Catch::Contains("max |data-parallel - one worker|"));
    }
  }
}

TEST_CASE("workers meet through a FileStore", "[distributed]") {
  const std::string file = (fs::temp_directory_path() / ("sheaf-dp-store-" + std::to_string(free_port()))).string();
  fs::remove(file);
  const std::vector<std::string> a{"--steps", "2", "--file", file};
  // No MASTER_ADDR/PORT to reach: a bad one proves they are not used.
  for (const Exit& e : run_workers({a, a}, {{"MASTER_ADDR", "no-such-host.invalid"}})) {
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("via file " + file));
  }
  fs::remove(file);
}

TEST_CASE("three workers, batches that leave one of them without examples", "[distributed]") {
  const std::vector<std::string> a{"--steps", "2", "--batch", "2"};
  for (const Exit& e : run_workers({a, a, a})) {
    INFO(e.out);
    CHECK(e.status == 0);
  }
}

TEST_CASE("a worker that dies or hangs stops the others with an error naming it", "[distributed]") {
  const std::vector<std::string> base{"--steps", "4", "--timeout-ms", "3000"};
  SECTION("dies") {
    std::vector<std::string> dying = base;
    dying.insert(dying.end(), {"--die-at", "2"});
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = run_workers({base, dying}, {}, 60s);
    INFO(out[0].out);
    CHECK(out[1].status == 9);
    CHECK(out[0].status == 3);
    CHECK_THAT(out[0].out, Catch::Contains("rank 1 stopped"));
    CHECK(seconds(t0) < 30);
  }
  SECTION("hangs") {
    std::vector<std::string> hanging = base;
    hanging.insert(hanging.end(), {"--hang-at", "2"});
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = run_workers({base, hanging}, {}, 30s, {0});
    INFO(out[0].out);
    CHECK(out[0].status == 3);
    CHECK_THAT(out[0].out, Catch::Contains("rank 1 is alive but has not started step 3"));
    CHECK(seconds(t0) < 25);
  }
  SECTION("rank 0, which serves the store, dies") {
    std::vector<std::string> dying = base;
    dying.insert(dying.end(), {"--die-at", "1"});
    const auto out = run_workers({dying, base}, {}, 60s);
    INFO(out[1].out);
    CHECK(out[1].status == 3);
    CHECK_THAT(out[1].out, Catch::Contains("rank 0 stopped"));
  }
  SECTION("dies or hangs, on a rendezvous file (a slower heartbeat)") {
    const std::string file = (fs::temp_directory_path() / ("sheaf-dp-beat-" + std::to_string(free_port()))).string();
    std::vector<std::string> on_file = base;
    on_file.insert(on_file.end(), {"--file", file});
    std::vector<std::string> dying = on_file, hanging = on_file;
    dying.insert(dying.end(), {"--die-at", "2"});
    hanging.insert(hanging.end(), {"--hang-at", "2"});
    fs::remove(file);
    auto out = run_workers({on_file, dying}, {}, 60s);
    INFO(out[0].out);
    CHECK(out[1].status == 9);
    CHECK(out[0].status == 3);
    CHECK_THAT(out[0].out, Catch::Contains("rank 1 stopped"));
    fs::remove(file);
    out = run_workers({on_file, hanging}, {}, 30s, {0});
    INFO(out[0].out);
    CHECK(out[0].status == 3);
    CHECK_THAT(out[0].out, Catch::Contains("rank 1 is alive but has not started step 3"));
    fs::remove(file);
  }
}

TEST_CASE("a gradient outside DataParallel::backward is a UserError unless asked for as local", "[distributed]") {
  // Both ranks: a plain loss.backward() at step 1 would step each with its own gradients.
  const std::vector<std::string> plain{"--steps", "3", "--plain-backward-at", "1"};
  for (const Exit& e : run_workers({plain, plain}, {}, 60s)) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("got a gradient outside DataParallel::backward"));
    CHECK_THAT(e.out, Catch::Contains("dp.local_gradients()"));
  }
  // Under the guard the same backward is allowed, and the step's summed
  // gradients (and so the result) are unchanged.
  const std::vector<std::string> local{"--steps", "3", "--local-grad-at", "1"};
  for (const Exit& e : run_workers({local, local}, {}, 60s)) {
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("max |data-parallel - one worker|"));
  }
}

TEST_CASE("two workers with one RANK or different WORLD_SIZEs stop at the start, saying so", "[distributed]") {
  // Rank 0 judges the roll call and every worker that came reports its
  // verdict. (8 s: every worker must claim within rank 0's window, also on a
  // loaded machine; a worker missing costs the whole of it.)
  const std::vector<std::string> base{"--timeout-ms", "8000"};
  std::vector<std::string> three = base;
  three.insert(three.end(), {"--world-size", "3"});
  auto every = [](const std::vector<Exit>& out, const std::string& says) {
    for (const Exit& e : out) {
      INFO(e.out);
      CHECK(e.status == 2);
      CHECK_THAT(e.out, Catch::Contains(says));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  SECTION("one RANK twice") {
    std::vector<std::string> again = base;
    again.insert(again.end(), {"--rank", "1"});
    every(run_workers({base, base, again}, {}, 60s), "two workers were started with RANK=1");
  }
  SECTION("rank 0 with the smaller WORLD_SIZE") {
    every(run_workers({base, three}, {}, 60s), "rank 1 was started with WORLD_SIZE=3, rank 0 with 2");
  }
  SECTION("rank 0 with the larger WORLD_SIZE") {
    // Known as rank 1 claims: not after the timeout that rank 2 would take.
    every(run_workers({three, base}, {}, 60s), "rank 1 was started with WORLD_SIZE=2, rank 0 with 3");
    CHECK(seconds(t0) < 8);
  }
  SECTION("a worker missing") {
    every(run_workers({three, three}, {}, 60s), "rank(s) 2 did not arrive within 8 s");
  }
  CHECK(seconds(t0) < 30);
}

TEST_CASE("a rendezvous file left by an earlier run stops every worker of the next and says why", "[distributed]") {
  const std::string file = (fs::temp_directory_path() / ("sheaf-dp-left-" + std::to_string(free_port()))).string();
  // The earlier run dies after its roll call: _exit runs no FileStore
  // destructor, so its file (claims, world sizes, verdict) stays.
  auto leave = [&](size_t world) {
    fs::remove(file);
    const std::vector<std::string> dying{"--steps", "2", "--file", file, "--die-at", "1"};
    run_workers(std::vector(world, dying), {}, 60s);
    REQUIRE(fs::exists(file));
  };
  auto start_again = [&](size_t world) {
    const std::vector<std::string> a{"--steps", "2", "--file", file, "--timeout-ms", "8000"};
    const auto t0 = std::chrono::steady_clock::now();
    for (const Exit& e : run_workers(std::vector(world, a), {}, 60s)) {
      INFO(e.out);
      CHECK(e.status == 2);
      CHECK_THAT(e.out, Catch::Contains("holds a roll call that already ended"));
      CHECK_THAT(e.out, Catch::Contains("its verdict: every rank came"));  // the earlier run's roll call succeeded
      CHECK_THAT(e.out, !Catch::Contains("WORLD_SIZE="));  // (before: a rank told of a mismatch that was not there)
    }
    CHECK(seconds(t0) < 8);  // no rank waits out the roll call's window
  };
  SECTION("left by a smaller world") {
    leave(2);
    start_again(3);
  }
  SECTION("left by a larger world") {
    leave(3);
    start_again(2);
  }
  SECTION("left by the same world") {
    leave(2);
    start_again(2);
  }
  fs::remove(file);
}

TEST_CASE("a rendezvous file in a missing folder or an empty path is a UserError at once", "[distributed]") {
  CHECK_THROWS_AS(sheaf::Rendezvous::file_store("", 0, 2), sheaf::UserError);
  const std::string file = (fs::temp_directory_path() / ("sheaf-no-such-dir-" + std::to_string(free_port())) / "f").string();
  const auto t0 = std::chrono::steady_clock::now();
  for (const Exit& e : run_workers({{"--file", file, "--timeout-ms", "8000"}}, {{"WORLD_SIZE", "2"}}, 60s)) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("the rendezvous file's folder") && Catch::Contains("does not exist"));
  }
  CHECK(seconds(t0) < 8);
}

TEST_CASE("DataParallel::sum adds each position over the ranks, and different lengths are a UserError", "[distributed]") {
  const auto same = run_workers({{"--steps", "1", "--sum", "2"}, {"--steps", "1", "--sum", "2"}}, {}, 60s);
  for (const Exit& e : same) {
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("summed: 3 3\n"));
  }
  // One rank with none: it still takes part (it hung in Gloo before).
  const auto differ = run_workers({{"--steps", "1", "--sum", "0"}, {"--steps", "1", "--sum", "3"}}, {}, 60s);
  for (const Exit& e : differ) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("the ranks passed from 0 to 3: every rank must sum the same number"));
  }
}

TEST_CASE("DataParallel::broadcast copies rank 0's tensors, and different tensors are a UserError", "[distributed]") {
  const auto same = run_workers({{"--steps", "1", "--broadcast", "3,2"}, {"--steps", "1", "--broadcast", "3,2"}}, {}, 60s);
  for (const Exit& e : same) {
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("broadcast: 3 2\n"));  // rank 0's ones
  }
  // Different counts, then different sizes: both ranks stop, saying which
  // (they hung or failed inside Gloo before).
  for (const Exit& e : run_workers({{"--steps", "1", "--broadcast", "3,2"}, {"--steps", "1", "--broadcast", "3"}}, {}, 60s)) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("the ranks passed from 1 to 2: every rank must pass the same tensors"));
  }
  for (const Exit& e : run_workers({{"--steps", "1", "--broadcast", "3,2"}, {"--steps", "1", "--broadcast", "3,5"}}, {}, 60s)) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("DataParallel::broadcast: tensor 1 ("));
    CHECK_THAT(e.out, Catch::Contains("differs in size between the ranks"));
  }
}

TEST_CASE("a backward that throws: run again if nothing went out, else this worker stops, saying why", "[distributed]") {
  // Without overlap nothing is sent during backward: the rank that threw
  // runs the step again and the result equals one worker's.
  const std::vector<std::string> quiet{"--steps", "3", "--no-overlap"};
  std::vector<std::string> throws = quiet;
  throws.insert(throws.end(), {"--throw-in-backward-at", "1"});
  const auto again = run_workers({quiet, throws}, {}, 60s);
  for (const Exit& e : again) {
    INFO(e.out);
    CHECK(e.status == 0);
    CHECK_THAT(e.out, Catch::Contains("max |data-parallel - one worker|"));
  }
  CHECK_THAT(again[1].out, Catch::Contains("step 1: backward threw; running the step again"));
  // With overlap the buckets went out before the throw: running the step
  // again would pair its collectives with the other rank's next ones (wrong
  // sums, or a hang). That rank stops with a UserError; the other names it.
  const auto out = run_workers({{"--steps", "3", "--timeout-ms", "10000"},
                                {"--steps", "3", "--timeout-ms", "10000", "--throw-in-backward-at", "1"}},
                               {}, 60s);
  INFO(out[0].out);
  INFO(out[1].out);
  CHECK(out[1].status == 2);
  CHECK_THAT(out[1].out, Catch::Contains("step 2's backward threw after 3 of 3 gradient buckets went out"));
  CHECK_THAT(out[1].out, Catch::Contains("cannot go on"));
  CHECK(out[0].status == 3);
  CHECK_THAT(out[0].out, Catch::Contains("rank 1 stopped"));
}

TEST_CASE("workers with different models stop at the start, saying so", "[distributed]") {
  const auto out = run_workers({{"--hidden", "16"}, {"--hidden", "24"}}, {}, 60s);
  for (const Exit& e : out) {
    INFO(e.out);
    CHECK(e.status == 2);
    CHECK_THAT(e.out, Catch::Contains("the workers' models differ"));
    CHECK_THAT(e.out, Catch::Contains("--hidden"));
  }
  CHECK_THAT(out[0].out, Catch::Contains("rank 1 has parameter 0: [200, 24] float sparse, this rank has parameter 0: [200, 16]"));
}

TEST_CASE("nobody at the address: a clear error within the timeout", "[distributed]") {
  // Rank 1 alone: rank 0 never starts.
  const auto t0 = std::chrono::steady_clock::now();
  const auto out = run_workers({{"--timeout-ms", "2000"}}, {{"WORLD_SIZE", "2"}, {"RANK", "1"}}, 60s);
  INFO(out[0].out);
  CHECK(out[0].status == 2);
  CHECK_THAT(out[0].out, Catch::Contains("could not reach rank 0 at 127.0.0.1:"));
  CHECK(seconds(t0) < 30);
  const auto bad = run_workers({{"--timeout-ms", "2000"}}, {{"WORLD_SIZE", "2"}, {"RANK", "1"},
                                                            {"MASTER_ADDR", "no-such-host.invalid"}}, 60s);
  INFO(bad[0].out);
  CHECK(bad[0].status == 2);
  CHECK_THAT(bad[0].out, Catch::Contains("no-such-host.invalid"));
}
