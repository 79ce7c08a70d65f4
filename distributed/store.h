// The key-value store the workers meet through (inside the library: it brings
// LibTorch's c10d headers).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

#include "rendezvous.h"

namespace sheaf::detail {

// Rank 0 serves a TCPStore and waits for the others; the others connect to it.
// Failing to listen, to reach rank 0, or to see every worker arrive within
// `timeout` is a UserError saying which and what to check.
c10::intrusive_ptr<c10d::Store> open_store(const Rendezvous& where, std::chrono::milliseconds timeout);

}  // namespace sheaf::detail
