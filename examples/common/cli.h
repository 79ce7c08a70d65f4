// The examples' command-line edges: a parse error or a failure is one line on
// stderr, prefixed with the program's name, and exit status 1; --help exits 0.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <string>

namespace sheaf::models {

// The help of every --threads option (which calls sheaf::set_threads).
inline constexpr const char* kThreadsHelp =
    "threads for the CPU math (sheaf::set_threads: OpenBLAS and LibTorch, one pool)";

// A number from `min` on, the whole text, finite and within float's range
// (an `inf` or `1e300` learning rate trained to NaN, or failed in the
// optimizer with LibTorch's words); its error says `what`. (CLI11's own
// PositiveNumber names its range as "0.000000 to 17976931348623157..." in
// 300 digits.)
inline CLI::Validator at_least(double min, const std::string& what) {
  return {[=](std::string& text) {
            char* end = nullptr;
            const double x = std::strtod(text.c_str(), &end);
            const bool number = end != text.c_str() && *end == '\0' && std::isfinite(x) &&
                                std::fabs(x) <= std::numeric_limits<float>::max();
            return number && x >= min ? std::string() : "'" + text + "' is not " + what;
          },
          ""};
}
inline const CLI::Validator kPositiveNumber = at_least(std::numeric_limits<double>::min(), "a positive number");
inline const CLI::Validator kNonNegativeNumber = at_least(0, "a number >= 0");
// A seed: decimal digits that fit 64 bits, without a leading zero (CLI11
// took 2^64 and more as the largest seed and -1 as 2^64 - 1, so that
// different seeds trained alike without a word, and reads 010 as octal 8).
inline const CLI::Validator kSeed{
    [](std::string& text) {
      uint64_t x = 0;
      const char* end = text.data() + text.size();
      const auto [at, error] = std::from_chars(text.data(), end, x);
      const bool decimal = !text.empty() && error == std::errc() && at == end && (text[0] != '0' || text.size() == 1);
      return decimal ? std::string()
                     : "'" + text + "' is not a seed (a whole number from 0 to 2^64 - 1, no leading zero)";
    },
    "0..2^64-1"};

// Parses; returns -1 to go on, else the status to exit with.
inline int parse_cli(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s: %s (see --help)\n", program, e.what());
    return 1;
  }
  return -1;
}

inline int run_cli(const char* program, const std::function<int()>& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    const std::string what = e.what();  // LibTorch's errors carry a backtrace after the first line
    std::fprintf(stderr, "%s: %s\n", program, what.substr(0, what.find('\n')).c_str());
    return 1;
  }
}

}  // namespace sheaf::models
