// countdown: the `while x > 0: x = x - 1` example from the Matchbox talk. Each
// example counts down from its own value; all of them run together, and a
// finished example costs nothing more.
//
//   ./build/examples/countdown [N]     (default 64 examples with inputs 1..N)
#include <ATen/ops/full.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include <sheaf/sheaf.h>

using namespace sheaf;

int main(int argc, char** argv) {
  // N whole, from 1 to 2,000 (about N^2 / 2 nodes in all; a huge N ran out of
  // memory): "1e3", "3abc" or a second argument are refused, not read as 1 or
  // 3 (atoi did).
  constexpr long kMax = 2000;
  long n = 64;
  if (argc > 1) {
    char* end = nullptr;
    errno = 0;
    n = std::strtol(argv[1], &end, 10);
    if (argc > 2 || end == argv[1] || *end != '\0' || errno != 0 || n <= 0 || n > kMax) {
      std::fprintf(stderr, "usage: countdown [N], N a whole number from 1 to %ld (default 64)\n", kMax);
      return 1;
    }
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
  std::printf("%ld examples counting down from 1..%ld: all reached %.0f\n", n, n, results.back().item());
  std::printf("batched loop steps (rounds): %llu, launches: %llu, host fetches: %llu\n",
              static_cast<unsigned long long>(s.rounds), static_cast<unsigned long long>(s.batches),
              static_cast<unsigned long long>(s.fetches));
  std::printf("one example at a time would take %ld loop steps (%ld launches of the body)\n", per_example_steps + n,
              per_example_steps);
  return 0;
}
