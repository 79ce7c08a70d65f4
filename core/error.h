// Errors. A UserError is the user's mistake and names the op, the example and
// the user's source line; an InternalError is ours and says so. Both leave the
// graph usable: nothing is appended by an op whose checks failed.
#pragma once

#include <cstdint>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ids.h"

namespace sheaf {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// A kernel's error that one row of its batch caused (an input resized since
// it was recorded, an index out of range): the executor names that row's
// node, its example and line, instead of the batch's first.
class RowError : public std::invalid_argument {
 public:
  RowError(int64_t row, const std::string& what) : std::invalid_argument(what), row_(row) {}
  int64_t row() const { return row_; }

 private:
  int64_t row_;
};

// Where something happened: the op, the user's example id (or kSharedExample /
// kMixedExample), and the user's line.
struct Site {
  std::string_view op;
  int64_t example = kSharedExample;
  std::source_location loc;
};

namespace detail {

// "file.cpp:42: sheaf: op 'affine' (example 3): "
std::string format_site(const Site& s);
// "file.cpp:42" (empty when the location is unknown)
std::string format_loc(const std::source_location& loc);

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

}  // namespace detail

// Builds the message only when thrown.
template <class... A>
[[noreturn]] void throw_user(const Site& s, const A&... what) {
  throw UserError(detail::format_site(s) + detail::cat(what...));
}

// For errors about no op in particular: "file.cpp:42: sheaf: ...".
template <class... A>
[[noreturn]] void throw_user_at(const std::source_location& loc, const A&... what) {
  std::string where = detail::format_loc(loc);
  throw UserError((where.empty() ? "" : where + ": ") + "sheaf: " + detail::cat(what...));
}

template <class... A>
[[noreturn]] void throw_internal(const A&... what) {
  throw InternalError("sheaf internal error (please report): " + detail::cat(what...));
}

#define SHEAF_ASSERT(cond, ...) \
  do {                          \
    if (!(cond)) ::sheaf::throw_internal(#cond, ": ", __VA_ARGS__); \
  } while (0)

}  // namespace sheaf
