// What a round's plan costs, for the strategies that choose between schedules
// (auto): its launches, its gathers and the bytes they copy.
//
// Counting launches alone can pick the slower schedule: one that saves a few
// launches by gathering many more rows (issue 14 saw a tagger whose schedule
// took half the launches of another and ran at 0.75x its speed). The
// constants are per device, measured with `sheaf-bench --workload calibrate`
// (docs/benchmarks.md says on what).
//
// Host time is left out on purpose: every candidate's scheduling is linear in
// the round's nodes (they differ by a few percent of it), and a choice that
// depended on a measured time would change from run to run, and with it the
// order of floating-point sums: training would not repeat bit for bit.
//
//   sheaf::GraphOptions o;
//   o.cost = sheaf::CostModel{.launch_us = 12, .gather_us = 6, .gather_us_per_mb = 60};  // your machine's figures
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace sheaf {

struct CostModel {
  // What one more batch costs, forward and backward: dispatch, an autograd
  // node, host work per batch. Every schedule of a round does the same
  // arithmetic, so the arithmetic is not counted.
  double launch_us = 0;
  // One gathered input, forward and backward, besides its bytes (the call,
  // the output's allocation, its autograd node).
  double gather_us = 0;
  // A megabyte (2^20 bytes) of rows gathered forward and added back backward.
  double gather_us_per_mb = 0;
  // Calibrated figures for the device's type (below).
  static CostModel for_device(c10::Device device);

  // Microseconds.
  double of(size_t launches, size_t gathers, uint64_t gathered_bytes) const {
    return launch_us * static_cast<double>(launches) + gather_us * static_cast<double>(gathers) +
           gather_us_per_mb * static_cast<double>(gathered_bytes) / (1024.0 * 1024.0);
  }
};

// One candidate's plan of a round, costed (Scheduler::compared, Stats::compared).
struct PlanCost {
  std::string name;  // the candidate strategy (a copy: a user's strategy may be gone when Stats are read)
  uint64_t launches = 0;
  uint64_t gathers = 0;         // inputs with rows not read as views (scheduler/plan.h)
  uint64_t gathered_bytes = 0;  // those rows' bytes
  double cost_us = 0;           // CostModel::of
};
// "lazy 184 launches + 799 gathers of 6954 KiB = 7163 us, agenda ..."
std::string describe(std::span<const PlanCost> costs);

// `sheaf-bench --workload calibrate --threads 1 --repeat 9`, 2026-11-26.
// CPU: AMD EPYC (Zen 5) with OpenBLAS: 6.3-6.4 us a batch, 6.9-7.1 us a
// gather besides its bytes (measured on index_select; the CPU's row gathers
// are cheaper, so this leans toward fewer gathers) and 78-82 us a MiB (the
// rows copied forward and their gradients added up backward). A launch weighs
// as much as ~80 KiB gathered. CUDA: NVIDIA H200 with torch 2.11: 41-43 us a
// batch and 49-57 us a gather, nearly all of it host work (dispatch,
// autograd, the launches), and 1.1 us a MiB: on a GPU, bytes hardly count and
// a gather weighs about as much as a launch.
inline CostModel CostModel::for_device(c10::Device device) {
  if (device.is_cuda()) return {.launch_us = 42, .gather_us = 53, .gather_us_per_mb = 1.1};
  return {.launch_us = 6.4, .gather_us = 7.0, .gather_us_per_mb = 80};
}

}  // namespace sheaf
