// The key-value store the workers meet through (inside the library: it brings
// LibTorch's c10d headers).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "rendezvous.h"

namespace sheaf::detail {

// Rank 0 serves a TCPStore; the others connect to it (DataParallel's roll
// call then waits for every worker). Failing to listen or to reach rank 0
// within `timeout` is a UserError saying which and what to check.
c10::intrusive_ptr<c10d::Store> open_store(const Rendezvous& where, std::chrono::milliseconds timeout);

}  // namespace sheaf::detail
