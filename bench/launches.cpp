#include "launches.h"

#include <ATen/record_function.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string_view>
#include <vector>

namespace sheaf::bench {

namespace {

// Ops that only make views or read metadata: no kernel.
bool launches_nothing(std::string_view name) {
  static const std::set<std::string_view> kFree = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided", "aten::narrow", "aten::select",
      "aten::slice", "aten::expand", "aten::expand_as", "aten::unsqueeze", "aten::squeeze", "aten::t",
      "aten::transpose", "aten::permute", "aten::movedim", "aten::detach", "aten::alias", "aten::split",
      "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::empty", "aten::empty_like",
      "aten::empty_strided", "aten::resize_", "aten::_unsafe_view", "aten::lift_fresh", "aten::size",
      "aten::stride", "aten::is_same_size", "aten::view_as", "aten::numel", "aten::dim", "aten::result_type",
      "aten::set_", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"};
  return kFree.count(name) != 0;
}

std::atomic<int> g_phase{LaunchCounter::kForward};
std::array<std::atomic<uint64_t>, LaunchCounter::kPhases> g_counts{};
std::mutex g_mu;
std::map<std::string, LaunchCounter::OpTime> g_by_op;
bool g_timed = false;
at::CallbackHandle g_handle = 0;

struct Frame {
  bool counted;
  std::chrono::steady_clock::time_point t0;
};
thread_local int t_depth = 0;
thread_local std::vector<int> t_base{0};       // the depth whose ops count (0; inside an autograd node, deeper)
thread_local std::vector<Frame> t_frames;

struct Ctx : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const int before = t_depth++;
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    t_base.push_back(before + 1);
    t_frames.push_back({false, {}});
    return nullptr;
  }
  const bool counted = before == t_base.back() && !launches_nothing(fn.name());
  if (counted) ++g_counts[static_cast<size_t>(g_phase.load())];
  t_frames.push_back({counted, g_timed && counted ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}});
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  --t_depth;
  if (t_frames.empty()) return;
  const Frame f = t_frames.back();
  t_frames.pop_back();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (t_base.size() > 1) t_base.pop_back();
    return;
  }
  if (!g_timed || !f.counted) return;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f.t0).count();
  std::lock_guard lock(g_mu);
  LaunchCounter::OpTime& t = g_by_op[fn.name()];
  ++t.launches;
  t.ms += ms;
}

}  // namespace

LaunchCounter::LaunchCounter(bool timed) {
  for (auto& c : g_counts) c = 0;
  g_by_op.clear();
  g_timed = timed;
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                       .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
}

LaunchCounter::~LaunchCounter() { at::removeCallback(g_handle); }

void LaunchCounter::set_phase(Phase p) { g_phase = p; }

std::array<uint64_t, LaunchCounter::kPhases> LaunchCounter::counts() const {
  std::array<uint64_t, kPhases> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = g_counts[i];
  return out;
}

std::map<std::string, LaunchCounter::OpTime> LaunchCounter::by_op() const {
  std::lock_guard lock(g_mu);
  return g_by_op;
}

}  // namespace sheaf::bench
