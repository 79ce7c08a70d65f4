#include "error.h"

namespace sheaf::detail {

std::string format_loc(const std::source_location& loc) {
  if (loc.line() == 0) return {};
  return std::string(loc.file_name()) + ":" + std::to_string(loc.line());
}

std::string format_site(const Site& s) {
  std::ostringstream os;
  if (std::string where = format_loc(s.loc); !where.empty()) os << where << ": ";
  os << "sheaf: op '" << s.op << "'";
  if (s.example >= 0)
    os << " (example " << s.example << ")";
  else if (s.example == kMixedExample)
    os << " (across examples)";
  os << ": ";
  return os.str();
}

}  // namespace sheaf::detail
