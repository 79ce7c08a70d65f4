// countdown: the `while x > 0: x = x - 1` example from the Matchbox talk. Each
// example counts down from its own value; all of them run together, and a
// finished example costs nothing more.
//
//   ./build/examples/countdown [N]     (default 64 examples with inputs 1..N)
#include <ATen/ops/full.h>

#include <cstdio>
#include <cstdlib>

#include <sheaf/sheaf.h>

using namespace sheaf;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 64;
  if (n <= 0) {
    std::fprintf(stderr, "usage: countdown [N > 0]\n");
    return 1;
  }
  Graph g;
  std::vector<Expr> results;
  for (int i = 1; i <= n; ++i) {
    auto scope = g.example(i - 1);
    Expr x = g.input(at::full({}, static_cast<double>(i)));
    // Per-example code: an ordinary while loop whose condition is computed.
    results.push_back(dsl::loop(x, [](Expr v) { return v > 0.0; }, [](Expr v) { return v - 1.0; }));
  }
  g.forward(results);

  long per_example_steps = 0;
  for (int i = 1; i <= n; ++i) per_example_steps += i;
  const Stats& s = g.stats();
  std::printf("%d examples counting down from 1..%d: all reached %.0f\n", n, n, results.back().item());
  std::printf("batched loop steps (rounds): %llu, launches: %llu, host fetches: %llu\n",
              static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.batches),
              static_cast<unsigned long long>(s.fetches));
  std::printf("one example at a time would take %ld loop steps (%ld launches of the body)\n", per_example_steps + n,
              per_example_steps);
  return 0;
}
