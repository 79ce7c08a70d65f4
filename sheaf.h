// Sheaf: write the model for ONE example; run it for MANY in batched launches.
// Everything a model author needs; nothing of the scheduler's or the executor's
// insides (those headers are installed too, for tools and user-defined ops).
#pragma once

#include "backend/runtime.h"      // IWYU pragma: export
#include "dsl/check.h"            // IWYU pragma: export
#include "dsl/control.h"          // IWYU pragma: export
#include "dsl/dsl.h"              // IWYU pragma: export
#include "dsl/function.h"         // IWYU pragma: export
#include "distributed/data_parallel.h"  // IWYU pragma: export
#include "dsl/task.h"             // IWYU pragma: export
#include "engine/graph.h"         // IWYU pragma: export
#include "engine/overlap.h"       // IWYU pragma: export
#include "engine/prefetch.h"      // IWYU pragma: export
#include "scheduler/strategy.h"   // IWYU pragma: export
