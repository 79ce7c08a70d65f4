#include "rendezvous.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <sheaf/core/error.h>

#include "store.h"

namespace sheaf {
namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int min, int max, std::optional<int> fallback = std::nullopt) {
  const std::optional<std::string> text = env(name);
  if (!text) {
    if (fallback) return *fallback;
    throw UserError(detail::cat("sheaf::Rendezvous: ", name, " is not set (scripts/launch.sh and torchrun set RANK, "
                                "WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"));
  }
  int value = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (ec != std::errc() || ptr != end || value < min || value > max)
    throw UserError(detail::cat("sheaf::Rendezvous: ", name, "='", *text, "' is not an integer from ", min, " to ",
                                max));
  return value;
}

}  // namespace

void Rendezvous::check() const {
  if (world_size < 1) throw UserError(detail::cat("sheaf::Rendezvous: world size ", world_size, " (needs >= 1)"));
  if (rank < 0 || rank >= world_size)
    throw UserError(detail::cat("sheaf::Rendezvous: rank ", rank, " is not in 0..", world_size - 1));
}

Rendezvous Rendezvous::from_env() {
  Rendezvous r;
  if (!env("WORLD_SIZE")) {
    // A rank of a world nobody sized: alone, it would train as a world of
    // one, each such worker on every example, without a word.
    if (const std::optional<std::string> rank = env("RANK"); rank && !rank->empty() && env_int("RANK", 0, 1 << 20) != 0)
      throw UserError(detail::cat("sheaf::Rendezvous: RANK='", *rank, "' is set but WORLD_SIZE is not (scripts/"
                                  "launch.sh and torchrun set both; unset RANK for a world of one)"));
    return r;
  }
  r.world_size = env_int("WORLD_SIZE", 1, 1 << 20);
  r.rank = env_int("RANK", 0, r.world_size - 1, r.world_size == 1 ? std::optional(0) : std::nullopt);
  r.local_rank = env_int("LOCAL_RANK", 0, 1 << 20, r.rank);
  if (r.world_size > 1) {
    r.master_addr = env("MASTER_ADDR").value_or("");
    if (r.master_addr.empty()) throw UserError("sheaf::Rendezvous: MASTER_ADDR is not set (rank 0's host name or address)");
    r.master_port = env_int("MASTER_PORT", 1, 65535);
  }
  return r;
}

Rendezvous Rendezvous::file_store(std::string path, int rank, int world_size) {
  Rendezvous r;
  r.rank = r.local_rank = rank;
  r.world_size = world_size;
  if (path.empty())  // (an empty file would mean TCP: the workers would wait for a rank 0 at ":0")
    throw UserError("sheaf::Rendezvous::file_store: the rendezvous file's path is empty");
  r.file = std::move(path);
  r.check();
  return r;
}

std::string Rendezvous::describe() const {
  std::string via = !file.empty() ? "file " + file : master_addr + ":" + std::to_string(master_port);
  return detail::cat("rank ", rank, " of ", world_size, " via ", via);
}

namespace detail {

c10::intrusive_ptr<c10d::Store> open_store(const Rendezvous& where, std::chrono::milliseconds timeout) {
  where.check();
  const double seconds = std::chrono::duration<double>(timeout).count();
  if (!where.file.empty()) {
    // Checked here: LibTorch retries a file it cannot create for its own
    // default timeout (minutes), whatever the store's timeout.
    const std::filesystem::path folder = std::filesystem::path(where.file).parent_path();
    std::error_code ec;
    if (!std::filesystem::is_directory(folder.empty() ? std::filesystem::path(".") : folder, ec))
      throw UserError(cat("sheaf::DataParallel (", where.describe(), "): the rendezvous file's folder ",
                          folder.string(), " does not exist"));
    try {
      auto store = c10::make_intrusive<c10d::FileStore>(where.file, where.world_size);
      store->setTimeout(timeout);
      return store;
    } catch (const std::exception& e) {
      throw UserError(cat("sheaf::DataParallel (", where.describe(), "): cannot use the rendezvous file: ", e.what()));
    }
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(where.master_port);
  o.isServer = where.rank == 0;
  o.numWorkers = where.world_size;
  // DataParallel's roll call waits for the workers, and can say which did not
  // come, or came with another WORLD_SIZE (the store's own wait says neither).
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(where.master_addr, o);
  } catch (const std::exception& e) {
    const std::string hint =
        where.rank == 0 ? cat("rank 0 could not listen on port ", where.master_port, " (port in use?)")
                        : cat("could not reach rank 0 at ", where.master_addr, ":", where.master_port, " within ",
                              seconds, " s (is rank 0 running? are MASTER_ADDR and MASTER_PORT rank 0's?)");
    throw UserError(cat("sheaf::DataParallel (", where.describe(), "): ", hint, ": ", e.what()));
  }
}

}  // namespace detail
}  // namespace sheaf
