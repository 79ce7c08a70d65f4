// The examples' command-line edges: a parse error or a failure is one line on
// stderr, prefixed with the program's name, and exit status 1; --help exits 0.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace sheaf::models {

// The help of every --threads option (which calls sheaf::set_threads).
inline constexpr const char* kThreadsHelp =
    "threads for the CPU math (sheaf::set_threads: OpenBLAS and LibTorch, one pool)";

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
