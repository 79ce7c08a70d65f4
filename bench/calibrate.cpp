// Calibration of scheduler/cost.h's CostModel on this machine and device:
//
// * launch_us: a Sheaf graph of one example, a chain of `depth` affine ops,
//   trained (forward and backward): one batch per op. The slope of time over
//   depth (two depths) is what one more batch costs: dispatch, autograd,
//   host work per batch; the graph's fixed costs cancel.
// * gather_us_per_mb and gather_us: rows of a [rows, width] tensor gathered
//   in a shuffled order and their gradient scattered back (index_select and
//   its backward, twenty gathers to one backward pass, as in a round) at two
//   widths: the slope is the bandwidth, what is left of the narrow one the
//   fixed cost of a gather. A slope under the timer's resolution reads 0.
//
// Medians of --repeat runs of each. Prints the two figures (JSON with --json),
// ready for GraphOptions::cost or CostModel::for_device's table.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>

#include <sheaf/backend/runtime.h>

#include "harness.h"

namespace sheaf::bench {

namespace {

// Milliseconds for one training step of a chain of `depth` affine ops on one example.
double chain_ms(c10::Device device, int depth, int repeat) {
  const auto opts = at::TensorOptions().device(device);
  at::Tensor W = (at::randn({4, 4}, opts) * 0.3).requires_grad_();
  at::Tensor b = at::zeros({4}, opts).requires_grad_();
  at::Tensor x0 = at::randn({4}, opts);
  Graph g(GraphOptions{.device = device});
  return median_ms(device, repeat, [&] {
    g.clear();
    Expr x = g.input(x0);
    for (int k = 0; k < depth; ++k) x = dsl::affine(W, x, b);
    Expr loss = dsl::sum(x);
    g.forward(loss);
    loss.value().backward();
  });
}

// Milliseconds to gather `rows` rows of `width` floats in shuffled order and scatter their gradient back.
double gather_ms(c10::Device device, int64_t rows, int64_t width, int repeat) {
  const auto opts = at::TensorOptions().device(device);
  at::Tensor src = at::randn({rows, width}, opts).requires_grad_();
  at::Tensor perm = at::randperm(rows, at::TensorOptions().dtype(at::kLong).device(device));
  at::Tensor grad = at::ones({rows, width}, opts);
  constexpr int kTimes = 20;  // several per timing: one is microseconds
  return median_ms(device, repeat, [&] {
    std::vector<at::Tensor> outs, grads(kTimes, grad);
    for (int k = 0; k < kTimes; ++k) outs.push_back(at::index_select(src, 0, perm));
    torch::autograd::grad(outs, {src}, grads);
  }) / kTimes;
}

}  // namespace

int run_calibrate(const Options& o) {
  const c10::Device device(o.device);
  constexpr int kShort = 20, kLong = 220;
  const double short_ms = chain_ms(device, kShort, o.repeat), long_ms = chain_ms(device, kLong, o.repeat);
  const double launch_us = (long_ms - short_ms) * 1000.0 / (kLong - kShort);
  // CPU: 8 KiB and 96 KiB, a batch's rows, below glibc's mmap threshold (a
  // larger tensor can cost page faults at every allocation: 50 to 370 us a
  // MiB between two runs of the same command). CUDA: 0.5 and 16 MiB, since
  // smaller copies take less time than their launch and the slope is noise
  // (it read -21 us a MiB on an H200 with the CPU's sizes).
  const bool cuda = device.is_cuda();
  const int64_t kRows = cuda ? 4096 : 64, kNarrow = 32, kWide = cuda ? 1024 : 384;
  const double narrow_ms = gather_ms(device, kRows, kNarrow, o.repeat), wide_ms = gather_ms(device, kRows, kWide, o.repeat);
  const double mb = static_cast<double>(kRows * (kWide - kNarrow) * 4) / (1024.0 * 1024.0);
  const double gather_us_per_mb = std::max(0.0, (wide_ms - narrow_ms) * 1000.0 / mb);
  const double gather_us = std::max(
      0.0, narrow_ms * 1000.0 - gather_us_per_mb * static_cast<double>(kRows * kNarrow * 4) / (1024.0 * 1024.0));
  if (o.json) {
    Json j;
    j.add("workload", "calibrate").add("device", o.device).add("threads", o.threads).add("repeat", o.repeat)
        .add("launch_us", launch_us).add("gather_us", gather_us).add("gather_us_per_mb", gather_us_per_mb)
        .add("chain_ms", std::vector<double>{short_ms, long_ms}).add("gather_ms", std::vector<double>{narrow_ms, wide_ms});
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf("calibrate, %s: one more batch %.2f us (chains of %d and %d affine ops: %.3f and %.3f ms a step); "
                "a gather %.2f us plus %.1f us a MiB (%lld rows of %lld and %lld floats: %.4f and %.4f ms)\n"
                "  GraphOptions::cost = sheaf::CostModel{.launch_us = %.3g, .gather_us = %.3g, .gather_us_per_mb = %.3g}\n",
                o.device.c_str(), launch_us, kShort, kLong, short_ms, long_ms, gather_us, gather_us_per_mb,
                static_cast<long long>(kRows), static_cast<long long>(kNarrow), static_cast<long long>(kWide),
                narrow_ms, wide_ms, launch_us, gather_us, gather_us_per_mb);
  }
  return 0;
}

}  // namespace sheaf::bench
