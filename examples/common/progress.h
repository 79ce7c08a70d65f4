// A progress bar for the examples' training loops: only on a terminal, and
// redrawn at most 10 times a second so that drawing never shows up in the
// items/s it reports.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

namespace sheaf::models {

class Progress {
 public:
  using Clock = std::chrono::steady_clock;
  Progress(bool enabled, int epoch, size_t total, const char* unit)
      : on_(enabled && isatty(2)), epoch_(epoch), total_(total), unit_(unit) {}
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void finish() {  // before anything else is printed
    if (on_) std::fprintf(stderr, "\r%79s\r", "");
    on_ = false;
  }
  void update(size_t done) {
    if (!on_ || Clock::now() - last_ < std::chrono::milliseconds(100)) return;
    last_ = Clock::now();
    constexpr size_t kWidth = 30;
    const size_t filled = kWidth * done / std::max<size_t>(total_, 1);
    const double seconds = std::chrono::duration<double>(last_ - start_).count();
    std::fprintf(stderr, "\repoch %d [%s%s] %zu/%zu %s, %.0f %s/s ", epoch_, std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done, total_, unit_, static_cast<double>(done) / seconds,
                 unit_);
    std::fflush(stderr);
  }

 private:
  bool on_;
  int epoch_;
  size_t total_;
  const char* unit_;
  Clock::time_point start_ = Clock::now(), last_{};
};

}  // namespace sheaf::models
