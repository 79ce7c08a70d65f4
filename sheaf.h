// Sheaf: write the model for ONE example; run it for MANY in batched launches.
#pragma once

#include "dsl/check.h"            // IWYU pragma: export
#include "backend/prefetch.h"     // IWYU pragma: export
#include "backend/runtime.h"      // IWYU pragma: export
#include "dsl/control.h"          // IWYU pragma: export
#include "dsl/dsl.h"              // IWYU pragma: export
#include "dsl/task.h"             // IWYU pragma: export
#include "scheduler/plan.h"       // IWYU pragma: export
#include "scheduler/strategy.h"   // IWYU pragma: export
#include "tracer/graph.h"         // IWYU pragma: export
