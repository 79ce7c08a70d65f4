// Checks and rewrites of a strategy's batches (scheduler-internal; tested on
// hand-built DAGs).
#pragma once

#include <string_view>

#include "batches.h"
#include "round.h"

namespace sheaf {

// Moves whole batches into other batches of their signature where dependencies
// allow (later, if every consumer still runs after; earlier, if every argument
// still runs before). Only removes launches; batch positions never change.
void merge_batches(const RoundDag& dag, Batches& schedule);

// Throws if `b` is not a valid schedule of `dag` (a node missing or twice,
// mixed signatures, batched shared nodes, a node before its argument): an
// InternalError for Sheaf's own strategies, a UserError naming Strategy's
// contract for one of the user's (`users_own`).
void validate_batches(const RoundDag& dag, const Batches& b, std::string_view strategy, bool users_own = false);

}  // namespace sheaf
