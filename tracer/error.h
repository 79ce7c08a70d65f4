// Errors. A UserError is the user's mistake and names the op, the example and
// the user's source line; an InternalError is ours and says so. Both leave the
// graph usable: nothing is appended by an op whose checks failed.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sheaf {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Where a node was recorded: the user's line, the op, the example.
struct Site {
  std::string_view op;
  int example = -1;  // -1: shared (no example); -2: mixes examples
  std::source_location loc;
};

namespace detail {

std::string format_site(const Site& s);

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

}  // namespace detail

// Builds the message only when thrown: "file.cpp:42: op 'affine' (example 3): ...".
template <class... A>
[[noreturn]] void throw_user(const Site& s, const A&... what) {
  throw UserError(detail::format_site(s) + detail::cat(what...));
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
